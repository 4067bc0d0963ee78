"""Micro-batching (opt-in, LAYA_BATCH_WINDOW_MS): concurrent single decisions as one forward.

A `/v1/systemone` request that passed its checks waits up to the window for others that ask
the same thing of the model (`core.grouping.group_key`), and the group runs on the worker as
`core.grouping.run_group` does: one `predict_batch`, each caller getting the answer its request
alone would get, or its own refusal. This module is the asynchronous window only.

Nothing here knows the web framework: a front end hands `submit` a decision and an `execute`
coroutine function that runs a blocking callable on its inference worker (the aiohttp app: the
worker lock and its one-thread executor). Admission is untouched: a waiting request keeps
the slot it was admitted with, and the pass's memory budget is the agent's (`predict_batch`
splits passes to fit it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from laya_onnx.core.grouping import Outcome, group_key, run_group
from laya_onnx.core.protocol import DecisionAgent
from laya_onnx.core.work import CallLimits, GroupLimits

#: A group runs as soon as it has this many requests, window or not.
DEFAULT_MAX_GROUP = 32

#: Runs a blocking callable on the worker under the given limits.
Execute = Callable[[Callable[[], Any], CallLimits | None], Awaitable[Any]]


@dataclass
class _Group:
    questions: Any
    controls: dict[str, Any]
    states: list[Any] = field(default_factory=list)
    futures: list[asyncio.Future[Outcome]] = field(default_factory=list)
    #: Each member's own limits (the group's pass runs under their `GroupLimits`).
    limits: list[CallLimits | None] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class MicroBatcher:
    """Collects decisions per `group_key` for `window_s`, then runs each group with `execute`.

    Loop-bound: create it on the serving loop. `submit` returns the member's `Outcome` (its
    result or exception, never raised here), or raises what `execute` itself raised (the worker
    refused the whole group, e.g. a drain).
    """

    def __init__(
        self,
        agent: DecisionAgent,
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

    async def submit(
        self, state: Any, questions: Any, controls: dict[str, Any], limits: CallLimits | None = None
    ) -> Outcome:
        """Wait for this request's outcome: run with others that share its `group_key`, or alone
        (under `limits`, this request's own)."""
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
        def work() -> list[Outcome]:
            return run_group(
                self.agent,
                group.states,
                group.questions,
                group.controls,
                self._configured_group,
                group.limits,
            )

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
