"""predict_long: windows, aggregation, usage, warnings, refusals and hooks, as laya 0.4.15.

Parity: the `long` suite (laya_onnx/parity/suites/long.json) through the parity tool against the
reference laya.Agent on every tiny preset (the whole suite on tiny-english, a seeded third of each
kind of request on the others), judged by the parity rule; warnings and the texts only
laya's ONNXAgent words its own way, against laya.onnx_agent.ONNXAgent on our own graph.
The window rules themselves are checked torch-free on a bundle.
"""

from __future__ import annotations

import json
import warnings

import pytest

from laya_onnx.parity.hook_cases import hook_case
from tests.parity_support import failures, suite_sample

pytestmark = pytest.mark.runtime

PRESETS = ["tiny-english", "tiny-multilingual", "tiny-typed-decisions"]
FULL_SUITE_PRESET = "tiny-english"  # the reference comparison runs the whole long suite here
QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the user ask for a refund?"},
    "queue": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {"billing": "billing and refunds", "tech": "login and app issues", "other": None},
    },
    "urgency": {"type": "score", "instructions": "How urgent is this?", "criteria": ["low", "soon", "now"]},
}
DOC = "I was charged twice for my order last week, please help me sort it out. " * 20


@pytest.fixture(scope="module")
def agent(bundle_factory):
    from laya_onnx import ONNXAgent

    return ONNXAgent(bundle_factory("tiny-english"))


