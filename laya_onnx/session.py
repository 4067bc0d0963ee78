"""One ONNX Runtime session wrapper: provider choice, verified attachment, observable fallback.

`providers=None` means auto: CUDA, then CoreML, then CPU, whichever this onnxruntime build
offers. What was asked for and what actually attached are both kept: a CUDA provider that
onnxruntime silently dropped (missing libraries, driver mismatch) is detected from
`session.get_providers()`, warned about loudly, and counted, never assumed.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from laya_onnx.bundle import GRAPH_INPUTS, GRAPH_OUTPUTS

log = logging.getLogger("laya_onnx.session")

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
COREML = "CoreMLExecutionProvider"
AUTO_ORDER = (CUDA, COREML, CPU)
ALIASES = {"cpu": CPU, "cuda": CUDA, "gpu": CUDA, "coreml": COREML, "tensorrt": "TensorrtExecutionProvider"}


class ProviderError(ValueError):
    """A provider request that names no execution provider onnxruntime knows."""


def canonical_provider(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ProviderError(f"execution provider names must be non-empty strings, got {name!r}")
    name = name.strip()
    return ALIASES.get(name.lower(), name)


def resolve_providers(
    requested: Sequence[str] | None, available: Sequence[str], known: Sequence[str] | None = None
) -> list[str]:
    """The provider list to ask for: auto order, or the caller's list, always ending in CPU.

    A name outside `known` (default: every provider this onnxruntime knows of,
    `get_all_providers()`) is a typo and a ProviderError; a known one missing from `available`
    is left in, for the session to count as a fallback.
    """
    if requested is None:
        chosen = [p for p in AUTO_ORDER if p in available]
    else:
        if isinstance(requested, str):
            requested = [requested]
        if known is None:
            import onnxruntime as ort

            known = ort.get_all_providers()
        chosen = []
        for p in requested:
            full = canonical_provider(p)
            if full not in known:
                raise ProviderError(
                    f"unknown execution provider {p!r}; use an alias ({', '.join(sorted(ALIASES))}) "
                    f"or a name this onnxruntime knows: {', '.join(sorted(known))}"
                )
            if full not in chosen:
                chosen.append(full)
    if CPU not in chosen:
        chosen.append(CPU)
    return chosen


def session_options(threads: int | None = None):
    """The onnxruntime SessionOptions of every laya-onnx session (the runtime's and the export check's)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Memory patterns off: with them a shape's second run allocates one planned block ~25% above
    # the first run's peak (2 x 4096 tokens, tiny-english: 560 -> 697 MiB), and lengths vary
    # from request to request, so the plan is rarely reused (no measurable speed difference).
    so.enable_mem_pattern = False
    if threads:
        so.intra_op_num_threads = int(threads)
    return so


class FallbackEntry(TypedDict):
    """One provider's fallbacks as reported: how many, and the latest reason."""

    count: int
    last_reason: str | None


@dataclass
class FallbackCounter:
    count: int = 0
    last_reason: str | None = None

    def as_dict(self) -> FallbackEntry:
        return {"count": self.count, "last_reason": self.last_reason}


@dataclass
class SessionInfo:
    requested: list[str]
    active: list[str]
    fallbacks: dict[str, FallbackCounter] = field(default_factory=dict)


#: onnxruntime run option that hands the arena's free regions back to the OS when the run ends.
ARENA_SHRINKAGE = "memory.enable_memory_arena_shrinkage"


def _find_malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; absent on musl, macOS, Windows
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _find_malloc_trim()


