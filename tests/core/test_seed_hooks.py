"""Every example of a hooks guide written for laya's API (in Russian) runs with `laya_onnx` in
place of `laya`, on the tiny bundle, and does what the guide says.

Each test quotes its block as the guide writes it (only `laya` -> `laya_onnx`); the names the
page leaves to the reader (`ship`, `Tracer`, `Metrics`, `log`, `redact`, ...) are defined here
as small recorders, so the assertions can see what happened. The page's model id
"convaiinnovations/laya" is the english checkpoint: `laya_onnx.load` finds its bundle in
$LAYA_MODELS_DIR, which the `models_dir` fixture points at the tiny english bundle.

The Router blocks (`Router(...)`, `router.route(...)`, on_route/on_load/on_evict) belong to the
Router; they are tested with it.
"""

from __future__ import annotations

import asyncio
import collections.abc
import dataclasses
import hashlib
import inspect
import json
import threading
import typing

import pytest

import laya_onnx

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the user want a refund?"},
    "topic": {"type": "choice", "instructions": "Topic?", "criteria": {"billing": None, "bug": None}},
}
STATES = ["I was charged twice, please refund me.", "The app crashes on start."]
#: How long a call that should return at once may take before the test calls it a hang.
HANG_GUARD_S = 60.0


@pytest.fixture
def models_dir(bundle_factory, tmp_path, monkeypatch):
    (tmp_path / "english").symlink_to(bundle_factory("tiny-english"), target_is_directory=True)
    monkeypatch.setenv("LAYA_MODELS_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(autouse=True)
def no_default_hooks():
    laya_onnx.core.hooks.clear_default_hooks()
    yield
    laya_onnx.core.hooks.clear_default_hooks()


def count_passes(agent) -> list[int]:
    """Counts the agent's forward passes (a skipped call runs none)."""
    passes = [0]
    run = agent.session.run

    def counted(feeds, **options):
        passes[0] += 1
        return run(feeds, **options)

    agent.session.run = counted
    return passes


def within(seconds: float, fn, *args, **kwargs):
    """fn(*args) on a thread: its result or exception, or a test failure (not a hang) when it
    has not returned after `seconds`."""
    out: dict[str, typing.Any] = {}

    def runner():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed back to the test
            out["error"] = exc

    worker = threading.Thread(target=runner, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail("%s did not return within %gs: it hangs" % (getattr(fn, "__name__", fn), seconds))
    if "error" in out:
        raise out["error"]
    return out.get("value")


# -- "Справочник по API": the imports ----------------------------------------------------------
def test_the_page_imports():
    # "everything on this page imports from laya (the common names) or laya.hooks (all of it)"
    from laya_onnx import AsyncHook, BaseHook, Hook, PredictContext, PredictHook, hooks
    from laya_onnx.core.hooks import HOOK_EVENTS, aggregate_usage, dispatch, normalise_hooks

    assert hooks is laya_onnx.core.hooks
    for name in ("PredictContext", "Hook", "PredictHook", "BaseHook", "AsyncHook"):
        assert getattr(laya_onnx, name) is getattr(hooks, name)
    assert (Hook, PredictContext, PredictHook, AsyncHook, BaseHook) == (
        hooks.Hook,
        hooks.PredictContext,
        hooks.PredictHook,
        hooks.AsyncHook,
        hooks.BaseHook,
    )
    assert all(callable(f) for f in (aggregate_usage, dispatch, normalise_hooks))
    assert HOOK_EVENTS == (
        "on_predict_start",
        "on_predict_end",
        "on_route",
        "on_load",
        "on_evict",
        "on_error",
    )


# -- PredictContext -----------------------------------------------------------------------------
def test_predict_context_is_the_documented_dataclass():
    from laya_onnx import PredictContext

    fields = [(f.name, f.default) for f in dataclasses.fields(PredictContext)]
    assert [name for name, _ in fields] == [
        "states",
        "questions",
        "run_id",
        "results",
        "decision",
        "model",
        "agent",
        "router",
        "max_len",
        "head_max_len",
        "usage",
        "started_at",
        "elapsed_ms",
        "error",
    ]
    a, b = PredictContext(states=["x"], questions={}), PredictContext(states=["x"], questions={})
    # "identity equality (eq=False): the context is hashable and two contexts are never equal"
    assert a != b and a == a and len({a, b}) == 2
    assert len(a.run_id) == 32 and a.run_id != b.run_id  # uuid4 hex
    assert a.results is None and a.elapsed_ms is None and isinstance(a.started_at, float)


# -- PredictContext.skip(results): the cache example -------------------------------------------
def test_the_cache_example_skips_inference_on_a_hit(models_dir):
    # The block as the page writes it (laya -> laya_onnx).
    CACHE = {}

    def key(ctx, index):
        # Not sort_keys=True: criteria order is positional, so two orders are two questions,
        # and the checkpoint and token budget change the answer too.
        payload = json.dumps(
            [ctx.states[index], ctx.questions, ctx.model, ctx.max_len, ctx.head_max_len], default=str
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    def cache_read(ctx):
        hits = [CACHE.get(key(ctx, i)) for i in range(len(ctx.states))]
        if all(hit is not None for hit in hits):
            ctx.skip(hits)  # one entry per state, same shape as predict_batch's return

    def cache_write(ctx):
        for i, result in enumerate(ctx.results or []):
            CACHE[key(ctx, i)] = result

    agent = laya_onnx.load("convaiinnovations/laya", on_predict_start=cache_read, on_predict_end=cache_write)
    # What the page says of it.
    passes = count_passes(agent)
    first = agent.predict_batch(STATES, QUESTIONS)
    assert passes[0] == 1 and len(CACHE) == 2
    again = agent.predict_batch(STATES, QUESTIONS)
    assert passes[0] == 1, "a full hit must skip the forward pass"
    assert again == first
    assert agent.predict(STATES[0], QUESTIONS) == first[0] and passes[0] == 1
    # the token budget is part of the key: another max_len is another answer, so inference runs
    agent.predict_batch(STATES, QUESTIONS, max_len=64)
    assert passes[0] == 2 and len(CACHE) == 4
    # two criteria orders are two questions
    reordered = {"topic": {**QUESTIONS["topic"], "criteria": {"bug": None, "billing": None}}}
    agent.predict(STATES[0], {**QUESTIONS, **reordered})
    assert passes[0] == 3


def test_skip_runs_the_end_hooks_and_returns_what_was_given(models_dir):
    """ "Called from on_predict_start it sets ctx.results, so the forward pass is skipped;
    on_predict_end still runs, and the given results are returned."""
    canned = {"answers": {}, "model": "cached"}
    ends = []
    agent = laya_onnx.load(
        "convaiinnovations/laya",
        on_predict_start=lambda ctx: ctx.skip([canned]),
        on_predict_end=lambda ctx: ends.append(ctx.results),
    )
    passes = count_passes(agent)
    assert agent.predict(STATES[0], QUESTIONS) is canned
    assert passes[0] == 0 and ends == [[canned]]


# -- the Hook protocol --------------------------------------------------------------------------
def test_hook_is_a_protocol_of_the_six_events(models_dir):
    from laya_onnx import Hook, PredictContext

    assert getattr(Hook, "_is_protocol", False)
    declared = [n for n, v in vars(Hook).items() if n.startswith("on_") and callable(v)]
    assert declared == list(laya_onnx.core.hooks.HOOK_EVENTS)
    for name in declared:
        assert list(inspect.signature(getattr(Hook, name)).parameters) == ["self", "ctx"]
        assert typing.get_type_hints(getattr(Hook, name))["ctx"] is PredictContext

    class OnlyEnd:  # "implement any subset of the methods; the rest are skipped"
        def __init__(self):
            self.seen = []
            self.extra = "free attributes and methods are fine"

        def helper(self):
            return 1

        def on_predict_end(self, ctx):
            self.seen.append(ctx.run_id)

    hook = OnlyEnd()
    agent = laya_onnx.load("convaiinnovations/laya", hooks=[hook])
    agent.predict(STATES[0], QUESTIONS)
    assert len(hook.seen) == 1

    class NotCallable:  # "one of the six defined as non-callable fails the configuration at once"
        on_predict_start = "nope"

    with pytest.raises(TypeError, match="hooks entry NotCallable.on_predict_start must be callable, got str"):
        laya_onnx.load("convaiinnovations/laya", hooks=[NotCallable()])


# -- BaseHook ----------------------------------------------------------------------------------
def test_the_base_hook_audit_example(models_dir):
    shipped = []

    def ship(run_id, results):
        shipped.append((run_id, results))

    # The block as the page writes it.
    from laya_onnx import BaseHook

    class Audit(BaseHook):
        def on_predict_end(self, ctx):
            ship(ctx.run_id, ctx.results)

    seen_ids = []
    agent = laya_onnx.load(
        "convaiinnovations/laya", hooks=[Audit()], on_predict_start=lambda ctx: seen_ids.append(ctx.run_id)
    )
    results = agent.predict_batch(STATES, QUESTIONS)
    assert shipped == [(seen_ids[0], results)]
    # every other event is an inherited no-op
    for event in laya_onnx.core.hooks.HOOK_EVENTS:
        assert getattr(BaseHook(), event)(None) is None


# -- PredictHook -------------------------------------------------------------------------------
def test_predict_hook_is_a_plain_callable_one_or_many(models_dir):
    from laya_onnx import PredictContext, PredictHook

    # PredictHook = Callable[[PredictContext], None]
    assert typing.get_origin(PredictHook) is collections.abc.Callable
    params, returns = typing.get_args(PredictHook)
    assert params == [PredictContext] and returns in (None, type(None))
    calls = []
    one: PredictHook = lambda ctx: calls.append("one")  # noqa: E731
    many: list[PredictHook] = [lambda ctx: calls.append("a"), lambda ctx: calls.append("b")]
    agent = laya_onnx.load("convaiinnovations/laya", on_predict_start=one, on_predict_end=many)
    agent.predict(STATES[0], QUESTIONS)
    assert calls == ["one", "a", "b"]
    # "hooks= does not take plain callables: a bare callable does not say which event it is for"
    with pytest.raises(TypeError, match="Pass a plain callable as on_predict_start=/on_predict_end= instead"):
        laya_onnx.load("convaiinnovations/laya", hooks=[one])


# -- registration at run time ------------------------------------------------------------------
def test_runtime_registration_example(models_dir):
    seen = []

    class Named(laya_onnx.BaseHook):
        def __init__(self, name):
            self.name = name

        def on_predict_start(self, ctx):
            seen.append(self.name)

    tracer, debug = Named("tracer"), Named("debug")
    agent = laya_onnx.load("convaiinnovations/laya")
    state, questions = STATES[0], QUESTIONS

    # The block as the page writes it.
    agent.add_hook(tracer)  # one hook or a sequence; returns self for chaining
    agent.remove_hook(tracer)  # by identity; True if it was installed

    with agent.hooks_installed(debug):  # installed for the block, removed on exit
        agent.system_one(state, questions)

    assert seen == ["debug"] and agent.hooks == []
    assert agent.add_hook(tracer) is agent
    assert agent.remove_hook(tracer) is True and agent.remove_hook(tracer) is False
    agent.add_hook([tracer, debug])
    with pytest.raises(RuntimeError):
        with agent.hooks_installed(Named("scoped")):
            raise RuntimeError("the block fails")
    assert agent.hooks == [tracer, debug]  # the previous list, also after an exception
    with pytest.raises(TypeError):
        agent.add_hook(print)  # add_hook takes what hooks= takes, not plain callables


# -- process-wide defaults ---------------------------------------------------------------------
def test_process_defaults_example(models_dir):
    order = []

    class Tracer(laya_onnx.BaseHook):
        def on_predict_start(self, ctx):
            order.append("tracer")

    class Metrics(laya_onnx.BaseHook):
        def on_predict_start(self, ctx):
            order.append("metrics")

    class Installed(laya_onnx.BaseHook):
        def on_predict_start(self, ctx):
            order.append("installed")

    agent = laya_onnx.load("convaiinnovations/laya", hooks=[Installed()])  # made before the defaults

    # The block as the page writes it.
    from laya_onnx import hooks

    hooks.set_default_hooks(hooks=[Tracer()])  # replaces the set, accepts the hooks= arguments
    hooks.add_default_hook(Metrics())  # appends
    hooks.clear_default_hooks()  # removes everything
    hooks.default_hooks()  # a copy of the current list

    hooks.compose_hooks(agent.hooks)  # defaults + installed (advanced)

    assert hooks.default_hooks() == []
    hooks.set_default_hooks(hooks=[Tracer()])
    hooks.add_default_hook(Metrics())
    copy = hooks.default_hooks()
    copy.clear()
    assert len(hooks.default_hooks()) == 2  # a copy
    assert [type(h).__name__ for h in hooks.compose_hooks(agent.hooks)] == ["Tracer", "Metrics", "Installed"]
    # defaults first, then installed, then per call; read at call time
    agent.predict(STATES[0], QUESTIONS, on_predict_start=lambda ctx: order.append("per-call"))
    assert order == ["tracer", "metrics", "installed", "per-call"]
    hooks.clear_default_hooks()
    order.clear()
    agent.predict(STATES[0], QUESTIONS)
    assert order == ["installed"]


# -- async hooks -------------------------------------------------------------------------------
def test_the_async_hook_example(models_dir):
    shipped = []

    async def ship(results):
        await asyncio.sleep(0)
        shipped.append(results)

    # The block as the page writes it.
    from laya_onnx import AsyncHook

    class Remote:
        async def on_predict_end(self, ctx):
            await ship(ctx.results)

    agent = laya_onnx.load("convaiinnovations/laya", hooks=[AsyncHook(Remote())])

    results = agent.predict_batch(STATES, QUESTIONS)
    assert shipped == [results]


def test_a_plain_async_callable_works_too(models_dir):
    seen = []

    async def remember(ctx):
        await asyncio.sleep(0)
        seen.append(ctx.run_id)

    agent = laya_onnx.load("convaiinnovations/laya", on_predict_start=remember, on_predict_end=remember)
    agent.predict(STATES[0], QUESTIONS)
    assert len(seen) == 2 and seen[0] == seen[1]


class LoopProbe:
    """Records the loop (and thread) its coroutine ran on."""

    def __init__(self):
        self.loops = []

    async def on_predict_end(self, ctx):
        self.loops.append((asyncio.get_running_loop(), threading.current_thread()))


def test_without_a_running_loop_the_coroutine_gets_its_own(models_dir):
    probe = LoopProbe()
    agent = laya_onnx.load("convaiinnovations/laya", hooks=[laya_onnx.AsyncHook(probe)])
    agent.predict(STATES[0], QUESTIONS)
    agent.predict(STATES[0], QUESTIONS)
    (loop1, thread1), (loop2, thread2) = probe.loops
    # asyncio.run: a fresh loop per call, on the calling thread, closed afterwards
    assert thread1 is threading.current_thread() and loop1 is not loop2 and loop1.is_closed()


def test_inside_a_running_loop_a_background_loop_runs_it(models_dir):
    probe = LoopProbe()
    agent = laya_onnx.load("convaiinnovations/laya", hooks=[laya_onnx.AsyncHook(probe)])

    async def caller():
        agent.predict(STATES[0], QUESTIONS)  # a sync call from async code blocks this loop
        return asyncio.get_running_loop()

    callers_loop = within(HANG_GUARD_S, asyncio.run, caller())
    ((loop, thread),) = probe.loops
    assert loop is not callers_loop and thread is not threading.current_thread()
    assert loop.is_running()  # the dedicated background loop stays up for the next call


def test_an_explicit_running_loop_receives_the_coroutine(models_dir):
    probe = LoopProbe()
    target = asyncio.new_event_loop()
    runner = threading.Thread(target=target.run_forever, daemon=True)
    runner.start()
    try:
        agent = laya_onnx.load("convaiinnovations/laya", hooks=[laya_onnx.AsyncHook(probe, loop=target)])
        within(HANG_GUARD_S, agent.predict, STATES[0], QUESTIONS)

        async def caller():  # from inside another running loop too
            agent.predict(STATES[0], QUESTIONS)

        within(HANG_GUARD_S, asyncio.run, caller())
        assert [loop for loop, _ in probe.loops] == [target, target]
        assert all(thread is runner for _, thread in probe.loops)
    finally:
        target.call_soon_threadsafe(target.stop)
        runner.join(5)
        target.close()


def test_a_stopped_loop_is_a_value_error_not_a_hang(models_dir):
    stopped = asyncio.new_event_loop()
    try:
        agent = laya_onnx.load(
            "convaiinnovations/laya", hooks=[laya_onnx.AsyncHook(LoopProbe(), loop=stopped)]
        )
        with pytest.raises(ValueError, match="^run_coroutine_sync: the loop passed is not running$"):
            within(HANG_GUARD_S, agent.predict, STATES[0], QUESTIONS)
    finally:
        stopped.close()


def test_the_callers_own_loop_is_a_value_error_not_a_hang(models_dir):
    agent = laya_onnx.load("convaiinnovations/laya")

    async def caller():
        own = asyncio.get_running_loop()
        agent.predict(STATES[0], QUESTIONS, hooks=[laya_onnx.AsyncHook(LoopProbe(), loop=own)])

    with pytest.raises(ValueError, match="is running in the calling thread; blocking on it would deadlock"):
        within(HANG_GUARD_S, asyncio.run, caller())


@pytest.mark.reference
def test_async_hook_misuse_texts_equal_the_reference():
    from laya import hooks as ref

    from laya_onnx.core.errors import reference_kind

    stopped = asyncio.new_event_loop()

    async def nothing():
        return None

    def refusal(module, make_coro, loop):
        try:
            within(HANG_GUARD_S, module.run_coroutine_sync, make_coro(), loop)
        except Exception as exc:
            return reference_kind(exc), str(exc)
        return None

    try:
        assert refusal(laya_onnx.core.hooks, nothing, stopped) == refusal(ref, nothing, stopped) is not None
    finally:
        stopped.close()

    # the caller's own loop: run_coroutine_sync called on the loop's thread, not from within()
    def own_loop(module):
        async def inner():
            try:
                module.run_coroutine_sync(nothing(), loop=asyncio.get_running_loop())
            except Exception as exc:
                return reference_kind(exc), str(exc)

        return within(HANG_GUARD_S, asyncio.run, inner())

    assert own_loop(laya_onnx.core.hooks) == own_loop(ref) is not None
    for bad in (LoopProbe, object()):
        try:
            ref.AsyncHook(bad)
        except TypeError as exc:
            expected = str(exc)
        with pytest.raises(TypeError) as ours:
            laya_onnx.AsyncHook(bad)
        assert str(ours.value) == expected


def test_a_hook_without_async_methods_is_unaffected(models_dir):
    seen = []

    class Sync(laya_onnx.BaseHook):
        def on_predict_end(self, ctx):
            seen.append(threading.current_thread())

    agent = laya_onnx.load("convaiinnovations/laya", hooks=[laya_onnx.AsyncHook(Sync())])
    agent.predict(STATES[0], QUESTIONS)
    assert seen == [threading.current_thread()]


# -- the configuration surface -----------------------------------------------------------------
HOOK_PARAMETERS = {"hooks": None, "on_predict_start": None, "on_predict_end": None}


def _defaults(fn) -> dict[str, typing.Any]:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items()}


def test_load_and_the_agent_take_the_documented_hook_arguments():
    """`load(..., hooks=None, on_predict_start=None, on_predict_end=None, hooks_raise=True,
    hooks_concurrent=True, hooks_timeout=None)` and the same on the agent's constructor."""
    documented = {**HOOK_PARAMETERS, "hooks_raise": True, "hooks_concurrent": True, "hooks_timeout": None}
    for fn in (laya_onnx.load, laya_onnx.ONNXAgent.__init__):
        defaults = _defaults(fn)
        assert {k: defaults.get(k, "missing") for k in documented} == documented, fn


@pytest.mark.parametrize("method", ["system_one", "predict", "predict_batch", "predict_long"])
def test_per_call_methods_take_the_documented_hook_arguments(method):
    """hooks_raise / hooks_timeout per call default to None ("use the instance's value");
    hooks_concurrent exists only on the instance."""
    fn = getattr(laya_onnx.ONNXAgent, method, None)
    if fn is None:
        pytest.skip("ONNXAgent.%s is not there yet (issue 6's predict_long part)" % method)
    documented = {**HOOK_PARAMETERS, "hooks_raise": None, "hooks_timeout": None}
    if method != "predict_long":
        documented.update(max_len=None, head_max_len=None)
    defaults = _defaults(fn)
    assert {k: defaults.get(k, "missing") for k in documented} == documented
    assert "hooks_concurrent" not in defaults


def test_per_call_hooks_raise_and_timeout_override_the_instance(models_dir):
    def boom(ctx):
        raise RuntimeError("hook failed")

    agent = laya_onnx.load("convaiinnovations/laya", on_predict_end=boom)  # hooks_raise=True
    with pytest.raises(RuntimeError, match="hook failed"):
        agent.predict(STATES[0], QUESTIONS)
    with pytest.warns(RuntimeWarning, match="hook failed"):
        agent.predict(STATES[0], QUESTIONS, hooks_raise=False)
    slow = threading.Event()
    with pytest.raises(TimeoutError, match="exceeded 0.2s"):
        agent.predict(
            STATES[0],
            QUESTIONS,
            hooks_raise=True,
            hooks=[],
            on_predict_start=lambda ctx: slow.wait(5),
            hooks_timeout=0.2,
        )
    slow.set()


# -- event payloads ----------------------------------------------------------------------------
def test_payload_timing_on_success_and_failure(models_dir):
    seen = {}

    class Watch(laya_onnx.BaseHook):
        def on_predict_start(self, ctx):
            seen["start"] = ctx.run_id

        def on_error(self, ctx):
            seen["error"] = (ctx.run_id, ctx.elapsed_ms, ctx.usage, type(ctx.error).__name__)

        def on_predict_end(self, ctx):
            seen["end"] = (ctx.run_id, ctx.results, ctx.usage, ctx.elapsed_ms)

    agent = laya_onnx.load("convaiinnovations/laya", hooks=[Watch()])
    results = agent.predict_batch(STATES, QUESTIONS)
    run_id, end_results, usage, elapsed = seen["end"]
    assert run_id == seen["start"] and end_results is results and elapsed is not None
    assert usage == laya_onnx.core.hooks.aggregate_usage(results) and usage["input_tokens"] > 0
    seen.clear()
    with pytest.raises(ValueError):
        agent.predict(STATES[0], {"q": {"type": "nope", "instructions": "?"}})
    # on_error runs before the finally block: no elapsed_ms, no usage there
    assert seen["error"][1:] == (None, None, "InvalidRequest")
    # on the failure path results is None (no skip), so usage is too; elapsed_ms is always set
    run_id, end_results, usage, elapsed = seen["end"]
    assert end_results is None and usage is None and elapsed is not None
    assert run_id == seen["start"] == seen["error"][0]


# -- advanced helpers --------------------------------------------------------------------------
def test_the_advanced_helpers_example():
    calls = []

    def log(ctx):
        calls.append(("log", list(ctx.states)))

    def redact(ctx):
        ctx.states = ["[redacted]" for _ in ctx.states]
        calls.append(("redact", list(ctx.states)))

    # The block as the page writes it (`questions={...}` is the page's literal).
    from laya_onnx.core.hooks import PredictContext, dispatch, normalise_hooks

    hooks = normalise_hooks(on_predict_start=[log, redact])
    ctx = PredictContext(states=["..."], questions={...})
    dispatch(hooks, "on_predict_start", ctx)

    assert calls == [("log", ["..."]), ("redact", ["[redacted]"])]
    assert list(inspect.signature(dispatch).parameters) == [
        "hooks",
        "event",
        "ctx",
        "raise_errors",
        "lock",
        "timeout",
    ]
    assert _defaults(dispatch) == {
        "hooks": inspect.Parameter.empty,
        "event": inspect.Parameter.empty,
        "ctx": inspect.Parameter.empty,
        "raise_errors": True,
        "lock": None,
        "timeout": None,
    }
    assert _defaults(laya_onnx.core.hooks.run_coroutine_sync) == {
        "awaitable": inspect.Parameter.empty,
        "loop": None,
    }
    assert laya_onnx.core.hooks.aggregate_usage(
        [
            {"usage": {"input_tokens": 3, "output_tokens": 0}},
            {"usage": {"input_tokens": 4, "output_tokens": 1}},
        ]
    ) == {"input_tokens": 7, "output_tokens": 1}


def test_run_coroutine_sync_in_and_out_of_a_loop():
    from laya_onnx.core.hooks import run_coroutine_sync

    async def where():
        return asyncio.get_running_loop()

    assert isinstance(run_coroutine_sync(where()), asyncio.AbstractEventLoop)

    async def caller():
        inner = run_coroutine_sync(where())  # from a thread whose loop is busy: the background one
        return inner is not asyncio.get_running_loop()

    assert within(HANG_GUARD_S, asyncio.run, caller()) is True