# -- parity: the long suite against laya.Agent, by the rule ---------------------------------------
@pytest.mark.torch
@pytest.mark.reference
@pytest.mark.parametrize("preset", PRESETS)
def test_long_suite_parity(preset, checkpoint_factory, bundle_factory, tmp_path):
    """The whole suite on tiny-english; a seeded third of each kind of request on the others."""
    from laya_onnx.parity import run_parity

    whole = preset == FULL_SUITE_PRESET
    suite = "long" if whole else suite_sample("long", tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the suite's clamps warn on both sides
        report = run_parity(checkpoint_factory(preset), bundle_factory(preset), suite=suite)
    summary = report.summary()
    print(preset, json.dumps(summary))
    refused = {c.name for c in report.cases if c.name.startswith("refuse-")}
    if whole:
        assert summary["requests"] >= 30 and summary["rows"] >= 200
        assert len(refused) >= 7
    else:
        assert summary["requests"] >= 15 and refused
    assert report.passed, failures(report)


# -- byte-for-byte against laya's own ONNXAgent on our graph --------------------------------------
@pytest.fixture(scope="module")
def pair(checkpoint_factory, bundle_factory):
    """(laya.onnx_agent.ONNXAgent on our bundle's graph, our ONNXAgent) for tiny-english."""
    from laya.onnx_agent import ONNXAgent as Reference

    from laya_onnx import ONNXAgent

    bundle = bundle_factory("tiny-english")
    return Reference(str(checkpoint_factory("tiny-english")), onnx_path=str(bundle / "laya.onnx")), ONNXAgent(
        bundle
    )


def _outcome(agent, state, questions, **kw):
    """(result without `model` as JSON text or the refusal, the warnings' texts)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = agent.predict_long(state, questions, **kw)
            out = json.dumps({k: v for k, v in result.items() if k != "model"})
        except (ValueError, TypeError) as exc:
            kind = next(b.__name__ for b in (ValueError, TypeError) if isinstance(exc, b))
            out = f"{kind}: {exc}"
    return out, [str(w.message) for w in caught]


CASES = {
    "default": dict(state=DOC * 2),
    "window-stride": dict(state=DOC, window=64, stride=30),
    "conversation": dict(
        state=[{"role": "user", "content": f"turn {i}: charged again"} for i in range(40)], window=70
    ),
    "json": dict(state={"ticket": DOC, "vip": True}, window=90),
    "explicit-clamp": dict(state=DOC * 2, window=5000),
    "stride-shrunk": dict(state=DOC * 2, window=5000, stride=2000),
    "stride-past": dict(state=DOC, window=50, stride=60),
    "hook-skip": dict(state=DOC, window=80, **hook_case("skip")),
    "hook-rewrite": dict(state=DOC, window=80, **hook_case("every-other-state")),
    "hook-no-states": dict(state=DOC, window=80, **hook_case("no-states")),
    "end-hook-drops-a-result": dict(state=DOC, window=80, **hook_case("drop-a-window-result")),
    "hook-shrinks-budget": dict(state=DOC * 2, **hook_case("shrink-max-len")),
}


@pytest.mark.torch
@pytest.mark.reference
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_answer_warnings_and_refusal_as_laya_onnx_agent(case, pair):
    reference, ours = pair
    kw = dict(CASES[case])
    state = kw.pop("state")
    ref_out, ref_warned = _outcome(reference, state, json.loads(json.dumps(QUESTIONS)), **kw)
    our_out, our_warned = _outcome(ours, state, json.loads(json.dumps(QUESTIONS)), **kw)
    assert our_out == ref_out
    assert our_warned == ref_warned


def test_default_clamp_warning_names_the_cost(agent):
    """100 options leave ~100 tokens of room: the default window is cut hard, with laya's warning,
    and the windows are capped per pass (the text itself is compared with laya's in the suite)."""
    ours = agent
    many = {
        "label": {
            "type": "choice",
            "instructions": "Which line?",
            "criteria": [f"line {i} x" for i in range(100)],
        }
    }
    with pytest.warns(RuntimeWarning, match="so the scan window is capped 312 -> "):
        result = ours.predict_long(DOC * 2, many)
    assert result["usage"]["windows"] > 3


# -- the window rules, torch-free ------------------------------------------------------------------
def test_windows_cover_every_token_and_answers_name_their_window(agent):
    from laya_onnx.core.sequences import state_ids

    result = agent.predict_long(DOC, QUESTIONS, window=64, stride=40)
    n = len(state_ids(agent.tok, DOC))
    count = result["usage"]["windows"]
    assert count == 1 + -(-(n - 64) // 40)  # starts 0, 40, ... until a window reaches the end
    for answer in result["answers"].values():
        w = answer["window"]
        assert w["count"] == count and w["token_start"] == 40 * w["index"]
        assert w["token_end"] == min(w["token_start"] + 64, n)
    # the deciding window is the most confident one: no other window beats it
    from laya_onnx.core.windows import split_windows

    texts, _ = split_windows(agent.tok, state_ids(agent.tok, DOC), 64, 40)
    per = agent.predict_batch(texts, QUESTIONS)
    for qid, answer in result["answers"].items():
        key = "noul" if answer["type"] == "noul" else "answer_confidence"
        values = [r["answers"][qid][key] for r in per]
        assert answer[key] == max(values) and answer["window"]["index"] == values.index(max(values))
    assert result["usage"]["input_tokens"] == sum(r["usage"]["input_tokens"] for r in per)
    assert result["usage"]["truncated"] == sum(r["usage"]["truncated"] for r in per)


def test_a_state_that_fits_is_a_plain_predict(agent):
    text = "I was charged twice, refund please."
    long = agent.predict_long(text, QUESTIONS)
    plain = agent.predict(text, QUESTIONS)
    assert long["answers"] == plain["answers"]
    assert long["usage"] == {**plain["usage"], "windows": 1}


@pytest.mark.parametrize(
    "kw, text",
    [
        (dict(window=50, stride=60), "stride=60 steps past the 50-token window, so 10 tokens"),
        (dict(window=5000, stride=6000), "-token window these questions leave room for, so "),
        (dict(aggregate="mean"), "predict_long: only aggregate='auto' is supported"),
    ],
)
def test_refusals(agent, kw, text):
    from laya_onnx.core.errors import InvalidRequest

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(InvalidRequest, match=text.replace("(", r"\(").replace(")", r"\)")):
            agent.predict_long(DOC * 2, QUESTIONS, **kw)


def test_refusals_of_state_and_room(agent):
    from laya_onnx.core.errors import InvalidRequest, InvalidRequestType

    with pytest.raises(InvalidRequestType, match="state must not be None"):
        agent.predict_long(None, QUESTIONS)
    huge = {"x": {"type": "choice", "instructions": "Pick.", "criteria": [f"l{i}" for i in range(300)]}}
    with pytest.raises(InvalidRequest, match="the questions' options fill the whole sequence"):
        agent.predict_long(DOC, huge)


def test_batch_cap_only_past_the_blowup():
    from laya_onnx.core.windows import window_batch_cap

    assert window_batch_cap(40, 100, 312, 7) == 7  # explicit wins
    assert window_batch_cap(40, 312, 312, None) is None  # window not clamped
    assert window_batch_cap(10, 250, 312, None) is None  # a mild clamp: one pass
    assert window_batch_cap(40, 100, 312, None) == 13  # ceil(40*50/156)


def test_usage_merge_sums_numbers_merges_dicts_keeps_last_list():
    from laya_onnx.core.windows import merge_usage

    usage = merge_usage(
        [
            {
                "usage": {
                    "input_tokens": 3,
                    "truncated": True,
                    "truncated_questions": ["a"],
                    "options": {"a": 1},
                }
            },
            {
                "usage": {
                    "input_tokens": 4,
                    "truncated": False,
                    "truncated_questions": [],
                    "options": {"b": 2},
                }
            },
        ]
    )
    assert usage == {
        "input_tokens": 7,
        "truncated": 1,
        "truncated_questions": [],
        "options": {"a": 1, "b": 2},
        "output_tokens": 0,
        "windows": 2,
    }
