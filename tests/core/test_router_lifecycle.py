"""The Router's hook lifecycle equals laya.Router's, event by event: what each hook sees
(elapsed_ms, usage, the error, the gated answers), the order (a batch's end hooks in reverse start
order per checkpoint group), and which failure reaches the caller, for `predict` and
`predict_batch`, answering, failing in the agent and failing in a hook. Both Routers serve the
same fake agents through `attach`, so this runs in milliseconds and compares hooks alone.
"""

from __future__ import annotations

import pytest

from laya_onnx.core.router import Router

pytestmark = pytest.mark.reference

Q = {"refund": {"type": "noul", "instructions": "Refund?"}}


class Agent:
    """Answers every noul with 0.5 (so min_confidence=0.6 abstains); may fail every pass."""

    revision = None

    def __init__(self, fail: bool = False):
        self.fail = fail

    def _answer(self, questions):
        if self.fail:
            raise RuntimeError("the pass failed")
        answers = {
            q: {"type": "noul", "noul": 0.5, "confidence": 0.5, "answer_confidence": 0.5} for q in questions
        }
        return {"model": "fake", "answers": answers, "usage": {"input_tokens": 3, "output_tokens": 0}}

    def system_one(self, state, questions, **kw):
        return self._answer(questions)

    predict = system_one

    def predict_batch(self, states, questions, **kw):
        return [self._answer(questions) for _ in states]


class Trace:
    """Every lifecycle event with what the hook could see; optionally fails one request's end."""

    def __init__(self, fail_end_of: str | None = None):
        self.events: list[tuple] = []
        self.fail_end_of = fail_end_of

    def _seen(self, event, ctx):
        results = ctx.results or []
        gated = sorted(
            a.get("abstention", "-") for r in results if isinstance(r, dict) for a in r["answers"].values()
        )
        self.events.append(
            (
                event,
                ctx.states[0],
                ctx.elapsed_ms is not None,
                ctx.usage,
                type(ctx.error).__name__ if ctx.error is not None else None,
                gated,
            )
        )

    def on_predict_start(self, ctx):
        self._seen("start", ctx)

    def on_error(self, ctx):
        self._seen("error", ctx)

    def on_predict_end(self, ctx):
        self._seen("end", ctx)
        if ctx.states[0] == self.fail_end_of:
            raise ValueError("end hook failed for %s" % ctx.states[0])


def _routers(fail: str | None):
    from laya.router import Router as LayaRouter

    pair = [Router(), LayaRouter()]
    for r in pair:
        for name in ("english", "multilingual"):
            r.attach(name, Agent(fail=name == fail))
    return pair


REQUESTS = [
    {"state": "e1", "questions": Q, "model": "english"},
    {"state": "m1", "questions": Q, "model": "multilingual"},
    {"state": "e2", "questions": Q, "model": "english"},
    {"state": "m2", "questions": Q, "model": "multilingual"},
]


def _run(router, method: str, fail_end_of: str | None):
    trace = Trace(fail_end_of)
    try:
        if method == "predict_batch":
            out = router.predict_batch(REQUESTS, min_confidence=0.6, hooks=[trace])
        else:
            out = router.predict("m1", Q, model="multilingual", min_confidence=0.6, hooks=[trace])
        outcome = ("ok", [r["answers"]["refund"]["abstention"] for r in out] if isinstance(out, list) else 1)
    except Exception as exc:
        context = type(exc.__context__).__name__ if exc.__context__ is not None else None
        outcome = ("raised", type(exc).__name__, str(exc), context)
    return trace.events, outcome


@pytest.mark.parametrize("method", ["predict", "predict_batch"])
@pytest.mark.parametrize(
    "fail, fail_end_of",
    [(None, None), ("multilingual", None), (None, "e1"), (None, "m1"), ("multilingual", "m2")],
    ids=["answers", "agent-fails", "end-hook-fails-in-first-group", "end-hook-fails", "both-fail"],
)
def test_hook_lifecycle_equals_laya_router(method, fail, fail_end_of):
    ours, ref = (_run(r, method, fail_end_of) for r in _routers(fail))
    assert ours == ref
    events, _ = ours
    assert events  # the hooks ran at all
