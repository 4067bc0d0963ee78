"""Typed decisions: a JSON schema (or a pydantic model) asked as Laya questions, answered as values.

The schema subset and every refusal are laya 0.4.15's (`laya.structured`), so `decide` answers
what the reference's does for the same schema and model answers:

* the top level is an object of at most 32 `properties`, each one question;
* `enum` / `const` (at most 32 values) -> a `choice` whose labels are the values as text
  (`None` -> "null"), answered with the original value; a two-value boolean enum -> a `noul`;
* `boolean` -> `noul` (True when p(true) >= 0.5);
* `integer` / `number` with integer `minimum` and `maximum` (at most 10 levels) -> a `score`,
  answered with `minimum` + the most probable level;
* `Optional[...]` (`anyOf`/`oneOf` with one non-null branch, or `type: [X, "null"]`), one-item
  `allOf`, and local `$ref`s into `$defs` / `definitions` (how pydantic renders enums) unwrap;
* free strings, arrays, nested objects and real unions are refused with a `SchemaError` that
  names the property.

Pure Python: a pydantic model is read through its own `model_json_schema()` (v2) or `schema()`
(v1), so the core never imports pydantic. A runner is anything with `predict` / `predict_batch`
(`ONNXAgent`); one that also has `route_batch` (a Router) gets one request dict per state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from laya_onnx.core.errors import InvalidRequest, InvalidRequestType
from laya_onnx.core.gate import apply_confidence_gate, finite_number
from laya_onnx.core.options import resolve_min_confidence

# Limits on a schema that `decide` asks, laya.structured's own values and names: they bound
# what a schema compiles to, not a question. A question passed to `predict` has no size limit in
# the core (1 option or level up to what fits in max_len, as in the reference); the HTTP edge caps
# questions with laya-serve's own limits (docs/http-api.md#limits).
MAX_PROPERTIES = 32
MAX_OPTIONS = 32
MAX_SCORE_LEVELS = 10
#: The keys a Router reads off each request rather than taking as keywords of predict_batch
#: (laya 0.4.15 decide_batch copies them onto every request).
ROUTER_REQUEST_KEYS = ("model", "task", "lang", "lang_guess", "max_len", "head_max_len")
_LOCAL_REF_PREFIXES = (("#/$defs/", "$defs"), ("#/definitions/", "definitions"))


class SchemaError(InvalidRequest):
    """A schema that cannot be asked as Laya questions; the text names the property at fault."""


@dataclass
class DecisionResult:
    """`decide(..., return_details=True)`: the values plus what each field's answer said.

    `confidence` is each answer's own `confidence` (0.0 when absent), `answer_confidence` its
    `answer_confidence` (None when absent or not a finite number), `probabilities` the answer's
    probabilities (a noul's as {"false", "true"}), `answers` the raw answers. The field order is
    the reference's (answer_confidence last).
    """

    values: dict[str, Any]
    confidence: dict[str, float]
    probabilities: dict[str, dict[str, Any]]
    answers: dict[str, Any]
    usage: dict[str, Any] | None = None
    routing: dict[str, Any] | None = None
    answer_confidence: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class SchemaField:
    """One property of a schema as a question, and how its answer maps back to a value."""

    name: str
    kind: str  # "choice" | "score" | "noul"
    question: dict[str, Any]
    options: tuple[tuple[str, Any], ...] = ()  # choice: (label, value), in schema order
    minimum: int = 0  # score: the value of level 0

    def value(self, answer: dict[str, Any]) -> Any:
        """The typed value of this field's answer (None when the gate abstained)."""
        if answer.get("low_confidence"):
            return None
        if self.kind == "noul":
            return float(answer.get("noul", 0.0)) >= 0.5
        if self.kind == "score":
            return self.minimum + _score_level(answer)
        label = str(answer.get("choice"))
        return next((value for text, value in self.options if text == label), label)


def _score_level(answer: dict[str, Any]) -> int:
    """The most probable 0-based level (the first on a tie); the rounded expected level when the
    answer carries no probabilities."""
    probs = answer.get("probabilities") or {}
    if not probs:
        return int(round(float(answer.get("score", 0.0))))
    best, best_p = 0, None
    for level in range(len(probs)):
        p = float(probs.get(str(level), probs.get(level, 0.0)))
        if best_p is None or p > best_p:
            best, best_p = level, p
    return best


def schema_of(schema: Any) -> dict[str, Any]:
    """The JSON schema of a pydantic model (v2 or v1), or a dict schema itself."""
    if hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    if hasattr(schema, "schema"):
        return schema.schema()
    if isinstance(schema, dict):
        return schema
    raise SchemaError("expected a JSON schema dict or a pydantic model, got %s" % type(schema).__name__)


def _choice_or_noul(path: str, name: str, values: Any, description: str | None) -> SchemaField:
    # A bare string is iterable: without this it would become one option per character.
    if not isinstance(values, (list, tuple)):
        raise SchemaError("%s: 'enum' must be an array of values, got %s" % (path, type(values).__name__))
    if len(values) > MAX_OPTIONS:
        raise SchemaError("%s: %d options exceeds MAX_OPTIONS=%d" % (path, len(values), MAX_OPTIONS))
    if not values:
        raise SchemaError("%s: 'enum' must not be empty" % path)
    if all(isinstance(v, bool) for v in values) and len(set(values)) == 2:
        return _noul(name, description)
    options = tuple(("null" if v is None else str(v), v) for v in values)
    labels = [text for text, _ in options]
    if len(set(labels)) != len(labels):
        raise SchemaError("%s: enum values produce duplicate choice labels" % path)
    question = {
        "type": "choice",
        "instructions": description or "What is `%s`?" % name,
        "criteria": dict.fromkeys(labels),
    }
    return SchemaField(name, "choice", question, options=options)


def _noul(name: str, description: str | None) -> SchemaField:
    return SchemaField(name, "noul", {"type": "noul", "instructions": description or "Is `%s` true?" % name})


def _score(path: str, name: str, prop: dict[str, Any], description: str | None) -> SchemaField:
    lo, hi = prop.get("minimum"), prop.get("maximum")
    # A bool is an int to Python but a yes/no to a schema: `"minimum": true` is no bound of 1.
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in (lo, hi)):
        raise SchemaError(
            "%s: a numeric field needs integer 'minimum' and 'maximum' to become a score" % path
        )
    assert isinstance(lo, int) and isinstance(hi, int)
    if hi < lo:
        raise SchemaError("%s: 'maximum' %d is below 'minimum' %d" % (path, hi, lo))
    levels = hi - lo + 1
    if levels > MAX_SCORE_LEVELS:
        raise SchemaError(
            "%s: %d levels exceeds MAX_SCORE_LEVELS=%d; narrow the range or use an enum"
            % (path, levels, MAX_SCORE_LEVELS)
        )
    question = {
        "type": "score",
        "instructions": description or "Score `%s` from %d to %d" % (name, lo, hi),
        "criteria": [str(v) for v in range(lo, hi + 1)],
    }
    return SchemaField(name, "score", question, minimum=lo)


