"""The Router's routing policy: which checkpoint answers a request, and laya's words for why.

First match wins: `model=` > `task=` > the typed-decisions workflow of the question ids (only with
`auto_task_detection=True`) > `lang=` > `lang_guess` (per call, then the Router's) > language
detection (`laya_onnx.core.lang.analyse`) > `default`. The decision is the `routing` block of
every answer, keys in laya's order, reasons in laya's words; `on_route` hooks see it and may
replace it. Nothing here loads or runs a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from laya_onnx.core.errors import InvalidRequest, InvalidRequestType
from laya_onnx.core.hooks import PredictContext
from laya_onnx.core.lang import analyse, english_from_code, route_detection
from laya_onnx.core.options import CallOptions
from laya_onnx.core.router.registry import ENGLISH, MULTILINGUAL, TYPED_DECISIONS

#: Question-id sets of the four workflows typed-decisions was fine-tuned on (laya router.py).
TYPED_DECISION_WORKFLOWS: dict[str, frozenset[str]] = {
    "agent_trace_observability": frozenset({"action", "needs_review", "outcome", "risk", "urgency"}),
    "customer_service": frozenset({"action", "category", "churn_risk", "needs_human", "urgency"}),
    "invoice_processing": frozenset(
        {"discrepancy_severity", "disposition", "duplicate", "matches_order", "urgency"}
    ),
    "security_incidents": frozenset(
        {"credential_compromise", "disposition", "severity", "true_positive", "urgency"}
    ),
}
#: The routing pins a request of a batch may carry.
ROUTING_KEYS = ("model", "task", "lang", "lang_guess")


class RouteDecision(dict):
    """Which checkpoint answers and why; a dict, so it serialises into the answer as it is."""

    @property
    def model(self) -> str:
        return self["model"]

    @property
    def reason(self) -> str:
        return self["reason"]

    def __repr__(self) -> str:
        return "RouteDecision(model=%r, reason=%r)" % (self["model"], self["reason"])


def match_typed_decisions_workflow(questions: Any) -> str | None:
    """The workflow whose question ids are exactly these, else None (a lone 'urgency' is not one)."""
    ids = set(questions or {})
    for workflow, signature in TYPED_DECISION_WORKFLOWS.items():
        if ids == signature:
            return workflow
    return None


def english_hint(hint: Any, state: Any) -> bool | None:
    """What a `lang_guess` (a language code, or a callable of the state giving one) says:
    True for English, False for another language, None when it says nothing."""
    if hint is None:
        return None
    if callable(hint):
        hint = hint(state)
    return english_from_code(hint)


def decide_route(
    router: Any,
    state: Any,
    questions: Any,
    model: Any = None,
    task: Any = None,
    lang: Any = None,
    lang_guess: Any = None,
    explain: bool = False,
) -> RouteDecision:
    """The decision alone, by the precedence above; `router` gives the names (`resolve`, `repo`)
    and its own `default`, `auto_task_detection` and `lang_guess`."""

    def decision(key: str, reason: str, detection: Any = None, workflow: Any = None) -> RouteDecision:
        return RouteDecision(
            model=key, repo=router.repo(key), reason=reason, detection=detection, workflow=workflow
        )

    if model is not None:
        return decision(router.resolve(model), "explicit model=%r" % (model,))
    if task is not None:
        typed = str(task).lower().replace("-", "_") == "typed_decisions"
        return decision(router.resolve(TYPED_DECISIONS if typed else task), "explicit task=%r" % (task,))
    workflow = match_typed_decisions_workflow(questions)
    if workflow and router.auto_task_detection:
        reason = "question ids match the %r typed-decisions workflow" % workflow
        return decision(TYPED_DECISIONS, reason, None, workflow)
    if lang is not None:
        english = english_from_code(lang)
        if english is not None:
            key = ENGLISH if english else MULTILINGUAL
            return decision(key, "explicit lang=%r" % (lang,), None, workflow)
    for where, hint in (("lang_guess", lang_guess), ("Router(lang_guess=...)", router.lang_guess)):
        english = english_hint(hint, state)
        if english is not None:
            reason = "%s: the caller identified this as %s text" % (
                where,
                "English" if english else "non-English",
            )
            return decision(ENGLISH if english else MULTILINGUAL, reason, None, workflow)
    det = analyse(state, explain=True) if explain else analyse(state)
    key, reason = route_detection(det, router.default)
    return decision(key, reason, det, workflow)


def check_questions(questions: Any) -> None:
    if questions is not None and not isinstance(questions, dict):
        raise InvalidRequestType(
            "questions must be a dict of question id -> definition, got %s" % type(questions).__name__
        )


def check_batch(requests: Any) -> None:
    if not isinstance(requests, Sequence) or isinstance(requests, (str, bytes)):
        raise InvalidRequestType("requests must be a sequence of request dictionaries")


def check_request(i: int, request: Any) -> None:
    """Refuse request `i` of a batch unless routing can read it (a dict with state and questions)."""
    if not isinstance(request, dict):
        raise InvalidRequestType("request %d must be a dict, got %s" % (i, type(request).__name__))
    if "state" not in request:
        raise InvalidRequest("request %d is missing required key 'state'" % i)
    if request["state"] is None:
        raise InvalidRequestType("request %d 'state' must not be None; pass a string, dict, or list" % i)
    if "questions" not in request:
        raise InvalidRequest("request %d is missing required key 'questions'" % i)
    if not isinstance(request["questions"], dict):
        raise InvalidRequestType(
            "request %d 'questions' must be a dict, got %s" % (i, type(request["questions"]).__name__)
        )


def routing_of(request: dict[str, Any]) -> dict[str, Any]:
    """The routing pins of one request of a batch (absent ones as None)."""
    return {key: request.get(key) for key in ROUTING_KEYS}


def route(
    router: Any, state: Any, questions: Any, routing: dict[str, Any], call: CallOptions, explain: bool = False
) -> Any:
    """`decide_route` by the `routing` pins, then the call's `on_route` hooks, which may replace it."""
    decision = decide_route(router, state, questions, **routing, explain=explain)
    ctx = PredictContext(states=[state], questions=questions or {}, decision=decision, router=router)
    call.fire("on_route", ctx)
    return ctx.decision


def route_all(
    router: Any, requests: Sequence[dict[str, Any]], call: CallOptions, explain: bool = False
) -> list[Any]:
    """Every request of a batch routed in order, each checked just before it is routed."""
    check_batch(requests)
    decisions = []
    for i, request in enumerate(requests):
        check_request(i, request)
        decisions.append(
            route(router, request["state"], request["questions"], routing_of(request), call, explain)
        )
    return decisions
