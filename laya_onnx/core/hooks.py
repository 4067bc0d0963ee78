"""Prediction hooks: observe or reshape every call without forking the runtime.

The semantics are laya 0.4.15's (docs/semantics.md#hooks), so a hook written for `laya` works on
`ONNXAgent` unchanged: a `PredictContext` per public call, `on_predict_start` (may rewrite
states/questions or `ctx.skip(results)`), `on_error`, `on_predict_end` (may rewrite results);
process defaults, then installed hooks, then per-call hooks; sync or async methods; an optional
per-hook timeout.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from laya_onnx.core.errors import InvalidRequest, InvalidRequestType
from laya_onnx.core.notices import cut

HOOK_EVENTS = ("on_predict_start", "on_predict_end", "on_route", "on_load", "on_evict", "on_error")


_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def new_run_id() -> str:
    """`uuid.uuid4().hex` (version 4, RFC 4122 variant, from os.urandom) without building a UUID
    object: a third of the cost, and every call makes one."""
    return "%032x" % (int.from_bytes(os.urandom(16), "big") & _UUID4_CLEAR | _UUID4_SET)


@dataclass(eq=False)
class PredictContext:
    """Mutable state shared by every hook of one call (identity equality, so it is hashable)."""

    # As the caller passed them (laya does not copy them either) or as a start hook rewrote them:
    # any value; the agent checks what survives the start hooks before inference.
    states: Any
    questions: dict[Any, Any]
    run_id: str = field(default_factory=new_run_id)
    results: list[dict[str, Any]] | None = None
    decision: dict[str, Any] | None = None
    model: str | None = None
    agent: Any = None
    router: Any = None
    max_len: int | None = None
    head_max_len: int | None = None
    usage: dict[str, int] | None = None
    started_at: float = field(default_factory=time.perf_counter)
    elapsed_ms: float | None = None
    error: BaseException | None = None

    def skip(self, results: list[dict[str, Any]]) -> None:
        """Answer the call from a start hook: inference is skipped, end hooks still run."""
        if (
            isinstance(self.states, (list, tuple))
            and isinstance(results, (list, tuple))
            and len(results) not in (1, len(self.states))
        ):
            # A hook's misuse, not the caller's request: a plain ValueError (a 500 when served).
            raise ValueError(
                "ctx.skip() takes one result for the whole call or one per state in "
                "ctx.states (%d); got %d" % (len(self.states), len(results))
            )
        self.results = results


class Hook(Protocol):
    """What a hook is, structurally: any subset of the six event methods (others are skipped)."""

    def on_predict_start(self, ctx: PredictContext) -> None: ...
    def on_predict_end(self, ctx: PredictContext) -> None: ...
    def on_route(self, ctx: PredictContext) -> None: ...
    def on_load(self, ctx: PredictContext) -> None: ...
    def on_evict(self, ctx: PredictContext) -> None: ...
    def on_error(self, ctx: PredictContext) -> None: ...


#: A plain function given as on_predict_start= / on_predict_end=.
PredictHook = Callable[[PredictContext], None]
HookArg = Hook | Sequence[Hook] | None
PredictHookArg = PredictHook | Sequence[PredictHook] | None


class BaseHook:
    """Subclass and override only the events you need; every method is a no-op."""

    def on_predict_start(self, ctx: PredictContext) -> None:
        pass

    def on_predict_end(self, ctx: PredictContext) -> None:
        pass

    def on_route(self, ctx: PredictContext) -> None:
        pass

    def on_load(self, ctx: PredictContext) -> None:
        pass

    def on_evict(self, ctx: PredictContext) -> None:
        pass

    def on_error(self, ctx: PredictContext) -> None:
        pass


class _Callable:
    """A plain function given as on_predict_start= / on_predict_end=, seen as a one-event hook."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[PredictContext], Any], event: str):
        if not callable(fn):
            raise InvalidRequestType("%s must be callable, got %s" % (event, type(fn).__name__))
        self.fn = fn


class _StartAdapter(_Callable):
    def on_predict_start(self, ctx):
        return self.fn(ctx)


class _EndAdapter(_Callable):
    def on_predict_end(self, ctx):
        return self.fn(ctx)


