"""The wire contract as typed schemas: the one source `/openapi.json` and `/docs` are built from.

These types describe what the server accepts and answers in its default (laya-serve) mode; they
are not what validates a request. The handlers check bodies with `validate.py` and the core's
question rules, in laya-serve's order and with its exact texts (docs/http-api.md, "Refusals in order"). The schema-driven
fuzz test (tests/serve/test_serve_fuzz.py) is what keeps the two in step: it sends thousands of
bodies generated from these schemas, valid and invalid, and fails on any answer that
contradicts them.

Rules a JSON Schema cannot state are written into the descriptions and answered with a
documented 4xx: `option_order` must be a permutation, labels that render alike (`1`, `1.0`,
`true`) collide, the options of all questions share one budget of 512, and the question rows
must fit the model's token budgets.

TypedDicts rather than models because an optional key that must not be `null` when present
(`option_order`, `labels`, most answer keys) is `NotRequired` here, which a pydantic model
field with a default cannot express without also advertising `null`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field
from typing_extensions import NotRequired, TypedDict

from laya_onnx.core import settings
from laya_onnx.core.tournament import MAX_ONE_PASS_CHOICE_OPTIONS
from laya_onnx.serve import validate as v

#: Extra keys are ignored by the server (laya-serve walks them only for lone surrogates).
_OPEN = ConfigDict(extra="allow")


def _no_labels(schema: dict[str, Any]) -> None:
    schema.setdefault("properties", {})["labels"] = False


#: A choice or score question may carry any extra key but `labels` (a noul's only: a 422).
_OPEN_NO_LABELS = ConfigDict(extra="allow", json_schema_extra=_no_labels)

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Count = Annotated[int, Field(ge=0)]
#: A choice label: a scalar, returned as itself in `choice` and as its JSON text in the keys.
Label = str | int | float | bool
#: Any JSON value but null (instructions, descriptions and levels are rendered as JSON text).
NonNull = str | float | bool | dict[str, Any] | list[Any]


# -- requests -------------------------------------------------------------------------------

Instructions = Annotated[
    Annotated[str, Field(pattern=v.NOT_BLANK)]
    | Annotated[dict[str, Any], Field(min_length=1)]
    | Annotated[list[Any], Field(min_length=1)]
    | float
    | bool,
    Field(
        description="What the model should answer: non-blank text, or a non-empty object or array "
        "(rendered as JSON text). A number or boolean is tolerated and rendered as JSON text, as laya does."
    ),
]

ChoiceCriteria = Annotated[
    Annotated[
        dict[str, Any],
        Field(
            min_length=1,
            max_length=v.MAX_CHOICE_OPTIONS,
            description="label -> description (any JSON value; null means the label alone)",
        ),
    ]
    | Annotated[
        list[Label],
        Field(
            min_length=1,
            max_length=v.MAX_CHOICE_OPTIONS,
            json_schema_extra={"uniqueItems": True},
            description="labels only; labels that are one dict key (1, 1.0 and true) are refused",
        ),
    ],
    Field(
        description="The options: at most %d (413 beyond); over %d they are answered by elimination "
        "(the answer carries x_tournament)." % (v.MAX_CHOICE_OPTIONS, MAX_ONE_PASS_CHOICE_OPTIONS)
    ),
]

OptionOrder = Annotated[
    list[Annotated[int, Field(ge=0, le=v.MAX_CHOICE_OPTIONS - 1)]],
    Field(
        min_length=1,
        max_length=v.MAX_CHOICE_OPTIONS,
        json_schema_extra={"uniqueItems": True},
        description="A permutation of range(number of options): the order the options are shown in "
        "(one entry per option, each option once; any other list is a 422).",
    ),
]


class ChoiceQuestion(TypedDict):
    """Pick one of the labelled options."""

    __pydantic_config__ = _OPEN_NO_LABELS  # type: ignore[misc]
    type: Literal["choice"]
    instructions: Instructions
    criteria: ChoiceCriteria
    option_order: NotRequired[OptionOrder]


class ScoreQuestion(TypedDict):
    """Rate on an ordinal scale; level i is criteria[i]."""

    __pydantic_config__ = _OPEN_NO_LABELS  # type: ignore[misc]
    type: Literal["score"]
    instructions: Instructions
    criteria: Annotated[
        list[NonNull],
        Field(
            min_length=1,
            max_length=v.MAX_REQUEST_SCORE_LEVELS,
            description="Level descriptions, index 0 first; a null level is a 422, more than %d a 413."
            % v.MAX_REQUEST_SCORE_LEVELS,
        ),
    ]
    option_order: NotRequired[OptionOrder]


class NoulLabels(TypedDict):
    """How a noul's two options are worded: distinct, non-blank strings."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    false: Annotated[str, Field(pattern=v.NOT_BLANK)]
    true: Annotated[str, Field(pattern=v.NOT_BLANK)]


