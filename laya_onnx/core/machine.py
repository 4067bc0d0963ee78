"""What this machine offers the runtime: CPU features, memory, GPUs, and the execution providers
that really attach (tried with a one-node graph, not read from a list).

Torch-free and cheap: /proc, `nvidia-smi` when it is installed, and onnxruntime. Used by
`laya-onnx doctor`, and by the speed figures, which name the CPU class they were measured on.
"""

from __future__ import annotations

import base64
import os
import platform
import shutil
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The CPU features that change which kernels onnxruntime (and a bf16 runtime) can use.
FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
#: Flags of an exact, fast u8 x s8 integer GEMM (VNNI or AMX).
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
#: Flags of a bf16 GEMM in hardware.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: A one-node ONNX graph (y = Relu(x), opset 13, 65 bytes), to try whether a provider attaches.
PROBE_GRAPH = base64.b64decode(
    "CAg6NwoMCgF4EgF5IgRSZWx1EgVwcm9iZVoPCgF4EgoKCAgBEgQKAggBYg8KAXkSCgoICAESBAoCCAFCBAoAEA0="
)


@dataclass(frozen=True)
class Cpu:
    model: str
    flags: frozenset[str]
    cores: int  # usable by this process (its affinity mask)

    @property
    def vnni(self) -> bool:
        return any(f in self.flags for f in VNNI_FLAGS)

    @property
    def bf16(self) -> bool:
        return any(f in self.flags for f in BF16_FLAGS)

    def as_dict(self) -> dict[str, Any]:
        """The CPU as a report states it: model, cores, each feature present or not, VNNI, bf16."""
        return {
            "model": self.model,
            "label": self.label,
            "cores": self.cores,
            "features": {f: f in self.flags for f in FEATURES},
            "vnni": self.vnni,
            "bf16": self.bf16,
        }

    @property
    def label(self) -> str:
        """The CPU class a speed figure names: model and the features that matter."""
        have = [f for f in FEATURES if f in self.flags]
        return "%s (%s)" % (self.model or platform.machine(), ", ".join(have) or "no AVX2")


def read_cpu(cpuinfo: str | None = None) -> Cpu:
    """This CPU, from /proc/cpuinfo (Linux); elsewhere the model is platform's and no flag is known."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    model, flags = "", frozenset[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return Cpu(model=model or platform.processor(), flags=flags, cores=cores)


def memory_bytes() -> dict[str, int | None]:
    """Total and available memory (/proc/meminfo; None where it cannot be read)."""
    out: dict[str, int | None] = {"total": None, "available": None}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out["total" if key == "MemTotal" else "available"] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


def gpus() -> list[dict[str, Any]]:
    """NVIDIA GPUs per `nvidia-smi` (name, memory in MiB); empty where it is not installed."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = "--query-gpu=name,memory.total,memory.used,driver_version"
    try:
        done = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        name, total, used, driver = (part.strip() for part in line.split(","))
        found.append(
            {"name": name, "memory_total_mib": int(total), "memory_used_mib": int(used), "driver": driver}
        )
    return found


def onnxruntime_build() -> dict[str, Any]:
    """Which onnxruntime distribution is installed and its version (None when there is none)."""
    from importlib import metadata

    for dist in ("onnxruntime-gpu", "onnxruntime", "onnxruntime-openvino", "onnxruntime-directml"):
        try:
            return {"distribution": dist, "version": metadata.version(dist)}
        except metadata.PackageNotFoundError:
            continue
    return {"distribution": None, "version": None}


#: The device label of each execution provider whose name does not say it.
PROVIDER_DEVICES = {
    "TensorrtExecutionProvider": "cuda",
    "MIGraphXExecutionProvider": "rocm",
    "CoreMLExecutionProvider": "mps",
    "DmlExecutionProvider": "dml",
}


def provider_device(provider: Any) -> str | None:
    """The device label a provider computes on (`CUDAExecutionProvider` -> `cuda`)."""
    if not isinstance(provider, str):
        return None
    return PROVIDER_DEVICES.get(provider) or provider.replace("ExecutionProvider", "").lower() or None


def attached_providers() -> dict[str, str]:
    """{provider: "attached" | why not} for every provider this onnxruntime build lists, each tried
    on `PROBE_GRAPH` alone (a provider onnxruntime drops silently shows as not attached)."""
    import onnxruntime as ort

    from laya_onnx.core.session import CPU, CUDA, preload_cuda_libraries

    if CUDA in ort.get_available_providers():
        preload_cuda_libraries(ort)
    out = {}
    # Azure's provider calls remote endpoints: not a device a bundle runs on
    for provider in (p for p in ort.get_available_providers() if p != "AzureExecutionProvider"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                session = ort.InferenceSession(PROBE_GRAPH, providers=[provider, CPU])
        except Exception as exc:  # the provider failed to initialise
            out[provider] = "failed: %s" % " ".join(str(exc).split())[:200]
            continue
        attached = session.get_providers()[0] == provider
        out[provider] = "attached" if attached else "did not attach (onnxruntime fell back to CPU)"
    return out


__all__ = [
    "BF16_FLAGS",
    "FEATURES",
    "VNNI_FLAGS",
    "Cpu",
    "attached_providers",
    "gpus",
    "memory_bytes",
    "onnxruntime_build",
    "read_cpu",
]
