"""One ONNX Runtime session wrapper: provider choice, verified attachment, observable fallback.

`providers=None` means auto: CUDA, then CoreML, then CPU, whichever this onnxruntime build
offers. Providers are given as onnxruntime takes them: names, or `(name, options)` pairs whose
options (`device_id`, `gpu_mem_limit`, `arena_extend_strategy`, CoreML's `MLComputeUnits`, ...)
are handed to onnxruntime as they are. What was asked for and what actually attached are both
kept: a CUDA provider that onnxruntime silently dropped (missing libraries, driver mismatch) is
detected from `session.get_providers()`, warned about loudly, and counted, never assumed; with
`strict=True` it is refused instead (`ProviderUnavailable`). On CUDA a pass feeds and fetches
through an IOBinding (`io_binding=None`: on for CUDA only; True works on CPU too).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from laya_onnx.core import settings
from laya_onnx.core.bundle import GRAPH_INPUTS, GRAPH_OUTPUTS
from laya_onnx.core.errors import ConfigError, UserError

log = logging.getLogger("laya_onnx.core.session")

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
COREML = "CoreMLExecutionProvider"
AUTO_ORDER = (CUDA, COREML, CPU)
ALIASES = {"cpu": CPU, "cuda": CUDA, "gpu": CUDA, "coreml": COREML, "tensorrt": "TensorrtExecutionProvider"}


class ProviderError(UserError, ValueError):
    """A provider request that names no execution provider onnxruntime knows, or is malformed."""


class ProviderUnavailable(RuntimeError):
    """`strict_providers=True` and a requested accelerator did not attach (or failed a pass)."""


#: What the CUDA provider is given unless the caller's options name the key (onnxruntime's own
#: option names and values):
#:  * `arena_extend_strategy`: onnxruntime's default, kNextPowerOfTwo, rounds each growth of the
#:    device arena up to a power of two, so a process would keep its largest pass's memory
#:    rounded up (a 5 GiB pass holds 8 GiB) until it exits; the arena is shrunk after large
#:    passes instead (`GraphSession.run(release_memory=True)`).
#:  * `use_tf32`: TF32 matmuls (Ampere and newer) round fp32 inputs to a 10-bit mantissa; an fp32
#:    bundle then misses the 1e-5 agreement it was validated to. `("cuda", {"use_tf32": 1})` turns
#:    it back on for speed.
CUDA_DEFAULTS: dict[str, Any] = {"arena_extend_strategy": "kSameAsRequested", "use_tf32": 0}

#: Consecutive failed device passes after which the session reports itself unhealthy: a CUDA
#: error that poisons the context fails every later pass in this process, so a supervisor
#: (Kubernetes' liveness probe on /health, systemd) should restart it rather than let every call
#: pay a failed GPU pass first.
DEVICE_FAILURE_LIMIT = 3


#: An execution provider as onnxruntime takes it: a name, or (name, {option: value}).
ProviderSpec = str | tuple[str, Mapping[str, Any]]


def canonical_provider(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ProviderError(f"execution provider names must be non-empty strings, got {name!r}")
    name = name.strip()
    return ALIASES.get(name.lower(), name)


def _is_pair(entry: Any) -> bool:
    return isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[1], Mapping)


def _checked_options(name: str, options: Mapping[Any, Any]) -> dict[str, Any]:
    """Provider options as onnxruntime takes them (it stringifies the values): refuse what it
    would silently turn into "None" or a repr."""
    out = {}
    for key, value in options.items():
        if not isinstance(key, str) or not key:
            raise ProviderError(f"{name} options must be keyed by option names (strings), got {key!r}")
        if value is None or not isinstance(value, (str, int, float)):
            raise ProviderError(
                f"{name} option {key!r} must be a string or a number (as onnxruntime takes it), got {value!r}"
            )
        out[key] = value
    return out


def provider_entries(requested: Any) -> list[tuple[str, dict[str, Any] | None]]:
    """(canonical name, options or None) per requested provider, in order, first of each name."""
    if requested is None:
        return []
    if isinstance(requested, str) or _is_pair(requested):
        requested = [requested]
    out: list[tuple[str, dict[str, Any] | None]] = []
    for entry in requested:
        if isinstance(entry, str):
            name, options = canonical_provider(entry), None
        elif _is_pair(entry):
            name = canonical_provider(entry[0])
            options = _checked_options(name, entry[1])
        else:
            raise ProviderError(f"an execution provider is a name or a (name, options) pair, got {entry!r}")
        if name not in (n for n, _ in out):
            out.append((name, options))
    return out


def resolve_providers(
    requested: Sequence[ProviderSpec] | ProviderSpec | None,
    available: Sequence[str],
    known: Sequence[str] | None = None,
) -> list[str]:
    """The provider list to ask for: auto order, or the caller's list, always ending in CPU.

    A name outside `known` (default: every provider this onnxruntime knows of,
    `get_all_providers()`) is a typo and a ProviderError; a known one missing from `available`
    is left in, for the session to count as a fallback.
    """
    if requested is None:
        chosen = [p for p in AUTO_ORDER if p in available]
    else:
        if known is None:
            import onnxruntime as ort

            known = ort.get_all_providers()
        chosen = []
        for full, _ in provider_entries(requested):
            if full not in known:
                raise ProviderError(
                    f"unknown execution provider {full!r}; use an alias ({', '.join(sorted(ALIASES))}) "
                    f"or a name this onnxruntime knows: {', '.join(sorted(known))}"
                )
            chosen.append(full)
    if CPU not in chosen:
        chosen.append(CPU)
    return chosen


def resolve_threads(threads: int | None = None) -> int | None:
    """Intra-op threads: `threads` if given (a positive int), else the variable
    (`settings.THREADS`), else None (onnxruntime's default, one per core). A bad argument is a
    ValueError naming it; a bad environment value is logged and ignored, as laya-serve does."""
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError("threads must be a positive integer or None, got %r" % (threads,))
        return threads
    return settings.THREADS.read()


def session_options(threads: int | None = None):
    """The onnxruntime SessionOptions of every laya-onnx session (the runtime's and the export check's)."""
    import onnxruntime as ort

    # No telemetry events, also where the host imported onnxruntime before the core could set
    # ORT_DISABLE_TELEMETRY (`laya_onnx.core`).
    ort.disable_telemetry_events()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Memory patterns off: with them a shape's second run allocates one planned block above the
    # first run's peak (docs/memory.md), and lengths vary from request to request, so the plan
    # is rarely reused and buys no speed.
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


_PRELOADED = False


def preload_cuda_libraries(ort) -> None:
    """Load the CUDA and cuDNN libraries of the `nvidia-*` wheels (`onnxruntime-gpu[cuda,cudnn]`,
    the `gpu` extra) before the first CUDA session: onnxruntime's CUDA provider finds them only
    after `onnxruntime.preload_dlls()` (1.21 and later), otherwise it fails to attach and the
    session runs on CPU. Once per process; a build without it (or system-wide CUDA) needs nothing."""
    global _PRELOADED
    if _PRELOADED or not hasattr(ort, "preload_dlls"):
        return
    _PRELOADED = True
    try:
        ort.preload_dlls()
    except Exception as exc:  # missing wheels: the session then attaches from the system, or falls back
        log.warning("onnxruntime.preload_dlls() failed (%s); relying on system CUDA/cuDNN libraries", exc)


class GraphSession:
    """Runs the Laya graph; `run(feeds) -> (logits, act_logits)`.

    The CPU arena stays on (without it every pass re-faults its memory op by op: 2.5-4.5x
    slower on large passes, and glibc still keeps most of it). Instead `run(feeds,
    release_memory=True)` shrinks the arena at the end of that run and trims the C heap, so the
    memory of a large pass goes back to the OS; the agent asks for it after calls whose largest
    pass is estimated above `laya_onnx.core.memory.ARENA_RELEASE_BYTES`. Memory patterns are off
    (`session_options`).
    """

    def __init__(
        self,
        graph_path: str,
        providers: Sequence[ProviderSpec] | ProviderSpec | None = None,
        threads: int | None = None,
        *,
        strict: bool = False,
        io_binding: bool | None = None,
        label: str | None = None,
    ):
        import onnxruntime as ort

        self._ort = ort
        self._path = str(graph_path)
        #: How a report names this session's bundle: its name (`ONNXAgent.name`), else its folder.
        self.label = label if label is not None else "at %s" % Path(self._path).parent
        self._threads = threads
        self._lock = threading.Lock()
        # Guards `info.fallbacks`: the inference thread counts while a server thread reads.
        self._fallbacks_lock = threading.Lock()
        self.strict = bool(strict)
        available = ort.get_available_providers()
        requested = resolve_providers(providers, available)
        #: {provider: options} handed to onnxruntime: the caller's, over `CUDA_DEFAULTS` for CUDA.
        self.provider_options = {name: opts for name, opts in provider_entries(providers) if opts}
        if CUDA in requested:
            self.provider_options[CUDA] = {**CUDA_DEFAULTS, **self.provider_options.get(CUDA, {})}
            if CUDA in available:
                preload_cuda_libraries(ort)
        #: Device passes failed in a row (reset by a pass that succeeds on the device).
        self.device_failures = 0
        self.info = SessionInfo(requested=requested, active=[])
        missing = [p for p in requested if p not in available]
        for p in missing:
            self._fallback(
                p, f"{p} is not available in this onnxruntime build (available: {', '.join(available)})"
            )
        self._refuse_if_strict(missing)
        usable = [p for p in requested if p in available]
        try:
            self._session = self._new_session(usable)
        except Exception as exc:  # a listed provider can still fail to initialise
            if usable == [CPU]:
                raise
            self._fallback(usable[0], f"session creation failed: {exc}")
            self._refuse_if_strict([usable[0]])
            self._session = self._new_session([CPU])
        self.info.active = list(self._session.get_providers())
        # onnxruntime drops a provider it cannot attach with only a log line; check, don't assume.
        dropped = [p for p in usable if p not in self.info.active and p not in missing]
        for p in dropped:
            self._fallback(
                p, f"{p} was requested but did not attach; running on {', '.join(self.info.active)}"
            )
        self._refuse_if_strict(dropped)
        self._check_io()
        self._cpu_session = self._session if self.info.active[0] == CPU else None
        self.io_binding = self.info.active[0] == CUDA if io_binding is None else bool(io_binding)

    def _refuse_if_strict(self, providers: Sequence[str]) -> None:
        """With `strict`, a requested accelerator that is not running is an error, not a fallback."""
        absent = [p for p in providers if p != CPU]
        if not self.strict or not absent:
            return
        with self._fallbacks_lock:
            reasons = "; ".join(f"{p}: {self.info.fallbacks[p].last_reason}" for p in absent)
        raise ProviderUnavailable(
            f"strict_providers: {', '.join(absent)} requested but not running ({reasons}); refusing "
            "to run elsewhere (pass strict_providers=False to allow the fallback)"
        )

    def _new_session(self, providers: list[str]):
        listed = [(p, self.provider_options[p]) if p in self.provider_options else p for p in providers]
        # enable_fallback=0: onnxruntime's own Python fallback would rebuild a failed session on CPU,
        # or move every later pass to CPU after one EPFail, without telling us; the fallback
        # here is counted and visible instead.
        return self._ort.InferenceSession(
            self._path, sess_options=session_options(self._threads), providers=listed, enable_fallback=0
        )

    def record_fallback(self, provider: str, reason: str) -> None:
        """Count and report that `provider` is not running (the reason is kept as the latest)."""
        self._fallback(provider, reason)

    def _fallback(self, provider: str, reason: str) -> None:
        with self._fallbacks_lock:
            counter = self.info.fallbacks.setdefault(provider, FallbackCounter())
            counter.count += 1
            counter.last_reason = reason
        # One report: a warning, which the command line and the server log as one line
        # (`laya_onnx.core.notices`) and an application filters as it likes.
        warnings.warn(
            f"laya-onnx: bundle {self.label}: provider fallback: {reason} (strict_providers=True, or "
            "--strict-providers, refuses instead)",
            RuntimeWarning,
            stacklevel=3,
        )

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

    @property
    def inference_session(self) -> Any:
        """The onnxruntime InferenceSession the passes run on (the first active provider's)."""
        return self._session

    @inference_session.setter
    def inference_session(self, session: Any) -> None:
        """Run the next passes on `session`: the CUDA check puts a failing one here to prove the
        counted fallback to CPU."""
        self._session = session

    def fallback_snapshot(self) -> dict[str, FallbackEntry]:
        """{provider: {"count", "last_reason"}} for every provider that fell back, copied under
        the lock, so a reader on another thread never sees a half-updated table."""
        with self._fallbacks_lock:
            return {p: c.as_dict() for p, c in self.info.fallbacks.items()}

    def _run_options(self, release_memory: bool, on_device: bool, stoppable: bool = False):
        """The run's options: None when it needs none; a stoppable run gets its own, whose
        terminate flag a cancel sets."""
        if not (release_memory or stoppable):
            return None
        options = self._ort.RunOptions()
        if release_memory:
            options.add_run_config_entry(ARENA_SHRINKAGE, self.arenas(on_device))
        return options

    def arenas(self, on_device: bool = True) -> str:
        """The arenas a run shrinks: the CPU arena every session has, and on CUDA the device
        arena too ("cpu:0;gpu:N", onnxruntime's syntax; naming an arena a session lacks fails
        the run, so the device is named only for a pass that runs on it)."""
        if on_device and self.info.active[0] == CUDA:
            return "cpu:0;gpu:%d" % self._device()[1]
        return "cpu:0"

    @property
    def device_memory_limit(self) -> int | None:
        """The CUDA arena's cap in bytes (`gpu_mem_limit`), when the session runs on CUDA with one."""
        if self.info.active[0] != CUDA:
            return None
        limit = (self.provider_options.get(CUDA) or {}).get("gpu_mem_limit")
        return int(limit) if limit is not None else None

    @property
    def healthy(self) -> bool:
        """False after `DEVICE_FAILURE_LIMIT` device passes failed in a row (see its comment)."""
        return self.device_failures < DEVICE_FAILURE_LIMIT

    def _device(self) -> tuple[str, int]:
        """Where the session's outputs live: onnxruntime's device name and id for an IOBinding."""
        if self.info.active[0] == CUDA:
            return "cuda", int((self.provider_options.get(CUDA) or {}).get("device_id", 0))
        return "cpu", 0

    def _run_bound(self, session, outputs: list[str], feeds: Mapping[str, np.ndarray], options):
        """One pass through an IOBinding: inputs bound from host arrays (copied to the device once),
        outputs allocated on the session's device, then copied back."""
        binding = session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        device, device_id = self._device()
        for name in outputs:
            binding.bind_output(name, device, device_id)
        session.run_with_iobinding(binding, options)
        return binding.copy_outputs_to_cpu()

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        *,
        release_memory: bool = False,
        stop_on: StopHook | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One forward pass; `release_memory=True` returns the arena's free memory afterwards.

        `stop_on(stop)` (`work.CallLimits.stopping`) arms `stop` for the run's duration: called,
        it sets onnxruntime's terminate flag and the run ends between two operators with
        `RunTerminated` (never retried on another provider)."""
        outputs = list(GRAPH_OUTPUTS)
        options = self._run_options(release_memory, on_device=True, stoppable=stop_on is not None)
        try:
            with contextlib.nullcontext() if stop_on is None else stop_on(partial(_terminate, options)):
                if self.io_binding:
                    logits, act = self._run_bound(self._session, outputs, feeds, options)
                else:
                    logits, act = self._session.run(outputs, dict(feeds), options)
        except Exception as exc:
            if options is not None and options.terminate:
                raise RunTerminated("the pass was stopped") from exc
            if self.info.active[0] == CPU:
                raise
            self.device_failures += 1
            if self.strict:
                raise ProviderUnavailable(
                    f"strict_providers: a pass failed on {self.info.active[0]} and is not retried on "
                    f"CPU: {exc}"
                ) from exc
            # A GPU pass that fails (out of memory, a kernel error) is retried once on CPU;
            # the device session stays for the next call, the counter says it happened.
            self._fallback(self.info.active[0], f"run failed on {self.info.active[0]}, retried on CPU: {exc}")
            with self._lock:
                if self._cpu_session is None:
                    self._cpu_session = self._new_session([CPU])
            options = self._run_options(release_memory, on_device=False)
            logits, act = self._cpu_session.run(outputs, dict(feeds), options)
        else:
            self.device_failures = 0
        if release_memory:
            trim_heap()
        return logits, act


#: How a caller arms a stop for one run: given the stop, a context manager for the run's duration.
StopHook = Callable[[Callable[[], None]], AbstractContextManager[Any]]


class RunTerminated(RuntimeError):
    """A run ended early because its stop was called (`GraphSession.run(stop_on=...)`)."""


def _terminate(options: Any) -> None:
    """Ask the run holding `options` to stop between two operators (onnxruntime's flag)."""
    options.terminate = True
