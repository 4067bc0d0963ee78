"""Per-pass memory: the bytes one session run needs, as a function of (rows, padded length).

One pass over `rows` rows padded to `length` tokens needs, on top of what the process holds
at idle (weights, tokenizer, interpreter),

    estimate(rows, length) = per_token * rows * length + per_token_sq * rows * length**2 + fixed

The quadratic term is attention: the graph materialises [rows, heads, length, length] float32
tensors (scores, probabilities, masks), so a budget counted in tokens (linear) lets one long
row take gigabytes. The coefficients are *measured* per bundle when it is exported (a few small
passes in fresh processes, peak RSS growth read from /proc, a least-squares fit scaled up until
it covers every measurement; `measure_pass_memory`, `fit_pass_memory`) and stored in the
manifest under "memory". A bundle without them gets a conservative estimate from its recorded
architecture (`estimate_from_architecture`), or from the largest Laya encoder when even that
is missing.

`ONNXAgent` splits passes so each stays inside `max_pass_memory` (LAYA_MAX_PASS_MEMORY, bytes
with K/M/G suffixes, default 2 GiB) and refuses a single row that cannot fit with
`PassTooLarge`. The probe runs on CPU: on a GPU session the model still bounds the pass, but it
prices host memory, not device memory. Nothing here imports torch; the probe needs onnxruntime.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from laya_onnx.core import settings
from laya_onnx.core.errors import PassTooLarge
from laya_onnx.core.manifest import Manifest
from laya_onnx.core.parsers import GiB, KiB, MiB
from laya_onnx.core.settings import DEFAULT_MAX_PASS_MEMORY, parse_bytes

#: Headroom on top of the worst measured/fitted ratio, for allocator noise between runs.
FIT_MARGIN = 1.10
#: A call whose largest pass is estimated at this or more hands the arena's free memory back to
#: the OS after its last pass (`GraphSession.run(release_memory=True)`). Below it the arena is
#: kept: the next pass would re-fault what was released, a cost small passes should not pay
#: (`laya-onnx bench memory --arena` measures it, docs/memory.md), and what they keep is at most
#: about this much.
ARENA_RELEASE_BYTES = 64 * MiB


def resolve_max_pass_memory(value: Any = None) -> int:
    """The pass budget in bytes: `value` if given, else the variable (`settings.MAX_PASS_MEMORY`)."""
    if value is not None:
        return parse_bytes(value, "max_pass_memory")
    return settings.MAX_PASS_MEMORY.read()


def device_pass_budget(budget: int, device_limit: int | None, weights: int) -> int:
    """The pass budget on a device whose arena is capped (`gpu_mem_limit`): a pass gets at most
    what the cap leaves beside the weights, so passes are split before the device runs out
    rather than failing there (the model prices host passes; fp32 activations take about as
    much on the device). Without a cap the budget is unchanged."""
    if device_limit is None:
        return budget
    return max(0, min(budget, int(device_limit) - int(weights)))


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class PassMemoryModel:
    """Peak bytes of one pass above idle: a*rows*len + b*rows*len**2 + c."""

    per_token: float
    per_token_sq: float
    fixed: float
    source: str

    def __post_init__(self):
        for name in ("per_token", "per_token_sq", "fixed"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"pass memory model: {name} must be a finite number >= 0, got {value!r}")

    def estimate(self, rows: int, length: int) -> int:
        """Bytes one pass of `rows` rows padded to `length` tokens needs above idle."""
        if rows <= 0:
            return 0
        return int(
            math.ceil(rows * (self.per_token * length + self.per_token_sq * length * length) + self.fixed)
        )

    def max_length(self, budget: int) -> int:
        """The longest single row that fits `budget` (0 when even the fixed part does not)."""
        room = budget - self.fixed
        if room <= 0:
            return 0
        a, b = self.per_token, self.per_token_sq
        if b <= 0:
            return sys.maxsize if a <= 0 else int(room // a)
        return int((-a + math.sqrt(a * a + 4 * b * room)) / (2 * b))

    def check_row(self, length: int, budget: int) -> None:
        """Raise PassTooLarge when one row of `length` tokens alone exceeds `budget`."""
        need = self.estimate(1, length)
        if need > budget:
            raise PassTooLarge(
                "a row of %d tokens needs an estimated %s in one forward pass, more than the "
                "%s a pass may use (%s); rows up to about %d tokens fit: "
                "send a shorter state or a smaller max_len"
                % (
                    length,
                    format_bytes(need),
                    format_bytes(budget),
                    settings.MAX_PASS_MEMORY.env,
                    self.max_length(budget),
                )
            )

    def as_dict(self) -> dict[str, Any]:
        return {
            "per_token": self.per_token,
            "per_token_sq": self.per_token_sq,
            "fixed": self.fixed,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PassMemoryModel:
        try:
            return cls(
                per_token=float(data["per_token"]),
                per_token_sq=float(data["per_token_sq"]),
                fixed=float(data["fixed"]),
                source=str(data.get("source", "manifest")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bundle manifest: 'memory' is not a pass memory model ({exc})") from None

    @classmethod
    def for_bundle(cls, manifest: Manifest | None) -> PassMemoryModel:
        """The bundle's measured model, else an estimate from its architecture, else the largest."""
        memory = manifest.memory if manifest is not None else None
        if memory is not None and memory.model is not None:
            return cls.from_dict(memory.model)
        export = manifest.export if manifest is not None else None
        if export is not None and export.architecture is not None:
            return estimate_from_architecture(export.architecture)
        return estimate_from_architecture(LARGEST_ARCHITECTURE, source="largest Laya encoder (no record)")


