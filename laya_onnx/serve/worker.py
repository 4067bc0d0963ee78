"""The one inference worker's guards, on the serving loop: its lock, the drain
(serve/README.md#stopping-a-terminating-signal-drains), micro-batches of `/v1/systemone` decisions,
and the memory given back after requests (serve/README.md#memory)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from laya_onnx.core.grouping import Outcome, group_key, run_group
from laya_onnx.core.memory import process_rss
from laya_onnx.core.protocol import DecisionAgent
from laya_onnx.core.session import trim_heap
from laya_onnx.core.work import CallLimits, GroupLimits
from laya_onnx.serve.errors import SHUTTING_DOWN, ApiError
from laya_onnx.serve.settings import Settings

log = logging.getLogger("laya_onnx.serve")

T = TypeVar("T")

#: Seconds a refused client is told to wait: a restart or another replica takes over by then.
RETRY_AFTER_SECONDS = 5
#: How many recent passes the duration estimate looks at.
RECENT_PASSES = 32
#: Seconds between two judgements of the queue while draining.
REJUDGE_SECONDS = 0.5
WOULD_NOT_FINISH = "its pass would not finish before the drain's stop time"
#: Growth above the idle RSS (at startup) that triggers a release.
RELEASE_MARGIN = 64 * 1024 * 1024
#: Seconds between two releases at most (each collects garbage: a few ms to tens of ms).
RELEASE_INTERVAL = 5.0


class DrainRefusal(ApiError):
    """The 503 a request gets because the server is stopping; `reason` is for the log only."""

    def __init__(self, reason: str) -> None:
        super().__init__(503, SHUTTING_DOWN, {"Retry-After": str(RETRY_AFTER_SECONDS)})
        self.reason = reason


class Drain:
    """One app's shutdown state, on the serving loop: when answering must stop, and the counts."""

    def __init__(self) -> None:
        self.stop_at: float | None = None  # `loop.time()` every answer is due by; None: serving
        self.in_flight = 0  # decision requests past admission, not answered yet
        self.answered = 0  # answered (any status) after the drain began
        self.refused = 0  # refused with 503 because of the drain
        self.abandoned = 0  # passes still running at the stop time, left to the worker thread
        self.lock: WorkerLock | None = None
        self._writing = 0  # answers being written (any route): a drain waits for them too
        self._deadline: asyncio.Future[None] | None = None
        self._idle = asyncio.Event()  # no decision request in flight, no answer being written
        self._idle.set()

    @property
    def draining(self) -> bool:
        return self.stop_at is not None

    def bind(self, lock: WorkerLock) -> None:
        self.lock = lock
        self._deadline = asyncio.get_running_loop().create_future()

    def begin(self, stop_at: float) -> None:
        """Start draining, or bring the stop time forward: refuse what can no longer finish."""
        loop = asyncio.get_running_loop()
        first = self.stop_at is None
        self.stop_at = stop_at if self.stop_at is None else min(self.stop_at, stop_at)
        if self.lock is not None:
            self.lock.refuse_unfinishable(self.stop_at)
        loop.call_at(self.stop_at, self._judge)
        if first:
            loop.call_later(REJUDGE_SECONDS, self._judge)

    def _judge(self) -> None:
        """At the stop time, refuse every waiter; before it, judge the queue again, and REJUDGE_SECONDS later."""
        if self.lock is None or self.stop_at is None or self._deadline is None or self._deadline.done():
            return
        loop = asyncio.get_running_loop()
        if loop.time() + 1e-3 >= self.stop_at:
            self._deadline.set_result(None)
            self.lock.refuse_all()
        else:
            self.lock.refuse_unfinishable(self.stop_at)
            loop.call_at(min(loop.time() + REJUDGE_SECONDS, self.stop_at), self._judge)

    def refuse(self, reason: str) -> DrainRefusal:
        self.refused += 1
        return DrainRefusal(reason)

    async def run(self, handling: Awaitable[T]) -> T:
        """An admitted decision request as its own task, refused at the stop time (its pass abandoned)."""
        task = asyncio.ensure_future(handling)
        self.in_flight += 1
        self._settle()
        try:
            waiting: set[asyncio.Future] = {task} if self._deadline is None else {task, self._deadline}
            try:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                task.cancel()
                raise
            if task.done():
                failure = None if task.cancelled() else task.exception()
                if isinstance(failure, DrainRefusal):
                    # logged here, in the request's own task, so the line carries its id
                    log.info("503 while draining: %s", failure.reason)
                elif self.draining:
                    self.answered += 1
                return task.result()
            task.cancel()
            self.abandoned += 1
            refusal = self.refuse("its pass was still running at the stop time and is abandoned")
            log.warning("503 while draining: %s", refusal.reason)
            raise refusal
        finally:
            self.in_flight -= 1
            self._settle()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around writing one answer (whole or cut): a drain waits for it, within its grace."""
        self._writing += 1
        self._settle()
        try:
            yield
        finally:
            self._writing -= 1
            self._settle()

    def _settle(self) -> None:
        if self.in_flight or self._writing:
            self._idle.clear()
        else:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """No decision request in flight and no answer being written; False after `timeout`."""
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), max(0.0, timeout))
        except asyncio.TimeoutError:
            return False
        return True


class WorkerLock:
    """One pass at a time, first come first served; draining, a waiter that would not finish is refused."""

    def __init__(self, drain: Drain) -> None:
        self._drain = drain
        self.busy = False
        self._queue: deque[asyncio.Future[None]] = deque()
        self._recent: deque[float] = deque(maxlen=RECENT_PASSES)
        self._held_since: float | None = None
        self._holder: CallLimits | None = None

    @property
    def waiting(self) -> int:
        return sum(1 for fut in self._queue if not fut.done())

    def pass_estimate(self) -> float | None:
        return max(self._recent) if self._recent else None

    def refuse_unfinishable(self, stop_at: float) -> None:
        """Refuse, in queue order, the waiters that would not be answered by `stop_at`."""
        estimate = self.pass_estimate()
        # the running request's own estimate (0: not planned yet, or no time model)
        holding = self._holder.charged if self._holder is not None else 0.0
        if estimate is None and not holding > 0:
            return  # nothing measured yet: each waiter is judged when its turn comes
        now = asyncio.get_running_loop().time()
        free_at = now
        if self.busy:  # held, or handed to a waiter that has not resumed yet
            elapsed = now - self._held_since if self._held_since is not None else 0.0
            free_at += max(0.0, (holding if holding > 0 else estimate or 0.0) - elapsed)
        each = estimate or 0.0  # a waiter's own passes are not planned yet
        for fut in list(self._queue):
            if fut.done():
                continue
            if free_at + each > stop_at or free_at >= stop_at:
                fut.set_exception(self._drain.refuse(WOULD_NOT_FINISH))
            else:
                free_at += each

    def refuse_all(self) -> None:
        for fut in list(self._queue):
            if not fut.done():
                fut.set_exception(self._drain.refuse("still waiting for the worker at the stop time"))

    async def acquire(self, limits: CallLimits | None = None) -> None:
        """Wait for the worker; the holder's `limits` tell the drain its estimate."""
        loop = asyncio.get_running_loop()
        if not self.busy and not self._queue:
            self.busy = True
        else:
            fut: asyncio.Future[None] = loop.create_future()
            self._queue.append(fut)
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    self._hand_over()  # cancelled just as its turn came: pass the turn on
                raise
            finally:
                if fut in self._queue:
                    self._queue.remove(fut)
        stop_at, estimate = self._drain.stop_at, self.pass_estimate()
        if stop_at is not None and estimate is not None and loop.time() + estimate > stop_at:
            self._hand_over()
            raise self._drain.refuse(WOULD_NOT_FINISH)
        self._held_since = loop.time()
        self._holder = limits

    def release(self) -> None:
        if self._held_since is not None:
            self._recent.append(asyncio.get_running_loop().time() - self._held_since)
            self._held_since = None
        self._holder = None
        self._hand_over()
        if self._drain.stop_at is not None:
            # the estimate may have become known, or grown: a waiter sits through no turn it won't get
            self.refuse_unfinishable(self._drain.stop_at)

    def _hand_over(self) -> None:
        while self._queue:
            fut = self._queue.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.busy = False

    async def __aenter__(self) -> WorkerLock:
        await self.acquire()
        return self

    async def __aexit__(self, *_exc_info: object) -> None:
        self.release()


