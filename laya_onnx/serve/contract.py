"""The HTTP contract of the decision routes, with no web framework in it (docs/http-api.md, "Refusals in order" and "Answers").

A front end (the aiohttp app, the Ray Serve ingress) reads the body and the headers its own way
and hands them here; what to check, in which order, what each refusal says, what the agent is
asked, and how its answer is shaped and rendered live only here, so two front ends cannot drift.

  * `authorized(settings, header)` — the bearer check of the decision routes, `/health`, `/metrics`;
  * `parse_systemone(raw, agent, checkpoint, settings)` -> `OneDecision`, and
    `parse_batch(...)` -> `BatchDecision`: every check in contract order, or `ApiError`;
  * `decision.run(agent, settings)` — the blocking agent call (through a tournament when
    `tournament.plan_group` says so), to run off the event loop;
  * `run_pass(fn, what, model)` / `pass_refusal(exc, ...)` — the pass's failures as 413/422/500;
  * `decision.payload(result, checkpoint, settings)` + `render_payload(make, what, model)` — shaping
    (routing block, `x_jev_confidence`, strict Jev projection, Jev profile) and JSON bytes;
  * `answer_headers(decision, result, checkpoint)` — `X-Model-Fallback` when the body's `model`
    named no checkpoint here and another answered (and its log line), `X-Unknown-Fields` when
    the body or its questions carry fields nothing reads;
  * `error_body(settings, status, detail, errors)` — a refusal in the configured wire profile;

Everything raises `ApiError` for a refusal; a front end renders it with `error_body`.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from laya_onnx.core import tournament
from laya_onnx.core.errors import LayaInputError, PassTooLarge
from laya_onnx.core.hooks import aggregate_usage
from laya_onnx.core.questions import UnknownField, unknown_fields
from laya_onnx.core.work import CallStopped, CallTooLarge
from laya_onnx.serve import jev
from laya_onnx.serve import validate as v
from laya_onnx.serve.errors import INFERENCE_FAILED, NON_FINITE, ApiError
from laya_onnx.serve.protocol import ServedAgent
from laya_onnx.serve.served import ModelChoice, Served
from laya_onnx.serve.settings import Settings
from laya_onnx.serve.wire import NonFiniteNumber, render, shape

log = logging.getLogger("laya_onnx.serve")

#: Names the body's fields that nothing reads (docs/http-api.md#request-fields).
UNKNOWN_FIELDS_HEADER = "X-Unknown-Fields"
#: How many unknown fields a response names at most (the first ones, in the body's order).
UNKNOWN_FIELDS_NAMED = 16

#: What answers a request: a Router's checkpoints, or one bundle as a Router of one (`served.py`).
ServedCheckpoints = Served

#: On a decision answered although its `model` named no checkpoint served here: the checkpoints
#: that answered instead (laya-serve auto-routes such a name without a word).
MODEL_FALLBACK_HEADER = "X-Model-Fallback"
#: The Jev profile's body field for the same (extra fields there are `x_` fields).
MODEL_FALLBACK_FIELD = "x_model_fallback"


# -- auth --------------------------------------------------------------------


def authorized(settings: Settings, authorization: str | Sequence[str] | None) -> bool:
    """Whether the `Authorization` header is exactly `Bearer <key>`; always True without a key.

    `authorization` is the header's value, or every value the request sent: more than one is
    never authorized (which one counts would depend on the proxies in between). Compared as
    bytes in constant time. aiohttp decodes header bytes as UTF-8 with surrogateescape, so
    re-encoding the same way gives back what was on the wire, and a header no text encoding
    likes is a 401 rather than an exception.
    """
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


# -- validated requests --------------------------------------------------------------------


def _shape(settings: Settings, result: dict[str, Any], fallback: str | None) -> dict[str, Any]:
    """One routed result in the wire profile; the Jev profile also names a model fallback in
    the body (laya-serve's body stays as it is: the header says it)."""
    if not settings.jev:
        return shape(result, settings.jev_strict)
    if fallback is not None:
        answered = {"requested": fallback, "answered_by": answered_by(result)}
        result = {**result, MODEL_FALLBACK_FIELD: answered}
    return jev.shape(result, settings.jev_strict)


def answered_by(routed: dict[str, Any]) -> str:
    """The checkpoint a result's `routing` block names."""
    routing = routed.get("routing")
    return str(routing.get("model")) if isinstance(routing, dict) else ""


@dataclass(frozen=True)
class OneDecision:
    """A `/v1/systemone` request that passed every check: what to ask the agent."""

    state: Any
    questions: Any
    #: Only the controls the caller sent (`agent_controls`).
    controls: dict[str, Any] = field(default_factory=dict)
    #: The body's `model` when it named no checkpoint here (`served.ModelChoice.fallback`).
    fallback: str | None = None
    #: Fields of the body and its questions that nothing reads (`unknown_fields_headers`).
    unknown: tuple[UnknownField, ...] = ()

    what = "inference"

    def run(self, agent: ServedAgent, settings: Settings) -> dict[str, Any]:
        return tournament.predict_as_planned(
            agent, self.state, self.questions, settings.tournament_group, **self.controls
        )

    def payload(
        self, result: dict[str, Any], checkpoint: ServedCheckpoints, settings: Settings
    ) -> dict[str, Any]:
        return _shape(settings, checkpoint.with_routing(result), self.fallback)


@dataclass(frozen=True)
class BatchDecision:
    """A `/v1/systemone/batch` request that passed every check: what to ask the agent."""

    states: list[Any]
    questions: Any
    #: The caller's controls plus the planned `batch_size` / `sort_by_length`.
    controls: dict[str, Any] = field(default_factory=dict)
    #: The body's `model` when it named no checkpoint here (`served.ModelChoice.fallback`).
    fallback: str | None = None
    #: Fields of the body and its questions that nothing reads (`unknown_fields_headers`).
    unknown: tuple[UnknownField, ...] = ()

    what = "batch inference"

    def run(self, agent: ServedAgent, settings: Settings) -> list[dict[str, Any]]:
        return tournament.predict_batch_as_planned(
            agent, self.states, self.questions, settings.tournament_group, **self.controls
        )

    def payload(
        self, results: list[dict[str, Any]], checkpoint: ServedCheckpoints, settings: Settings
    ) -> dict[str, Any]:
        routed = [checkpoint.with_routing(r) for r in results]
        return {
            "results": [_shape(settings, r, self.fallback) for r in routed],
            "total_usage": aggregate_usage(routed),
        }


def agent_controls(
    body: v.Body, checkpoint: ServedCheckpoints, settings: Settings
) -> tuple[dict[str, Any], ModelChoice]:
    """model → max_len → head_max_len → lang → lang_guess → min_confidence, in contract order.

    Returns only the controls the caller sent (absent/null are never forwarded, so the bundle's
    own budgets stay in charge), and how `model` was taken. The Router is told what to route by
    (`model` resolved, None to auto-route; `task`, `lang_guess`); one bundle pins its checkpoint.
    """
    model = checkpoint.check_model(body.body.get("model"))
    checked = {
        k: body.control(k) for k in ("max_len", "head_max_len", "lang", "lang_guess", "min_confidence")
    }
    lang_guess = checked.pop("lang_guess")
    controls = {k: value for k, value in checked.items() if value is not None}
    controls.update(checkpoint.routing_controls(model.pinned, body.body.get("task"), lang_guess))
    return controls, model


def parse_systemone(
    raw: bytes, agent: ServedAgent, checkpoint: ServedCheckpoints, settings: Settings
) -> OneDecision:
    """The `/v1/systemone` checks in the order of docs/http-api.md, "Refusals in order" on the raw body; the first failing wins."""
    del agent  # one signature for both routes; the single route plans nothing from the agent
    with jev.validation_stage(settings.jev):
        body = v.Body(v.parse_json(raw), False, settings.jev, settings.max_token_budget)
        body.limits()
        body.refusals()
        controls, model = agent_controls(body, checkpoint, settings)
        checkpoint.check_task(body.body.get("task"))
    unknown = tuple(unknown_fields(body.body, v.REQUEST_FIELDS, most=UNKNOWN_FIELDS_NAMED))
    return OneDecision(body.body["state"], body.body["questions"], controls, model.fallback, unknown)


def parse_batch(
    raw: bytes, agent: ServedAgent, checkpoint: ServedCheckpoints, settings: Settings
) -> BatchDecision:
    """The `/v1/systemone/batch` checks in the order of docs/http-api.md, "Refusals in order", and the pass plan ("Batch")."""
    with jev.validation_stage(settings.jev):
        body = v.Body(v.parse_json(raw), True, settings.jev, settings.max_token_budget)
        body.limits()
        body.refusals()
        controls, model = agent_controls(body, checkpoint, settings)
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


# -- the pass and the answer ---------------------------------------------------------------


def pass_refusal(exc: Exception, what: str, model: str) -> ApiError:
    """The refusal for an exception the agent call raised.

    A row too large for the pass memory budget (`PassTooLarge`), or a request whose passes are
    estimated to take longer than it may (`CallTooLarge`), is a 413 with the agent's text (the
    estimate, the budget and its setting); a request stopped for its deadline is a 504. Any other `LayaInputError` (InvalidRequest/InvalidRequestType)
    is the caller's request: 422 with its text verbatim. Anything else — numpy, onnxruntime, a
    hook's own ValueError — is ours and is logged with its traceback but answered with a fixed
    500, so nothing about the host leaks. Call it where the request's log context is set (the
    aiohttp app calls it on the loop, not on the worker thread).
    """
    if isinstance(exc, (PassTooLarge, CallTooLarge)):
        return ApiError(413, str(exc))
    if isinstance(exc, CallStopped):
        # a deadline that cannot be met (the loop's own deadline answers a passed one first)
        return ApiError(504, "request not answered: %s; no pass of it ran after that" % exc.reason)
    if isinstance(exc, LayaInputError):
        return ApiError(422, str(exc))
    log.error("%s failed for model=%s", what, model, exc_info=exc)
    return ApiError(500, INFERENCE_FAILED)


def render_payload(make_payload: Callable[[], Any], what: str, model: str) -> bytes:
    """Shape and render after inference: a non-finite float is a 422, anything else a logged 500."""
    try:
        return render(make_payload())
    except NonFiniteNumber:
        raise ApiError(422, NON_FINITE) from None
    except Exception:
        log.exception("%s failed for model=%s", what, model)
        raise ApiError(500, INFERENCE_FAILED) from None


def answering_checkpoints(result: Any, checkpoint: ServedCheckpoints) -> list[str]:
    """The served checkpoints that answered a result (a batch's states may route apart), in order
    of first answer; names from the routing blocks, never a client's text."""
    results = result if isinstance(result, list) else [result]
    return [n for n in dict.fromkeys(answered_by(checkpoint.with_routing(r)) for r in results) if n]


def metrics_checkpoint(result: Any, checkpoint: ServedCheckpoints) -> str:
    """The `checkpoint` label of a decision's metrics: the one served checkpoint that answered it
    (the one a Router picked or was pinned to), this server's name when several did."""
    names = answering_checkpoints(result, checkpoint)
    return names[0] if len(names) == 1 else checkpoint.name


def model_fallback_headers(
    decision: OneDecision | BatchDecision, result: Any, checkpoint: ServedCheckpoints
) -> dict[str, str]:
    """`X-Model-Fallback: <checkpoint>[, <checkpoint>...]` for a decision whose `model` named no
    checkpoint served here: the checkpoints that answered (a batch may route states apart), and
    one log line saying so. Nothing for any other decision."""
    if decision.fallback is None:
        return {}
    answered = ", ".join(answering_checkpoints(result, checkpoint)) or checkpoint.name
    log.info("model %.200r names no checkpoint served here; answered by %s", decision.fallback, answered)
    # a header value is printable ASCII; a checkpoint's name comes from its folder or option
    return {MODEL_FALLBACK_HEADER: "".join(c if " " <= c <= "~" else "?" for c in answered)}


def answer_headers(
    decision: OneDecision | BatchDecision, result: Any, checkpoint: ServedCheckpoints
) -> dict[str, str]:
    """The headers an answer carries beside its body, for both front ends: what the client sent
    that the server did not take as written (a model it does not serve, fields it does not read)."""
    return {
        **model_fallback_headers(decision, result, checkpoint),
        **unknown_fields_headers(decision),
    }


def unknown_fields_headers(decision: OneDecision | BatchDecision) -> dict[str, str]:
    """`X-Unknown-Fields` for a decision whose body or questions carry fields nothing reads (a
    misspelt optional field would otherwise change nothing in silence, as laya-serve accepts
    it): `field`, `question.field`, each with `=nearest` where a known field is close; printable
    ASCII, at most 1 000 characters. Nothing for a body without such fields."""
    if not decision.unknown:
        return {}
    named = []
    for f in decision.unknown:
        where = str(f.name) if f.question is None else "%s.%s" % (f.question, f.name)
        named.append(where if f.did_you_mean is None else "%s=%s" % (where, f.did_you_mean))
    # a client's key may hold anything: outside printable ASCII, and the list's comma, becomes "?"
    text = ", ".join("".join(c if " " < c <= "~" and c != "," else "?" for c in n) for n in named)
    return {UNKNOWN_FIELDS_HEADER: text[:1000]}


def error_body(settings: Settings, status: int, detail: str, errors: Any = None) -> Any:
    """A refusal's body in the configured wire profile: laya-serve's `{"detail": "<string>"}`,
    or the Jev profile's shapes (`jev.error_payload`)."""
    if settings.jev:
        return jev.error_payload(status, detail, errors)
    return {"detail": detail}


def api_error_body(settings: Settings, exc: ApiError) -> Any:
    """`error_body` for a raised refusal (a Jev validation error carries its list of errors)."""
    return error_body(settings, exc.status, exc.detail, getattr(exc, "errors", None))
