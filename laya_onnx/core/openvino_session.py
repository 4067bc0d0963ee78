"""The bf16 runtime: a bundle exported with `--precision bf16` runs on OpenVINO's CPU plugin at
bf16 inference precision, where the CPU has bf16 in hardware (AVX512-BF16, AMX).

The bundle's graph is the fp32 one; OpenVINO reads it as it is and computes its GEMMs and
activations in bf16 (`INFERENCE_PRECISION_HINT`). Without the `openvino` package (the `openvino`
extra) or on a CPU without bf16, the same graph runs fp32 on onnxruntime instead: the fallback is
counted under `OPENVINO` in the session's fallbacks (`ONNXAgent.fallbacks`, `/health`) and
warned about once. With `strict=True` it is refused (`ProviderUnavailable`).

Torch-free; `openvino` is imported only when a bf16 bundle is loaded.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np

from laya_onnx.core.bundle import GRAPH_OUTPUTS
from laya_onnx.core.machine import Cpu, read_cpu
from laya_onnx.core.session import (
    CPU,
    FallbackEntry,
    GraphSession,
    ProviderSpec,
    ProviderUnavailable,
    SessionInfo,
    StopHook,
    trim_heap,
)

#: How the bf16 runtime is named in `providers` and in the fallbacks.
OPENVINO = "OpenVINO"
#: OpenVINO's CPU plugin settings of a bf16 bundle: one request at a time, at the least latency.
#: OpenVINO keeps no part of the graph in f32 at this hint (its per-node `disable_fp16_compression`
#: marks on the LayerNorms, the residual adds or the whole head changed no output bit: measured).
BF16_CONFIG = {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY"}


def bf16_unavailable(cpu: Cpu | None = None) -> str | None:
    """Why a bf16 bundle cannot run at bf16 here (None when it can)."""
    cpu = cpu or read_cpu()
    if not cpu.bf16:
        return "this CPU (%s) has no bf16 in hardware (AVX512-BF16 or AMX)" % cpu.label
    try:
        import openvino  # noqa: F401
    except ImportError:
        return "the openvino package is not installed (pip install 'laya-onnx[openvino]')"
    return None


class OpenVINOSession:
    """Runs the Laya graph on OpenVINO's CPU plugin at bf16; `run(feeds) -> (logits, act_logits)`,
    the contract of `GraphSession`."""

    def __init__(self, graph_path: str, threads: int | None = None):
        import openvino as ov

        config: dict[str, object] = dict(BF16_CONFIG)
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        core = ov.Core()
        self._compiled = core.compile_model(core.read_model(str(graph_path)), "CPU", config)
        self._request = self._compiled.create_infer_request()
        self._outputs = [self._compiled.output(name) for name in GRAPH_OUTPUTS]
        # One infer request, one pass at a time (a request is not safe to share between threads).
        self._lock = threading.Lock()
        self.info = SessionInfo(requested=[OPENVINO], active=[OPENVINO])
        self.device_memory_limit: int | None = None

    @property
    def providers(self) -> list[str]:
        return list(self.info.active)

    @property
    def healthy(self) -> bool:
        return True

    def fallback_snapshot(self) -> dict[str, FallbackEntry]:
        return {}

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        *,
        release_memory: bool = False,
        stop_on: StopHook | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One pass; `stop_on` is accepted and not used: an OpenVINO pass runs to its end."""
        with self._lock:
            result = self._request.infer(dict(feeds))
            logits, act = (np.array(result[out], dtype=np.float32) for out in self._outputs)
        if release_memory:
            trim_heap()
        return logits, act


def open_session(
    graph_path: str,
    precision: str,
    providers: Sequence[ProviderSpec] | ProviderSpec | None = None,
    threads: int | None = None,
    *,
    strict: bool = False,
    io_binding: bool | None = None,
    cpu: Cpu | None = None,
) -> GraphSession | OpenVINOSession:
    """The session of a bundle of `precision`: OpenVINO at bf16 for a bf16 bundle when the caller
    names no providers and this machine can (`bf16_unavailable`), onnxruntime otherwise."""
    if precision != "bf16" or providers is not None:
        return GraphSession(
            graph_path, providers=providers, threads=threads, strict=strict, io_binding=io_binding
        )
    reason = bf16_unavailable(cpu)
    if reason is None:
        return OpenVINOSession(graph_path, threads=threads)
    if strict:
        raise ProviderUnavailable(
            f"strict_providers: the bf16 bundle cannot run at bf16 here: {reason}; refusing to run it "
            "in fp32 (pass strict_providers=False to allow the fallback)"
        )
    session = GraphSession(graph_path, providers=[CPU], threads=threads, io_binding=io_binding)
    session.record_fallback(OPENVINO, f"bf16 bundle runs fp32 on onnxruntime's CPU provider: {reason}")
    return session


__all__ = ["BF16_CONFIG", "OPENVINO", "OpenVINOSession", "bf16_unavailable", "open_session"]
