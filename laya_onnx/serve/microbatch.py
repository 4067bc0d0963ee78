"""Micro-batching (opt-in, LAYA_BATCH_WINDOW_MS): concurrent single decisions as one forward.

A `/v1/systemone` request that passed its checks waits up to the window for others that ask
the same thing of the model — the same questions and the same controls that change the pass
or its decoding (`group_key`: max_len, head_max_len, lang, min_confidence) — and the group runs
as one `predict_batch` on the worker. Each caller gets its own result: the answer its request
alone would get (the rows are the same; only the padding of the pass differs, which moves the
last float bits, within the parity rule). Whatever goes wrong stays per request: when the
group's call raises, every member is run alone, so each gets its own answer or its own refusal
with the text it would have had alone. A group is also run member by member when its questions
are answered by elimination (`serve.tournament.plan_group`).

Nothing here knows the web framework: a front end hands `submit` a decision and an `execute`
coroutine function that runs a blocking callable on its inference worker (the aiohttp app: the
inference gate and its one-thread executor). Admission is untouched: a waiting request keeps
the slot it was admitted with, and the pass's memory budget is the agent's (`predict_batch`
splits passes to fit it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from laya_onnx.core.question_cache import question_key
from laya_onnx.serve import tournament_policy as elimination
from laya_onnx.serve.protocol import ServedAgent

#: Controls that change the pass or the decoding: requests group only when they agree on all.
GROUPED_CONTROLS = ("max_len", "head_max_len", "lang", "min_confidence")
#: A group runs as soon as it has this many requests, window or not.
DEFAULT_MAX_GROUP = 32

Execute = Callable[[Callable[[], Any]], Awaitable[Any]]


def group_key(questions: Any, controls: dict[str, Any]) -> Hashable | None:
    """What requests must share to run in one pass, or None when this one must run alone
    (questions or controls that have no type-exact snapshot, or a control we do not group on)."""
    if set(controls) - set(GROUPED_CONTROLS):
        return None
    qkey = question_key(questions)
    ckey = question_key({k: controls.get(k) for k in GROUPED_CONTROLS})
    if qkey is None or ckey is None:
        return None
    return (qkey, ckey)


@dataclass
class Outcome:
    """One member's result or exception, and the times its pass began and ended (perf_counter)."""

    result: Any = None
    error: Exception | None = None
    started: float = 0.0
    ended: float = 0.0


def run_group(
    agent: ServedAgent,
    states: list[Any],
    questions: Any,
    controls: dict[str, Any],
    configured_group: int,
) -> list[Outcome]:
    """The blocking pass of a group (on the worker): one `predict_batch`, or each member alone
    when that raised or the questions go through a tournament."""
    started = time.perf_counter()
    try:
        together = (
            elimination.plan_group(agent, questions, configured_group, controls.get("head_max_len")) is None
        )
    except Exception:  # refused while planning: each member is refused alone, as it would be
        together = False
    if together and len(states) > 1:
        try:
            results = agent.predict_batch(states, questions, **controls)
        except Exception:
            pass
        else:
            ended = time.perf_counter()
            return [Outcome(result=r, started=started, ended=ended) for r in results]
    outcomes = []
    for state in states:
        t0 = time.perf_counter()
        try:
            outcomes.append(
                Outcome(
                    result=elimination.predict(agent, state, questions, configured_group, **controls),
                    started=t0,
                    ended=time.perf_counter(),
                )
            )
        except Exception as exc:
            outcomes.append(Outcome(error=exc, started=t0, ended=time.perf_counter()))
    return outcomes


@dataclass
class _Group:
    questions: Any
    controls: dict[str, Any]
    states: list[Any] = field(default_factory=list)
    futures: list[asyncio.Future[Outcome]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class MicroBatcher:
    """Collects decisions per `group_key` for `window_s`, then runs each group with `execute`.

    Loop-bound: create it on the serving loop. `submit` returns the member's `Outcome` (its
    result or exception, never raised here), or raises what `execute` itself raised (the worker
    refused the whole group, e.g. a drain).
    """

    def __init__(
        self,
        agent: ServedAgent,
        window_s: float,
        execute: Execute,
        configured_group: int = 0,
        max_group: int = DEFAULT_MAX_GROUP,
    ):
        if not window_s > 0:
            raise ValueError("the batching window must be positive, got %r" % (window_s,))
        self.agent = agent
        self.window_s = window_s
        self.max_group = max(1, int(max_group))
        self._execute = execute
        self._configured_group = configured_group
        self._open: dict[Hashable, _Group] = {}
        self._running: set[asyncio.Task[None]] = set()
        #: How many groups ran and how many requests they held (for tests and metrics).
        self.groups_run = 0
        self.requests_run = 0

    async def submit(self, state: Any, questions: Any, controls: dict[str, Any]) -> Outcome:
        """Wait for this request's outcome: run with others that share its `group_key`, or alone."""
        loop = asyncio.get_running_loop()
        key = group_key(questions, controls)
        future: asyncio.Future[Outcome] = loop.create_future()
        if key is None:
            self._start(_Group(questions, dict(controls), [state], [future]))
            return await future
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = _Group(questions, dict(controls))
            group.timer = loop.call_later(self.window_s, self._close, key)
        group.states.append(state)
        group.futures.append(future)
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
        def work() -> list[Outcome]:
            return run_group(
                self.agent, group.states, group.questions, group.controls, self._configured_group
            )

        try:
            outcomes = await self._execute(work)
        except BaseException as exc:  # the worker refused the group: every member hears why
            for fut in group.futures:
                if not fut.done():
                    fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        self.groups_run += 1
        self.requests_run += len(outcomes)
        for fut, outcome in zip(group.futures, outcomes, strict=True):
            if not fut.done():
                fut.set_result(outcome)
