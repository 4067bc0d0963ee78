"""The refusals of a decision body in laya-serve's order and words (docs/http-api.md#refusals-in-order),
read off the errors of the request models (`schema.py`) in both wire profiles, beside the checks no
model states; the batch plan (docs/http-api.md#batch).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.gate import check_min_confidence
from laya_onnx.core.questions import unknown_fields
from laya_onnx.serve import schema
from laya_onnx.serve.body import MAX_BODY_BYTES  # noqa: F401 (the cap's name where the limits are)
from laya_onnx.serve.errors import INVALID_JSON, LONE_SURROGATE, ApiError
from laya_onnx.serve.served import Served
from laya_onnx.serve.settings import Settings

#: The keys a body may send only as null (the models' null-only fields), by their refusal, in
#: order: hooks name code running in the server; the batch's out-parameters are never read back.
HOOK_KEYS = tuple(k for k, f in schema.DecisionRequest.model_fields.items() if f.annotation is type(None))
NULL_ONLY = {
    "%s run inside the server process and cannot be sent to this endpoint; "
    "install them where laya-serve runs, or drop them": HOOK_KEYS,
    "%s is filled in place for an in-process caller and cannot be returned over HTTP; "
    "read the per-group report from the CLI or a local Router": tuple(
        k
        for k, f in schema.BatchRequest.model_fields.items()
        if f.annotation is type(None) and k not in HOOK_KEYS
    ),
}
#: The controls handed to the agent, in the order they are checked: the models' fields that are
#: neither the request's content, a hook key, `model` nor `task` (checked apart).
CONTROLS = tuple(
    k
    for k in schema.DecisionRequest.model_fields
    if k not in (*HOOK_KEYS, "state", "questions", "model", "task")
)
_MODELS: dict[tuple[bool, bool], type[BaseModel]] = {
    (False, False): schema.DecisionRequest,
    (False, True): schema.JevSystemOneRequest,
    (True, False): schema.BatchRequest,
    (True, True): schema.JevBatchRequest,
}
#: laya-serve's words for a control its model field refused, by the kind of fault.
CONTROL_TEXTS = {
    "int_type": "%s must be an integer",
    "greater_than_equal": "%s must be a positive integer",
    "string_type": '%s must be a language code string such as "de", or null',
    "bool_type": "%s must be a boolean",
}
_SURROGATE = re.compile("[\ud800-\udfff]")
#: What the model reads for a Jev question without `instructions` (docs/http-api.md#the-jev-profile).
DEFAULT_INSTRUCTIONS = {
    "choice": "Which option applies?",
    "score": "Which level applies?",
    "noul": "Which outcome holds?",
}


class JevValidationError(ApiError):
    """A 422 whose body is the Jev list of `{loc, msg, type}` entries."""

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__(422, "; ".join(e["msg"] for e in errors) or "invalid request")
        self.errors = errors


def check(
    raw: bytes, checkpoint: Served, settings: Settings, batch: bool
) -> tuple[dict[str, Any], dict[str, Any], str | None, str | None]:
    """A decision body's checks in order, the first failing one raised (in the Jev profile a 400 or
    422 as the Jev list): the body, the controls for the agent (those sent, the Router's routing,
    a batch's pass plan), the `model` it named when served nowhere here, its unread fields."""
    try:
        body = Body(raw, batch, settings.jev, settings.max_token_budget)
        body.refusals()
        model = checkpoint.check_model(body.body.get("model"))
        checked = {k: body.control(k) for k in CONTROLS}
        lang_guess = checked.pop("lang_guess")
        controls = {k: value for k, value in checked.items() if value is not None}
        controls.update(checkpoint.routing_controls(model.pinned, body.body.get("task"), lang_guess))
        if batch:
            body.plan(controls, settings.max_batch_tokens)
        checkpoint.check_task(body.body.get("task"))
    except ApiError as exc:
        if isinstance(exc, JevValidationError) or not settings.jev or exc.status not in (400, 422):
            raise
        kind = "json_invalid" if exc.detail == INVALID_JSON else "value_error"
        refusal = JevValidationError([{"loc": ["body"], "msg": exc.detail, "type": kind}])
        if exc.item is not None:  # a batch item at fault: its place in the list, and the header
            refusal.errors[0]["loc"] = ["body", "states", exc.item]
            refusal.at_item(exc.item)
        raise refusal from None
    return body.body, controls, model.fallback, unknown_named(body.body, batch)


def unknown_named(body: dict[str, Any], batch: bool) -> str | None:
    """`X-Unknown-Fields` of a body (docs/http-api.md#request-fields): its first fields and its
    questions' that the route does not read, each with `=nearest` where a known one is close;
    printable ASCII (anything else, and the list's comma, is "?"), at most 1 000 characters."""
    named = []
    for f in unknown_fields(body, tuple(_MODELS[batch, False].model_fields), most=16):
        where = str(f.name) if f.question is None else "%s.%s" % (f.question, f.name)
        named.append(where if f.did_you_mean is None else "%s=%s" % (where, f.did_you_mean))
    if not named:
        return None
    return ", ".join("".join(c if " " < c <= "~" and c != "," else "?" for c in n) for n in named)[:1000]


def _jev_schema(error: ErrorDetails) -> bool:
    """Whether an error is the Jev schema's (the state's and the questions' shape): every other
    one is a check laya-serve runs in its own place (limits, each state of a batch, controls)."""
    loc, kind = error["loc"], error["type"]
    if not loc:
        return True
    if loc[0] == "state":
        return kind == "missing"
    if loc[0] == "states":
        return len(loc) == 1 and kind != "too_long"
    return loc[0] == "questions" and kind not in ("too_long", "null_level")


class Body:
    """A decision body and its model's errors, asked in laya-serve's order by the methods below."""

    def __init__(self, raw: bytes, batch: bool, jev_profile: bool, max_token_budget: int):
        try:  # BOM/UTF-16/UTF-32 detection, NaN literals, the last of a repeated key
            body = self.body = json.loads(raw)
        except (ValueError, RecursionError):  # also UnicodeDecodeError and the >4300-digit int guard
            raise ApiError(400, INVALID_JSON) from None
        self.batch, self.max_token_budget = batch, max_token_budget
        try:
            _MODELS[batch, jev_profile].model_validate(body)
            self.errors: list[ErrorDetails] = []
        except ValidationError as exc:
            self.errors = exc.errors(include_url=False)
        if jev_profile:
            listed = [e for e in self.errors if _jev_schema(e)]
            if listed:
                raise JevValidationError(
                    [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in listed]
                )
            neutral = DEFAULT_INSTRUCTIONS
            self.body["questions"] = {
                qid: {**q, "instructions": neutral[q["type"]]}
                if isinstance(q, dict) and q.get("instructions") is None and q.get("type") in neutral
                else q
                for qid, q in body["questions"].items()
            }
        if not isinstance(body, dict) or "questions" not in body or (batch and "states" not in body):
            fields = "'states' and 'questions' fields" if batch else "a 'questions' field"
            raise ApiError(400, "request body must be an object with " + fields)

    def _at(self, *loc: Any) -> list[ErrorDetails]:
        return [e for e in self.errors if e["loc"][: len(loc)] == loc]

    def refusals(self) -> None:
        """Steps 6-8 of docs/http-api.md#refusals-in-order: the state(s), the questions, the sizes;
        hook keys (the batch's out-parameters next); unpaired surrogates."""
        if self.batch:
            states = self.body["states"]
            for e in self._at("states"):
                if len(e["loc"]) == 1 and e["type"] == "too_long":
                    raise ApiError(
                        413, "too many states in batch (%d > %d)" % (len(states), e["ctx"]["max_length"])
                    )
                if len(e["loc"]) == 1:
                    raise ApiError(400, "'states' must be a non-empty list")
            for i, state in enumerate(states):  # each state as a request of its own: the questions once
                if state is None:
                    raise ApiError(400, "'state' is required").at_item(i)
                if i == 0:
                    self._questions()
                try:
                    self._size("states", i)
                except ApiError as exc:
                    raise exc.at_item(i) from None
        elif self.body.get("state") is None:
            raise ApiError(400, "'state' is required")
        else:
            self._questions()
            self._size("state")
        for text, keys in NULL_ONLY.items():
            given = sorted(e["loc"][0] for e in self.errors if e["loc"][0] in keys)
            if given:
                raise ApiError(422, text % ", ".join(given))
        if has_lone_surrogate(self.body):
            raise ApiError(400, LONE_SURROGATE)

    def _size(self, *loc: Any) -> None:
        for e in self._at(*loc):
            if e["type"] == "json_type":
                raise ApiError(400, "'state' must be JSON-serializable")
            if e["type"] == "too_long":
                raise ApiError(
                    413, "state too large (%d > %d chars)" % (e["ctx"]["length"], schema.MAX_STATE_CHARS)
                )

    def _questions(self) -> None:
        questions = self.body["questions"]
        for e in self._at("questions"):
            loc, kind = e["loc"], e["type"]
            if loc == ("questions",) and kind == "dict_type":
                raise ApiError(400, "'questions' must be an object")
            if loc == ("questions",) and kind == "too_long":
                raise ApiError(413, "too many questions (%d > %d)" % (len(questions), e["ctx"]["max_length"]))
        for e in self._at("questions"):
            loc, kind = e["loc"], e["type"]
            if kind == "too_long" and loc[3:] == ("criteria",):
                what = "choice options" if loc[2] == "choice" else "score levels"
                n, cap = len(e["input"]), e["ctx"]["max_length"]
                raise ApiError(413, "too many %s for %r (%d > %d)" % (what, loc[1], n, cap))
            if kind == "null_level":
                # A hole in the rubric would come back as `legend: {"i": null}`, which a Jev
                # client cannot parse. The core refuses it too, later and in laya's words.
                raise ApiError(
                    422,
                    "score question %r has a null level at index %s; give every level a description"
                    % (loc[1], loc[4]),
                )
        total = sum(_options(q) for q in questions.values())
        if total > schema.MAX_TOTAL_OPTIONS:
            raise ApiError(
                413, "too many answer options across questions (%d > %d)" % (total, schema.MAX_TOTAL_OPTIONS)
            )

    def plan(self, controls: dict[str, Any], max_batch_tokens: int) -> None:
        """A batch's `batch_size` (the caller's, or `chunk_plan`'s when smaller) and `sort_by_length`."""
        caller_size = self.control("batch_size")
        n = len(self.body["states"]), len(self.body["questions"])
        planned = chunk_plan(*n, self.body.get("max_len"), max_batch_tokens)
        if caller_size is not None:
            controls["batch_size"] = caller_size if planned is None else min(caller_size, planned)
        elif planned is not None:
            controls["batch_size"] = planned
        if self.control("sort_by_length"):
            controls["sort_by_length"] = True  # False is the agent's own default: not forwarded

    def control(self, key: str) -> Any:
        """A control's value once its model field took it (None when absent), or its refusal; a
        min_confidence is the core's to check, in its words (docs/semantics.md#the-confidence-gate)."""
        value = self.body.get(key)
        if key == "min_confidence" and value is not None:
            try:
                value = check_min_confidence(value)
            except InvalidRequest as exc:
                raise ApiError(422, str(exc)) from None
        for e in self._at(key):
            text = CONTROL_TEXTS[e["type"]] % key if e["type"] in CONTROL_TEXTS else e["msg"]
            if key == "batch_size" and e["type"] == "greater_than_equal":
                text += ", got %r" % (e["input"],)
            raise ApiError(422, text)
        if key in ("max_len", "head_max_len") and value is not None and value > self.max_token_budget:
            raise ApiError(422, "%s exceeds server limit (%d > %d)" % (key, value, self.max_token_budget))
        return value


def _options(question: Any) -> int:
    """The options a question counts toward `schema.MAX_TOTAL_OPTIONS` (not a noul's)."""
    if not isinstance(question, dict):
        return 0
    kind, criteria = question.get("type"), question.get("criteria")
    counted = (dict, list) if kind == "choice" else (list,) if kind == "score" else ()
    return len(criteria) if isinstance(criteria, counted) else 0


def has_lone_surrogate(value: Any) -> bool:
    """Whether any key or string anywhere in the parsed body holds an unpaired surrogate (a paired
    escape is one astral character by now); iterative, as `json.loads` nests past the recursion limit."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def chunk_plan(n_states: int, n_questions: int, max_len: Any, token_budget: int) -> int | None:
    """States per pass within `token_budget`, or None when the batch fits it: then no `batch_size`
    is sent, so the batch runs exactly as without a plan (padding width moves float bits). The
    agent cuts any pass past its memory budget itself. docs/http-api.md#batch."""
    if n_states <= 0 or n_questions <= 0:
        return None
    width = max_len or 512  # a checked `max_len`, else the english default
    rows = max(1, token_budget // width)
    if n_states * n_questions <= rows and n_states * n_questions * width <= token_budget:
        return None
    return max(1, min(n_states, rows // n_questions))
