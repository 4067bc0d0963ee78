"""The Router's answers: route, load, then answer on the chosen agent, hooks around it all.

`predict` is one call with laya's hook lifecycle around route + inference; `predict_batch` routes
every request, then runs them grouped by checkpoint, question set, token budgets and (for an
agent with per-language temperatures) language, each request with its own hook lifecycle;
`predict_long` is `predict` whose inference is the routed agent's window scan.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from laya_onnx.core.errors import InvalidRequestType
from laya_onnx.core.gate import apply_confidence_gate, check_min_confidence
from laya_onnx.core.hooks import (
    PredictContext,
    aggregate_usage,
    call_lifecycle,
    compose_hooks,
    skipping_default_hooks,
    validate_timeout,
)

Scan = Callable[[PredictContext, Any], dict[str, Any]]


def question_schema(questions: Any) -> str:
    """Order-sensitive text of a question set: requests with equal text share a forward pass
    (options are positional, so the same options in another order must not)."""
    return json.dumps(questions, sort_keys=False, ensure_ascii=False, default=str)


def _budgets(ctx: PredictContext) -> dict[str, int]:
    """The token budgets a start hook left set (an agent attached by hand may take neither)."""
    return {k: v for k, v in (("max_len", ctx.max_len), ("head_max_len", ctx.head_max_len)) if v is not None}


def _detected_lang(lang: Any, decision: Any) -> Any:
    """The caller's `lang`, else the language detection found while routing."""
    if lang is None:
        lang = (decision.get("detection") or {}).get("language") or None
    return lang


def answer(
    router: Any,
    state: Any,
    questions: Any,
    routing: dict[str, Any],
    active: list[Any],
    call_hooks: Any,
    hooks_raise: bool | None,
    hooks_timeout: float | None,
    *,
    max_len: int | None = None,
    head_max_len: int | None = None,
    min_confidence: Any = None,
    scan: Scan | None = None,
) -> dict[str, Any]:
    """`Router.predict`; `scan(ctx, lang)` replaces the one-window answer (`predict_long`)."""
    if state is None:
        raise InvalidRequestType("state must not be None; pass a string, dict, or list")
    if not isinstance(questions, dict):
        raise InvalidRequestType(
            "questions must be a dict of question id -> definition, got %s" % type(questions).__name__
        )
    mc = check_min_confidence(min_confidence) if min_confidence is not None else None
    raise_errors = router.hooks_raise if hooks_raise is None else bool(hooks_raise)
    timeout = router.hooks_timeout if hooks_timeout is None else validate_timeout(hooks_timeout)
    ctx = PredictContext(
        states=[state], questions=questions, router=router, max_len=max_len, head_max_len=head_max_len
    )

    def fire(event: str) -> None:
        router._dispatch(active, event, ctx, raise_errors=raise_errors, timeout=timeout)

    with call_lifecycle(ctx, fire, partial(apply_confidence_gate, mc=mc)):
        decision = router.route(
            state,
            questions,
            **routing,
            hooks=call_hooks,
            hooks_raise=hooks_raise,
            hooks_timeout=hooks_timeout,
        )
        ctx.decision = dict(decision)
        ctx.model = decision["model"]
        ctx.agent = agent = router.load(decision["model"])
        lang = _detected_lang(routing["lang"], decision)
        ctx.started_at = time.perf_counter()
        fire("on_predict_start")
        if ctx.results is None:
            with skipping_default_hooks():
                if scan is not None:
                    result = scan(ctx, lang)
                else:
                    result = agent.predict(ctx.states[0], ctx.questions, lang=lang, **_budgets(ctx))
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
    batch_size: int | None,
    hooks_timeout: float | None,
    min_confidence: Any,
    sort_by_length: bool,
    *,
    hooks: Any,
    on_predict_start: Any,
    on_predict_end: Any,
    hooks_raise: bool | None,
) -> list[dict[str, Any]]:
    """`Router.predict_batch`: start hooks per request before grouping, end hooks in reverse start
    order per checkpoint group; results in input order."""
    mc = check_min_confidence(min_confidence) if min_confidence is not None else None
    decisions = router.route_batch(requests, hooks_timeout, hooks=hooks, hooks_raise=hooks_raise)
    groups: dict[str, list[int]] = {}
    for i, decision in enumerate(decisions):
        groups.setdefault(router.resolve(decision["model"]), []).append(i)
    active = compose_hooks(router.hooks, hooks, on_predict_start, on_predict_end)
    raise_errors = router.hooks_raise if hooks_raise is None else bool(hooks_raise)
    timeout = router.hooks_timeout if hooks_timeout is None else validate_timeout(hooks_timeout)
    results: list[Any] = [None] * len(decisions)
    for name, indices in groups.items():
        agent = router.load(name)
        started: list[PredictContext] = []
        try:
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
                router._dispatch(active, "on_predict_start", ctx, raise_errors=raise_errors, timeout=timeout)
            for items, kwargs in _passes(agent, indices, started, requests, decisions):
                if sort_by_length:
                    kwargs["sort_by_length"] = True
                with skipping_default_hooks():
                    answers = agent.predict_batch(
                        [ctx.states[0] for _, ctx in items],
                        items[0][1].questions,
                        batch_size=batch_size,
                        **kwargs,
                    )
                if len(answers) != len(items):
                    raise RuntimeError(
                        "internal error: predict_batch returned %d results for %d states"
                        % (len(answers), len(items))
                    )
                for (i, ctx), result in zip(items, answers, strict=True):
                    result["routing"] = dict(decisions[i])
                    ctx.results = [result]
            for ctx in started:
                ctx.usage = aggregate_usage(ctx.results or [])
        except BaseException as exc:
            for ctx in started:
                if ctx.results:
                    apply_confidence_gate(ctx.results, mc)
            _end(router, active, started, raise_errors, timeout, exc)
            raise
        for ctx in started:
            if ctx.results:
                apply_confidence_gate(ctx.results, mc)
        _end(router, active, started, raise_errors, timeout)
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


def _end(router, active, contexts, raise_errors, timeout, error: BaseException | None = None) -> None:
    """End a checkpoint group's requests in reverse start order; each gets its end hook even
    when another's raises (the first such failure is raised afterwards)."""
    now = time.perf_counter()
    for ctx in contexts:
        ctx.elapsed_ms = (now - ctx.started_at) * 1000.0
        if error is not None:
            ctx.error = error
    first: BaseException | None = None
    for ctx in reversed(contexts):
        events = ("on_error", "on_predict_end") if ctx.error is not None else ("on_predict_end",)
        for event in events:
            try:
                router._dispatch(active, event, ctx, raise_errors=raise_errors, timeout=timeout)
            except BaseException as hook_exc:
                if ctx.error is not None:
                    ctx.error.__context__ = hook_exc
                elif first is None:
                    first = hook_exc
    if first is not None:
        raise first
