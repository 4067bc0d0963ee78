"""TypeSafe's Jev profile (`LAYA_JEV_PROFILE=typesafe`): the wire format a client written against
TypeSafe's Jev spec expects where it asks more than laya-serve (docs/http-api.md, "The Jev profile").

Off by default: the default server is laya-serve's wire format byte for byte. On, it changes
only the edges — the same checks, the same model, the same numbers:

  * requests are validated against the Jev request models (`schema.JevSystemOneRequest`) first; a failure, malformed JSON
    included, is a 422 `{"detail": [{"loc": ["body", ...], "msg", "type"}, ...]}`, and so is
    every other 400/422 refusal of a request body (one entry, `loc: ["body"]`);
  * every other error is `{"detail": {"error_type", "message"}}`;
  * a question may omit `instructions` (a noul then needs a described outcome): the model is given
    a neutral per-type instruction instead (`DEFAULT_INSTRUCTIONS`);
  * `confidence` is TypeSafe's (choice `(n·p_max − 1)/(n − 1)`, score the distance form; see
    `wire.jev_confidence`), and laya's entropy confidence moves to `x_laya_confidence`;
  * every field outside the Jev contract is prefixed `x_` (root, `usage` and answers:
    `x_routing`, `x_state_tokens`, `x_answer_confidence`, `x_action`, ...), unless
    `LAYA_JEV_STRICT` drops them altogether.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from laya_onnx.serve import schema
from laya_onnx.serve.errors import ApiError
from laya_onnx.serve.wire import jev_confidence, strict_projection

#: What the model reads when a Jev question leaves `instructions` out: laya's head needs some
#: question text, and these add nothing the option texts do not already say.
DEFAULT_INSTRUCTIONS = {
    "choice": "Which option applies?",
    "score": "Which level applies?",
    "noul": "Which outcome holds?",
}

#: error_type by status for the non-validation errors (TypeSafe's Jev error types; the last two are ours).
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


def error_type(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "internal_error" if status >= 500 else "api_usage_error"


# -- validation ----------------------------------------------------------------------------


class JevValidationError(ApiError):
    """A 422 whose body is the Jev list of `{loc, msg, type}` entries."""

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__(422, "; ".join(e["msg"] for e in errors) or "invalid request")
        self.errors = errors


def body_error(detail: str, kind: str = "value_error") -> JevValidationError:
    return JevValidationError([{"loc": ["body"], "msg": detail, "type": kind}])


@contextlib.contextmanager
def validation_stage(enabled: bool) -> Iterator[None]:
    """Inside, a 400/422 refusal of the body is re-raised as the Jev 422 list when `enabled`."""
    try:
        yield
    except JevValidationError:
        raise
    except ApiError as exc:
        if not enabled or exc.status not in (400, 422):
            raise
        kind = "json_invalid" if exc.status == 400 and "valid JSON" in exc.detail else "value_error"
        refusal = body_error(exc.detail, kind)
        if exc.item is not None:  # a batch item at fault: its place in the list, and the header
            refusal.errors[0]["loc"] = ["body", "states", exc.item]
            refusal.at_item(exc.item)
        raise refusal from None


def with_default_instructions(questions: dict[str, Any]) -> dict[str, Any]:
    """The questions as sent, each without `instructions` given its type's neutral one."""
    out = {}
    for qid, q in questions.items():
        if isinstance(q, dict) and q.get("instructions") is None and q.get("type") in DEFAULT_INSTRUCTIONS:
            q = {**q, "instructions": DEFAULT_INSTRUCTIONS[q["type"]]}
        out[qid] = q
    return out


# -- response shaping ----------------------------------------------------------------------

#: The Jev contract's keys per answer type, in the order TypeSafe's schema lists them: the fields
#: of the Jev answer models (`schema.py`); every other key of an answer is an `x_` one.
CONTRACT = {
    "choice": tuple(schema.JevChoiceAnswer.model_fields),
    "score": tuple(schema.JevScoreAnswer.model_fields),
    "noul": tuple(schema.JevNoulAnswer.model_fields),
}
USAGE_KEYS = tuple(schema.Tokens.model_fields)
ROOT_KEYS = tuple(k for k in schema.JevSystemOneResponse.model_fields if not k.startswith("x_"))


def _extra(key: str) -> str:
    return key if key.startswith("x_") else "x_" + key


def _answer(answer: Any) -> Any:
    kind = answer.get("type") if isinstance(answer, dict) else None
    if kind not in CONTRACT:
        return answer
    assert isinstance(answer, dict)
    values = dict(answer)
    if "confidence" in values:
        values["x_laya_confidence"] = values.pop("confidence")
    if kind != "noul":
        conf = jev_confidence(answer)
        values["confidence"] = round(conf, 4) if conf is not None else values.get("x_laya_confidence")
    out = {k: values.pop(k) for k in CONTRACT[kind] if k in values}
    out.update({_extra(k): v for k, v in values.items()})
    return out


def _result(result: dict[str, Any]) -> dict[str, Any]:
    answers = result.get("answers")
    out: dict[str, Any] = {k: result[k] for k in ROOT_KEYS if k in result}
    if isinstance(answers, dict):
        out["answers"] = {qid: _answer(a) for qid, a in answers.items()}
    usage = result.get("usage")
    if isinstance(usage, dict):
        out["usage"] = {k: usage[k] for k in USAGE_KEYS if k in usage}
        out["usage"].update({_extra(k): v for k, v in usage.items() if k not in USAGE_KEYS})
    out.update({_extra(k): v for k, v in result.items() if k not in ROOT_KEYS})
    return out


def shape(result: dict[str, Any], strict: bool) -> dict[str, Any]:
    """One decision result in the Jev profile; `strict` keeps the contract's keys only."""
    shaped = _result(result)
    return strict_projection(shaped) if strict else shaped


def error_payload(status: int, detail: str, errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The Jev error body: the validation list for a 422, else {error_type, message}."""
    if status == 422:
        return {
            "detail": errors
            if errors is not None
            else [{"loc": ["body"], "msg": detail, "type": "value_error"}]
        }
    return {"detail": {"error_type": error_type(status), "message": detail}}
