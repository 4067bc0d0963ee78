"""TypeSafe's Jev profile (`LAYA_JEV_PROFILE=typesafe`): the wire format a client written against
TypeSafe's Jev spec expects where it asks more than laya-serve (docs/http-api.md, "The Jev profile").

Off by default: the default server is laya-serve's wire format byte for byte. On, it changes
only the edges — the same checks, the same model, the same numbers:

  * requests are validated against the Jev request schema below first; a failure, malformed JSON
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

The pydantic models are the schema of record for `/openapi.json` as well as the validator.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from laya_onnx.serve.errors import ApiError
from laya_onnx.serve.validate import NOT_BLANK
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


# -- request schema ------------------------------------------------------------------------

Content = Any  # text, object or array (laya also reads numbers); laya's validator has the last word

# What the validators below check, for the document (a field typed Any says nothing by itself).
_NOT_NULL: dict[str, Any] = {"not": {"type": "null"}}
_SCALAR_LABEL: dict[str, Any] = {"type": ["string", "number", "boolean"]}
_CHOICE_CRITERIA: dict[str, Any] = {
    "anyOf": [
        {"type": "object", "minProperties": 1},
        {"type": "array", "minItems": 1, "items": _SCALAR_LABEL},
    ]
}
_SCORE_CRITERIA: dict[str, Any] = {"type": "array", "minItems": 1, "items": _NOT_NULL}
#: An object whose values are not all null (at least one described outcome).
_DESCRIBED: dict[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "not": {"additionalProperties": {"type": "null"}},
}


_INSTRUCTIONS: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": NOT_BLANK},
        {"type": "object", "minProperties": 1},
        {"type": "array", "minItems": 1},
        {"type": ["number", "boolean", "null"]},
    ]
}


def _hashable(label: Any) -> bool:
    return isinstance(label, (str, int, float, bool))


def _asks_something(schema: dict[str, Any]) -> None:
    """A noul needs instructions or a described outcome (`NoulQuestion._asks_something`)."""
    schema["anyOf"] = [
        {"required": ["instructions"], "properties": {"instructions": _NOT_NULL}},
        {"required": ["criteria"], "properties": {"criteria": _DESCRIBED}},
    ]


class _Question(BaseModel):
    # Laya's own question keys (`option_order`, noul `labels`) pass through to laya's validator.
    model_config = ConfigDict(extra="allow")

    instructions: Content | None = Field(
        None,
        description="What to decide; optional in Jev. Text with a non-blank character, a non-empty "
        "object or array (read as its JSON text), a number or a boolean.",
        json_schema_extra=_INSTRUCTIONS,
    )


class ChoiceQuestion(_Question):
    type: Literal["choice"]
    criteria: Any = Field(
        ...,
        description="Option names mapped to descriptions (null for none); at least one option. "
        "A list of names (strings, numbers or booleans) is accepted too (laya); two names that are "
        'one answer key (true and "true") are a 422.',
        json_schema_extra=_CHOICE_CRITERIA,
    )

    @field_validator("criteria")
    @classmethod
    def _options(cls, value: Any) -> Any:
        if not isinstance(value, (dict, list)):
            raise PydanticCustomError(
                "dict_type", "choice criteria must be an object of option -> description"
            )
        if not value:
            raise PydanticCustomError("too_short", "a choice question needs at least one option")
        if isinstance(value, list):
            keys: dict[str, Any] = {}
            for label in value:
                if not _hashable(label):
                    continue  # laya refuses a label that is not a scalar, in its own words
                key = json.dumps({label: 0})
                if key in keys and keys[key] != label:
                    # laya's own check takes 1, 1.0 and True as one label; `true` and "true"
                    # differ for it yet share an answer key, and one would hide the other
                    raise PydanticCustomError(
                        "value_error",
                        "choice labels {first!r} and {second!r} are one answer key; give every option its own",
                        {"first": keys[key], "second": label},
                    )
                keys.setdefault(key, label)
        return value


class ScoreQuestion(_Question):
    type: Literal["score"]
    criteria: Any = Field(
        ...,
        description="Level descriptions, index 0 first; at least one level, none null.",
        json_schema_extra=_SCORE_CRITERIA,
    )

    @field_validator("criteria")
    @classmethod
    def _levels(cls, value: Any) -> Any:
        if isinstance(value, dict):
            raise PydanticCustomError(
                "list_type",
                "score criteria must be a list of level descriptions, index 0 first; "
                'the map form {"0": ..., "1": ...} is not accepted',
            )
        if not isinstance(value, list):
            raise PydanticCustomError("list_type", "score criteria must be a list of level descriptions")
        if not value:
            raise PydanticCustomError("too_short", "a score question needs at least one level")
        return value


class NoulQuestion(_Question):
    model_config = ConfigDict(extra="allow", json_schema_extra=_asks_something)

    type: Literal["noul"]
    criteria: Any = Field(
        None,
        description="Optional {true, false} descriptions of the two outcomes (keys in any case); "
        "instructions or one described outcome is needed.",
        json_schema_extra={
            "type": ["object", "null"],
            "propertyNames": {"pattern": "^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$"},
        },
    )

    @model_validator(mode="after")
    def _asks_something(self) -> NoulQuestion:
        described = isinstance(self.criteria, dict) and any(v is not None for v in self.criteria.values())
        if self.instructions is None and not described:
            raise PydanticCustomError(
                "value_error", "a noul question needs instructions or criteria describing an outcome"
            )
        return self


Question = Annotated[ChoiceQuestion | ScoreQuestion | NoulQuestion, Field(discriminator="type")]


class SystemOneRequest(BaseModel):
    """`POST /v1/systemone` in the Jev profile; laya's controls (`max_len`, ...) ride along."""

    model_config = ConfigDict(extra="allow")

    model: Any = Field(
        None,
        description="Model name: jev-latest, or a checkpoint's name or alias. Any other name is "
        "answered too, and the answer says so (x_model_fallback, X-Model-Fallback).",
    )
    state: Content = Field(
        ..., description="The content every question is about.", json_schema_extra=_NOT_NULL
    )
    questions: dict[str, Question] = Field(
        ..., min_length=1, json_schema_extra={"propertyNames": {"pattern": NOT_BLANK}}
    )

    @field_validator("state")
    @classmethod
    def _state_not_null(cls, value: Any) -> Any:
        if value is None:
            raise PydanticCustomError("missing", "state must not be null")
        return value


