"""Hooks on ONNXAgent behave as laya 0.4.15's do (docs/semantics.md#hooks)."""

import asyncio
import time

import pytest

from laya_onnx import ONNXAgent
from laya_onnx import hooks as H
from laya_onnx.core.errors import reference_kind

Q = {"n": {"type": "noul", "instructions": "Refund?"}}


@pytest.fixture(scope="module")
def agent(bundle_factory):
    return ONNXAgent(bundle_factory("tiny-english"))


class Recorder(H.BaseHook):
    def __init__(self):
        self.events = []

    def on_predict_start(self, ctx):
        self.events.append(("start", list(ctx.states), ctx.results))

    def on_error(self, ctx):
        # The kind laya would raise: caller mistakes are InvalidRequest, a ValueError subclass.
        self.events.append(("error", reference_kind(ctx.error)))

    def on_predict_end(self, ctx):
        self.events.append(("end", ctx.usage, ctx.elapsed_ms is not None, ctx.error is not None))


class NoEvents:
    pass


class BadMethod:
    on_predict_start = 3


@pytest.mark.reference
@pytest.mark.parametrize(
    "kwargs",
    [
        {"hooks": Recorder},
        {"hooks": NoEvents()},
        {"hooks": BadMethod()},
        {"on_predict_start": 3},
        {"on_predict_end": [print, "x"]},
    ],
    ids=["class", "no-events", "bad-method", "start", "end"],
)
def test_normalise_refusals_match_reference(kwargs):
    from laya import hooks as ref_hooks

    with pytest.raises(TypeError) as ref:
        ref_hooks.normalise_hooks(**kwargs)
    with pytest.raises(TypeError) as ours:
        H.normalise_hooks(**kwargs)
    assert str(ours.value) == str(ref.value)


@pytest.mark.reference
@pytest.mark.parametrize("value", [True, 0, -1, float("nan"), float("inf")], ids=repr)
def test_timeout_refusals_match_reference(value):
    from laya import hooks as ref_hooks

    with pytest.raises(ValueError) as ref:
        ref_hooks.validate_timeout(value)
    with pytest.raises(ValueError) as ours:
        H.validate_timeout(value)
    assert str(ours.value) == str(ref.value)


def test_start_end_usage_and_order(agent):
    rec = Recorder()
    out = agent.predict("charged twice", Q, hooks=rec)
    assert rec.events[0] == ("start", ["charged twice"], None)
    kind, usage, timed, failed = rec.events[1]
    assert kind == "end" and timed and not failed
    assert usage == {"input_tokens": out["usage"]["input_tokens"], "output_tokens": 0}


def test_skip_short_circuits_and_end_still_runs(agent):
    cached = {"model": "cache", "answers": {}, "usage": {"input_tokens": 7, "output_tokens": 0}}
    ends = []
    out = agent.predict(
        "x",
        Q,
        on_predict_start=lambda ctx: ctx.skip([cached]),
        on_predict_end=lambda ctx: ends.append(ctx.usage),
    )
    assert out is cached and ends == [{"input_tokens": 7, "output_tokens": 0}]
    with pytest.raises(ValueError, match=r"one per state in ctx.states \(3\); got 2"):
        agent.predict_batch(["a", "b", "c"], Q, on_predict_start=lambda ctx: ctx.skip([cached, cached]))


def test_start_hook_rewrites_state_and_budget(agent):
    def rewrite(ctx):
        ctx.states = [s.upper() for s in ctx.states]
        ctx.max_len = 64

    a = agent.predict("charged twice " * 40, Q, on_predict_start=rewrite)
    b = agent.predict("CHARGED TWICE " * 40, Q, max_len=64)
    assert a == b and a["usage"]["truncated"]


def test_error_path_runs_on_error_then_end(agent):
    rec = Recorder()
    with pytest.raises(ValueError, match="unknown type"):
        agent.predict("x", {"q": {"type": "nope", "instructions": "?"}}, hooks=rec)
    assert [e[0] for e in rec.events] == ["start", "error", "end"]
    assert rec.events[1] == ("error", "ValueError") and rec.events[2][3] is True


def test_failing_hook_raises_or_warns(agent):
    def boom(ctx):
        raise RuntimeError("hook broke")

    with pytest.raises(RuntimeError, match="hook broke"):
        agent.predict("x", Q, on_predict_end=boom)
    with pytest.warns(RuntimeWarning, match="laya: hook _EndAdapter.on_predict_end failed: hook broke"):
        out = agent.predict("x", Q, on_predict_end=boom, hooks_raise=False)
    assert "n" in out["answers"]


def test_timeout_and_async_hooks(agent):
    with pytest.raises(TimeoutError, match=r"exceeded 0.05s"):
        agent.predict("x", Q, on_predict_start=lambda ctx: time.sleep(0.5), hooks_timeout=0.05)
    seen = []

    async def later(ctx):
        await asyncio.sleep(0)
        seen.append(ctx.run_id)

    agent.predict("x", Q, on_predict_end=later)
    assert len(seen) == 1 and len(seen[0]) == 32

    async def inside_a_loop():  # a caller already running a loop must not deadlock
        return agent.predict("x", Q, on_predict_end=later)

    asyncio.run(inside_a_loop())
    assert len(seen) == 2


def test_registry_defaults_and_scoping(agent):
    rec, default = Recorder(), Recorder()
    H.add_default_hook(default)
    try:
        with agent.hooks_installed(rec):
            agent.predict("x", Q)
        agent.predict("x", Q)
    finally:
        H.clear_default_hooks()
    assert len(rec.events) == 2 and len(default.events) == 4
    assert agent.add_hook(rec) is agent and agent.remove_hook(rec) and not agent.remove_hook(rec)


def test_gate_runs_before_end_hooks(agent):
    seen = []
    agent.predict(
        "x",
        Q,
        min_confidence=0.99,
        on_predict_end=lambda ctx: seen.append(ctx.results[0]["answers"]["n"]["abstention"]),
    )
    assert seen == ["abstained"]