def _resolve_ref(
    path: str, prop: dict[str, Any], root: dict[str, Any], seen: tuple[Any, ...]
) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """A local `$ref` replaced by its definition, the property's own keys on top.

    The definition's `description` is dropped: pydantic fills it from the enum class's docstring,
    which describes the type, not the question this field asks. Only this schema's own `$defs` /
    `definitions` are looked up (nothing is fetched); a ref met twice on one path is a cycle.
    """
    ref = prop["$ref"]
    if ref in seen:
        raise SchemaError("%s: $ref %r is recursive; flatten the schema" % (path, ref))
    target = None
    if isinstance(ref, str):
        for prefix, key in _LOCAL_REF_PREFIXES:
            defs = root.get(key)
            if ref.startswith(prefix) and isinstance(defs, dict):
                target = defs.get(ref[len(prefix) :])
    if not isinstance(target, dict):
        raise SchemaError(
            "%s: $ref %r does not resolve to an entry of this schema's '$defs' or 'definitions'" % (path, ref)
        )
    merged = {k: v for k, v in target.items() if k != "description"}
    merged.update((k, v) for k, v in prop.items() if k != "$ref")
    return merged, (*seen, ref)


def _plan_field(
    path: str, name: str, prop: Any, root: dict[str, Any], seen: tuple[Any, ...] = ()
) -> SchemaField:
    if not isinstance(prop, dict):
        raise SchemaError("%s: property must be an object, got %s" % (path, type(prop).__name__))
    while "$ref" in prop:
        prop, seen = _resolve_ref(path, prop, root, seen)
    description = prop.get("description")
    if not {"const", "enum", "type"} & set(prop):
        # Wrappers pydantic writes: v1's `{"allOf": [{"$ref": ...}], "description": ...}` for a
        # described enum, v2's `{"anyOf": [X, {"type": "null"}]}` for Optional[X].
        wrapped = prop.get("allOf")
        if isinstance(wrapped, list) and len(wrapped) == 1 and isinstance(wrapped[0], dict):
            inner = {**wrapped[0], **{k: v for k, v in prop.items() if k != "allOf"}}
            return _plan_field(path, name, inner, root, seen)
        union = prop.get("anyOf") or prop.get("oneOf")
        if union is not None:
            real = [b for b in union if isinstance(b, dict) and b.get("type") != "null"]
            if len(real) != 1:
                raise SchemaError(
                    "%s: only 'Optional[...]' unions (one non-null branch) are supported, got %d"
                    % (path, len(real))
                )
            inner = dict(real[0])
            inner.setdefault("description", description)
            return _plan_field(path, name, inner, root, seen)
    if "const" in prop:
        return _choice_or_noul(path, name, [prop["const"]], description)
    if "enum" in prop:
        return _choice_or_noul(path, name, prop["enum"], description)
    kind = prop.get("type")
    if isinstance(kind, list):  # nullable: ["integer", "null"]
        kinds = [k for k in kind if k != "null"]
        if len(kinds) > 1:
            raise SchemaError("%s: 'type' has multiple non-null types; unions are not supported" % path)
        kind = kinds[0] if kinds else None
    if kind == "boolean":
        return _noul(name, description)
    if kind == "string":
        raise SchemaError("%s: a free string cannot be a fixed option set; use 'enum' or a boolean" % path)
    if kind in ("integer", "number"):
        return _score(path, name, prop, description)
    if kind == "array":
        raise SchemaError("%s: arrays are not supported; ask one field per element" % path)
    if kind == "object":
        raise SchemaError("%s: nested objects are not supported; flatten the schema" % path)
    raise SchemaError("%s: unsupported schema %r" % (path, prop))