@dataclass
class _Group:
    questions: Any
    controls: dict[str, Any]
    states: list[Any] = field(default_factory=list)
    futures: list[asyncio.Future[Outcome]] = field(default_factory=list)
    limits: list[CallLimits | None] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class MicroBatcher:
    """Decisions sharing a `group_key`, collected for LAYA_BATCH_WINDOW_MS (or LAYA_BATCH_MAX_REQUESTS of
    them), run as one `core.grouping.run_group` with `execute` on the inference worker."""

    def __init__(self, agent: DecisionAgent, settings: Settings, execute: Callable[..., Awaitable[Any]]):
        self.agent = agent
        self.window_s = settings.batch_window_ms / 1000.0
        self.max_group = max(1, int(settings.batch_max_requests))
        self._execute = execute
        self._configured_group = settings.tournament_group
        self._open: dict[Hashable, _Group] = {}
        self._running: set[asyncio.Task[None]] = set()

    async def submit(
        self, state: Any, questions: Any, controls: dict[str, Any], limits: CallLimits | None = None
    ) -> Outcome:
        """This request's `Outcome`, run with its group or alone; raises what `execute` raised."""
        loop = asyncio.get_running_loop()
        key = group_key(questions, controls)
        future: asyncio.Future[Outcome] = loop.create_future()
        if key is None:
            self._start(_Group(questions, dict(controls), [state], [future], [limits]))
            return await future
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = _Group(questions, dict(controls))
            group.timer = loop.call_later(self.window_s, self._close, key)
        group.states.append(state)
        group.futures.append(future)
        group.limits.append(limits)
        if len(group.states) >= self.max_group:
            self._close(key)
        return await future

    def _close(self, key: Hashable) -> None:
        group = self._open.pop(key, None)
        if group is None:
            return
        if group.timer is not None:
            group.timer.cancel()
        self._start(group)

    def _start(self, group: _Group) -> None:
        task = asyncio.get_running_loop().create_task(self._run(group))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, group: _Group) -> None:
        group_args = (group.states, group.questions, group.controls, self._configured_group, group.limits)
        work = partial(run_group, self.agent, *group_args)
        try:
            outcomes = await self._execute(work, GroupLimits(group.limits))
        except BaseException as exc:  # the worker refused the group: every member hears why
            for fut in group.futures:
                if not fut.done():
                    fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for fut, outcome in zip(group.futures, outcomes, strict=True):
            if not fut.done():
                fut.set_result(outcome)


