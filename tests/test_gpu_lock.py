"""lock/gpu.txt, the GPU server's pins: what the gpu extra needs is pinned, including the CUDA and
cuDNN wheels onnxruntime-gpu loads with preload_dlls, and every package it shares with the dev
lock has the dev lock's version (both tiers test the same numpy, tokenizers, aiohttp...)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pins(name: str) -> dict[str, str]:
    out = {}
    for line in (ROOT / "lock" / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            package, _, version = line.partition("==")
            out[re.sub(r"[-_.]+", "-", package).lower()] = version
    return out


def test_the_gpu_lock_pins_onnxruntime_gpu_and_its_cuda_libraries():
    gpu = pins("gpu.txt")
    assert "onnxruntime-gpu" in gpu and "onnxruntime" not in gpu  # never both: one shadows the other
    major, minor = (int(x) for x in gpu["onnxruntime-gpu"].split(".")[:2])
    assert (major, minor) >= (1, 21)  # the first with the cuda/cudnn extras and preload_dlls
    assert any(name.startswith("nvidia-cudnn") for name in gpu), "the cudnn extra's wheel"
    assert "nvidia-cuda-runtime" in gpu or "nvidia-cuda-runtime-cu12" in gpu
    for need in ("numpy", "tokenizers", "huggingface-hub", "aiohttp", "pydantic", "prometheus-client"):
        assert need in gpu, need


def test_the_gpu_lock_agrees_with_the_dev_lock():
    gpu, dev = pins("gpu.txt"), pins("dev.txt")
    differ = {
        name: (version, dev[name]) for name, version in gpu.items() if name in dev and dev[name] != version
    }
    assert not differ, differ


def test_the_gpu_extra_brings_the_cuda_libraries():
    text = (ROOT / "pyproject.toml").read_text()
    (gpu,) = re.findall(r"^gpu = \[(.*)\]$", text, flags=re.M)
    assert "onnxruntime-gpu[cuda,cudnn]" in gpu
