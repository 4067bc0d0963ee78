"""The CUDA path's settings and failure handling, checked on a CPU-only onnxruntime: what the
runtime hands onnxruntime for CUDA, which arenas a run shrinks, that onnxruntime's own silent
fallback is off, the device pass budget, and /health once the device keeps failing."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("onnxruntime")

from laya_onnx.core import session as session_mod
from laya_onnx.core.memory import GiB, MiB, device_pass_budget
from laya_onnx.core.session import (
    ARENA_SHRINKAGE,
    COREML,
    CPU,
    CUDA,
    CUDA_DEFAULTS,
    DEVICE_FAILURE_LIMIT,
    preload_cuda_libraries,
)

QUESTIONS = {"refund": {"type": "noul", "instructions": "Does the user ask for a refund?"}}


def cuda_looking(agent, device_id: int = 0, **options):
    """Make an agent's session look like it runs on CUDA (this build has none)."""
    agent.session.info.active = [CUDA, CPU]
    agent.session.provider_options[CUDA] = {**CUDA_DEFAULTS, "device_id": device_id, **options}
    agent.session.io_binding = False
    return agent


@pytest.fixture
def cpu_agent(bundle_factory):
    from laya_onnx import ONNXAgent

    return ONNXAgent(bundle_factory("tiny-english"), providers=["cpu"])


def test_cuda_defaults_turn_tf32_off_and_grow_the_arena_as_requested(bundle_factory, monkeypatch):
    import onnxruntime as ort

    from laya_onnx import ONNXAgent

    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, COREML, CPU])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # CUDA does not attach here
        plain = ONNXAgent(bundle_factory("tiny-english"), providers=["cuda"])
        asked = ONNXAgent(bundle_factory("tiny-english"), providers=[("cuda", {"use_tf32": 1})])
    assert plain.session.provider_options[CUDA] == {
        "arena_extend_strategy": "kSameAsRequested",
        "use_tf32": 0,
    }
    assert asked.session.provider_options[CUDA]["use_tf32"] == 1  # the caller's choice wins
    # CPU-only requests get no CUDA options at all
    assert CUDA not in ONNXAgent(bundle_factory("tiny-english"), providers=["cpu"]).session.provider_options


def test_onnxruntime_own_fallback_is_off(cpu_agent):
    # onnxruntime would otherwise rebuild a failed session on CPU, or switch every later pass to CPU
    # after one EPFail, uncounted; `enable_fallback=0` leaves that to the counted fallback.
    assert cpu_agent.session.inference_session._enable_fallback is False


def test_release_names_the_device_arena_only_for_a_device_pass(cpu_agent):
    session = cpu_agent.session
    assert session.arenas() == "cpu:0"
    cuda_looking(cpu_agent, device_id=1)
    assert session.arenas() == "cpu:0;gpu:1"
    assert session.arenas(on_device=False) == "cpu:0"  # the CPU retry's session has no device arena
    options = session._run_options(True, on_device=True)
    assert options.get_run_config_entry(ARENA_SHRINKAGE) == "cpu:0;gpu:1"
    assert session._run_options(False, on_device=True) is None


def test_device_memory_limit_caps_the_pass_budget(cpu_agent):
    assert cpu_agent.session.device_memory_limit is None  # CPU: no device cap
    cuda_looking(cpu_agent, gpu_mem_limit=3 * GiB)
    assert cpu_agent.session.device_memory_limit == 3 * GiB
    assert device_pass_budget(2 * GiB, None, 500 * MiB) == 2 * GiB
    assert device_pass_budget(4 * GiB, 3 * GiB, 500 * MiB) == 3 * GiB - 500 * MiB
    assert device_pass_budget(2 * GiB, 3 * GiB, 500 * MiB) == 2 * GiB
    assert device_pass_budget(2 * GiB, 100 * MiB, 500 * MiB) == 0


def test_agent_budget_follows_the_device_cap(bundle_factory, monkeypatch):
    from laya_onnx import ONNXAgent

    monkeypatch.setattr(session_mod.GraphSession, "device_memory_limit", property(lambda self: 64 * MiB))
    agent = ONNXAgent(bundle_factory("tiny-english"), providers=["cpu"], max_pass_memory="2G")
    weights = agent.bundle.graph_path.stat().st_size
    assert agent.max_pass_memory == 64 * MiB - weights


class Broken:
    def run(self, *args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_repeated_device_failures_make_the_agent_unhealthy(cpu_agent):
    expected = cpu_agent.predict("refund me", QUESTIONS)
    working = cpu_agent.session.inference_session
    cuda_looking(cpu_agent)
    cpu_agent.session._cpu_session = None
    cpu_agent.session.inference_session = Broken()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for n in range(1, DEVICE_FAILURE_LIMIT + 1):
            assert cpu_agent.healthy
            assert cpu_agent.predict("refund me", QUESTIONS) == expected  # retried on CPU
            assert cpu_agent.session.device_failures == n
    assert not cpu_agent.healthy
    assert cpu_agent.fallbacks[CUDA]["count"] == DEVICE_FAILURE_LIMIT
    cpu_agent.session.inference_session = working  # the device recovers: one good pass resets the streak
    cpu_agent.predict("refund me", QUESTIONS)
    assert cpu_agent.healthy and cpu_agent.session.device_failures == 0


def test_preload_runs_once_and_survives_missing_libraries(monkeypatch, caplog):
    calls = []

    class FakeOrt:
        @staticmethod
        def preload_dlls():
            calls.append(1)
            raise OSError("libcudnn.so.9: cannot open shared object file")

    monkeypatch.setattr(session_mod, "_PRELOADED", False)
    preload_cuda_libraries(FakeOrt)
    preload_cuda_libraries(FakeOrt)
    assert calls == [1]
    assert "relying on system CUDA/cuDNN libraries" in caplog.text
    monkeypatch.setattr(session_mod, "_PRELOADED", False)
    preload_cuda_libraries(object())  # a build without preload_dlls: nothing to do, no error
