"""The wire contract of the decision routes as pydantic models, for both wire profiles
(docs/http-api.md#request-fields): `validate.Body` checks a body with them, `openapi.py` generates
`/openapi.json` from them. A rule a JSON Schema cannot state is written into its description.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from laya_onnx.core import settings
from laya_onnx.core.tournament import MAX_ONE_PASS_CHOICE_OPTIONS

#: "Not blank" as `str.strip()` judges it: a character Python does not count as whitespace
#: (ECMA's `\S` also matches U+001C..U+001F, which `strip()` removes).
NOT_BLANK = "[^%s]" % "".join("\\u%04x" % c for c in range(0x3001) if chr(c).isspace())  # U+3000 is the last

MAX_QUESTIONS = 64
MAX_STATE_CHARS = 50000
MAX_BATCH_STATES = 64
#: TypeSafe Jev's cap; over `MAX_ONE_PASS_CHOICE_OPTIONS` a choice is answered by elimination.
MAX_CHOICE_OPTIONS = 255
#: laya-serve's cap on a question's score levels (`core.structured` has its own).
MAX_REQUEST_SCORE_LEVELS = 32
#: The choice options and score levels of all questions of one request together.
MAX_TOTAL_OPTIONS = 512


def absent_field(description: str | None = None, unique: bool = False, **constraints: Any) -> Any:
    """A key that may be absent but is never null: not required, and no `default: null` shown;
    `unique`: a list whose items differ (documented; the question checks refuse a repeat)."""

    def extra(schema: dict[str, Any]) -> None:
        schema.pop("default", None)
        schema.update({"uniqueItems": True} if unique else {})

    return Field(None, description=description, json_schema_extra=extra, **constraints)


OPEN = ConfigDict(extra="allow")
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Count = Annotated[int, Field(ge=0)]
#: A choice label: a scalar, returned as itself in `choice` and as its JSON text in the keys.
Label = str | int | float | bool


def _blank(value: Any, handler: Any) -> Any:
    try:
        return handler(value)
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "string_pattern_mismatch":  # pydantic's text quotes the pattern
            raise PydanticCustomError("string_pattern_mismatch", "must not be blank") from None
        raise


NonBlank = Annotated[str, Field(pattern=NOT_BLANK), WrapValidator(_blank)]


def _state(value: Any) -> Any:
    """Not null, and within the size limit as the model reads it (a string, else its JSON text) and
    as sent (before a long numeric text is read as a number)."""
    if value is None:
        raise PydanticCustomError("missing", "state must not be null")
    try:
        n = len(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        raise PydanticCustomError("json_type", "state must be JSON-serializable") from None
    if n > MAX_STATE_CHARS:
        raise PydanticCustomError(
            "too_long", "at most {max_length} characters", {"max_length": MAX_STATE_CHARS, "length": n}
        )
    return value


State = Annotated[
    Annotated[str, Field(max_length=MAX_STATE_CHARS)] | float | bool | dict[str, Any] | list[Any],
    BeforeValidator(_state),
    Field(
        description="Text, or any JSON value but null (read as its JSON text); at most %d characters "
        "measured that way (413 beyond)." % MAX_STATE_CHARS
    ),
]


def _one_branch(value: Any, handler: Any) -> Any:
    """A union's failure as one error at the field itself (one fault, one entry in the Jev list):
    the error of the branch of the value's own type, else of a branch that took its type."""
    try:
        return handler(value)
    except ValidationError as exc:
        errors = exc.errors()
        named = [e for e in errors if str(e["loc"][0]).startswith(type(value).__name__)]
        took = [e for e in errors if not e["type"].endswith(("_type", "_parsing"))]
        first = (named or took or errors)[0]
        raise PydanticCustomError(first["type"], first["msg"], first.get("ctx")) from None


Instructions = Annotated[
    NonBlank
    | Annotated[dict[str, Any], Field(min_length=1)]
    | Annotated[list[Any], Field(min_length=1)]
    | float
    | bool,
    WrapValidator(_one_branch),
    Field(description="Text, a non-empty object or array, a number or a boolean (read as JSON text)."),
]
OptionOrder = list[Annotated[int, Field(ge=0, le=MAX_CHOICE_OPTIONS - 1)]]


