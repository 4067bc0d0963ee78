"""The CUDA check: what a torch-free GPU box answers and how fast, through the runtime itself.

    python -m laya_onnx.bench.device FP32_BUNDLE [FP16_BUNDLE] [--repeats 20] [--json report.json]

Runs on an install with only `laya-onnx[gpu]` (no torch: checked before and after, since torch's
own CUDA libraries would make CUDA attach where a torch-free install would not). Every agent is an
`ONNXAgent` with `strict_providers=True`, so what runs is what production runs: the runtime's
session options, CUDA defaults, IOBinding and fallback counting; every pass is checked to have
run on CUDA (`agent.providers`, no fallback counted), not only the first. It reports:

  * agreement with the fp32 bundle on the CPU EP (the validated reference) over the parity suite
    `core` and the bench workloads: decisions agreeing, max |dp| of the answers, max |d logit| of
    the raw passes; for fp32 with TF32 off and on, for fp16 (gated by its manifest's fp16 gate);
  * p50 and p99 latency of the short, 3-question and 32 x 3 workloads, fp32 and fp16, IOBinding on and
    off, interleaved in one run, with the host's peak RSS and the GPU's memory (`nvidia-smi`)
    before and after the largest pass;
  * one injected device failure on a non-strict agent: the counted CPU retry (`agent.fallbacks`);
  * the nodes onnxruntime placed on the CPU, from its verbose session log.

`--provider cpu` is a dry run of the script itself on a machine without a GPU (its figures say
nothing about CUDA). Exit status 1 when a gate is missed, a pass left CUDA, or torch was loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from laya_onnx.bench.agent import agreement, call_for
from laya_onnx.bench.http import percentile
from laya_onnx.core.session import CPU, CUDA

#: The workloads timed (short, 3 questions, 32 states x 3 questions).
TIMED = ("short-1x1", "readme-1x3", "batch-32x3")
#: The fp32 bundle on CUDA, TF32 off, agrees with CPU within this max |d logit|. A GPU sums in
#: another order than a CPU, so fp32 on CUDA sits a little further from the CPU than the export's
#: 1e-4 against torch on the same CPU; TF32 is two orders of magnitude beyond it (docs/gpu.md).
FP32_LOGIT_TOLERANCE = 5e-4


def host_peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gpu_memory_mib() -> list[int] | None:
    """Memory used on each GPU, per `nvidia-smi` (None where it is not installed)."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return [int(v) for v in out.stdout.split()] if out.returncode == 0 else None


class PassRecorder:
    """Keeps every pass's raw outputs and checks that each ran on the device it should."""

    def __init__(self, agent: Any, device: str):
        self.outputs: list[tuple[np.ndarray, np.ndarray]] = []
        self.off_device = 0
        run = agent.session.run

        def recorded(*args: Any, **kwargs: Any) -> Any:
            result = run(*args, **kwargs)
            if agent.providers[0] != device or agent.fallbacks:
                self.off_device += 1
            self.outputs.append(result)
            return result

        agent.session.run = recorded


def make_agent(bundle: str, provider: str, *, tf32: bool = False, io_binding: bool | None = None) -> Any:
    from laya_onnx import ONNXAgent

    spec: Any = (provider, {"use_tf32": int(tf32)}) if provider == CUDA else provider
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a reduced-precision bundle warns at load
        return ONNXAgent(bundle, providers=[spec], strict_providers=provider != CPU, io_binding=io_binding)


def suite_call(case: dict[str, Any]) -> Callable[[Any], Any]:
    """A parity-suite request as a call on any agent (`predict`, or `predict_batch` for `states`)."""
    kwargs = {k: v for k, v in case.items() if k not in ("name", "state", "states", "questions")}
    if "states" in case:
        return lambda agent: agent.predict_batch(case["states"], case["questions"], **kwargs)
    return lambda agent: agent.predict(case["state"], case["questions"], **kwargs)


