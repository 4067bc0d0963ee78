"""ONNXAgent loading, bundle integrity, provider selection and fallback, call-level errors."""

import json
import shutil
import threading
import warnings

import numpy as np
import pytest

from laya_onnx import ONNXAgent
from laya_onnx.core.bundle import Bundle, BundleError
from laya_onnx.core.errors import InvalidRequest, InvalidRequestType, LayaInputError, reference_kind
from laya_onnx.core.session import CPU, CUDA, ProviderError, resolve_providers

pytestmark = pytest.mark.runtime

QUESTIONS = {
    "q": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "tech", "other"]},
    "n": {"type": "noul", "instructions": "Refund?"},
}


@pytest.fixture(scope="module")
def agent(bundle_factory):
    return ONNXAgent(bundle_factory("tiny-english"))


def test_the_multilingual_bundle_answers_a_cyrillic_state(bundle_factory):
    """The runtime core loads the multilingual bundle the exporter wrote and reads non-Latin text."""
    agent = ONNXAgent(bundle_factory("tiny-multilingual"))
    result = agent.predict(
        "Клиента списали деньги дважды", {"r": {"type": "noul", "instructions": "Refund?"}}
    )
    assert 0.0 <= result["answers"]["r"]["noul"] <= 1.0


def test_resolve_providers_auto_and_explicit():
    assert resolve_providers(None, [CPU]) == [CPU]
    assert resolve_providers(None, [CUDA, CPU]) == [CUDA, CPU]
    assert resolve_providers(["cuda"], [CPU]) == [CUDA, CPU]
    assert resolve_providers("cpu", [CPU]) == [CPU]
    with pytest.raises(ProviderError, match="unknown execution provider 'tpu'"):
        resolve_providers(["tpu"], [CPU])
    with pytest.raises(ProviderError):
        resolve_providers([""], [CPU])
    # A name onnxruntime does not know is a typo, refused; a known one this build lacks is kept
    # (the session counts it as a fallback).
    with pytest.raises(
        ProviderError, match="unknown execution provider 'FooExecutionProvider'.*CPUExecution"
    ):
        resolve_providers(["FooExecutionProvider"], [CPU])
    assert resolve_providers(["DmlExecutionProvider"], [CPU]) == ["DmlExecutionProvider", CPU]
    assert resolve_providers(["XExecutionProvider"], [CPU], known=["XExecutionProvider", CPU]) == [
        "XExecutionProvider",
        CPU,
    ]


def test_unknown_provider_is_an_error_not_a_silent_cpu_run(bundle_factory):
    with pytest.raises(ProviderError, match="unknown execution provider 'FooExecutionProvider'"):
        ONNXAgent(bundle_factory("tiny-english"), providers=["FooExecutionProvider"])


def test_unavailable_cuda_falls_back_to_cpu_observably(bundle_factory):
    with pytest.warns(RuntimeWarning, match="CUDAExecutionProvider is not available"):
        a = ONNXAgent(bundle_factory("tiny-english"), providers=["cuda"])
    assert a.providers == [CPU]
    assert a.requested_providers == [CUDA, CPU]
    assert a.fallbacks[CUDA]["count"] == 1 and "not available" in a.fallbacks[CUDA]["last_reason"]
    assert a.predict("x", QUESTIONS)["answers"]["q"]["choice"] in ("billing", "tech", "other")


def test_cpu_agent_reports_no_fallbacks(agent):
    assert agent.providers == [CPU] and agent.fallbacks == {}


def test_tampered_bundle_is_refused(bundle_factory, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle_factory("tiny-english"), copy)
    cfg = json.loads((copy / "rl_agent_config.json").read_text())
    cfg["temperature"] = [5.0, 5.0, 5.0]
    (copy / "rl_agent_config.json").write_text(json.dumps(cfg))
    with pytest.raises(BundleError, match="sha256 mismatch for 'rl_agent_config.json'"):
        ONNXAgent(copy)
    (copy / "laya.onnx").unlink()
    with pytest.raises(BundleError, match="laya.onnx"):
        Bundle.open(copy, verify=False)


