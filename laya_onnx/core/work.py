"""A call's work: how long its forward passes take, and the limits its caller puts on them.

One pass over `rows` rows padded to `length` tokens does about

    operations(rows, length) = per_token * rows * length + per_token_sq * rows * length**2

floating-point operations (`PassWork`, from the bundle's recorded architecture: the layers'
matrix products are the linear term, attention's two products the quadratic one), and takes
`operations / speed + PASS_OVERHEAD` seconds. The speed is this process's own (`PassClock`): a
probe pass when the first estimate is asked for, then the median of the recent passes that ran
long enough to say something (MIN_OBSERVED_SECONDS), so an estimate follows the machine it runs
on — a GPU, a busier or a quieter host — rather than the one the bundle was exported on. How
close the model comes is in docs/speed.md#the-pass-time-model.

`CallLimits` is what a caller who runs calls on behalf of others (the HTTP server, per request)
puts around one call, on the thread that runs it (`with call_limits(limits):`):

  * `max_seconds` — the call's estimated seconds, summed over its planned passes, may not
    exceed it: `CallTooLarge` (a caller's mistake: too large for this server) before any pass;
  * `deadline` — a `time.monotonic()` by which the call must be done: a call whose estimate
    cannot finish by then is stopped before any pass (`CallStopped`), and no further pass
    starts once it is past;
  * `cancelled` — set from another thread (the client went away): no further pass starts, and
    the pass running is cut short (`stopping`, which the agent hands the session: it sets
    onnxruntime's terminate flag, which the run obeys between two of its operators).

The agent checks them between states while encoding and before every pass. Without limits set,
a call runs as it always did (and no probe runs).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.manifest import Manifest
from laya_onnx.core.memory import LARGEST_ARCHITECTURE, probe_feeds

#: How many recent passes `PassClock` judges this process's speed from.
RECENT_PASSES = 32
#: Passes shorter than this do not set the speed: a short pass is mostly fixed overhead, and a
#: speed taken there would misjudge the long passes a budget is about.
MIN_OBSERVED_SECONDS = 0.05
#: Seconds every pass costs whatever its size (feeding, fetching, decoding), added to each.
PASS_OVERHEAD = 0.002
#: The probe pass that measures the speed before the first estimate: one row of this many tokens.
PROBE_LENGTH = 256
#: Operations per second assumed when nothing was measured (no probe given): a server CPU core
#: pair running fp32 matrix products; a small model runs far below it, a GPU far above.
ASSUMED_FLOPS = 100e9


class CallTooLarge(InvalidRequest):
    """The call's passes are estimated to need more time than its caller allows; nothing ran.
    A server answers it with 413 and this text: the request is well formed, only too large."""


class CallStopped(Exception):
    """The caller stopped the call before its next pass (`reason` says why): the client went
    away, or its deadline passed or cannot be met. Not a caller's mistake about the request."""

    def __init__(self, reason: str, *, deadline: bool = False):
        super().__init__(reason)
        self.reason = reason
        #: True when the deadline (not a cancellation) stopped it.
        self.deadline = deadline


def format_seconds(seconds: float) -> str:
    if seconds >= 3600:
        return "%.1f h" % (seconds / 3600)
    if seconds >= 100:
        return "%.1f min" % (seconds / 60)
    return "%.1f s" % seconds