def calls_to_compare(mask_token: str) -> list[tuple[str, Callable[[Any], Any]]]:
    """(name, call(agent)) for every request of the parity suite `core` and every bench workload."""
    from laya_onnx.parity.suite import load_suite

    calls: list[tuple[str, Callable[[Any], Any]]] = []
    for case in load_suite("core", mask_token):
        if not case.get("expect_error"):  # refusals happen before any pass
            calls.append((case["name"], suite_call(case)))
    calls.extend((name, workload_call(name)) for name in TIMED)
    return calls


def workload_call(name: str) -> Callable[[Any], Any]:
    return lambda agent: call_for(agent, name)()


def compare(reference: Any, candidate: Any, device: str) -> dict[str, Any]:
    """Answers and raw passes of `candidate` against `reference` over `calls_to_compare`."""
    ref_passes, cand_passes = PassRecorder(reference, CPU), PassRecorder(candidate, device)
    agreeing = total = 0
    max_dp = max_dlogit = 0.0
    for _, call in calls_to_compare(reference.tok.mask_token):
        ours, theirs = call(candidate), call(reference)
        check = agreement(ours, theirs)
        total += 1
        agreeing += bool(check["decisions_identical"] and check["same_keys"])
        max_dp = max(max_dp, check["max_printed_gap"])
    for (a_logits, a_act), (b_logits, b_act) in zip(cand_passes.outputs, ref_passes.outputs, strict=True):
        if a_logits.shape == b_logits.shape:
            gap = max(float(np.max(np.abs(a_logits - b_logits))), float(np.max(np.abs(a_act - b_act))))
            max_dlogit = max(max_dlogit, gap)
    return {
        "calls": total,
        "decisions_agreeing": agreeing,
        "agreement": agreeing / total,
        "max_abs_dp": max_dp,
        "max_abs_dlogit": max_dlogit,
        "passes_off_device": cand_passes.off_device,
    }


def time_variants(agents: dict[str, Any], repeats: int) -> dict[str, Any]:
    """p50 and p99 ms per workload per agent, the agents interleaved call by call."""
    figures: dict[str, Any] = {}
    for workload in TIMED:
        calls = {name: call_for(agent, workload) for name, agent in agents.items()}
        for call in calls.values():
            call()  # warm-up: kernels, arena
        times: dict[str, list[float]] = {name: [] for name in calls}
        order = list(calls)
        for i in range(repeats):
            for name in order if i % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                calls[name]()
                times[name].append((time.perf_counter() - start) * 1000)
        figures[workload] = {name: latency_figures(t) for name, t in times.items()}
    return figures


def latency_figures(times_ms: list[float]) -> dict[str, float]:
    """The median and the nearest-rank p99 of one variant's calls."""
    return {"p50": round(statistics.median(times_ms), 3), "p99": round(percentile(times_ms, 99) or 0.0, 3)}


def injected_failure(bundle: str, device: str) -> dict[str, Any]:
    """A device pass made to fail on a non-strict agent: answered by the counted CPU retry."""
    from laya_onnx import ONNXAgent

    agent = ONNXAgent(bundle, providers=[device])
    call = call_for(agent, "short-1x1")
    expected = call()

    class Broken:
        def run(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("injected device failure")

        run_with_iobinding = run

        def io_binding(self) -> Any:
            return self

        def bind_cpu_input(self, *args: Any) -> None: ...

        def bind_output(self, *args: Any) -> None: ...

    simulated = device == CPU  # a dry run: the session is made to look like a device session
    if simulated:
        agent.session.info.active = [CUDA, CPU]
        agent.session.io_binding = False
    agent.session.inference_session = Broken()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        answered = call()
    return {
        "simulated": simulated,
        "same_answer": answered == expected,
        "fallbacks": agent.fallbacks,
        "healthy": agent.healthy,
    }


def cpu_placed_nodes(graph: Path, device: str) -> list[str]:
    """The lines of onnxruntime's verbose session log that say nodes were placed on the CPU."""
    import onnxruntime as ort

    from laya_onnx.core.session import session_options

    options = session_options()
    options.log_severity_level = 1  # INFO: includes the node placement summary
    with tempfile.TemporaryFile(mode="w+") as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)  # onnxruntime logs from C++ to the process's stderr
        try:
            ort.InferenceSession(str(graph), sess_options=options, providers=[device, CPU])
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        text = log.read()
    keys = (
        "were not assigned to the preferred execution providers",
        "Node(s) placed on [CPUExecutionProvider]",
    )
    return [line.strip() for line in text.splitlines() if any(k in line for k in keys)]


