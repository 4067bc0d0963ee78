"""One ONNX Runtime session wrapper: provider choice, verified attachment, observable fallback.

`providers=None` means auto: CUDA, then CoreML, then CPU, whichever this onnxruntime build
offers. What was asked for and what actually attached are both kept: a CUDA provider that
onnxruntime silently dropped (missing libraries, driver mismatch) is detected from
`session.get_providers()`, warned about loudly, and counted, never assumed.
"""

from __future__ import annotations

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


class GraphSession:
    """Runs the Laya graph; `run(feeds) -> (logits, act_logits)`."""

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

    def run(self, feeds: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        outputs = list(GRAPH_OUTPUTS)
        try:
            logits, act = self._session.run(outputs, dict(feeds))
        except Exception as exc:
            if self.info.active[0] == CPU:
                raise
            # A GPU pass that fails (out of memory, a kernel error) is retried once on CPU;
            # the device session stays for the next call, the counter says it happened.
            self._fallback(self.info.active[0], f"run failed on {self.info.active[0]}, retried on CPU: {exc}")
            with self._lock:
                if self._cpu_session is None:
                    self._cpu_session = self._new_session([CPU])
            logits, act = self._cpu_session.run(outputs, dict(feeds))
        return logits, act