def test_a_bundle_without_its_manifest_is_refused(bundle_factory, tmp_path):
    """Its files are verified against the manifest before anything is parsed: without one the
    bundle is refused, not run unverified."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle_factory("tiny-english"), copy)
    (copy / "manifest.json").unlink()
    for open_it in (Bundle.open, ONNXAgent):
        with pytest.raises(
            BundleError, match="has no manifest.json, so its files cannot be verified; re-export it"
        ):
            open_it(copy)


def test_bundle_with_another_option_layout_is_refused(bundle_factory, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle_factory("tiny-english"), copy)
    cfg = json.loads((copy / "rl_agent_config.json").read_text())
    cfg["option_layout"] = "parallel"
    (copy / "rl_agent_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"bundle '.*bundle': option_layout='parallel' is not supported"):
        ONNXAgent(copy, verify=False)


def test_missing_bundle_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="bundle '.*nope': no such directory"):
        ONNXAgent(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match="is an empty folder, not a bundle: export one into it"):
        ONNXAgent(tmp_path / "empty")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a bundle")
    with pytest.raises(BundleError, match="has no laya.onnx"):
        ONNXAgent(tmp_path / "other")


def test_call_level_type_errors_match_reference_text(agent):
    with pytest.raises(TypeError, match="predict_batch expects a list of states"):
        agent.predict_batch("a string", QUESTIONS)
    with pytest.raises(TypeError, match="questions must be a dict of question id -> definition, got list"):
        agent.predict("x", [QUESTIONS])
    with pytest.raises(TypeError, match="state must not be None"):
        agent.predict(None, QUESTIONS)
    assert agent.predict_batch([], QUESTIONS) == []


def test_batch_equals_single_calls_and_keeps_order(agent):
    states = ["short", "a much longer state " * 30, {"k": "v"}, [{"role": "user", "content": "hi"}]]
    batch = agent.predict_batch(states, QUESTIONS, batch_size=2, sort_by_length=True)
    singles = [agent.predict(s, QUESTIONS) for s in states]
    for b, s in zip(batch, singles, strict=False):
        assert b["usage"] == s["usage"]
        for qid in QUESTIONS:
            pb = b["answers"][qid].get("probabilities") or {"t": b["answers"][qid]["noul"]}
            ps = s["answers"][qid].get("probabilities") or {"t": s["answers"][qid]["noul"]}
            assert np.allclose(list(pb.values()), list(ps.values()), atol=2e-4)


def test_empty_questions_skip_inference(agent):
    assert agent.predict("x", {}) == {
        "model": "laya-rl-agent-onnx",
        "answers": {},
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def test_min_confidence_validated_before_anything(agent):
    with pytest.raises(ValueError, match=r"min_confidence must be a float in \[0.0, 1.0\], got 2"):
        agent.predict("x", {"bad": {"type": "nope"}}, min_confidence=2)


def test_out_of_range_temperature_is_clamped_with_warning(bundle_factory):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        a = ONNXAgent(bundle_factory("tiny-typed-decisions"))
    assert any("outside [0.5, 5]" in str(w.message) for w in seen)
    assert min(a.calibration.temperature_by_options.values()) >= 0.5


@pytest.mark.parametrize("kw", [{"max_len": "512"}, {"head_max_len": 1.5}, {"max_len": True}])
def test_non_integer_budgets_are_named(agent, kw):
    name = next(iter(kw))
    with pytest.raises(TypeError, match=f"{name} must be an integer or None"):
        agent.predict("x", QUESTIONS, **kw)
    with pytest.raises(TypeError, match="batch_size must be an integer or None"):
        agent.predict_batch(["x"], QUESTIONS, batch_size="2")


def test_budget_too_small_gets_the_marker_diagnosis(agent):
    with pytest.raises(ValueError, match=r"question 'q': only 0 of its 3 option markers fit in max_len=0"):
        agent.predict("x", QUESTIONS, max_len=0)


NOUL = {"type": "noul", "instructions": "Refund?"}


@pytest.mark.parametrize(
    "states, questions, subject",
    [
        (["charged \ud800 twice"], {"n": NOUL}, r"state contains an unpaired surrogate '\\ud800'"),
        ([{"k\udcff": 1}], {"n": NOUL}, r"state contains an unpaired surrogate '\\udcff'"),
        (["ok", ["fine", "\udc00"]], {"n": NOUL}, r"states\[1\] contains"),
        (["ok"], {"n": {**NOUL, "instructions": "Re\ud800fund?"}}, "question 'n' instructions contains"),
        (
            ["ok"],
            {"q": {"type": "choice", "instructions": "Which?", "criteria": ["billing", "te\udfffch"]}},
            r"question 'q' criterion 'te\\udfffch' \(its label\) contains",
        ),
        (
            ["ok"],
            {"q": {"type": "choice", "instructions": "Which?", "criteria": {"tech": "lo\ud800gin"}}},
            r"question 'q' criterion 'tech' \(its description\) contains",
        ),
        (
            ["ok"],
            {"s": {"type": "score", "instructions": "How?", "criteria": ["low", {"x": "hi\ud800gh"}]}},
            "question 's' criterion 1 contains",
        ),
        (["ok"], {"n": {**NOUL, "criteria": {"TRUE": "y\ud800"}}}, "question 'n' criterion 'true' contains"),
        (
            ["ok"],
            {"n": {**NOUL, "labels": {"false": "n\ud800o", "true": "yes"}}},
            r"question 'n' labels\['false'\] contains",
        ),
    ],
)
def test_unencodable_text_is_refused_naming_where_it_is(agent, states, questions, subject):
    """A lone surrogate never reaches the tokenizer (whose own error is a bare TypeError)."""
    with pytest.raises(InvalidRequest, match=subject + ".*must encode as UTF-8"):
        agent.predict_batch(states, questions)


def test_paired_surrogates_and_emoji_pass(agent):
    paired = json.loads('"charged twice \\ud83d\\ude00"')  # a JSON surrogate pair is one emoji
    assert paired.endswith("\U0001f600")
    result = agent.predict(paired, {"n": {**NOUL, "labels": {"false": "no 😀", "true": "yes"}}})
    assert 0.0 <= result["answers"]["n"]["noul"] <= 1.0


def test_agent_reports_checkpoint_name_and_source(agent, bundle_factory):
    assert agent.name == "tiny-english"  # exported with name=preset (tests/conftest.py)
    source = agent.bundle.source
    assert source.name == "tiny-english" and len(source.weights_sha256) == 64


def test_predict_cli_answers_and_names_bad_requests(bundle_factory):
    import subprocess
    import sys

    bundle = str(bundle_factory("tiny-english"))
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "laya_onnx",
            "predict",
            bundle,
            "--compact",
            "--request",
            json.dumps({"state": "x", "questions": QUESTIONS, "min_confidence": 0.5}),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert set(json.loads(ok.stdout)["answers"]) == {"q", "n"}
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "laya_onnx",
            "predict",
            bundle,
            "--request",
            json.dumps({"state": "x", "questions": {"r": {"type": "noul"}}}),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "laya-onnx predict: error: question 'r': no 'instructions'" in bad.stderr


@pytest.mark.parametrize(
    "call,kind,text",
    [
        (lambda a: a.predict("x", {"q": {"type": "X", "instructions": "x"}}), InvalidRequest, "unknown type"),
        (lambda a: a.predict("x", QUESTIONS, max_len=0), InvalidRequest, "option markers fit"),
        (lambda a: a.predict("x", QUESTIONS, min_confidence=2), InvalidRequest, "min_confidence must be"),
        (lambda a: a.predict("x", QUESTIONS, hooks_timeout=-1), InvalidRequest, "hooks_timeout must be"),
        (lambda a: a.predict("x", [QUESTIONS]), InvalidRequestType, "questions must be a dict"),
        (lambda a: a.predict(None, QUESTIONS), InvalidRequestType, "state must not be None"),
        (lambda a: a.predict("x", QUESTIONS, max_len="5"), InvalidRequestType, "max_len must be an integer"),
        (lambda a: a.predict("x", QUESTIONS, hooks=[object]), InvalidRequestType, "must be instances"),
        (lambda a: a.predict("x", QUESTIONS, on_predict_end=5), InvalidRequestType, "must be callable"),
        (lambda a: a.predict({1, 2}, QUESTIONS), InvalidRequestType, "Object of type set is not JSON"),
        (lambda a: a.predict("a\ud800", QUESTIONS), InvalidRequest, "state contains an unpaired surrogate"),
    ],
)
def test_caller_mistakes_raise_the_caller_mistake_types(agent, call, kind, text):
    # The server answers exactly these with a 422; reference_kind is what parity compares.
    with pytest.raises(kind, match=text) as caught:
        call(agent)
    assert reference_kind(caught.value) == ("ValueError" if kind is InvalidRequest else "TypeError")


def test_a_hooks_own_errors_are_not_caller_mistakes(agent):
    class Broken:
        def on_predict_start(self, ctx):
            ctx.skip([{}, {}, {}])  # three results for one state: the hook's mistake

    with pytest.raises(ValueError, match="ctx.skip") as caught:
        agent.predict("x", QUESTIONS, hooks=[Broken()])
    assert not isinstance(caught.value, LayaInputError)


def test_bad_lang_temperatures_are_caller_mistakes(bundle_factory):
    with pytest.raises(InvalidRequest, match="Language override keys must be strings, got 5"):
        ONNXAgent(bundle_factory("tiny-english"), lang_temperatures={5: {}})


def test_fallback_snapshot_is_a_copy_taken_under_the_lock(bundle_factory):
    with pytest.warns(RuntimeWarning):
        a = ONNXAgent(bundle_factory("tiny-english"), providers=["cuda"])
    snap = a.fallbacks
    snap[CUDA]["count"] = 99
    snap.clear()
    assert a.fallbacks[CUDA]["count"] == 1
    session = a.session
    # A counter that lands while a reader copies waits for the copy to finish.
    with pytest.warns(RuntimeWarning, match="retried on CPU"):
        with session._fallbacks_lock:
            counting = threading.Thread(target=session._fallback, args=(CUDA, "run failed, retried on CPU"))
            counting.start()
            counting.join(0.2)
            assert counting.is_alive() and session.info.fallbacks[CUDA].count == 1
        counting.join(5)
    assert a.fallbacks[CUDA] == {"count": 2, "last_reason": "run failed, retried on CPU"}


def test_predict_cli_reports_a_type_mistake_in_one_line(bundle_factory, capsys):
    from laya_onnx.cli import main

    bundle = str(bundle_factory("tiny-english"))
    for request, text in (
        (
            {"state": "x", "questions": QUESTIONS, "max_len": "5"},
            "max_len must be an integer or None, got '5'",
        ),
        (
            {"state": "a\ud800", "questions": QUESTIONS},
            "state contains an unpaired surrogate '\\ud800' (after 'a'); text must encode as UTF-8, "
            "so a surrogate escape such as \\ud800 is only valid as half of a pair",
        ),
    ):
        assert main(["predict", bundle, "--request", json.dumps(request)]) == 2
        err = capsys.readouterr().err
        assert err == f"laya-onnx predict: error: {text}\n"