def plan_from_json_schema(schema: Any) -> list[SchemaField]:
    """One planned field per property, in schema order; SchemaError for what cannot be asked."""
    if not isinstance(schema, dict):
        raise SchemaError("expected a JSON schema object, got %s" % type(schema).__name__)
    if schema.get("type") not in (None, "object") or "properties" not in schema:
        raise SchemaError("the top level must be an object with 'properties'")
    properties = schema["properties"]
    if not isinstance(properties, dict) or not properties:
        raise SchemaError("'properties' must be a non-empty object")
    if len(properties) > MAX_PROPERTIES:
        raise SchemaError("%d properties exceeds MAX_PROPERTIES=%d" % (len(properties), MAX_PROPERTIES))
    return [_plan_field("properties.%s" % name, name, prop, schema) for name, prop in properties.items()]


def plan(schema: Any) -> list[SchemaField]:
    """`plan_from_json_schema` of a dict schema or a pydantic model."""
    return plan_from_json_schema(schema_of(schema))


def questions_from_json_schema(schema: Any) -> dict[str, dict[str, Any]]:
    """The Laya questions a JSON schema asks, one per property."""
    return {f.name: f.question for f in plan_from_json_schema(schema)}


def questions_from_pydantic(model: Any) -> dict[str, dict[str, Any]]:
    """The Laya questions a pydantic model's schema asks."""
    return {f.name: f.question for f in plan(model)}


def project(answers: dict[str, Any], fields: Sequence[SchemaField]) -> dict[str, Any]:
    """The schema's values from one state's answers; a field with no answer is left out."""
    return {f.name: f.value(answers[f.name]) for f in fields if answers.get(f.name) is not None}


def answers_to_json(answers: dict[str, Any], schema: Any) -> dict[str, Any]:
    """The values of a JSON schema (choice value, integer level, boolean) from Laya answers."""
    return project(answers, plan_from_json_schema(schema))


def answer_to_pydantic(model: Any, answers: dict[str, Any]) -> Any:
    """An instance of a pydantic model built from Laya answers."""
    return model(**answers_to_json(answers, schema_of(model)))


