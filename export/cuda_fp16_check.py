"""The fp16 bundle on a real GPU: agreement with fp32 and speed, in one short run. NOT RUN YET.

The export gates fp16 on CPU with an emulation of fp16 rounding (onnxruntime's CPU EP computes
an fp16 graph in fp32); this script measures the written graph where it is meant to run:

    python -m venv .venv-gpu && .venv-gpu/bin/pip install -e '.[gpu,export]'  # onnxruntime-gpu only:
                                                # never beside onnxruntime, which it shadows
    laya-onnx export CKPT -o b32                  # or copy bundles exported on any box
    laya-onnx export CKPT -o b16 --precision fp16
    .venv-gpu/bin/python export/cuda_fp16_check.py b32 b16 [--repeats 20] [--json report.json]

`--provider CPUExecutionProvider` is a dry run of the script itself (no GPU; the CPU EP runs the
fp16 graph in fp32, so its figures say nothing about fp16).

The reference is the fp32 bundle on the CPU EP (validated within 1e-4 of fp32 torch at export).
Both suites of the export gate (the export cases and the parity suite) run on the fp16 bundle
on CUDAExecutionProvider; the script prints, per suite, the decisions agreeing with fp32 and max
|dp|, then the median pass time of fp16 vs fp32 on CUDA (interleaved, same run), and exits 1 when
the fp16 gate (max |dp| <= 1e-2, >= 99.5% agreeing) is missed or CUDA is not what ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

CUDA = "CUDAExecutionProvider"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fp32_bundle")
    ap.add_argument("fp16_bundle")
    ap.add_argument("--repeats", type=int, default=20, help="timed passes per graph (interleaved)")
    ap.add_argument("--json", default=None, help="also write the report here")
    ap.add_argument("--provider", default=CUDA, help="the EP to check (CPUExecutionProvider: a dry run)")
    args = ap.parse_args(argv)
    provider = args.provider

    import onnxruntime as ort

    from laya_onnx.core.bundle import GRAPH_INPUTS, GRAPH_OUTPUTS, Bundle
    from laya_onnx.core.calibration import Calibration
    from laya_onnx.core.tokenizer import LayaTokenizer
    from laya_onnx.export.cases import CALLS, encode_calls
    from laya_onnx.export.ladder import Suite, measure_agreement, passes, suite_calls
    from laya_onnx.export.precision import GATES

    if provider not in ort.get_available_providers():
        print(f"{provider} is not available here ({ort.get_available_providers()}); install onnxruntime-gpu")
        return 1
    b32, b16 = Bundle.open(Path(args.fp32_bundle)), Bundle.open(Path(args.fp16_bundle))
    if b16.precision["precision"] != "fp16":
        print(f"{args.fp16_bundle} is a {b16.precision['precision']} bundle, not fp16")
        return 1
    cfg = b32.config
    budgets = int(cfg.get("max_len", 512)), int(cfg.get("head_max_len", 192))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        calibration = Calibration.from_config(cfg)
    mask = LayaTokenizer.from_dir(b32.tokenizer_dir).mask_token
    cpu32 = ort.InferenceSession(str(b32.graph_path), providers=["CPUExecutionProvider"])
    cuda = {
        name: ort.InferenceSession(str(b.graph_path), providers=[provider, "CPUExecutionProvider"])
        for name, b in (("fp32", b32), ("fp16", b16))
    }
    if cuda["fp16"].get_providers()[0] != provider:
        print(f"the fp16 session runs on {cuda['fp16'].get_providers()}, not {provider}")
        return 1

    def run(session, feeds):
        return session.run(list(GRAPH_OUTPUTS), {k: feeds[k] for k in GRAPH_INPUTS})

    suites = []
    for name, calls in (("export-cases", CALLS), ("parity-core", suite_calls("core", mask))):
        cases = encode_calls(b32.tokenizer_dir, *budgets, calls)
        suites.append(Suite(name, list(calls), cases, [tuple(run(cpu32, c["feeds"])) for c in cases]))
    gate = GATES["fp16"]
    report = {
        "providers": cuda["fp16"].get_providers(),
        "device": ort.get_device(),
        "gate": gate.as_dict(),
        "suites": {s.name: measure_agreement(cuda["fp16"], s, calibration) for s in suites},
    }
    feeds = max((c["feeds"] for s in suites for c in s.cases), key=lambda f: f["input_ids"].size)
    times: dict[str, list[float]] = {"fp32": [], "fp16": []}
    for name in times:  # warm-up
        run(cuda[name], feeds)
    for i in range(args.repeats):
        for name in ("fp32", "fp16") if i % 2 == 0 else ("fp16", "fp32"):
            start = time.perf_counter()
            run(cuda[name], feeds)
            times[name].append((time.perf_counter() - start) * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    report["speed"] = {
        "pass": "x".join(map(str, feeds["input_ids"].shape)),
        "median_ms": med,
        "fp16_speedup_vs_fp32": med["fp32"] / med["fp16"],
    }
    report["passed"] = all(passes(m, gate) for m in report["suites"].values())
    print(json.dumps(report, indent=1, default=repr))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=repr) + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
