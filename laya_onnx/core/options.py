"""One public call's options, resolved once: which hooks run and how, and the confidence gate.

Every answering path (`ONNXAgent.predict`/`predict_batch`/`predict_long`, the `Router`'s,
`decide`) takes laya's keyword arguments (`hooks`, `on_predict_start`, `on_predict_end`,
`hooks_raise`, `hooks_timeout`, `min_confidence`), resolves them here against the runner's own
settings, and hands the one `CallOptions` down; the hook lifecycle runs from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

from laya_onnx.core import tracing
from laya_onnx.core.gate import Threshold, apply_confidence_gate, check_min_confidence
from laya_onnx.core.hooks import (
    HookRegistry,
    PredictContext,
    call_lifecycle,
    compose_hooks,
    dispatch,
    validate_timeout,
)


def resolve_min_confidence(value: Any) -> Threshold | None:
    """A validated `min_confidence` (a threshold or a per-bucket map), or None for no gate."""
    return None if value is None else check_min_confidence(value)


@dataclass(frozen=True)
class CallOptions:
    """The hooks of one call in the order they run (process defaults, installed, per-call), the
    failure and time policy they run under, and the call's confidence gate."""

    hooks: tuple[Any, ...] = ()
    raise_errors: bool = True
    timeout: float | None = None
    #: Held around every hook when the runner was built with `hooks_concurrent=False`.
    lock: Any = None
    min_confidence: Threshold | None = None

    @classmethod
    def resolve(
        cls,
        runner: HookRegistry,
        hooks: Any = None,
        on_predict_start: Any = None,
        on_predict_end: Any = None,
        hooks_raise: bool | None = None,
        hooks_timeout: float | None = None,
        min_confidence: Any = None,
    ) -> CallOptions:
        """The per-call arguments over the runner's settings (None: the runner's value)."""
        gate = resolve_min_confidence(min_confidence)
        return cls(
            hooks=tuple(compose_hooks(runner.hooks, hooks, on_predict_start, on_predict_end)),
            raise_errors=runner.hooks_raise if hooks_raise is None else bool(hooks_raise),
            timeout=runner.hooks_timeout if hooks_timeout is None else validate_timeout(hooks_timeout),
            lock=runner.hooks_lock,
            min_confidence=gate,
        )

    def with_hook(self, hook: Any) -> CallOptions:
        """These options with `hook` running after every other."""
        return replace(self, hooks=(*self.hooks, hook))

    def fire(self, event: str, ctx: PredictContext) -> None:
        """Run `event` on every hook of the call that has it (a `laya.hooks` span when traced)."""
        if not self.hooks:
            return
        with tracing.span("laya.hooks", {"laya.hooks.event": event}):
            dispatch(
                self.hooks, event, ctx, raise_errors=self.raise_errors, lock=self.lock, timeout=self.timeout
            )

    def gate(self, results: list[Any]) -> None:
        apply_confidence_gate(results, self.min_confidence)

    def lifecycle(
        self, contexts: Sequence[PredictContext], group: bool = False
    ) -> AbstractContextManager[None]:
        """`hooks.call_lifecycle` with these hooks and this gate."""
        return call_lifecycle(contexts, self.fire, self.gate, group=group)


__all__ = ["CallOptions", "resolve_min_confidence"]
