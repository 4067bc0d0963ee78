"""Which integer GEMM an int8 bundle runs on this CPU: u8 x s8 where it is exact and fast, u8 x u8 elsewhere.

An int8 bundle holds its weight codes in two forms of the same integers, each with its own graph:

- `laya.onnx`: u8 codes around the zero point 128 (u8 activations x u8 weights). MLAS computes
  it exactly on every x86 CPU (and on ARM); on CPUs with VNNI it runs at about half the speed of
  the other form.
- `laya.u8s8.onnx`: the same codes minus 128 as s8 (u8 activations x s8 weights). With VNNI
  (AVX512-VNNI, AVX-VNNI, AMX) MLAS multiplies them into 32-bit sums exactly, several times
  faster than an fp32 GEMM; without it (AVX2, AVX-512 without VNNI) its `vpmaddubsw` kernel
  saturates a pair of products at 16 bits, so full 8-bit codes give wrong sums. 7-bit codes
  (-63..63) fit and are exact everywhere.

Both forms feed the same integers through the same scales, so their logits are bit-identical and
so batch-invariant alike; the choice changes the speed only. `auto` (the default) takes u8s8
where the CPU reports VNNI, or where the codes fit 7 bits, and u8u8 otherwise, including where
the CPU's flags cannot be read. `LAYA_INT8_KERNEL=u8s8|u8u8` (or `ONNXAgent(int8_kernel=...)`)
forces one; forcing u8s8 with 8-bit codes on a CPU without VNNI is refused, never run wrong.
The CPU's flags are `laya_onnx.core.machine`'s (`VNNI_FLAGS`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laya_onnx.core import settings
from laya_onnx.core.errors import UserError
from laya_onnx.core.machine import Cpu, read_cpu
from laya_onnx.core.manifest import PrecisionRecord

AUTO, U8S8, U8U8 = settings.INT8_KERNELS
KERNELS = (U8S8, U8U8)
CHOICES = settings.INT8_KERNELS
#: The graph of the u8 x s8 form, beside `laya.onnx` (the u8 x u8 form) and reading its data file.
U8S8_GRAPH_FILE = "laya.u8s8.onnx"
#: Codes at most this large in magnitude cannot saturate `vpmaddubsw` (2 x 255 x 63 < 2**15).
SAFE_WEIGHT_BITS = 7


class Int8KernelError(UserError, ValueError):
    """A kernel that cannot run this bundle exactly here, or an `int8_kernel` naming no kernel."""


@functools.lru_cache(maxsize=1)
def cpu_info() -> Cpu:
    """This CPU, read once per process (`machine.read_cpu`: /proc/cpuinfo; elsewhere no flags are
    known and `auto` takes the kernel that is exact on every CPU)."""
    return read_cpu()


def requested_kernel(int8_kernel: str | None = None) -> str:
    """The kernel asked for: `int8_kernel` if given, else $LAYA_INT8_KERNEL (`settings.INT8_KERNEL`)."""
    if int8_kernel is None:
        return settings.INT8_KERNEL.read()
    if not isinstance(int8_kernel, str) or int8_kernel.strip().lower() not in CHOICES:
        raise Int8KernelError(f"int8_kernel must be one of {', '.join(CHOICES)}, got {int8_kernel!r}")
    return int8_kernel.strip().lower()


@dataclass(frozen=True)
class Int8Kernel:
    """The graph an int8 bundle runs here and why (`kernel` None: the bundle is not int8)."""

    kernel: str | None
    graph: str
    requested: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "graph": self.graph,
            "requested": self.requested,
            "reason": self.reason,
        }


def bundle_forms(record: PrecisionRecord) -> dict[str, str]:
    """{kernel: graph file} of an int8 precision record. A bundle exported before the two forms
    holds one: u8 x u8 with 8-bit weights, u8 x s8 with 7-bit ones."""
    if record.kernels is not None:
        return {k: v for k, v in record.kernels.items() if k in KERNELS}
    return {U8S8 if record.weight_bits == SAFE_WEIGHT_BITS else U8U8: "laya.onnx"}


def choose_kernel(
    record: PrecisionRecord, requested: str, cpu: Cpu | None = None, default_graph: str = "laya.onnx"
) -> Int8Kernel:
    """The form of the int8 bundle whose precision record is `record` to run on `cpu`."""
    if record.precision != "int8":
        return Int8Kernel(None, default_graph, requested, f"the bundle is {record.precision}, not int8")
    cpu = cpu or cpu_info()
    forms = bundle_forms(record)
    # Bundles before the record said so: 8-bit codes (the unsafe case) unless it says 7.
    safe_codes = record.weight_bits == SAFE_WEIGHT_BITS
    where = (
        f"{cpu.model or 'this CPU'} ({'VNNI' if cpu.vnni else 'no VNNI' if cpu.flags else 'flags unknown'})"
    )
    if requested == AUTO:
        if U8S8 in forms and (cpu.vnni or safe_codes):
            why = "VNNI: u8 x s8 is exact and fastest" if cpu.vnni else "7-bit codes cannot saturate"
            return Int8Kernel(U8S8, forms[U8S8], requested, f"auto on {where}: {why}")
        why = "u8 x u8 is exact on every CPU" if U8S8 in forms else "the bundle holds the u8 x u8 form only"
        return Int8Kernel(U8U8, forms[U8U8], requested, f"auto on {where}: {why}")
    if requested not in forms:
        raise Int8KernelError(
            f"{requested} was asked for ({settings.INT8_KERNEL.env} or int8_kernel), but the bundle holds the "
            f"{', '.join(forms)} form only; re-export it with this laya-onnx for both"
        )
    if requested == U8S8 and not (cpu.vnni or safe_codes):
        raise Int8KernelError(
            f"{U8S8} was asked for ({settings.INT8_KERNEL.env} or int8_kernel), but {where} has no VNNI: its u8 x s8 "
            f"kernel saturates 8-bit weight codes and would answer wrongly; use {AUTO} or {U8U8}"
        )
    return Int8Kernel(requested, forms[requested], requested, f"forced on {where}")


def resolve_graph(root: Path, choice: Int8Kernel) -> Path:
    """The chosen graph's path in the bundle at `root` (an error naming it when it is missing)."""
    path = root / choice.graph
    if not path.is_file():
        raise Int8KernelError(
            f"bundle {str(root)!r} has no {choice.graph} for the {choice.kernel} kernel its manifest lists"
        )
    return path


__all__ = [
    "AUTO",
    "CHOICES",
    "KERNELS",
    "U8S8",
    "U8S8_GRAPH_FILE",
    "U8U8",
    "Int8Kernel",
    "Int8KernelError",
    "choose_kernel",
    "cpu_info",
    "requested_kernel",
    "resolve_graph",
]