NoulCriteria = Annotated[
    dict[str, Any] | None,
    Field(
        json_schema_extra={"propertyNames": {"pattern": "^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$"}},
        description="Optional descriptions of the 'true' and/or 'false' option (keys in any case).",
    ),
]


class NoulQuestion(TypedDict):
    """A yes/no probability: P(true)."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]
    type: Literal["noul"]
    instructions: Instructions
    criteria: NotRequired[NoulCriteria]
    labels: NotRequired[NoulLabels]
    option_order: NotRequired[OptionOrder]


Question = Annotated[
    ChoiceQuestion | ScoreQuestion | NoulQuestion,
    Field(discriminator="type"),
]

Questions = Annotated[
    dict[str, Question],
    Field(
        max_length=v.MAX_QUESTIONS,
        json_schema_extra={"propertyNames": {"pattern": v.NOT_BLANK}},
        description="question id (non-blank) -> question; at most %d (413 beyond); {} is answered "
        "with no answers" % v.MAX_QUESTIONS,
    ),
]

State = Annotated[
    Annotated[str, Field(max_length=v.MAX_STATE_CHARS)] | float | bool | dict[str, Any] | list[Any],
    Field(
        description="What the questions are about: text, or any JSON value but null (read as its JSON "
        "text). At most %d characters measured that way (413 beyond)." % v.MAX_STATE_CHARS
    ),
]

MinConfidence = Annotated[
    Probability
    | Annotated[
        dict[str, Probability],
        Field(
            min_length=1,
            json_schema_extra={
                "propertyNames": {"pattern": r"^(default|(choice|score|noul):(2|3-5|6-10|11\+))$"}
            },
        ),
    ]
    | None,
    Field(
        description="Abstention threshold on answer_confidence: one number, or per bucket "
        "('choice:3-5', ..., 'default'). Adds abstention keys to every answer."
    ),
]

#: Keys that name code running inside the server: accepted only as null (422 otherwise).
HookRefusal = Annotated[None, Field(description="Refused with 422 unless null: hooks run server-side.")]


class _Controls(TypedDict):
    __pydantic_config__ = _OPEN  # type: ignore[misc]
    model: NotRequired[
        Annotated[
            Any,
            Field(
                description="Empty/absent, 'jev-latest', or this checkpoint's name, alias or Hub id: "
                "answered here. Any other name (a typo, another Jev id): answered here too, with the "
                "X-Model-Fallback header naming the checkpoint that answered. A path, an unpublished "
                "Hub id or another laya checkpoint's name: 422."
            ),
        ]
    ]
    task: NotRequired[
        Annotated[str | None, Field(description="This checkpoint's name; anything else is a 422.")]
    ]
    max_len: NotRequired[
        Annotated[
            Annotated[int, Field(ge=1)] | None,
            Field(
                description=f"Token budget per row, at most {settings.MAX_TOKEN_BUDGET.env} (the "
                "document's `maximum`; a 422 above). An integer written without a fraction: 512.0 is "
                "a 422, as laya-serve refuses it."
            ),
        ]
    ]
    head_max_len: NotRequired[
        Annotated[
            Annotated[int, Field(ge=1)] | None,
            Field(
                description=f"Token budget of the option head, at most {settings.MAX_TOKEN_BUDGET.env} "
                "(the document's `maximum`; a 422 above); 192.0 is a 422, as for max_len."
            ),
        ]
    ]
    lang: NotRequired[Annotated[str | None, Field(description="Language hint passed to the model.")]]
    lang_guess: NotRequired[
        Annotated[str | None, Field(description="Routing hint; validated, unused (one checkpoint).")]
    ]
    min_confidence: NotRequired[MinConfidence]
    hooks: NotRequired[HookRefusal]
    on_predict_start: NotRequired[HookRefusal]
    on_predict_end: NotRequired[HookRefusal]
    hooks_raise: NotRequired[HookRefusal]
    hooks_timeout: NotRequired[HookRefusal]


class DecisionRequest(_Controls):
    """`POST /v1/systemone`: one state, any number of questions."""

    state: State
    questions: Questions


class BatchRequest(_Controls):
    """`POST /v1/systemone/batch`: one question set over many states."""

    states: Annotated[list[State], Field(min_length=1, max_length=v.MAX_BATCH_STATES)]
    questions: Questions
    batch_size: NotRequired[
        Annotated[
            Annotated[int, Field(ge=1)] | None,
            Field(
                description=f"States per forward pass; capped by the server's {settings.MAX_BATCH_TOKENS.env} plan."
            ),
        ]
    ]
    sort_by_length: NotRequired[bool | None]
    diagnostics: NotRequired[
        Annotated[None, Field(description="Refused with 422 unless null: an in-process out-parameter.")]
    ]


# -- responses ------------------------------------------------------------------------------


class Action(TypedDict):
    act_probability: Probability


class Tournament(TypedDict):
    __pydantic_config__ = _OPEN  # type: ignore[misc]
    finalists: list[Any]
    rounds: Count


_GATE_DOC = "Only when the request set min_confidence."


class _Gate(TypedDict):
    abstention: NotRequired[
        Annotated[Literal["passed", "abstained", "unevaluated"], Field(description=_GATE_DOC)]
    ]
    abstention_threshold: NotRequired[Annotated[Probability, Field(description=_GATE_DOC)]]
    low_confidence: NotRequired[Annotated[Literal[True], Field(description="Only on abstained answers.")]]


_STRICT_DOC = f"Absent under {settings.JEV_STRICT.env}."


class ChoiceAnswer(_Gate):
    __pydantic_config__ = _OPEN  # type: ignore[misc]
    type: Literal["choice"]
    choice: Annotated[Label, Field(description="The most probable label, as the request spelled it.")]
    probabilities: Annotated[
        dict[str, Probability], Field(description="label (as JSON text) -> probability, in criteria order")
    ]
    confidence: Annotated[Probability, Field(description="1 - H(p)/log k (laya's entropy confidence)")]
    answer_confidence: NotRequired[Annotated[Probability, Field(description=_STRICT_DOC)]]
    action: NotRequired[Annotated[Action, Field(description=_STRICT_DOC)]]
    x_jev_confidence: NotRequired[
        Annotated[Probability, Field(description="TypeSafe's (max p - 1/n)/(1 - 1/n). " + _STRICT_DOC)]
    ]
    x_tournament: NotRequired[Tournament]


class ScoreAnswer(_Gate):
    __pydantic_config__ = _OPEN  # type: ignore[misc]
    type: Literal["score"]
    score: Annotated[float, Field(ge=0.0, description="Expected level index, sum of i * p_i.")]
    legend: Annotated[dict[str, Any], Field(description='"i" -> the level as the request gave it')]
    probabilities: dict[str, Probability]
    confidence: Probability
    answer_confidence: NotRequired[Annotated[Probability, Field(description=_STRICT_DOC)]]
    action: NotRequired[Annotated[Action, Field(description=_STRICT_DOC)]]
    x_jev_confidence: NotRequired[
        Annotated[Probability, Field(description="TypeSafe's distance confidence. " + _STRICT_DOC)]
    ]


class NoulAnswer(_Gate):
    __pydantic_config__ = _OPEN  # type: ignore[misc]
    type: Literal["noul"]
    noul: Annotated[Probability, Field(description="P(true)")]
    confidence: NotRequired[Annotated[Probability, Field(description="max(p, 1 - p). " + _STRICT_DOC)]]
    answer_confidence: NotRequired[Annotated[Probability, Field(description=_STRICT_DOC)]]
    action: NotRequired[Annotated[Action, Field(description=_STRICT_DOC)]]


Answer = Annotated[ChoiceAnswer | ScoreAnswer | NoulAnswer, Field(discriminator="type")]


class OptionSpans(TypedDict):
    total: Count
    distinct: Count
    tokens_per_option: Annotated[
        Count | None,
        Field(description="The cap each option span was cut to, or null when none was (laya's common.py)."),
    ]


class Usage(TypedDict):
    """Token counts; everything but the two Jev counts is absent under LAYA_JEV_STRICT."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]
    input_tokens: Count
    output_tokens: Count
    state_tokens: NotRequired[Count]
    state_tokens_dropped: NotRequired[Count]
    truncated: NotRequired[bool]
    truncated_questions: NotRequired[list[Any]]
    options: NotRequired[dict[str, OptionSpans]]


