"""Micro-batching: concurrent `/v1/systemone` decisions gathered to run as `core.grouping.run_group`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from laya_onnx.core.grouping import Outcome, group_key, run_group
from laya_onnx.core.protocol import DecisionAgent
from laya_onnx.core.work import CallLimits, GroupLimits
from laya_onnx.serve.settings import Settings

#: Runs a blocking callable on the worker under the given limits.
Execute = Callable[[Callable[[], Any], CallLimits | None], Awaitable[Any]]


@dataclass
class _Group:
    questions: Any
    controls: dict[str, Any]
    states: list[Any] = field(default_factory=list)
    futures: list[asyncio.Future[Outcome]] = field(default_factory=list)
    limits: list[CallLimits | None] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class MicroBatcher:
    """Decisions that share a `group_key`, collected for LAYA_BATCH_WINDOW_MS (or until there are
    LAYA_BATCH_MAX_REQUESTS), then run as one group with `execute` on the inference worker."""

    def __init__(self, agent: DecisionAgent, settings: Settings, execute: Execute):
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