def split_rows(lengths: Sequence[int], model: PassMemoryModel, budget: int) -> list[range]:
    """Cut rows (in order) into consecutive passes that each stay within `budget`.

    A pass is padded to its longest row, so it grows greedily while `estimate(rows, longest)`
    fits. One piece covering everything is returned when the whole set fits, so a call the
    budget does not bind runs exactly the passes it ran before. A row that does not fit even
    alone raises `PassTooLarge` (check every row before running any pass).
    """
    pieces: list[range] = []
    start, longest = 0, 0
    for i, length in enumerate(lengths):
        wider = max(longest, length)
        if i > start and model.estimate(i - start + 1, wider) > budget:
            pieces.append(range(start, i))
            start, wider = i, length
        if i == start:
            model.check_row(length, budget)
        longest = wider
    if start < len(lengths):
        pieces.append(range(start, len(lengths)))
    return pieces


# -- the conservative estimate -------------------------------------------------------------------

#: ModernBERT-large, the biggest encoder a Laya checkpoint ships with (the random-english-large
#: preset has the same shape): what an unrecorded bundle is assumed to be.
LARGEST_ARCHITECTURE = {
    "layers": 28,
    "hidden": 1024,
    "heads": 16,
    "intermediate": 2624,
    "head_layers": 2,
    "head_heads": 16,
    "attention": "unfused",
}
#: Live float32 [rows, heads, len, len] tensors at the attention peak, per attention kind, and
#: float32 [rows, len, len] masks beside them, rounded up from measurements (peak growth of a
#: 2048-token row, `measure_pass_memory`): the unfused graph holds ~6 per head (24 B per head and
#: len**2 on tiny-english, 2 heads, and tiny-typed-decisions, 4 heads: scores, the masked sum,
#: softmax, its NaN-guarded copy, the float masks), the fused one ~2 (8.5 B: the kernel's scores
#: and probabilities).
LIVE_SQUARE_TENSORS = {"unfused": 7.0, "fused": 2.5}
LIVE_SQUARE_MASKS = {"unfused": 4.0, "fused": 1.0}
#: Live float32 [rows, len, width] activations at the peak, in units of (hidden + 2*intermediate).
LIVE_ACTIVATION_WIDTHS = 4.0
#: Per-pass overhead independent of the shape (kernel scratch, planner), bytes.
FIXED_OVERHEAD = 16 * MiB