def trim_heap() -> None:
    """Return the C heap's free pages to the OS (glibc `malloc_trim`; a no-op elsewhere).

    Arena regions smaller than glibc's mmap threshold (which grows to 32 MiB once big blocks
    were freed) live on the heap: freeing them keeps their pages resident until trimmed.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class GraphSession:
    """Runs the Laya graph; `run(feeds) -> (logits, act_logits)`.

    The CPU arena stays on (without it every pass re-faults its memory op by op: 2.5-4.5x
    slower on large passes, and glibc still keeps most of it). Instead `run(feeds,
    release_memory=True)` shrinks the arena at the end of that run and trims the C heap, so the
    memory of a large pass goes back to the OS; the agent asks for it after calls whose largest
    pass is estimated above `laya_onnx.memory.ARENA_RELEASE_BYTES`. Memory patterns are off
    (`session_options`).
    """

    def __init__(self, graph_path: str, providers: Sequence[str] | None = None, threads: int | None = None):
        import onnxruntime as ort

        self._ort = ort
        self._path = str(graph_path)
        self._threads = threads
        self._lock = threading.Lock()
        # Guards `info.fallbacks`: the inference thread counts while a server thread reads.
        self._fallbacks_lock = threading.Lock()
        available = ort.get_available_providers()
        requested = resolve_providers(providers, available)
        self.info = SessionInfo(requested=requested, active=[])
        missing = [p for p in requested if p not in available]
        for p in missing:
            self._fallback(
                p, f"{p} is not available in this onnxruntime build (available: {', '.join(available)})"
            )
        usable = [p for p in requested if p in available]
        try:
            self._session = self._new_session(usable)
        except Exception as exc:  # a listed provider can still fail to initialise
            if usable == [CPU]:
                raise
            self._fallback(usable[0], f"session creation failed: {exc}")
            self._session = self._new_session([CPU])
        self.info.active = list(self._session.get_providers())
        # onnxruntime drops a provider it cannot attach with only a log line; check, don't assume.
        for p in usable:
            if p not in self.info.active and p not in missing:
                self._fallback(
                    p, f"{p} was requested but did not attach; running on {', '.join(self.info.active)}"
                )
        self._check_io()
        self._cpu_session = self._session if self.info.active[0] == CPU else None

    def _new_session(self, providers: list[str]):
        return self._ort.InferenceSession(
            self._path, sess_options=session_options(self._threads), providers=providers
        )

    def _fallback(self, provider: str, reason: str) -> None:
        with self._fallbacks_lock:
            counter = self.info.fallbacks.setdefault(provider, FallbackCounter())
            counter.count += 1
            counter.last_reason = reason
        warnings.warn(f"laya-onnx: {reason}", RuntimeWarning, stacklevel=3)
        log.warning("provider fallback: %s", reason)

    def _check_io(self) -> None:
        names = [i.name for i in self._session.get_inputs()]
        outs = [o.name for o in self._session.get_outputs()]
        if sorted(names) != sorted(GRAPH_INPUTS) or not set(GRAPH_OUTPUTS) <= set(outs):
            raise ValueError(
                f"{self._path}: graph inputs {names} / outputs {outs} do not match the Laya contract "
                f"{list(GRAPH_INPUTS)} -> {list(GRAPH_OUTPUTS)}"
            )

    @property
    def providers(self) -> list[str]:
        return list(self.info.active)

    def fallback_snapshot(self) -> dict[str, FallbackEntry]:
        """{provider: {"count", "last_reason"}} for every provider that fell back, copied under
        the lock, so a reader on another thread never sees a half-updated table."""
        with self._fallbacks_lock:
            return {p: c.as_dict() for p, c in self.info.fallbacks.items()}

    def _run_options(self, release_memory: bool):
        if not release_memory:
            return None
        options = self._ort.RunOptions()
        # The CPU arena only: every session has one. A CUDA device arena ("gpu:0") is left alone;
        # naming an arena a session lacks fails the run, and no GPU was available to test it.
        options.add_run_config_entry(ARENA_SHRINKAGE, "cpu:0")
        return options

    def run(
        self, feeds: Mapping[str, np.ndarray], *, release_memory: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """One forward pass; `release_memory=True` returns the arena's free memory afterwards."""
        outputs = list(GRAPH_OUTPUTS)
        try:
            options = self._run_options(release_memory)
            logits, act = self._session.run(outputs, dict(feeds), options)
        except Exception as exc:
            if self.info.active[0] == CPU:
                raise
            # A GPU pass that fails (out of memory, a kernel error) is retried once on CPU;
            # the device session stays for the next call, the counter says it happened.
            self._fallback(self.info.active[0], f"run failed on {self.info.active[0]}, retried on CPU: {exc}")
            with self._lock:
                if self._cpu_session is None:
                    self._cpu_session = self._new_session([CPU])
            options = self._run_options(release_memory)
            logits, act = self._cpu_session.run(outputs, dict(feeds), options)
        if release_memory:
            trim_heap()
        return logits, act