def _many(value: Any) -> tuple:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def normalise_hooks(hooks: Any = None, on_predict_start: Any = None, on_predict_end: Any = None) -> list[Any]:
    """One ordered list: `hooks` entries, then start callables, then end callables."""
    out: list[Any] = []
    for hook in _many(hooks):
        if isinstance(hook, type):
            raise InvalidRequestType(
                "hooks entries must be instances, not classes; got %s. Instantiate it first." % hook.__name__
            )
        if not any(hasattr(hook, e) for e in HOOK_EVENTS):
            raise InvalidRequestType(
                "hooks entries must implement at least one of %s; got %s. Pass a plain "
                "callable as on_predict_start=/on_predict_end= instead."
                % (", ".join(HOOK_EVENTS), type(hook).__name__)
            )
        for event in HOOK_EVENTS:
            method = getattr(hook, event, None)
            if method is not None and not callable(method):
                raise InvalidRequestType(
                    "hooks entry %s.%s must be callable, got %s"
                    % (type(hook).__name__, event, type(method).__name__)
                )
        out.append(hook)
    out += [_StartAdapter(fn, "on_predict_start") for fn in _many(on_predict_start)]
    out += [_EndAdapter(fn, "on_predict_end") for fn in _many(on_predict_end)]
    return out


# -- process-wide defaults ---------------------------------------------------------------------
_DEFAULTS: list[Any] = []
_DEFAULTS_LOCK = threading.Lock()
#: Set while a Router runs an agent: the defaults already ran at the Router level, once.
_SKIP_DEFAULTS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "laya_onnx_skip_default_hooks", default=False
)


@contextmanager
def skipping_default_hooks():
    """Inside this block `compose_hooks` leaves the process-wide defaults out (a Router's agent
    call: the Router's own call already ran them)."""
    token = _SKIP_DEFAULTS.set(True)
    try:
        yield
    finally:
        _SKIP_DEFAULTS.reset(token)


def default_hooks() -> list[Any]:
    with _DEFAULTS_LOCK:
        return list(_DEFAULTS)


def set_default_hooks(hooks: Any = None, on_predict_start: Any = None, on_predict_end: Any = None) -> None:
    hooks = normalise_hooks(hooks, on_predict_start, on_predict_end)
    with _DEFAULTS_LOCK:
        _DEFAULTS[:] = hooks


def add_default_hook(hook: Any) -> None:
    hooks = normalise_hooks(hook)
    with _DEFAULTS_LOCK:
        _DEFAULTS.extend(hooks)


def clear_default_hooks() -> None:
    with _DEFAULTS_LOCK:
        _DEFAULTS.clear()


def compose_hooks(
    installed: Sequence[Any], hooks: Any = None, on_predict_start: Any = None, on_predict_end: Any = None
) -> list[Any]:
    """The hooks of one call: defaults (read now; none inside `skipping_default_hooks`),
    installed, then per-call."""
    defaults = [] if _SKIP_DEFAULTS.get() else default_hooks()
    if hooks is None and on_predict_start is None and on_predict_end is None:
        return defaults + list(installed)
    return defaults + list(installed) + normalise_hooks(hooks, on_predict_start, on_predict_end)


