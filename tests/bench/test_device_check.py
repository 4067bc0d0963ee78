"""`python -m laya_onnx.bench.device`, the CUDA check, as a dry run on the CPU EP: it runs through
the runtime's own agents without importing torch, and its verdict names what failed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("onnxruntime")

from laya_onnx.bench.device import FP32_LOGIT_TOLERANCE, verdict


def test_the_dry_run_passes_without_torch(bundle_factory, tmp_path):
    report_path = tmp_path / "report.json"
    bundle = bundle_factory("tiny-english")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "laya_onnx.bench.device",
            str(bundle),
            "--provider",
            "cpu",
            "--repeats",
            "1",
            "--json",
            str(report_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(report_path.read_text())
    assert report["torch_loaded"] is False and report["faults"] == []
    assert report["agreement"]["fp32"]["decisions_agreeing"] == report["agreement"]["fp32"]["calls"] > 30
    assert set(report["latency_ms"]) == {"short-1x1", "readme-1x3", "batch-32x3"}
    for variants in report["latency_ms"].values():
        for figures in variants.values():
            assert 0 < figures["p50"] <= figures["p99"]
    failure = report["injected_failure"]
    assert failure["same_answer"] and failure["fallbacks"]["CUDAExecutionProvider"]["count"] == 1


def figures(**overrides):
    base = {
        "calls": 10,
        "decisions_agreeing": 10,
        "agreement": 1.0,
        "max_abs_dp": 0.0,
        "max_abs_dlogit": 0.0,
        "passes_off_device": 0,
    }
    return {**base, **overrides}


def test_the_verdict_names_each_fault():
    ok = {
        "device": "CUDAExecutionProvider",
        "torch_loaded": False,
        "agreement": {"fp32": figures(), "fp16": figures(max_abs_dp=5e-3)},
    }
    gate = {"max_abs_dp": 1e-2, "min_agreement": 0.995}
    assert verdict(ok, gate) == []
    moved = {**ok, "agreement": {"fp32": figures(passes_off_device=2), "fp16": figures(agreement=0.9)}}
    faults = verdict({**moved, "torch_loaded": True}, gate)
    assert any("2 passes did not run on CUDAExecutionProvider" in f for f in faults)
    assert any("fp16 misses its gate" in f for f in faults)
    assert any("torch was imported" in f for f in faults)
    tf32 = {**ok, "agreement": {"fp32": figures(max_abs_dlogit=10 * FP32_LOGIT_TOLERANCE)}}
    assert any("fp32 without TF32" in f for f in verdict(tf32, None))


def test_fp32_on_a_gpu_passes_and_tf32_does_not():
    """The figures of the full-size fp32 bundle on an H200 (docs/gpu.md): fp32 with TF32 off is
    1.53e-4 from the CPU in logits, which is GPU summation order and no fault; TF32 on is 4.8e-2."""
    run = {"device": "CUDAExecutionProvider", "torch_loaded": False}
    fp32 = {**run, "agreement": {"fp32": figures(max_abs_dlogit=1.53e-4, max_abs_dp=1e-4)}}
    assert verdict(fp32, None) == []
    tf32 = {**run, "agreement": {"fp32": figures(max_abs_dlogit=4.84e-2, max_abs_dp=6.2e-3)}}
    assert any("fp32 without TF32" in f for f in verdict(tf32, None))