def details(values: dict[str, Any], result: dict[str, Any]) -> DecisionResult:
    """The `DecisionResult` of one state's result and its projected values."""
    answers = result.get("answers", {}) or {}
    probabilities: dict[str, dict[str, Any]] = {}
    for name, answer in answers.items():
        if answer.get("type") == "noul":
            p = float(answer.get("noul", 0.0))
            probabilities[name] = {"false": round(1.0 - p, 4), "true": round(p, 4)}
        else:
            probabilities[name] = dict(answer.get("probabilities") or {})
    return DecisionResult(
        values=values,
        confidence={name: float(a.get("confidence", 0.0)) for name, a in answers.items()},
        probabilities=probabilities,
        answers=dict(answers),
        usage=result.get("usage"),
        routing=result.get("routing"),
        answer_confidence={name: finite_number(a.get("answer_confidence")) for name, a in answers.items()},
    )


def _check_one_of(schema: Any, questions: Any) -> None:
    if (schema is None) == (questions is None):
        raise InvalidRequest("pass exactly one of schema= or questions=")


def _questions(schema: Any, questions: Any) -> tuple[list[SchemaField] | None, Any]:
    """The planned fields (None for explicit questions) and the questions to ask."""
    if schema is None:
        return None, questions
    fields = plan(schema)
    return fields, {f.name: f.question for f in fields}


def _outcome(result: dict[str, Any], fields: list[SchemaField] | None, return_details: bool) -> Any:
    answers = result.get("answers", {}) or {}
    values = project(answers, fields) if fields is not None else dict(answers)
    return details(values, result) if return_details else values


def decide(
    runner: Any,
    state: Any,
    schema: Any = None,
    *,
    questions: dict[str, Any] | None = None,
    return_details: bool = False,
    min_confidence: Any = None,
    **predict_kwargs: Any,
) -> Any:
    """Answer one state against a schema (typed values) or explicit questions (raw answers).

    Pass exactly one of `schema` and `questions`. `min_confidence` gates every answer (a field
    that abstains comes back as None; its answer stays in the details); the other keywords go to
    `runner.predict`. `return_details=True` returns a `DecisionResult`.
    """
    _check_one_of(schema, questions)
    mc = resolve_min_confidence(min_confidence)
    fields, asked = _questions(schema, questions)
    if mc is not None:
        predict_kwargs["min_confidence"] = mc
    result = runner.predict(state, asked, **predict_kwargs)
    if isinstance(result, dict):
        apply_confidence_gate([result], mc)
    return _outcome(result, fields, return_details)


def decide_batch(
    runner: Any,
    states: Sequence[Any],
    schema: Any = None,
    *,
    questions: dict[str, Any] | None = None,
    return_details: bool = False,
    min_confidence: Any = None,
    **predict_kwargs: Any,
) -> list[Any]:
    """`decide` over many states in one `runner.predict_batch` call, results in input order.

    The schema is planned once. A Router-like runner (one with `route_batch`) gets one
    `{"state", "questions"}` request per state, with the routing pins and token budgets
    (`ROUTER_REQUEST_KEYS`) copied onto each; an agent gets `(states, questions)`. The gate is
    applied to the results here, after the runner's hooks have run.
    """
    _check_one_of(schema, questions)
    if isinstance(states, (str, bytes)) or not isinstance(states, Sequence):
        raise InvalidRequestType("states must be a sequence of states, not %s" % type(states).__name__)
    mc = resolve_min_confidence(min_confidence)
    fields, asked = _questions(schema, questions)
    predict_batch = getattr(runner, "predict_batch", None)
    if predict_batch is None:
        raise InvalidRequestType(
            "%s has no predict_batch; loop decide() over the states instead" % type(runner).__name__
        )
    if hasattr(runner, "route_batch"):
        pins = {key: predict_kwargs.pop(key) for key in ROUTER_REQUEST_KEYS if key in predict_kwargs}
        results = predict_batch([{"state": s, "questions": asked, **pins} for s in states], **predict_kwargs)
    else:
        results = predict_batch(list(states), asked, **predict_kwargs)
    apply_confidence_gate([r for r in results if isinstance(r, dict)], mc)
    return [_outcome(r, fields, return_details) for r in results]


__all__ = [
    "MAX_OPTIONS",
    "MAX_PROPERTIES",
    "MAX_SCORE_LEVELS",
    "DecisionResult",
    "SchemaError",
    "SchemaField",
    "answer_to_pydantic",
    "answers_to_json",
    "decide",
    "decide_batch",
    "plan",
    "plan_from_json_schema",
    "questions_from_json_schema",
    "questions_from_pydantic",
]
