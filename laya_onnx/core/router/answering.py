"""The Router's answers: route, load, then answer on the chosen agent, hooks around it all.

`answer` is one call (`Router.predict`, or `predict_long` with the window scan as its inference)
under laya's hook lifecycle around route + inference; `answer_batch` routes every request, then
runs them grouped by checkpoint, question set, token budgets and (for an agent with per-language
temperatures) language, each checkpoint group under one lifecycle. The hooks and the gate are the
call's `CallOptions`, resolved once by the Router.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from laya_onnx.core.errors import InvalidRequestType
from laya_onnx.core.hooks import PredictContext, skipping_default_hooks
from laya_onnx.core.options import CallOptions
from laya_onnx.core.router import policy

Scan = Callable[[PredictContext, Any], dict[str, Any]]


def question_schema(questions: Any) -> str:
    """Order-sensitive text of a question set: requests with equal text share a forward pass
    (options are positional, so the same options in another order must not)."""
    return json.dumps(questions, sort_keys=False, ensure_ascii=False, default=str)


def check_call(state: Any, questions: Any) -> None:
    """Refuse what no route or hook could answer: no state, or questions that are not a dict."""
    if state is None:
        raise InvalidRequestType("state must not be None; pass a string, dict, or list")
    if not isinstance(questions, dict):
        raise InvalidRequestType(
            "questions must be a dict of question id -> definition, got %s" % type(questions).__name__
        )


def _budgets(ctx: PredictContext) -> dict[str, int]:
    """The token budgets a start hook left set (an agent attached by hand may take neither; an
    unset control is not passed, so the agent's own default stays in charge)."""
    return {k: v for k, v in (("max_len", ctx.max_len), ("head_max_len", ctx.head_max_len)) if v is not None}


def answer(
    router: Any,
    state: Any,
    questions: Any,
    routing: dict[str, Any],
    call: CallOptions,
    *,
    max_len: int | None = None,
    head_max_len: int | None = None,
    scan: Scan | None = None,
) -> dict[str, Any]:
    """`Router.predict`; `scan(ctx, lang)` replaces the one-window answer (`predict_long`).
    `elapsed_ms` counts from the start hooks, after route and load (laya's)."""
    ctx = PredictContext(
        states=[state], questions=questions, router=router, max_len=max_len, head_max_len=head_max_len
    )
    with call.lifecycle([ctx]):
        decision = policy.route(router, state, questions, routing, call)
        ctx.decision = dict(decision)
        ctx.model = decision["model"]
        ctx.agent = agent = router.load(decision["model"])
        lang = routing["lang"]
        if lang is None:
            lang = (decision.get("detection") or {}).get("language") or None
        ctx.started_at = time.perf_counter()
        call.fire("on_predict_start", ctx)
        if ctx.results is None:
            with skipping_default_hooks():
                if scan is not None:
                    result = scan(ctx, lang)
                else:
                    langs = {"lang": lang} if lang is not None else {}
                    result = agent.predict(ctx.states[0], ctx.questions, **langs, **_budgets(ctx))
            if scan is not None:
                result.setdefault("routing", dict(decision))
            else:
                result["routing"] = dict(decision)
            ctx.results = [result]
        else:  # a start hook answered: the answer still says where it was routed
            for result in ctx.results:
                if isinstance(result, dict):
                    result.setdefault("routing", dict(decision))
    return ctx.results[0]


def window_scan(window: Any, stride: Any, aggregate: str, batch_size: Any) -> Scan:
    """The inference of `Router.predict_long`: the routed agent's `predict_long` over the state,
    run after the start hooks (so a hook that answers wins)."""

    def scan(ctx: PredictContext, detected_lang: Any) -> dict[str, Any]:
        long = getattr(ctx.agent, "predict_long", None)
        if long is None:
            raise InvalidRequestType(
                "%s has no predict_long, so a state longer than its window cannot be scanned; "
                "the PyTorch Agent and ONNXAgent implement it, and an agent attached by hand needs "
                "it too" % type(ctx.agent).__name__
            )
        return long(
            ctx.states[0],
            ctx.questions,
            window=window,
            stride=stride,
            aggregate=aggregate,
            batch_size=batch_size,
            lang=detected_lang,
        )

    return scan


def answer_batch(
    router: Any,
    requests: Sequence[dict[str, Any]],
    call: CallOptions,
    batch_size: int | None,
    sort_by_length: bool,
) -> list[dict[str, Any]]:
    """`Router.predict_batch`: start hooks per request before grouping, end hooks in reverse
    start order per checkpoint group; results in input order."""
    decisions = policy.route_all(router, requests, call)
    groups: dict[str, list[int]] = {}
    for i, decision in enumerate(decisions):
        groups.setdefault(router.resolve(decision["model"]), []).append(i)
    results: list[Any] = [None] * len(decisions)
    for name, indices in groups.items():
        agent = router.load(name)
        started: list[PredictContext] = []
        with call.lifecycle(started, group=True):
            for i in indices:
                ctx = PredictContext(
                    states=[requests[i]["state"]],
                    questions=requests[i]["questions"],
                    decision=dict(decisions[i]),
                    model=name,
                    agent=agent,
                    router=router,
                    max_len=requests[i].get("max_len"),
                    head_max_len=requests[i].get("head_max_len"),
                )
                started.append(ctx)
                call.fire("on_predict_start", ctx)
            for items, kwargs in _passes(agent, indices, started, requests, decisions):
                if sort_by_length:
                    kwargs["sort_by_length"] = True
                if batch_size is not None:
                    kwargs["batch_size"] = batch_size
                with skipping_default_hooks():
                    answers = agent.predict_batch(
                        [ctx.states[0] for _, ctx in items], items[0][1].questions, **kwargs
                    )
                if len(answers) != len(items):
                    raise RuntimeError(
                        "internal error: predict_batch returned %d results for %d states"
                        % (len(answers), len(items))
                    )
                for (i, ctx), result in zip(items, answers, strict=True):
                    result["routing"] = dict(decisions[i])
                    ctx.results = [result]
        for i, ctx in zip(indices, started, strict=True):
            results[i] = ctx.results[0] if ctx.results else None
    return results


def _passes(agent, indices, started, requests, decisions):
    """[(items, kwargs)]: the started requests no hook answered, grouped by what one
    `agent.predict_batch` call shares (question set, token budgets, language)."""
    per_language = bool(getattr(getattr(agent, "calibration", None), "lang_temperatures", None))
    groups: dict[tuple, tuple[list, dict]] = {}
    for i, ctx in zip(indices, started, strict=True):
        if ctx.results is not None:  # answered by a start hook
            for result in ctx.results:
                if isinstance(result, dict):
                    result.setdefault("routing", dict(decisions[i]))
            continue
        kwargs: dict[str, Any] = _budgets(ctx)
        lang = None
        if per_language:
            lang = requests[i].get("lang")
            if lang is None:
                lang = (decisions[i].get("detection") or {}).get("language")
            if lang is not None:
                kwargs["lang"] = lang
        key = (question_schema(ctx.questions), ctx.max_len, ctx.head_max_len, lang)
        groups.setdefault(key, ([], kwargs))[0].append((i, ctx))
    return list(groups.values())
