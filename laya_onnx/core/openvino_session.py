"""The bf16 runtime: a bundle exported with `--precision bf16` runs on OpenVINO's CPU plugin with
its GEMMs in bf16, where the CPU has bf16 in hardware (AVX512-BF16, AMX).

The bundle's graph is an fp32 one (traced with transformers' layers, whose RoPE OpenVINO fuses
into its own kernel: `ExportOptions.constant_shape_layers`). At load, the linear layers of the
encoder but its first (nearly all of the work) get a conversion to bf16 in front of both inputs
of their MatMul and one back to f32 behind it (`bf16_gemms`), and the model is compiled at f32
inference precision: those GEMMs run on the CPU's bf16 units with f32 accumulation, and
everything else - the residual stream, LayerNorm, softmax, the rotary embedding, the first
layer, the decision head - stays f32, as torch's CPU autocast (laya's `LAYA_CPU_AMP=bf16`)
keeps all but the GEMMs. OpenVINO's global
bf16 hint would round every activation instead, for no speed gained, and move the answers further
from fp32 (docs/precision.md#bf16-openvino-cpus-with-avx512-bf16-or-amx).

Without the `openvino` package (the `openvino` extra) or on a CPU without bf16, the same graph
runs fp32 on onnxruntime instead: the fallback is counted under `OPENVINO` in the session's
fallbacks (`ONNXAgent.fallbacks`, `/health`) and warned about once. With `strict=True` it is
refused (`ProviderUnavailable`).

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
#: OpenVINO's CPU plugin settings of a bf16 bundle: one request at a time, at the least latency,
#: f32 wherever the graph does not ask for bf16 itself (`bf16_gemms` asks for it at the GEMMs).
#: Said explicitly: on some CPUs with bf16 units the plugin's default precision is bf16.
BF16_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}


#: Which GEMMs run in bf16, by the name of their weight (the torch parameter's): the encoder's
#: layers but the first. Layer 0's rounding reaches every later layer, and the decision head, its
#: scorer and the act head are a few percent of the work: kept f32, as the fp16 plan keeps them.
#: Keeping them f32 moves answers less than rounding every GEMM, at no measurable cost
#: (docs/precision.md#bf16-openvino-cpus-with-avx512-bf16-or-amx).
BF16_LAYERS = "encoder.layers."
BF16_KEEP_F32 = ("encoder.layers.0.",)


def _in_bf16(weight_name: str) -> bool:
    return weight_name.startswith(BF16_LAYERS) and not weight_name.startswith(BF16_KEEP_F32)


def bf16_gemms(model) -> int:
    """Put the GEMMs `BF16_LAYERS` names (a MatMul whose weight is a constant) of `model` (an
    `openvino.Model`) in bf16: a conversion to bf16 in front of both inputs, one back to f32
    behind. Returns how many. A graph whose weights carry no torch parameter names (the dynamo
    exporter's) gets every weighted MatMul in bf16 instead, as autocast would: never none."""
    import openvino as ov
    from openvino import opset13

    weighted = [
        node
        for node in model.get_ordered_ops()
        if node.get_type_name() == "MatMul" and node.input_value(1).get_node().get_type_name() == "Constant"
    ]
    chosen = [n for n in weighted if _in_bf16(n.input_value(1).get_node().get_friendly_name())] or weighted
    for node in chosen:
        for port in (0, 1):
            node.input(port).replace_source_output(
                opset13.convert(node.input_value(port), ov.Type.bf16).output(0)
            )
        readers = list(node.output(0).get_target_inputs())
        back = opset13.convert(node.output(0), ov.Type.f32)
        for reader in readers:
            reader.replace_source_output(back.output(0))
    model.validate_nodes_and_infer_types()
    return len(chosen)


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
        model = core.read_model(str(graph_path))
        #: how many GEMMs run in bf16 (see `bf16_gemms`)
        self.bf16_gemms = bf16_gemms(model)
        self._compiled = core.compile_model(model, "CPU", config)
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
    label: str | None = None,
) -> GraphSession | OpenVINOSession:
    """The session of a bundle of `precision`: OpenVINO at bf16 for a bf16 bundle when the caller
    names no providers and this machine can (`bf16_unavailable`), onnxruntime otherwise."""
    if precision != "bf16" or providers is not None:
        return GraphSession(
            graph_path,
            providers=providers,
            threads=threads,
            strict=strict,
            io_binding=io_binding,
            label=label,
        )
    reason = bf16_unavailable(cpu)
    if reason is None:
        return OpenVINOSession(graph_path, threads=threads)
    if strict:
        raise ProviderUnavailable(
            f"strict_providers: the bf16 bundle cannot run at bf16 here: {reason}; refusing to run it "
            "in fp32 (pass strict_providers=False to allow the fallback)"
        )
    session = GraphSession(graph_path, providers=[CPU], threads=threads, io_binding=io_binding, label=label)
    session.record_fallback(OPENVINO, f"bf16 bundle runs fp32 on onnxruntime's CPU provider: {reason}")
    return session


__all__ = [
    "BF16_CONFIG",
    "BF16_KEEP_F32",
    "BF16_LAYERS",
    "OPENVINO",
    "OpenVINOSession",
    "bf16_gemms",
    "bf16_unavailable",
    "open_session",
]
