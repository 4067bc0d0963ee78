"""Execution providers as onnxruntime takes them: names or (name, options), strict mode, IOBinding.

A CPU-only onnxruntime is assumed: CUDA/CoreML options are shown to reach onnxruntime's
InferenceSession (what we hand it), not to act on a device; the IOBinding path is run on CPU.
"""

from __future__ import annotations

import argparse
import json
import warnings

import pytest

pytest.importorskip("onnxruntime")

from laya_onnx.core.session import (
    COREML,
    CPU,
    CUDA,
    CUDA_DEFAULTS,
    ProviderError,
    ProviderUnavailable,
    provider_entries,
    resolve_providers,
)

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the user ask for a refund?"},
    "queue": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "tech", "other"]},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "soon", "now"]},
}
STATES = ["refund me", "I was charged twice for the same order " * 12, {"order": 7, "late": True}]
CUDA_OPTIONS = {"device_id": 1, "gpu_mem_limit": 2 * 2**30, "arena_extend_strategy": "kSameAsRequested"}


def test_names_and_pairs():
    assert provider_entries(["cuda", (COREML, {"MLComputeUnits": "CPUAndNeuralEngine"}), "cpu", "gpu"]) == [
        (CUDA, None),
        (COREML, {"MLComputeUnits": "CPUAndNeuralEngine"}),
        (CPU, None),
    ]
    assert provider_entries(("cuda", CUDA_OPTIONS)) == [(CUDA, CUDA_OPTIONS)]  # one pair alone
    assert resolve_providers([("cuda", CUDA_OPTIONS)], [CPU]) == [CUDA, CPU]
    with pytest.raises(ProviderError, match="a name or a \\(name, options\\) pair, got \\('cuda',\\)"):
        provider_entries([("cuda",)])
    with pytest.raises(
        ProviderError, match="CUDAExecutionProvider option 'device_id' must be a string or a number"
    ):
        provider_entries([("cuda", {"device_id": None})])
    with pytest.raises(ProviderError, match="options must be keyed by option names"):
        provider_entries([("cuda", {1: "x"})])


@pytest.fixture
def sessions_made(monkeypatch):
    """Every providers= list handed to onnxruntime.InferenceSession, with CUDA and CoreML listed
    as available (this build has neither, so onnxruntime itself still falls back to CPU)."""
    import onnxruntime as ort

    made = []
    real = ort.InferenceSession

    def spy(path, sess_options=None, providers=None, **kw):
        made.append(providers)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # onnxruntime's own "not in available providers"
            return real(path, sess_options=sess_options, providers=providers, **kw)

    monkeypatch.setattr(ort, "InferenceSession", spy)
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, COREML, CPU])
    return made


def test_provider_options_reach_onnxruntime(bundle_factory, sessions_made):
    from laya_onnx import ONNXAgent

    coreml = {"MLComputeUnits": "CPUAndNeuralEngine"}
    bundle = bundle_factory("tiny-english")
    sessions_made.clear()  # the export's own validation sessions, when this test exported it
    with pytest.warns(RuntimeWarning, match="was requested but did not attach") as caught:
        agent = ONNXAgent(bundle, providers=[("cuda", CUDA_OPTIONS), ("coreml", coreml), "cpu"])
    # each report names the bundle (by the one name /health and every other warning use) and
    # the way to refuse instead of falling back
    fallbacks = [str(w.message) for w in caught if "provider fallback" in str(w.message)]
    assert fallbacks and all(
        f"bundle {agent.name!r}: provider fallback" in m and "--strict-providers" in m for m in fallbacks
    ), fallbacks
    assert all(f"bundle {agent.name!r}" in str(w.message) for w in caught if "bundle" in str(w.message))
    # CUDA gets the runtime's defaults (TF32 off, arena grown as requested) under the caller's options
    cuda = {**CUDA_DEFAULTS, **CUDA_OPTIONS}
    assert sessions_made == [[(CUDA, cuda), (COREML, coreml), CPU]]
    # observability: what was asked, what runs, what fell back
    assert agent.requested_providers == [CUDA, COREML, CPU]
    assert agent.providers == [CPU]
    assert set(agent.fallbacks) == {CUDA, COREML} and agent.fallbacks[CUDA]["count"] == 1
    assert agent.session.provider_options == {CUDA: cuda, COREML: coreml}


