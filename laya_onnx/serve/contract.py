"""The decision routes' contract, with no web framework in it: a body's checks, what the agent is
asked, and how its answer is shaped and rendered in the wire profile (docs/http-api.md#answers,
docs/http-api.md#the-jev-profile). The aiohttp app and the Ray ingress both decide through it.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from laya_onnx.core import tournament
from laya_onnx.core.errors import LayaInputError, PassTooLarge
from laya_onnx.core.hooks import aggregate_usage
from laya_onnx.core.protocol import DecisionAgent
from laya_onnx.core.questions import UnknownField, unknown_fields
from laya_onnx.core.work import CallStopped, CallTooLarge
from laya_onnx.serve import schema
from laya_onnx.serve import validate as v
from laya_onnx.serve.errors import INFERENCE_FAILED, NON_FINITE, ApiError
from laya_onnx.serve.served import ModelChoice, Served
from laya_onnx.serve.settings import Settings

log = logging.getLogger("laya_onnx.serve")

#: Names the body's fields that nothing reads, the first 16 (docs/http-api.md#request-fields).
UNKNOWN_FIELDS_HEADER = "X-Unknown-Fields"
UNKNOWN_FIELDS_NAMED = 16
#: The checkpoints that answered a `model` naming none served here (docs/http-api.md#the-model-field);
#: the Jev profile names them in the body too.
MODEL_FALLBACK_HEADER = "X-Model-Fallback"
MODEL_FALLBACK_FIELD = "x_model_fallback"
#: The controls handed to the agent, in the order they are checked: the models' fields that are
#: neither the request's content, a hook key, `model` nor `task` (checked apart).
CONTROLS = tuple(
    k
    for k in schema.DecisionRequest.model_fields
    if k not in (*v.HOOK_KEYS, "state", "questions", "model", "task")
)
#: The Jev contract's keys per answer type and of `usage`, in TypeSafe's order (docs/http-api.md#the-jev-profile).
JEV_KEYS = {
    "choice": tuple(schema.JevChoiceAnswer.model_fields),
    "score": tuple(schema.JevScoreAnswer.model_fields),
    "noul": tuple(schema.JevNoulAnswer.model_fields),
}
USAGE_KEYS = tuple(schema.Tokens.model_fields)
ROOT_KEYS = tuple(k for k in schema.JevSystemOneResponse.model_fields if not k.startswith("x_"))
#: What `LAYA_JEV_STRICT` keeps (docs/http-api.md#strict-projection): the same keys, a score's
#: `legend` last, as laya-serve lists it.
STRICT_KEYS = {kind: tuple(sorted(keys, key=lambda k: k == "legend")) for kind, keys in JEV_KEYS.items()}
#: The Jev profile's `error_type` by status (docs/http-api.md#the-jev-profile).
ERROR_TYPES = {
    400: "api_usage_error",
    401: "authentication_error",
    403: "authentication_error",
    404: "not_found",
    429: "rate_limit_error",
    500: "internal_error",
    502: "upstream_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def authorized(settings: Settings, authorization: str | Sequence[str] | None) -> bool:
    """Whether `Authorization` is exactly one `Bearer <key>`; True without a key
    (docs/http-api.md#authentication). Compared in constant time as the bytes on the wire
    (aiohttp's surrogateescape undone), so an undecodable header is a 401, not an exception."""
    key = settings.api_key
    if key is None:
        return True
    if not isinstance(authorization, str) and authorization is not None:
        if len(authorization) != 1:
            return False
        authorization = authorization[0]
    supplied = (authorization or "").encode("utf-8", "surrogateescape")
    expected = ("Bearer " + key).encode("utf-8", "surrogateescape")
    return hmac.compare_digest(supplied, expected)


# -- the checks ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OneDecision:
    """A `/v1/systemone` request that passed every check: what to ask the agent."""

    state: Any
    questions: Any
    #: Only the controls the caller sent.
    controls: dict[str, Any] = field(default_factory=dict)
    #: The body's `model` when it named no checkpoint here (`served.ModelChoice.fallback`).
    fallback: str | None = None
    #: Fields of the body and its questions that nothing reads.
    unknown: tuple[UnknownField, ...] = ()

    what = "inference"

    def run(self, agent: DecisionAgent, settings: Settings) -> dict[str, Any]:
        return tournament.predict_as_planned(
            agent, self.state, self.questions, settings.tournament_group, **self.controls
        )

    def payload(self, result: dict[str, Any], checkpoint: Served, settings: Settings) -> dict[str, Any]:
        return shape(settings, checkpoint.with_routing(result), self.fallback)


@dataclass(frozen=True)
class BatchDecision:
    """A `/v1/systemone/batch` request that passed every check (its controls hold the batch plan)."""

    states: list[Any]
    questions: Any
    controls: dict[str, Any] = field(default_factory=dict)
    fallback: str | None = None
    unknown: tuple[UnknownField, ...] = ()

    what = "batch inference"

    def run(self, agent: DecisionAgent, settings: Settings) -> list[dict[str, Any]]:
        return tournament.predict_batch_as_planned(
            agent, self.states, self.questions, settings.tournament_group, **self.controls
        )

    def payload(
        self, results: list[dict[str, Any]], checkpoint: Served, settings: Settings
    ) -> dict[str, Any]:
        routed = [checkpoint.with_routing(r) for r in results]
        return {
            "results": [shape(settings, r, self.fallback) for r in routed],
            "total_usage": aggregate_usage(routed),
        }


def agent_controls(body: v.Body, checkpoint: Served) -> tuple[dict[str, Any], ModelChoice]:
    """`model`, then `CONTROLS` in order: only those the caller sent (the bundle's own budgets stay
    in charge of the rest), plus what the Router routes by; and how `model` was taken."""
    model = checkpoint.check_model(body.body.get("model"))
    checked = {k: body.control(k) for k in CONTROLS}
    lang_guess = checked.pop("lang_guess")
    controls = {k: value for k, value in checked.items() if value is not None}
    controls.update(checkpoint.routing_controls(model.pinned, body.body.get("task"), lang_guess))
    return controls, model


def parse_systemone(raw: bytes, agent: DecisionAgent, checkpoint: Served, settings: Settings) -> OneDecision:
    """The checks of docs/http-api.md#post-v1systemone in order; the first failing one is raised."""
    del agent  # one signature for both routes; the single route plans nothing from the agent
    with v.validation_stage(settings.jev):
        body = v.Body(v.parse_json(raw), False, settings.jev, settings.max_token_budget)
        body.limits()
        body.refusals()
        controls, model = agent_controls(body, checkpoint)
        checkpoint.check_task(body.body.get("task"))
    unknown = tuple(unknown_fields(body.body, v.REQUEST_FIELDS, most=UNKNOWN_FIELDS_NAMED))
    return OneDecision(body.body["state"], body.body["questions"], controls, model.fallback, unknown)


def parse_batch(raw: bytes, agent: DecisionAgent, checkpoint: Served, settings: Settings) -> BatchDecision:
    """The checks of docs/http-api.md#post-v1systemonebatch in order, and the pass plan
    (docs/http-api.md#batch)."""
    with v.validation_stage(settings.jev):
        body = v.Body(v.parse_json(raw), True, settings.jev, settings.max_token_budget)
        body.limits()
        body.refusals()
        controls, model = agent_controls(body, checkpoint)
        caller_size = body.control("batch_size")
        states, questions = body.body["states"], body.body["questions"]
        planned = v.chunk_plan(
            len(states),
            len(questions),
            body.body.get("max_len"),
            settings.max_batch_tokens,
            memory=v.pass_memory_of(agent),
        )
        if caller_size is not None:
            controls["batch_size"] = caller_size if planned is None else min(caller_size, planned)
        elif planned is not None:
            controls["batch_size"] = planned
        if body.control("sort_by_length"):
            controls["sort_by_length"] = True  # False is the agent's own default: not forwarded
        checkpoint.check_task(body.body.get("task"))
    unknown = tuple(unknown_fields(body.body, v.BATCH_FIELDS, most=UNKNOWN_FIELDS_NAMED))
    return BatchDecision(states, questions, controls, model.fallback, unknown)


def pass_refusal(exc: Exception, what: str, model: str) -> ApiError:
    """The refusal for an exception the agent call raised: a pass or call over its budget is a 413,
    a call stopped for its deadline a 504, the caller's mistake (`LayaInputError`) a 422 with its
    text; anything else is ours: logged with its traceback (call it where the request's log context
    is set), answered with a fixed 500 that leaks nothing about the host."""
    if isinstance(exc, (PassTooLarge, CallTooLarge)):
        return ApiError(413, str(exc))
    if isinstance(exc, CallStopped):
        # a deadline that cannot be met (the loop's own deadline answers a passed one first)
        return ApiError(504, "request not answered: %s; no pass of it ran after that" % exc.reason)
    if isinstance(exc, LayaInputError):
        return ApiError(422, str(exc))
    log.error("%s failed for model=%s", what, model, exc_info=exc)
    return ApiError(500, INFERENCE_FAILED)


# -- the answer ------------------------------------------------------------------------------


def jev_confidence(answer: dict[str, Any]) -> float | None:
    """TypeSafe Jev's `confidence` of a choice or score answer (docs/http-api.md#answers), or None
    when its probabilities are not usable (a boolean, non-numeric, negative or non-finite one)."""
    kind, probs = answer.get("type"), answer.get("probabilities")
    if kind not in ("choice", "score") or not isinstance(probs, dict) or not probs:
        return None
    if any(isinstance(v, bool) for v in probs.values()):
        return None
    try:
        keys = sorted(probs, key=int) if kind == "score" else list(probs)
        p = [float(probs[k]) for k in keys]
    except (TypeError, ValueError, OverflowError):
        return None
    if not all(math.isfinite(v) and v >= 0.0 for v in p):
        return None
    n = len(p)
    if n == 1:
        return 1.0
    total = sum(p)
    p = [v / total for v in p] if total else [1.0 / n] * n
    if kind == "choice":
        return (max(p) - 1.0 / n) / (1.0 - 1.0 / n)
    mode = max(range(n), key=p.__getitem__)
    spread = sum(v * abs(i - mode) for i, v in enumerate(p))
    center = (n - 1) / 2
    uniform = sum(abs(i - center) for i in range(n)) / n
    return max(0.0, 1.0 - spread / uniform)


def with_jev_confidence(result: dict[str, Any]) -> dict[str, Any]:
    """A copy of `result` whose choice/score answers carry `x_jev_confidence` (answers not mutated)."""
    answers = result.get("answers")
    if not isinstance(answers, dict):
        return result
    out = {}
    for qid, answer in answers.items():
        conf = jev_confidence(answer) if isinstance(answer, dict) else None
        out[qid] = answer if conf is None else {**answer, "x_jev_confidence": round(conf, 4)}
    return {**result, "answers": out}


def strict_projection(result: dict[str, Any]) -> dict[str, Any]:
    """`LAYA_JEV_STRICT` (docs/http-api.md#strict-projection); nothing is recomputed. A typed answer
    missing one of its keys raises KeyError: the 500 it is, as laya-serve answers it."""
    answers = {}
    for qid, a in (result.get("answers") or {}).items():
        keys = STRICT_KEYS.get(str(a.get("type"))) if isinstance(a, dict) else None
        answers[qid] = a if keys is None else {k: a[k] for k in keys}
    usage = result.get("usage") or {}
    return {
        "model": result["model"],
        "answers": answers,
        "usage": {k: usage.get(k, 0) for k in USAGE_KEYS},
    }


def _extra(key: str) -> str:
    return key if key.startswith("x_") else "x_" + key


def _jev_answer(answer: Any) -> Any:
    kind = answer.get("type") if isinstance(answer, dict) else None
    if kind not in JEV_KEYS:
        return answer
    assert isinstance(answer, dict)
    values = dict(answer)
    if "confidence" in values:
        values["x_laya_confidence"] = values.pop("confidence")
    if kind != "noul":
        conf = jev_confidence(answer)
        values["confidence"] = round(conf, 4) if conf is not None else values.get("x_laya_confidence")
    out = {k: values.pop(k) for k in JEV_KEYS[kind] if k in values}
    out.update({_extra(k): v for k, v in values.items()})
    return out


def jev_result(result: dict[str, Any]) -> dict[str, Any]:
    """One result in the Jev profile: TypeSafe's confidence, the contract's keys first, every other
    key prefixed `x_` (docs/http-api.md#the-jev-profile)."""
    answers = result.get("answers")
    out: dict[str, Any] = {k: result[k] for k in ROOT_KEYS if k in result}
    if isinstance(answers, dict):
        out["answers"] = {qid: _jev_answer(a) for qid, a in answers.items()}
    usage = result.get("usage")
    if isinstance(usage, dict):
        out["usage"] = {k: usage[k] for k in USAGE_KEYS if k in usage}
        out["usage"].update({_extra(k): v for k, v in usage.items() if k not in USAGE_KEYS})
    out.update({_extra(k): v for k, v in result.items() if k not in ROOT_KEYS})
    return out


def shape(settings: Settings, result: dict[str, Any], fallback: str | None) -> dict[str, Any]:
    """One routed result in the wire profile; the Jev profile names a model fallback in the body too."""
    if settings.jev:
        if fallback is not None:
            answered = {"requested": fallback, "answered_by": answered_by(result)}
            result = {**result, MODEL_FALLBACK_FIELD: answered}
        result = jev_result(result)
    elif not settings.jev_strict:
        return with_jev_confidence(result)
    return strict_projection(result) if settings.jev_strict else result


class NonFiniteNumber(ValueError):
    """A payload holds a NaN or an infinity, which JSON cannot carry."""


def render(payload: Any) -> bytes:
    """Compact UTF-8 JSON; NonFiniteNumber for a NaN or an infinity. json's ValueError also means
    other failures (a circular reference), so the payload is searched before it is called that."""
    try:
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        if has_non_finite(payload):
            raise NonFiniteNumber(str(exc)) from None
        raise
    return text.encode("utf-8")


def has_non_finite(value: Any) -> bool:
    """Whether a float anywhere in `value` (dict keys included) is a NaN or an infinity; iterative,
    each container visited once, so deep or self-referencing payloads end."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, (dict, list, tuple)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            else:
                stack.extend(item)
    return False


def render_payload(make_payload: Callable[[], Any], what: str, model: str) -> bytes:
    """Shape and render after inference: a non-finite float is a 422, anything else a logged 500."""
    try:
        return render(make_payload())
    except NonFiniteNumber:
        raise ApiError(422, NON_FINITE) from None
    except Exception:
        log.exception("%s failed for model=%s", what, model)
        raise ApiError(500, INFERENCE_FAILED) from None


def answered_by(routed: dict[str, Any]) -> str:
    """The checkpoint a result's `routing` block names."""
    routing = routed.get("routing")
    return str(routing.get("model")) if isinstance(routing, dict) else ""


def answering_checkpoints(result: Any, checkpoint: Served) -> list[str]:
    """The served checkpoints that answered a result (a batch's states may route apart), in order
    of first answer; names from the routing blocks, never a client's text."""
    results = result if isinstance(result, list) else [result]
    return [n for n in dict.fromkeys(answered_by(checkpoint.with_routing(r)) for r in results) if n]


def metrics_checkpoint(result: Any, checkpoint: Served) -> str:
    """The `checkpoint` label of a decision's metrics: the one served checkpoint that answered it,
    this server's name when several did."""
    names = answering_checkpoints(result, checkpoint)
    return names[0] if len(names) == 1 else checkpoint.name


def answer_headers(decision: OneDecision | BatchDecision, result: Any, checkpoint: Served) -> dict[str, str]:
    """What the client sent that the server did not take as written: `X-Model-Fallback` (and a log
    line) for a `model` served nowhere here, `X-Unknown-Fields` for fields nothing reads, each in
    printable ASCII (docs/http-api.md#request-fields, docs/http-api.md#the-model-field)."""
    headers = {}
    if decision.fallback is not None:
        answered = ", ".join(answering_checkpoints(result, checkpoint)) or checkpoint.name
        log.info("model %.200r names no checkpoint served here; answered by %s", decision.fallback, answered)
        headers[MODEL_FALLBACK_HEADER] = "".join(c if " " <= c <= "~" else "?" for c in answered)
    if decision.unknown:
        named = []
        for f in decision.unknown:
            where = str(f.name) if f.question is None else "%s.%s" % (f.question, f.name)
            named.append(where if f.did_you_mean is None else "%s=%s" % (where, f.did_you_mean))
        # a client's key may hold anything: outside printable ASCII, and the list's comma, is "?"
        text = ", ".join("".join(c if " " < c <= "~" and c != "," else "?" for c in n) for n in named)
        headers[UNKNOWN_FIELDS_HEADER] = text[:1000]
    return headers


def error_body(settings: Settings, status: int, detail: str, errors: Any = None) -> Any:
    """A refusal's body in the wire profile: laya-serve's `{"detail": "<string>"}`, or the Jev
    profile's list (a 422) or `{error_type, message}` (docs/http-api.md#the-jev-profile)."""
    if not settings.jev:
        return {"detail": detail}
    if status == 422:
        return {
            "detail": errors
            if errors is not None
            else [{"loc": ["body"], "msg": detail, "type": "value_error"}]
        }
    error_type = ERROR_TYPES.get(status, "internal_error" if status >= 500 else "api_usage_error")
    return {"detail": {"error_type": error_type, "message": detail}}


def api_error_body(settings: Settings, exc: ApiError) -> Any:
    """`error_body` for a raised refusal (a Jev validation error carries its list of errors)."""
    return error_body(settings, exc.status, exc.detail, getattr(exc, "errors", None))