def run_check(fp32: str, fp16: str | None, device: str, repeats: int) -> dict[str, Any]:
    reference = make_agent(fp32, CPU)
    variants = {"fp32": make_agent(fp32, device), "fp32-tf32": make_agent(fp32, device, tf32=True)}
    if fp16:
        variants["fp16"] = make_agent(fp16, device)
    report: dict[str, Any] = {"device": device, "gpu_memory_mib_at_load": gpu_memory_mib()}
    report["agreement"] = {name: compare(reference, agent, device) for name, agent in variants.items()}
    timed = {f"{name}-iobinding": agent for name, agent in variants.items() if name != "fp32-tf32"}
    timed.update(
        {
            f"{name}-plain": make_agent(b, device, io_binding=False)
            for name, b in (("fp32", fp32), ("fp16", fp16))
            if b
        }
    )
    report["latency_ms"] = time_variants(timed, repeats)
    report["host_peak_rss_mib"] = round(host_peak_rss_mib(), 1)
    report["gpu_memory_mib_after_runs"] = gpu_memory_mib()
    call_for(variants["fp32"], "batch-32x3")()
    report["gpu_memory_mib_after_large_pass"] = gpu_memory_mib()
    report["injected_failure"] = injected_failure(fp32, device)
    report["cpu_placed_nodes"] = {
        name: cpu_placed_nodes(a.bundle.graph_path, device)
        for name, a in variants.items()
        if not name.endswith("tf32")
    }
    return report


def verdict(report: dict[str, Any], fp16_gate: dict[str, Any] | None) -> list[str]:
    """What failed, in words (empty: passed)."""
    faults = []
    for name, figures in report["agreement"].items():
        if figures["passes_off_device"]:
            faults.append(f"{name}: {figures['passes_off_device']} passes did not run on {report['device']}")
    fp32 = report["agreement"]["fp32"]
    if fp32["max_abs_dlogit"] > FP32_LOGIT_TOLERANCE:
        faults.append(
            f"fp32 without TF32: max |d logit| {fp32['max_abs_dlogit']:.2e} > {FP32_LOGIT_TOLERANCE}"
        )
    if fp16_gate and "fp16" in report["agreement"]:
        fp16 = report["agreement"]["fp16"]
        if fp16["max_abs_dp"] > fp16_gate["max_abs_dp"] or fp16["agreement"] < fp16_gate["min_agreement"]:
            faults.append(f"fp16 misses its gate {fp16_gate}: {fp16}")
    if report["torch_loaded"]:
        faults.append("torch was imported: the check must run on a torch-free install")
    return faults


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("fp32_bundle")
    ap.add_argument("fp16_bundle", nargs="?")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per variant and workload")
    ap.add_argument("--provider", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run")
    ap.add_argument("--json", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    device = CUDA if args.provider == "cuda" else CPU
    torch_before = "torch" in sys.modules
    report = run_check(args.fp32_bundle, args.fp16_bundle, device, args.repeats)
    report["torch_loaded"] = torch_before or "torch" in sys.modules
    gate = None
    if args.fp16_bundle:
        from laya_onnx.core.bundle import Bundle

        gate = Bundle.open(Path(args.fp16_bundle)).precision.gate
    report["faults"] = verdict(report, gate)
    text = json.dumps(report, indent=1, default=repr)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 1 if report["faults"] else 0


if __name__ == "__main__":
    sys.exit(main())