class BatchRequest(BaseModel):
    """`POST /v1/systemone/batch` in the Jev profile (laya's route; Jev has no batch)."""

    model_config = ConfigDict(extra="allow")

    model: Any = None
    states: list[Content] = Field(..., min_length=1, json_schema_extra={"items": _NOT_NULL})
    questions: dict[str, Question] = Field(
        ..., min_length=1, json_schema_extra={"propertyNames": {"pattern": NOT_BLANK}}
    )


# -- response schema (for /openapi.json; `x_` fields are open-ended) ------------------------


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChoiceAnswer(_Answer):
    type: Literal["choice"]
    #: The chosen label as the request wrote it (a list-form label may be a number or a boolean).
    choice: str | float | bool
    confidence: float = Field(..., ge=0, le=1)
    probabilities: dict[str, float]


class ScoreAnswer(_Answer):
    type: Literal["score"]
    score: float
    confidence: float = Field(..., ge=0, le=1)
    legend: dict[str, Any]
    probabilities: dict[str, float]


class NoulAnswer(_Answer):
    type: Literal["noul"]
    noul: float = Field(..., ge=0, le=1)


Answer = Annotated[ChoiceAnswer | ScoreAnswer | NoulAnswer, Field(discriminator="type")]


class Usage(BaseModel):
    model_config = ConfigDict(extra="allow")

    input_tokens: int = Field(..., ge=0)
    output_tokens: int = Field(..., ge=0)


class ModelFallback(BaseModel):
    requested: str = Field(..., description="The body's `model`, which names no checkpoint here.")
    answered_by: str = Field(..., description="The checkpoint that answered instead.")


class SystemOneResponse(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    answers: dict[str, Answer]
    usage: Usage
    x_model_fallback: ModelFallback | None = Field(
        None,
        description="Only when the body's `model` named no checkpoint this server knows and the "
        "request was answered anyway (also in the X-Model-Fallback header).",
    )


class ValidationErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class HTTPValidationError(BaseModel):
    detail: list[ValidationErrorItem]


class ErrorDetail(BaseModel):
    error_type: str
    message: str


class ErrorBody(BaseModel):
    detail: ErrorDetail


# -- validation ----------------------------------------------------------------------------


class JevValidationError(ApiError):
    """A 422 whose body is the Jev list of `{loc, msg, type}` entries."""

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__(422, "; ".join(e["msg"] for e in errors) or "invalid request")
        self.errors = errors


def _entries(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False)
    ]


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


def _with_default_instructions(questions: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for qid, q in questions.items():
        if isinstance(q, dict) and q.get("instructions") is None and q.get("type") in DEFAULT_INSTRUCTIONS:
            q = {**q, "instructions": DEFAULT_INSTRUCTIONS[q["type"]]}
        out[qid] = q
    return out


def validate(body: Any, schema: type[BaseModel]) -> dict[str, Any]:
    """`body` checked against `schema` (422 list on failure), questions given default instructions.

    The body itself goes on to laya's checks, not pydantic's dump of it, so every value reaches
    the model exactly as the caller wrote it.
    """
    try:
        schema.model_validate(body)
    except ValidationError as exc:
        raise JevValidationError(_entries(exc)) from None
    return {**body, "questions": _with_default_instructions(body["questions"])}


# -- response shaping ----------------------------------------------------------------------

#: The Jev contract's keys per answer type, in the order TypeSafe's schema lists them.
CONTRACT = {
    "choice": ("type", "choice", "confidence", "probabilities"),
    "score": ("type", "score", "confidence", "legend", "probabilities"),
    "noul": ("type", "noul"),
}
USAGE_KEYS = ("input_tokens", "output_tokens")
ROOT_KEYS = ("model", "answers", "usage")


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


__all__ = [
    "BatchRequest",
    "ChoiceAnswer",
    "ChoiceQuestion",
    "ErrorBody",
    "HTTPValidationError",
    "JevValidationError",
    "ModelFallback",
    "NoulAnswer",
    "NoulQuestion",
    "ScoreAnswer",
    "ScoreQuestion",
    "SystemOneRequest",
    "SystemOneResponse",
    "Usage",
    "error_payload",
    "shape",
    "validate",
    "validation_stage",
]