class Routing(TypedDict):
    """Which checkpoint answered; with one bundle always this one (reason 'served bundle')."""

    model: str
    repo: str
    reason: str
    detection: dict[str, Any] | None
    workflow: str | None


class DecisionResponse(TypedDict):
    __pydantic_config__ = _OPEN  # type: ignore[misc]
    model: str
    answers: Annotated[dict[str, Answer], Field(description="question id -> answer, one per question")]
    usage: Usage
    routing: NotRequired[Annotated[Routing, Field(description=_STRICT_DOC)]]


class TotalUsage(TypedDict):
    input_tokens: Count
    output_tokens: Count


class BatchResponse(TypedDict):
    results: Annotated[list[DecisionResponse], Field(description="one result per state, in order")]
    total_usage: TotalUsage


class FallbackCount(TypedDict):
    count: Count
    last_reason: str | None


class Health(TypedDict):
    """Always `status`; the rest only without LAYA_API_KEY or with the right bearer."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]
    status: Literal["ok"]
    loaded: NotRequired[list[str]]
    revisions: NotRequired[dict[str, str | None]]
    device: NotRequired[str]
    device_is_preference: NotRequired[bool]
    checkpoint_devices: NotRequired[dict[str, str]]
    cpu_fallbacks: NotRequired[dict[str, FallbackCount]]
    providers: NotRequired[dict[str, list[str]]]
    provider_fallbacks: NotRequired[dict[str, dict[str, dict[str, Any]]]]
    int8_kernels: NotRequired[
        Annotated[
            dict[str, str],
            Field(description="The integer GEMM (u8s8 or u8u8) each loaded int8 checkpoint runs here"),
        ]
    ]


class Probe(TypedDict):
    """`/health/live` and `/health/ready`: one word."""

    status: Literal["ok", "ready", "warming up", "draining", "unhealthy"]


class ModelCard(TypedDict):
    """One served checkpoint: Jev's three keys, then ours (x_, only for an authorized caller)."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]
    name: str
    description: str
    release_date: str
    x_aliases: NotRequired[
        Annotated[list[str], Field(description="Other `model` values this checkpoint answers to.")]
    ]
    x_revision: NotRequired[str | None]
    x_repo: NotRequired[str]
    x_graph_sha256: NotRequired[
        Annotated[str | None, Field(description="sha256 of laya.onnx, from the bundle manifest")]
    ]
    x_manifest_sha256: NotRequired[
        Annotated[str | None, Field(description="sha256 of manifest.json (pins every file)")]
    ]
    x_precision: NotRequired[str]
    x_providers: NotRequired[list[str]]
    x_int8_kernel: NotRequired[
        Annotated[str, Field(description="An int8 bundle's integer GEMM here: u8s8 (CPUs with VNNI) or u8u8")]
    ]


class ModelList(TypedDict):
    models: list[ModelCard]


class Index(TypedDict):
    """`GET /`: what answers here and where (LAYA_ROOT_PATH included in every path)."""

    name: str
    summary: str
    version: NotRequired[Annotated[str, Field(description=f"Only without {settings.API_KEY.env}.")]]
    routes: Annotated[dict[str, str], Field(description='"METHOD /path" -> what the route does')]
    docs: NotRequired[Annotated[str, Field(description="The HTML API page, where it is served.")]]
    openapi: NotRequired[Annotated[str, Field(description="The OpenAPI document, where it is served.")]]


class ErrorBody(TypedDict):
    detail: str