def estimate_from_architecture(arch: Mapping[str, Any], source: str | None = None) -> PassMemoryModel:
    """A conservative model from layer shapes alone (for bundles exported without measurements)."""
    try:
        heads = max(int(arch["heads"]), int(arch.get("head_heads") or 0))
        width = int(arch["hidden"]) + 2 * int(arch["intermediate"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"bundle manifest: architecture record is incomplete ({exc})") from None
    kind = "fused" if arch.get("attention") == "fused" else "unfused"
    return PassMemoryModel(
        per_token=4.0 * LIVE_ACTIVATION_WIDTHS * width,
        per_token_sq=4.0 * (LIVE_SQUARE_TENSORS[kind] * heads + LIVE_SQUARE_MASKS[kind]),
        fixed=float(FIXED_OVERHEAD),
        source=source or f"estimated from the architecture ({kind} attention, {heads} heads)",
    )


# -- measuring and fitting -------------------------------------------------------------------------

#: Shapes probed at export, smallest first: long single rows pin the quadratic term, a wide batch
#: of short rows the linear one, the shortest row the fixed part. Four shapes, one more than the
#: model's coefficients, so the fit is checked by a sample it did not need; each costs a fresh
#: process and a pass, which at full size is most of an export's time (docs/coldstart.md).
#: Shapes the fit so far predicts above `PROBE_CAP` are skipped.
PROBE_SHAPES: tuple[tuple[int, int], ...] = ((1, 128), (8, 128), (1, 1024), (1, 2048))
PROBE_CAP = 1 * GiB
PROBE_TIMEOUT = 600.0


def fit_pass_memory(
    samples: Iterable[tuple[int, int, float]], margin: float = FIT_MARGIN, source: str = "measured"
) -> PassMemoryModel:
    """Least-squares fit of (rows, length, bytes) samples, non-negative, scaled to cover them all.

    Each sample is weighted by 1/sqrt(bytes), between a relative fit (small passes dominate,
    the long-row slope comes out off) and an absolute one (small passes ignored). The
    coefficients are then scaled to cover the sample with the largest rows*length**2, the fixed
    part is lifted to cover every other sample, and everything is multiplied by `margin`: the
    model never predicts less than it was shown.
    """
    data = [(float(r), float(n), float(m)) for r, n, m in samples]
    if len(data) < 3:
        raise ValueError(f"fitting a pass memory model needs at least 3 measurements, got {len(data)}")
    x = np.array([[r * n, r * n * n, 1.0] for r, n, _ in data])
    y = np.array([max(m, 1.0) for _, _, m in data])
    w = 1.0 / np.sqrt(y)
    best: np.ndarray | None = None
    best_err = math.inf
    # Non-negative least squares by enumeration: 3 coefficients, 7 non-empty supports.
    for support in range(1, 8):
        cols = [i for i in range(3) if support >> i & 1]
        coef, *_ = np.linalg.lstsq(x[:, cols] * w[:, None], y * w, rcond=None)
        if np.any(coef < 0):
            continue
        full = np.zeros(3)
        full[cols] = coef
        err = float(np.sum(((x @ full - y) * w) ** 2))
        if err < best_err:
            best, best_err = full, err
    assert best is not None  # the single-column supports always give a non-negative solution
    predicted = np.maximum(x @ best, 1.0)
    # Scale to cover the sample that weighs the length**2 term most (the one that decides how the
    # model extrapolates to long rows), then lift the fixed part to cover the rest: a shortfall
    # on a small pass is allocator noise, not a reason to inflate the long-row estimate.
    far = int(np.argmax(x[:, 1]))
    scale = max(1.0, float(y[far] / predicted[far]))
    lift = max(0.0, float(np.max(y - scale * predicted)))
    a, b = (float(v) * scale * margin for v in best[:2])
    c = (float(best[2]) * scale + lift) * margin
    return PassMemoryModel(per_token=a, per_token_sq=b, fixed=c, source=source)


def probe_feeds(rows: int, length: int) -> dict[str, np.ndarray]:
    """Graph inputs of the given shape; token id 1 exists in every vocabulary and the content
    does not change how much memory a pass takes."""
    from laya_onnx.core.bundle import GRAPH_INPUTS

    feeds = {
        "input_ids": np.ones((rows, length), np.int64),
        "attention_mask": np.ones((rows, length), np.int64),
        "marker_pos": np.tile(np.array([[1, 2]], np.int64), (rows, 1)),
        "marker_mask": np.ones((rows, 2), bool),
        "qtype": np.zeros((rows,), np.int64),
    }
    return {name: feeds[name] for name in GRAPH_INPUTS}


def process_memory() -> dict[str, int]:
    """This process's VmRSS and VmHWM (peak) in bytes, from /proc (Linux only)."""
    out = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * KiB
    return out


def process_rss() -> dict[str, int | None]:
    """This process's resident memory now and at its peak, in bytes (/proc; the peak from
    getrusage where /proc is missing)."""
    import resource

    try:
        memory = process_memory()
    except OSError:
        memory = {}
    peak = memory.get("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rss_bytes": memory.get("VmRSS"), "peak_rss_bytes": peak}


def probe_pass(graph: str, rows: int, length: int, threads: int | None) -> dict[str, Any]:
    """Run one pass in this (fresh) process; the peak growth over the warmed-up idle RSS."""
    import time

    from laya_onnx.core.session import GraphSession

    session = GraphSession(graph, providers=["CPUExecutionProvider"], threads=threads)
    session.run(probe_feeds(1, 8))  # session start-up and first-run allocations are idle cost
    before = process_memory()["VmRSS"]
    started = time.perf_counter()
    session.run(probe_feeds(rows, length))
    seconds = time.perf_counter() - started
    peak = process_memory()["VmHWM"]
    return {"rows": rows, "length": length, "bytes": max(0, peak - before), "seconds": round(seconds, 3)}


#: What each probe's fresh interpreter runs: `probe_pass`, its figures as one JSON line.
_PROBE_CHILD = (
    "import json, sys; from laya_onnx.core.memory import probe_pass; "
    "print(json.dumps(probe_pass(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) or None)))"
)


def measure_pass_memory(
    graph: os.PathLike | str,
    shapes: Sequence[tuple[int, int]] = PROBE_SHAPES,
    *,
    cap: int = PROBE_CAP,
    threads: int | None = None,
    timeout: float = PROBE_TIMEOUT,
) -> list[dict[str, Any]]:
    """Peak RSS growth of one pass per shape, each in a fresh process (Linux /proc).

    A fresh process per shape keeps one measurement from inheriting the allocator state of the
    previous one. Once three shapes are in, a shape the fit so far predicts above `cap` bytes is
    skipped, so probing a big encoder stays bounded.
    """
    if not Path("/proc/self/status").exists():
        raise OSError("measuring pass memory reads /proc/self/status; this platform has none")
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    results: list[dict[str, Any]] = []
    for rows, length in shapes:
        if len(results) >= 3:
            so_far = fit_pass_memory([(s["rows"], s["length"], s["bytes"]) for s in results], margin=1.0)
            if so_far.estimate(rows, length) > cap:
                continue
        cmd = [sys.executable, "-c", _PROBE_CHILD, str(graph), str(rows), str(length), str(int(threads or 0))]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            raise RuntimeError(
                f"memory probe {rows}x{length} on {str(graph)!r} failed: {proc.stderr.strip()[-2000:]}"
            )
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results


__all__ = [
    "DEFAULT_MAX_PASS_MEMORY",
    "GiB",
    "KiB",
    "MiB",
    "PassMemoryModel",
    "PassTooLarge",
    "estimate_from_architecture",
    "split_rows",
    "fit_pass_memory",
    "measure_pass_memory",
    "parse_bytes",
    "probe_feeds",
    "probe_pass",
    "process_memory",
    "resolve_max_pass_memory",
]