def _options(value: Any, handler: Any) -> Any:
    """A choice's criteria: an object or a list, and not empty."""
    if not isinstance(value, (dict, list)):
        raise PydanticCustomError("dict_type", "choice criteria must be an object of option -> description")
    if not value:
        raise PydanticCustomError("too_short", "a choice question needs at least one option")
    return _one_branch(value, handler)


def _levels(value: Any) -> Any:
    """A score's criteria: a list, not empty (the map form is refused by name)."""
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


def _distinct_keys(value: Any) -> Any:
    """Labels that are one answer key (`true` and "true") would hide each other's probability."""
    if isinstance(value, list):
        keys: dict[str, Any] = {}
        for label in value:
            key = json.dumps({label: 0})
            if key in keys and keys[key] != label:
                raise PydanticCustomError(
                    "value_error",
                    "choice labels {first} and {second} are one answer key; give every option its own",
                    {"first": repr(keys[key]), "second": repr(label)},
                )
            keys.setdefault(key, label)
    return value


def _no_labels(schema: dict[str, Any]) -> None:
    schema.setdefault("properties", {})["labels"] = False


def _described(level: Any) -> Any:
    if level is None:
        raise PydanticCustomError("null_level", "a score level must be described, not null")
    return level


class _Question(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra=_no_labels)
    instructions: Instructions
    option_order: OptionOrder = absent_field(
        "The order the options are shown in: a permutation of range(number of options), else a 422.",
        unique=True,
        min_length=1,
        max_length=MAX_CHOICE_OPTIONS,
    )


_OPTIONS = Field(min_length=1, max_length=MAX_CHOICE_OPTIONS)
_UNIQUE = Field(json_schema_extra={"uniqueItems": True})


class ChoiceQuestion(_Question):
    """Pick one of the labelled options."""

    type: Literal["choice"]
    criteria: Annotated[
        Annotated[dict[str, Any], _OPTIONS, Field(description="label -> description (null: the label alone)")]
        | Annotated[
            list[Label], _OPTIONS, _UNIQUE, Field(description="labels only; 1, 1.0 and true are one")
        ],
        WrapValidator(_options),
        AfterValidator(_distinct_keys),
        Field(
            description="The options: at most %d (413 beyond); over %d they are answered by elimination "
            "(the answer carries x_tournament)." % (MAX_CHOICE_OPTIONS, MAX_ONE_PASS_CHOICE_OPTIONS)
        ),
    ]


class ScoreQuestion(_Question):
    """Rate on an ordinal scale; level i is criteria[i]."""

    type: Literal["score"]
    criteria: Annotated[
        list[Annotated[str | float | bool | dict[str, Any] | list[Any], BeforeValidator(_described)]],
        BeforeValidator(_levels),
        Field(
            min_length=1,
            max_length=MAX_REQUEST_SCORE_LEVELS,
            description="Level descriptions, index 0 first; a null level is a 422, more than %d a 413."
            % MAX_REQUEST_SCORE_LEVELS,
        ),
    ]


class NoulLabels(BaseModel):
    """How a noul's two options are worded: distinct, non-blank strings."""

    model_config = ConfigDict(extra="forbid")
    false: NonBlank
    true: NonBlank


def _needs_text(schema: dict[str, Any]) -> None:
    """Without instructions a noul needs a described outcome (`_asks_something`)."""
    described = {"type": "object", "minProperties": 1, "not": {"additionalProperties": {"type": "null"}}}
    schema["anyOf"] = [
        {"required": ["instructions"], "properties": {"instructions": {"not": {"type": "null"}}}},
        {"required": ["criteria"], "properties": {"criteria": described}},
    ]