def test_cpu_options_are_passed_too(bundle_factory, monkeypatch):
    import onnxruntime as ort

    from laya_onnx import ONNXAgent

    made = []
    real = ort.InferenceSession
    monkeypatch.setattr(
        ort,
        "InferenceSession",
        lambda *a, providers=None, **k: made.append(providers) or real(*a, providers=providers, **k),
    )
    agent = ONNXAgent(bundle_factory("tiny-english"), providers=[("cpu", {"use_arena": "0"})])
    assert made == [[(CPU, {"use_arena": "0"})]]
    assert agent.providers == [CPU] and not agent.fallbacks


def test_strict_providers_refuses_an_accelerator_that_did_not_attach(bundle_factory, sessions_made):
    from laya_onnx import ONNXAgent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(
            ProviderUnavailable,
            match=r"strict_providers: CUDAExecutionProvider requested but not running \(CUDAExecutionProvider: CUDAExecutionProvider was requested but did not attach",
        ):
            ONNXAgent(bundle_factory("tiny-english"), providers=["cuda"], strict_providers=True)
    # CPU asked for, CPU running: nothing to refuse
    assert ONNXAgent(bundle_factory("tiny-english"), providers=["cpu"], strict_providers=True).providers == [
        CPU
    ]


def test_strict_providers_refuses_a_provider_this_build_lacks(bundle_factory):
    from laya_onnx import ONNXAgent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(ProviderUnavailable, match="is not available in this onnxruntime build"):
            ONNXAgent(bundle_factory("tiny-english"), providers=["cuda", "cpu"], strict_providers=True)


def test_a_failed_device_pass_is_retried_on_cpu_unless_strict(bundle_factory):
    """The run-time fallback branch, with the session made to look like it runs on CUDA."""
    from laya_onnx import ONNXAgent

    for strict in (False, True):
        agent = ONNXAgent(bundle_factory("tiny-english"))
        expected = agent.predict(STATES[0], QUESTIONS)
        agent.session.info.active = [CUDA, CPU]
        agent.session.strict = strict
        agent.session._cpu_session = None
        agent.session.io_binding = False

        class Broken:
            def run(self, *a, **k):
                raise RuntimeError("CUDA out of memory")

        agent.session.inference_session = Broken()
        if strict:
            with pytest.raises(
                ProviderUnavailable, match="a pass failed on CUDAExecutionProvider and is not retried"
            ):
                agent.predict(STATES[0], QUESTIONS)
        else:
            with pytest.warns(RuntimeWarning, match="retried on CPU: CUDA out of memory"):
                assert agent.predict(STATES[0], QUESTIONS) == expected
            assert agent.fallbacks[CUDA]["count"] == 1


def test_io_binding_gives_identical_answers_on_cpu(bundle_factory, monkeypatch):
    from laya_onnx import ONNXAgent

    plain = ONNXAgent(bundle_factory("tiny-english"))
    bound = ONNXAgent(bundle_factory("tiny-english"), io_binding=True)
    assert plain.session.io_binding is False and bound.session.io_binding is True
    calls = []
    real = type(bound.session.inference_session).run_with_iobinding
    monkeypatch.setattr(
        type(bound.session.inference_session),
        "run_with_iobinding",
        lambda self, binding, options=None: calls.append(1) or real(self, binding, options),
    )

    def answers(agent):
        return json.dumps(
            [
                agent.predict_batch(STATES, QUESTIONS, batch_size=2),
                agent.predict_long(STATES[1] * 4, QUESTIONS, window=64),
            ]
        )

    assert answers(bound) == answers(plain)
    assert len(calls) >= 3  # the bound agent's passes went through the binding


def test_cli_provider_options_syntax():
    from laya_onnx.cli.common import parse_providers

    assert parse_providers("cuda:device_id=1;gpu_mem_limit=2147483648,cpu") == [
        ("cuda", {"device_id": "1", "gpu_mem_limit": "2147483648"}),
        "cpu",
    ]
    assert parse_providers("coreml:MLComputeUnits=CPUAndNeuralEngine") == [
        ("coreml", {"MLComputeUnits": "CPUAndNeuralEngine"})
    ]
    assert parse_providers("auto") is None
    with pytest.raises(
        argparse.ArgumentTypeError, match="provider option 'device_id' of 'cuda' is not KEY=VALUE"
    ):
        parse_providers("cuda:device_id")