class MemoryKeeper:
    """One per app, on its loop: `start()` once serving, `after_request()` after each decision."""

    def __init__(self) -> None:
        self.baseline: int | None = None
        self._last = -float("inf")  # loop time of the last release
        self._task: asyncio.Task[None] | None = None
        self._later: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.baseline = process_rss()["rss_bytes"]

    def after_request(self) -> None:
        """Release when the RSS is up by the margin; if one ran too recently, look again later."""
        if self.baseline is None or (self._task is not None and not self._task.done()):
            return
        now = process_rss()["rss_bytes"]
        if now is None or now - self.baseline <= RELEASE_MARGIN:
            return
        loop = asyncio.get_running_loop()
        wait = self._last + RELEASE_INTERVAL - loop.time()
        if wait > 0:
            if self._later is None:
                self._later = loop.call_later(wait, self._look_again)
            return
        self._last = loop.time()
        self._task = loop.create_task(self._release(now))

    def _look_again(self) -> None:
        self._later = None
        self.after_request()

    async def _release(self, before: int) -> None:
        """Collect garbage and hand the C heap's free pages back to the OS, off the loop."""
        await asyncio.to_thread(gc.collect)
        await asyncio.to_thread(trim_heap)
        after = process_rss()["rss_bytes"] or before
        log.info("gave memory back after a request: RSS %d -> %d MiB", before >> 20, after >> 20)