class NoulQuestion(_Question):
    """A yes/no probability: P(true)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=None)
    type: Literal["noul"]
    criteria: Annotated[
        dict[Annotated[str, Field(pattern="^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$")], Any] | None,
        Field(description="Optional descriptions of the 'true' and/or 'false' option (keys in any case)."),
    ] = None
    labels: NoulLabels = absent_field()

    @model_validator(mode="after")
    def _asks_something(self) -> NoulQuestion:
        described = isinstance(self.criteria, dict) and any(v is not None for v in self.criteria.values())
        if self.instructions is None and not described:
            raise PydanticCustomError(
                "value_error", "a noul question needs instructions or criteria describing an outcome"
            )
        return self


#: A Jev question may leave `instructions` out (a neutral question per type is read): the one
#: field the Jev variants widen.
_JEV_INSTRUCTIONS = Field(None, description="Optional here (docs/http-api.md#the-jev-profile).")


class JevChoiceQuestion(ChoiceQuestion):
    instructions: Instructions | None = _JEV_INSTRUCTIONS  # type: ignore[assignment]


class JevScoreQuestion(ScoreQuestion):
    instructions: Instructions | None = _JEV_INSTRUCTIONS  # type: ignore[assignment]


class JevNoulQuestion(NoulQuestion):
    model_config = ConfigDict(extra="allow", json_schema_extra=_needs_text)
    instructions: Instructions | None = _JEV_INSTRUCTIONS  # type: ignore[assignment]


_QUESTIONS_DOC = "question id (non-blank) -> question; the limits: docs/http-api.md#limits"
Questions = Annotated[
    dict[NonBlank, Annotated[ChoiceQuestion | ScoreQuestion | NoulQuestion, Field(discriminator="type")]],
    Field(max_length=MAX_QUESTIONS, description=_QUESTIONS_DOC + "; {} is answered with no answers"),
]
JevQuestions = Annotated[
    dict[
        NonBlank,
        Annotated[JevChoiceQuestion | JevScoreQuestion | JevNoulQuestion, Field(discriminator="type")],
    ],
    Field(min_length=1, max_length=MAX_QUESTIONS, description=_QUESTIONS_DOC),
]


#: A token budget's cap is the server's setting (`validate.Body.control`, `openapi._components`).
Positive = Annotated[StrictInt, Field(ge=1)] | None
Language = Annotated[str | None, Field(description="A language code such as 'de'; blank means no hint.")]
#: A key laya's in-process API takes and this server refuses unless null (422).
HookRefusal = Annotated[
    None, Field(description="Refused with 422 unless null (docs/http-api.md#request-fields).")
]
_BUCKET = r"^(default|(choice|score|noul):(2|3-5|6-10|11\+))$"


class _Controls(BaseModel):
    """What both routes take beside the state(s) and the questions, in the order they are checked."""

    model_config = OPEN
    hooks: HookRefusal = None
    on_predict_start: HookRefusal = None
    on_predict_end: HookRefusal = None
    hooks_raise: HookRefusal = None
    hooks_timeout: HookRefusal = None
    model: Any = Field(None, description="Which checkpoint answers (docs/http-api.md#the-model-field).")
    max_len: Positive = Field(None, description="Token budget per row; 512.0 is a 422, as in laya-serve.")
    head_max_len: Positive = Field(None, description="Token budget of the option head; 192.0 is a 422.")
    lang: Language = None
    lang_guess: Language = Field(None, description="Routing hint: a language code; blank means none.")
    min_confidence: Annotated[
        Probability
        | Annotated[dict[Annotated[str, Field(pattern=_BUCKET)], Probability], Field(min_length=1)]
        | None,
        Field(description="Abstention threshold, one or per bucket (docs/semantics.md#the-confidence-gate)."),
    ] = None
    task: str | None = Field(None, description="A checkpoint's name or typed_decisions, else a 422.")


class DecisionRequest(_Controls):
    """`POST /v1/systemone`: one state, any number of questions."""

    state: State
    questions: Questions


class BatchRequest(_Controls):
    """`POST /v1/systemone/batch`: one question set over many states."""

    states: Annotated[list[State], Field(min_length=1, max_length=MAX_BATCH_STATES)]
    diagnostics: HookRefusal = None
    batch_size: Positive = Field(None, description="docs/http-api.md#batch")
    sort_by_length: StrictBool | None = None
    questions: Questions


class JevSystemOneRequest(DecisionRequest):
    """`POST /v1/systemone` in the Jev profile."""

    questions: JevQuestions  # type: ignore[assignment]


class JevBatchRequest(BatchRequest):
    """`POST /v1/systemone/batch` in the Jev profile (laya's route; Jev has no batch)."""

    questions: JevQuestions  # type: ignore[assignment]


_STRICT = f"Absent under {settings.JEV_STRICT.env}."
_GATE = "Only when the request set min_confidence."


class Action(BaseModel):
    act_probability: Probability


class Tournament(BaseModel):
    model_config = OPEN
    finalists: list[Any]
    rounds: Count


class JevChoiceAnswer(BaseModel):
    model_config = OPEN
    type: Literal["choice"]
    choice: Label = Field(description="The most probable label, as the request spelled it.")
    confidence: Probability
    probabilities: dict[str, Probability] = Field(description="label (its JSON text) -> probability")


class JevScoreAnswer(BaseModel):
    model_config = OPEN
    type: Literal["score"]
    score: float = Field(ge=0.0, description="Expected level index, sum of i * p_i.")
    confidence: Probability
    legend: dict[str, Any] = Field(description='"i" -> the level as the request gave it')
    probabilities: dict[str, Probability]


class JevNoulAnswer(BaseModel):
    model_config = OPEN
    type: Literal["noul"]
    noul: Probability = Field(description="P(true)")


class _Laya(BaseModel):
    """laya's keys beside the Jev contract's, on each answer of the laya-serve profile."""

    answer_confidence: Probability = absent_field(_STRICT)
    action: Action = absent_field(_STRICT)
    abstention: Literal["passed", "abstained", "unevaluated"] = absent_field(_GATE)
    abstention_threshold: Probability = absent_field(_GATE)
    low_confidence: Literal[True] = absent_field("Only on abstained answers.")


class ChoiceAnswer(_Laya, JevChoiceAnswer):
    confidence: Probability = Field(description="1 - H(p)/log k (laya's entropy confidence)")
    x_jev_confidence: Probability = absent_field("TypeSafe's (max p - 1/n)/(1 - 1/n). " + _STRICT)
    x_tournament: Tournament = absent_field()


class ScoreAnswer(_Laya, JevScoreAnswer):
    x_jev_confidence: Probability = absent_field("TypeSafe's distance confidence. " + _STRICT)


class NoulAnswer(_Laya, JevNoulAnswer):
    confidence: Probability = absent_field("max(p, 1 - p). " + _STRICT)


class Tokens(BaseModel):
    """Token counts; in a laya-serve answer's `usage` more keys follow (`Usage`)."""

    model_config = OPEN
    input_tokens: Count
    output_tokens: Count


class OptionSpans(BaseModel):
    total: Count
    distinct: Count
    tokens_per_option: Count | None = Field(description="The cap each option span was cut to, or null.")


class Usage(Tokens):
    """Token counts; everything but the two Jev counts is absent under LAYA_JEV_STRICT."""

    state_tokens: Count = absent_field()
    state_tokens_dropped: Count = absent_field()
    truncated: bool = absent_field()
    truncated_questions: list[Any] = absent_field()
    options: dict[str, OptionSpans] = absent_field()


class Routing(BaseModel):
    """Which checkpoint answered; with one bundle always this one (reason 'served bundle')."""

    model: str
    repo: str
    reason: str
    detection: dict[str, Any] | None
    workflow: str | None


class DecisionResponse(BaseModel):
    model_config = OPEN
    model: str
    answers: dict[str, Annotated[ChoiceAnswer | ScoreAnswer | NoulAnswer, Field(discriminator="type")]] = (
        Field(description="question id -> answer, one per question")
    )
    usage: Usage
    routing: Routing = absent_field(_STRICT)


class BatchResponse(BaseModel):
    results: list[DecisionResponse] = Field(description="one result per state, in order")
    total_usage: Tokens


class ModelFallback(BaseModel):
    """The body's `model`, which names no checkpoint here, and the checkpoint that answered."""

    requested: str
    answered_by: str


class JevSystemOneResponse(BaseModel):
    model_config = OPEN
    model: str
    answers: dict[
        str, Annotated[JevChoiceAnswer | JevScoreAnswer | JevNoulAnswer, Field(discriminator="type")]
    ]
    usage: Tokens
    x_model_fallback: ModelFallback = absent_field("docs/http-api.md#the-model-field")


class JevBatchResponse(BaseModel):
    results: list[JevSystemOneResponse]
    total_usage: Tokens