def validate_timeout(value: Any) -> float | None:
    """A positive finite number of seconds, or None for no limit."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidRequest(
            "hooks_timeout must be a positive finite number or None, not a bool; got %r" % (value,)
        )
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidRequest(
            "hooks_timeout must be a positive finite number or None; got %r" % (value,)
        ) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidRequest("hooks_timeout must be a positive finite number or None; got %r" % (value,))
    return seconds


# -- running hooks -----------------------------------------------------------------------------
_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or not _LOOP.is_running():
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, daemon=True, name="laya-onnx-async-hooks").start()
        return _LOOP


def _as_coroutine(awaitable: Any) -> Any:
    if asyncio.iscoroutine(awaitable):
        return awaitable

    async def wrap():
        return await awaitable

    return wrap()


def _refuse(awaitable: Any, reason: str) -> None:
    if asyncio.iscoroutine(awaitable):
        awaitable.close()  # never awaited, on purpose: no "was never awaited" warning
    raise ValueError("run_coroutine_sync: " + reason)


def run_coroutine_sync(awaitable: Any, loop: asyncio.AbstractEventLoop | None = None) -> Any:
    """Finish an awaitable from sync code and return its result.

    Without `loop`: `asyncio.run` when the calling thread runs no loop; on a thread that does, a
    background loop (blocking the caller's own loop on it would deadlock). An explicit `loop`
    must be running and must not be the calling thread's own: either mistake would block forever,
    so both raise ValueError instead.
    """
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is not None:
        if not loop.is_running():
            _refuse(awaitable, "the loop passed is not running")
        if loop is running:
            _refuse(
                awaitable,
                "the loop passed is running in the calling thread; blocking on it would deadlock",
            )
        return asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), loop).result()
    if running is None:
        return asyncio.run(_as_coroutine(awaitable))
    return asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), _background_loop()).result()


class AsyncHook:
    """A hook whose event methods are coroutines (or return awaitables), run to completion in
    the synchronous core by `run_coroutine_sync`; `loop=` sends every coroutine to that loop.

    >>> class Remote:
    ...     async def on_predict_end(self, ctx):
    ...         await ship(ctx.results)                                  # doctest: +SKIP
    >>> agent = laya_onnx.load(BUNDLE, hooks=[AsyncHook(Remote())])    # doctest: +SKIP
    """

    __slots__ = ("hook", "loop")

    def __init__(self, hook: Any, loop: asyncio.AbstractEventLoop | None = None):
        if isinstance(hook, type):
            raise InvalidRequestType("AsyncHook wraps an instance, not a class; got %s" % hook.__name__)
        if not any(hasattr(hook, event) for event in HOOK_EVENTS):
            raise InvalidRequestType(
                "AsyncHook wraps an object implementing at least one of %s; got %s"
                % (", ".join(HOOK_EVENTS), type(hook).__name__)
            )
        self.hook = hook
        self.loop = loop

    def _run(self, event: str, ctx: PredictContext) -> None:
        method = getattr(self.hook, event, None)
        if method is None:
            return
        result = method(ctx)
        if inspect.isawaitable(result):
            run_coroutine_sync(result, loop=self.loop)

    def on_predict_start(self, ctx: PredictContext) -> None:
        self._run("on_predict_start", ctx)

    def on_predict_end(self, ctx: PredictContext) -> None:
        self._run("on_predict_end", ctx)

    def on_route(self, ctx: PredictContext) -> None:
        self._run("on_route", ctx)

    def on_load(self, ctx: PredictContext) -> None:
        self._run("on_load", ctx)

    def on_evict(self, ctx: PredictContext) -> None:
        self._run("on_evict", ctx)

    def on_error(self, ctx: PredictContext) -> None:
        self._run("on_error", ctx)

    def __repr__(self) -> str:
        return "AsyncHook(%r)" % (self.hook,)


def _name(method: Any) -> str:
    return getattr(method, "__qualname__", None) or getattr(method, "__name__", None) or repr(method)


def _invoke(method: Any, ctx: PredictContext, timeout: float | None) -> None:
    def call():
        result = method(ctx)
        if inspect.isawaitable(result):
            run_coroutine_sync(result)

    if timeout is None:
        call()
        return
    failure: list[BaseException] = []
    context = contextvars.copy_context()

    def runner():
        try:
            context.run(call)
        except BaseException as exc:  # re-raised on the calling thread
            failure.append(exc)

    worker = threading.Thread(target=runner, daemon=True, name="laya-onnx-hook-timeout")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        # Threads cannot be interrupted: the hook runs on; the call is what the timeout protects.
        raise TimeoutError("laya: hook %s exceeded %gs" % (_name(method), timeout))
    if failure:
        raise failure[0]


def dispatch(
    hooks: Sequence[Any],
    event: str,
    ctx: PredictContext,
    *,
    raise_errors: bool = True,
    lock: Any = None,
    timeout: float | None = None,
) -> None:
    """Call `event` on every hook that has it, in order; failures raise or warn per `raise_errors`."""
    timeout = validate_timeout(timeout)
    for hook in hooks:
        method = getattr(hook, event, None)
        if method is None:
            continue
        try:
            if lock is not None:
                with lock:
                    _invoke(method, ctx, timeout)
            else:
                _invoke(method, ctx, timeout)
        except Exception as exc:
            if raise_errors:
                raise
            warnings.warn(
                "laya: hook %s.%s failed: %s" % (type(hook).__name__, event, cut(str(exc), 500)),
                RuntimeWarning,
                stacklevel=2,
            )


@contextmanager
def call_lifecycle(
    contexts: Sequence[PredictContext],
    fire: Callable[[str, PredictContext], Any],
    finish: Callable[[list[Any]], Any],
    group: bool = False,
):
    """The end of a public call's requests, as laya runs it, around the code that answers them.

    A failure fails every context with it and goes to `on_error` (a failing error hook is
    chained onto it, the original raised). Afterwards, failed or not, every context gets
    `elapsed_ms`, `usage` and `finish(results)` (the gate), then `on_predict_end`, in reverse of
    the order they started (a hook that sets something in start and resets it in end unwinds the
    last one first). Every context gets its end hooks even when another's raise; the first such
    failure is raised afterwards, and only when nothing else failed.

    `contexts` may grow inside the block (requests start one by one). `group` is a Router batch's
    checkpoint group, whose requests all started before any ends (laya's order): `usage` is summed
    on success only, before any end hook, so a malformed usage block fails the group like any
    other error, and `on_error` runs in the end loop, just before each `on_predict_end`. Without
    it `on_error` runs as soon as the call fails.
    """
    try:
        yield
        if group:
            usages = [aggregate_usage(ctx.results or []) for ctx in contexts]
            for ctx, usage in zip(contexts, usages, strict=True):
                ctx.usage = usage
    except BaseException as exc:
        for ctx in contexts:
            ctx.error = exc
            if not group:
                try:
                    fire("on_error", ctx)
                except BaseException as hook_exc:
                    exc.__context__ = hook_exc
        raise
    finally:
        _end_contexts(contexts, fire, finish, group)


def _end_contexts(
    contexts: Sequence[PredictContext],
    fire: Callable[[str, PredictContext], Any],
    finish: Callable[[list[Any]], Any],
    group: bool,
) -> None:
    now = time.perf_counter()
    for ctx in contexts:
        ctx.elapsed_ms = (now - ctx.started_at) * 1000.0
        if ctx.results is not None:
            if not group:
                ctx.usage = aggregate_usage(ctx.results)
            finish(ctx.results)
    first: BaseException | None = None
    for ctx in reversed(contexts):
        failed = ctx.error is not None
        for event in ("on_error", "on_predict_end") if group and failed else ("on_predict_end",):
            try:
                fire(event, ctx)
            except BaseException as hook_exc:
                if ctx.error is not None:
                    ctx.error.__context__ = hook_exc  # the original failure wins
                elif first is None:
                    first = hook_exc
    if first is not None:
        raise first


class HookRegistry:
    """A runtime-mutable hook list and the policy its hooks run under (laya's constructor
    arguments); a call in flight keeps the snapshot it started with."""

    hooks: list[Any] = []
    hooks_raise: bool = True
    hooks_concurrent: bool = True
    hooks_timeout: float | None = None
    #: Held around every hook call when built with `hooks_concurrent=False`.
    hooks_lock: threading.RLock | None = None
    _hooks_mutex: threading.Lock | None = None

    def _install_hooks(
        self,
        hooks: Any,
        on_predict_start: Any,
        on_predict_end: Any,
        hooks_raise: bool,
        hooks_concurrent: bool,
        hooks_timeout: float | None,
    ) -> None:
        self.hooks = normalise_hooks(hooks, on_predict_start, on_predict_end)
        self.hooks_raise = bool(hooks_raise)
        self.hooks_concurrent = bool(hooks_concurrent)
        self.hooks_timeout = validate_timeout(hooks_timeout)
        self.hooks_lock = None if hooks_concurrent else threading.RLock()
        self._hooks_mutex = threading.Lock()

    def _mutex(self) -> threading.Lock:
        if self._hooks_mutex is None:
            self._hooks_mutex = threading.Lock()
        return self._hooks_mutex

    def add_hook(self, hook: Any) -> HookRegistry:
        added = normalise_hooks(hook)
        with self._mutex():
            self.hooks = list(self.hooks) + added
        return self

    def remove_hook(self, hook: Any) -> bool:
        with self._mutex():
            before = list(self.hooks)
            self.hooks = [h for h in before if h is not hook]
            return len(self.hooks) < len(before)

    @contextmanager
    def hooks_installed(self, *hooks: Any):
        """Install hooks for a `with` block; on exit remove the latest occurrence of each."""
        added = normalise_hooks([h for arg in hooks for h in _many(arg)])
        with self._mutex():
            self.hooks = list(self.hooks) + added
        try:
            yield self
        finally:
            with self._mutex():
                current = list(self.hooks)
                for hook in added:
                    for i in range(len(current) - 1, -1, -1):
                        if current[i] is hook:
                            del current[i]
                            break
                self.hooks = current


def aggregate_usage(results: Sequence[Any]) -> dict[str, int]:
    """The call's token totals, as hooks see them in ctx.usage."""

    def total(key: str) -> int:
        return sum(
            int(((r.get("usage") if isinstance(r, dict) else None) or {}).get(key, 0) or 0) for r in results
        )

    return {"input_tokens": total("input_tokens"), "output_tokens": total("output_tokens")}
