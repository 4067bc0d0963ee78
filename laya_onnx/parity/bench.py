"""Speed against the reference, as a ratio measured in one run with the two runtimes interleaved.

Absolute times drift 20-30% on shared machines within minutes; alternating ours and the
reference call by call and reporting the ratio of medians cancels most of that drift.
"""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Any

from laya_onnx.demo import README_REQUEST

WORKLOADS = {
    "readme-1x3": ([README_REQUEST["state"]], README_REQUEST["questions"]),
    "batch-8x3": (
        [README_REQUEST["state"] + " " + "More context. " * (5 * i) for i in range(8)],
        README_REQUEST["questions"],
    ),
    "long-1x3": (["The invoice was paid twice by the customer. " * 120], README_REQUEST["questions"]),
}


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000.0


def run_bench(
    checkpoint, bundle, repeats: int = 10, threads: int | None = None, workloads: list[str] | None = None
) -> dict[str, Any]:
    import torch

    from laya_onnx.parity.runner import load_runtimes

    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    ref, ours = load_runtimes(checkpoint, bundle, threads=threads)
    out: dict[str, Any] = {
        "threads": threads,
        "repeats": repeats,
        "providers": ours.providers,
        "workloads": {},
    }
    for name in workloads or list(WORKLOADS):
        states, questions = WORKLOADS[name]
        calls = {
            "reference": partial(ref.predict_batch, states, questions),
            "laya-onnx": partial(ours.predict_batch, states, questions),
        }
        for fn in calls.values():  # warm-up: first-call allocations, lazy inits
            fn()
        times: dict[str, list[float]] = {k: [] for k in calls}
        for i in range(repeats):
            order = list(calls) if i % 2 == 0 else list(reversed(calls))
            for key in order:
                times[key].append(_time(calls[key]))
        med = {k: statistics.median(v) for k, v in times.items()}
        out["workloads"][name] = {
            "median_ms": {k: round(v, 2) for k, v in med.items()},
            "speedup_vs_reference": round(med["reference"] / med["laya-onnx"], 3),
        }
    return out