@dataclass(frozen=True)
class PassWork:
    """Floating-point operations of one pass: per_token*rows*len + per_token_sq*rows*len**2."""

    per_token: float
    per_token_sq: float
    source: str

    def operations(self, rows: int, length: int) -> float:
        return rows * (self.per_token * length + self.per_token_sq * length * length) if rows > 0 else 0.0

    @classmethod
    def of(cls, arch: Mapping[str, Any], source: str) -> PassWork:
        """2 * (4h^2 + 3hi) per layer and token for the projections and the gated MLP, 4h per
        layer, token and token of length for attention's two products (head layers counted as
        encoder layers: only the ratio of the two terms matters, the speed is measured)."""
        try:
            layers = int(arch["layers"]) + int(arch.get("head_layers") or 0)
            hidden, inner = int(arch["hidden"]), int(arch["intermediate"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bundle manifest: architecture record is incomplete ({exc})") from None
        return cls(
            per_token=layers * 2.0 * (4 * hidden * hidden + 3 * hidden * inner),
            per_token_sq=layers * 4.0 * hidden,
            source=source,
        )

    @classmethod
    def for_bundle(cls, manifest: Manifest | None) -> PassWork:
        """From the manifest's architecture record, else the largest Laya encoder's."""
        export = manifest.export if manifest is not None else None
        if export is not None and export.architecture is not None:
            return cls.of(export.architecture, "the bundle's architecture")
        return cls.of(LARGEST_ARCHITECTURE, "the largest Laya encoder (no record)")


def timed_pass(session: Any, rows: int, length: int) -> float:
    """A `PassClock` probe: seconds of one pass of synthetic rows on `session` (a
    `GraphSession`), after one short pass that warms it up. Never cut short by a cancel: every
    later estimate needs its measured speed."""
    session.run(probe_feeds(1, 8))
    started = time.perf_counter()
    session.run(probe_feeds(rows, length))
    return time.perf_counter() - started


#: The padded lengths a warm-up runs one pass at: onnxruntime prepares each new shape once.
WARM_LENGTHS = (32, 64, 128, 256, 512)


def warm_up(session: Any, clock: PassClock, longest: int) -> None:
    """`clock`'s speed probe, then one pass of one row at each of WARM_LENGTHS up to `longest`."""
    clock.seconds(1, PROBE_LENGTH)
    for length in WARM_LENGTHS:
        if length <= longest:
            session.run(probe_feeds(1, length))


class PassClock:
    """Seconds of a pass at this process's measured speed (thread-safe).

    `probe` runs one pass of (1, PROBE_LENGTH) and returns its seconds; it is called once, for
    the first estimate asked before any pass was observed.
    """

    def __init__(self, work: PassWork, probe: Callable[[int, int], float] | None = None):
        self.work = work
        self._probe = probe
        self._speeds: deque[float] = deque(maxlen=RECENT_PASSES)
        self._speed: float | None = None
        self._lock = threading.Lock()

    @property
    def speed(self) -> float | None:
        """Operations per second: the median of the recent observed passes (None before any)."""
        return self._speed

    def seconds(self, rows: int, length: int) -> float:
        if self._speed is None and self._probe is not None:
            probe, self._probe = self._probe, None  # once, even when it fails
            self.observe(1, PROBE_LENGTH, probe(1, PROBE_LENGTH), probe=True)
        speed = self._speed or ASSUMED_FLOPS
        return self.work.operations(rows, length) / speed + PASS_OVERHEAD

    def observe(self, rows: int, length: int, seconds: float, probe: bool = False) -> None:
        """Take one pass's measured time into the speed (a pass under MIN_OBSERVED_SECONDS only
        when it is the probe, or the first pass of all)."""
        work = self.work.operations(rows, length)
        if work <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        if seconds < MIN_OBSERVED_SECONDS and not probe and self._speed is not None:
            return
        with self._lock:
            self._speeds.append(work / seconds)
            self._speed = statistics.median(self._speeds)


@dataclass
class CallLimits:
    """What one call may spend; see the module docstring. Thread-safe to cancel."""

    #: Estimated seconds the call's passes may need in all (None: no limit).
    max_seconds: float | None = None
    #: The setting that sets `max_seconds`, named in the refusal.
    max_seconds_setting: str = "max_seconds"
    #: `time.monotonic()` by which the call must be answered (None: none).
    deadline: float | None = None
    #: The setting that sets the deadline, named when it stops the call.
    deadline_setting: str = "deadline"
    #: Estimated seconds charged so far (a tournament's rounds add up).
    charged: float = 0.0
    #: Forward passes planned by the calls charged so far (the server's passes per request).
    passes: int = 0
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _reason: str = field(default="", repr=False)
    _stops: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def cancel(self, reason: str) -> None:
        """Let no further pass of the call start, and cut the running one short (any thread)."""
        with self._lock:
            if self._cancelled.is_set():
                return
            self._reason = reason
            self._cancelled.set()
            stops = list(self._stops)
        for stop in stops:
            stop()

    @contextlib.contextmanager
    def stopping(self, stop: Callable[[], None]) -> Iterator[None]:
        """While inside, a cancel calls `stop` (on the cancelling thread): how a running pass is
        cut short. Not armed when the call already was cancelled: a pass run then is one the
        stopped call still wants (the short pass that hands the arena back)."""
        with self._lock:
            armed = not self._cancelled.is_set()
            if armed:
                self._stops.append(stop)
        try:
            yield
        finally:
            if armed:
                with self._lock:
                    self._stops.remove(stop)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check(self) -> None:
        """Before a pass (or more encoding): CallStopped once cancelled or past the deadline."""
        if self._cancelled.is_set():
            raise CallStopped(self._reason or "cancelled")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise CallStopped("its deadline (%s) passed" % self.deadline_setting, deadline=True)

    def charge(self, seconds: float, what: str, passes: int = 0) -> None:
        """Add a planned call's estimate and its `passes`; refuse it before any of them run.

        `what` describes the planned passes for the refusal ("64 rows of up to 7400 tokens in
        32 passes")."""
        self.check()
        total = self.charged + seconds
        if self.max_seconds is not None and total > self.max_seconds:
            raise CallTooLarge(
                "this request needs an estimated %s of inference (%s), more than the %s one "
                "request may take (%s); send fewer states or questions, shorter states or a "
                "smaller max_len"
                % (format_seconds(total), what, format_seconds(self.max_seconds), self.max_seconds_setting)
            )
        if self.deadline is not None and time.monotonic() + seconds > self.deadline:
            raise CallStopped(
                "its estimated %s of inference (%s) cannot finish before its deadline (%s)"
                % (format_seconds(seconds), what, self.deadline_setting),
                deadline=True,
            )
        self.charged = total
        self.passes += passes


class GroupLimits(CallLimits):
    """The limits of a pass several requests share (`core.grouping.run_group`): the members'
    budgets summed, the latest of their deadlines, and stopped only once every member is."""

    def __init__(self, members: Sequence[CallLimits | None]):
        given = [m for m in members if m is not None]
        budgets = [m.max_seconds for m in given]
        deadlines = [m.deadline for m in given]
        first = given[0] if given else CallLimits()
        super().__init__(
            max_seconds=sum(b for b in budgets if b is not None) if given and None not in budgets else None,
            max_seconds_setting=first.max_seconds_setting,
            deadline=max(d for d in deadlines if d is not None) if given and None not in deadlines else None,
            deadline_setting=first.deadline_setting,
        )
        self.members = given

    @property
    def cancelled(self) -> bool:
        return bool(self.members) and all(m.cancelled for m in self.members)

    @contextlib.contextmanager
    def stopping(self, stop: Callable[[], None]) -> Iterator[None]:
        """`stop` once the last member still waiting is cancelled."""

        def when_all_gone() -> None:
            if self.cancelled:
                stop()

        with contextlib.ExitStack() as stack:
            if not self.cancelled:
                for member in self.members:
                    stack.enter_context(member.stopping(when_all_gone))
            yield

    def check(self) -> None:
        if self.cancelled:
            raise CallStopped("every request of the group went away")
        super().check()

    def charge(self, seconds: float, what: str, passes: int = 0) -> None:
        """The group's passes answer every member: each member counts them as its own."""
        super().charge(seconds, what, passes)
        for member in self.members:
            member.passes += passes


_CURRENT: ContextVar[CallLimits | None] = ContextVar("laya_onnx_call_limits", default=None)


def current_limits() -> CallLimits | None:
    """The limits the code running this call put around it, or None."""
    return _CURRENT.get()


@contextlib.contextmanager
def call_limits(limits: CallLimits | None) -> Iterator[CallLimits | None]:
    """Run the calls inside under `limits` (on this thread / context only)."""
    token = _CURRENT.set(limits)
    try:
        yield limits
    finally:
        _CURRENT.reset(token)


__all__ = [
    "CallLimits",
    "CallStopped",
    "CallTooLarge",
    "GroupLimits",
    "PassClock",
    "PassWork",
    "call_limits",
    "current_limits",
]
