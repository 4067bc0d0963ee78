"""Request checks for the decision routes, in the order laya-serve 0.4.15 runs them (docs/http-api.md, "Refusals in order").

Everything here is pure: a function takes parsed JSON and either returns the value to forward
or raises `ApiError`. The handlers call them in contract order, so the first failing check is
the one a caller hears about.
"""

from __future__ import annotations

import json
import re
from typing import Any

from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.gate import check_min_confidence
from laya_onnx.core.questions import null_level
from laya_onnx.serve.body import MAX_BODY_BYTES  # noqa: F401 (the cap's name where the limits are)
from laya_onnx.serve.errors import INVALID_JSON, ApiError

#: JSON Schema `pattern` for "not blank" as the handlers judge it (`str.strip()`): at least one
#: character Python does not count as whitespace. ECMA's `\S` is not that: it matches the
#: separators U+001C..U+001F, which `strip()` removes, so a schema saying `\S` would promise to
#: answer a question id the handlers refuse.
NOT_BLANK = "[^%s]" % "".join("\\u%04x" % c for c in range(0x3001) if chr(c).isspace())  # U+3000 is the last

MAX_QUESTIONS = 64
MAX_STATE_CHARS = 50000
MAX_BATCH_STATES = 64
#: TypeSafe Jev's documented cap (laya-serve's with LAYA_TOURNAMENT_GROUP): a choice over
#: `core.tournament.MAX_ONE_PASS_CHOICE_OPTIONS` is answered by elimination.
MAX_CHOICE_OPTIONS = 255
#: laya-serve's cap on one request's score levels (the typed-decision schema has its own,
#: `core.structured.MAX_SCORE_LEVELS`).
MAX_REQUEST_SCORE_LEVELS = 32
MAX_TOTAL_OPTIONS = 512
#: Row width a batch is planned with when the request sets no `max_len` (the english default).
BATCH_ROW_TOKENS_ASSUMED = 512

#: Controls that name a callable or how the operator's callables run: never from a body.
HOOK_KEYS = ("hooks", "on_predict_start", "on_predict_end", "hooks_raise", "hooks_timeout")
#: Out-parameters a remote caller could never read back (batch route only).
OUT_PARAMETERS = ("diagnostics",)

#: How many values the state-size probe inspects before leaving the verdict to `json.dumps`.
_PROBE_VALUES = 256
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_json(raw: bytes) -> Any:
    """`json.loads` on the raw bytes: BOM/UTF-16/UTF-32 detection, NaN literals, last key wins."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        # ValueError covers JSONDecodeError, UnicodeDecodeError and the >4300-digit int guard.
        raise ApiError(400, INVALID_JSON) from None


# -- size limits ---------------------------------------------------------------------------


def _length_lower_bound(state: Any, cap: int) -> int:
    """A lower bound on `len(json.dumps(state))`, returned only once it proves the state is over
    `cap`; 0 means "not proven" and sends the state on to the exact measurement.

    Each string serializes to at least its length plus two quotes, each container to at least
    its two brackets, each other scalar to at least one character, and all those parts are
    disjoint, so the sum never overstates. It spares a near-2 MiB body the full encode just to be
    refused, and it lets the 413 quote a number that was measured rather than invented.
    """
    bound = 0
    stack = [state]
    for _ in range(_PROBE_VALUES):
        if not stack:
            return 0
        item = stack.pop()
        if isinstance(item, str):
            bound += len(item) + 2
        elif isinstance(item, dict):
            bound += 2
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            bound += 2
            stack.extend(item)
        else:
            bound += 1
        if bound > cap:
            return bound
    return 0


def state_length(state: Any) -> int:
    """The state's size as the model reads it: a string as is, anything else as its JSON text."""
    if isinstance(state, str):
        return len(state)
    over = _length_lower_bound(state, MAX_STATE_CHARS)
    if over:
        return over
    try:
        return len(json.dumps(state, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        raise ApiError(400, "'state' must be JSON-serializable") from None


def check_request_limits(state: Any, questions: Any) -> None:
    """The pre-tokenization guards for one state and its questions (400/413/422)."""
    if state is None:
        raise ApiError(400, "'state' is required")
    if not isinstance(questions, dict):
        raise ApiError(400, "'questions' must be an object")
    if len(questions) > MAX_QUESTIONS:
        raise ApiError(413, "too many questions (%d > %d)" % (len(questions), MAX_QUESTIONS))
    total = 0
    for qid, question in questions.items():
        if not isinstance(question, dict):
            continue
        kind, criteria = question.get("type"), question.get("criteria")
        if kind == "choice" and isinstance(criteria, (dict, list)):
            total += len(criteria)
            if len(criteria) > MAX_CHOICE_OPTIONS:
                raise ApiError(
                    413, "too many choice options for %r (%d > %d)" % (qid, len(criteria), MAX_CHOICE_OPTIONS)
                )
        elif kind == "score" and isinstance(criteria, list):
            total += len(criteria)
            if len(criteria) > MAX_REQUEST_SCORE_LEVELS:
                raise ApiError(
                    413,
                    "too many score levels for %r (%d > %d)" % (qid, len(criteria), MAX_REQUEST_SCORE_LEVELS),
                )
            null = null_level(criteria)
            if null is not None:
                # A hole in the rubric would come back as `legend: {"i": null}`, which a Jev
                # client cannot parse. The core refuses it too, later and in laya's words;
                # here it is refused among the limits, in laya-serve's.
                raise ApiError(
                    422,
                    "score question %r has a null level at index %d; give every "
                    "level a description" % (qid, null),
                )
    if total > MAX_TOTAL_OPTIONS:
        raise ApiError(413, "too many answer options across questions (%d > %d)" % (total, MAX_TOTAL_OPTIONS))
    n = state_length(state)
    if n > MAX_STATE_CHARS:
        raise ApiError(413, "state too large (%d > %d chars)" % (n, MAX_STATE_CHARS))


def check_batch_limits(states: Any, questions: Any) -> None:
    if not isinstance(states, list) or not states:
        raise ApiError(400, "'states' must be a non-empty list")
    if len(states) > MAX_BATCH_STATES:
        raise ApiError(413, "too many states in batch (%d > %d)" % (len(states), MAX_BATCH_STATES))
    for i, state in enumerate(states):
        try:
            check_request_limits(state, questions)
        except ApiError as exc:
            if "state" in exc.detail.split(" ", 1)[0]:  # 'state' is required / state too large / ...
                raise exc.at_item(i) from None
            raise


# -- refusals ------------------------------------------------------------------------------


def refuse_hooks(body: dict[str, Any]) -> None:
    given = sorted(k for k in HOOK_KEYS if body.get(k) is not None)
    if given:
        raise ApiError(
            422,
            "%s run inside the server process and cannot be sent to this endpoint; "
            "install them where laya-serve runs, or drop them" % ", ".join(given),
        )


def refuse_out_parameters(body: dict[str, Any]) -> None:
    given = sorted(k for k in OUT_PARAMETERS if body.get(k) is not None)
    if given:
        raise ApiError(
            422,
            "%s is filled in place for an in-process caller and cannot be returned "
            "over HTTP; read the per-group report from the CLI or a local Router" % ", ".join(given),
        )


def has_lone_surrogate(value: Any) -> bool:
    """Whether any key or string anywhere in the parsed body holds an unpaired surrogate.

    Iterative on purpose: `json.loads` accepts nesting far deeper than the recursion limit.
    A *paired* escape has already become one astral character, so emoji pass.
    """
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


# -- controls ------------------------------------------------------------------------------


def budget(body: dict[str, Any], key: str, cap: int) -> int | None:
    """`max_len` / `head_max_len`: a positive int no larger than the server's cap, or None."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(422, "%s must be an integer" % key)
    if value <= 0:
        raise ApiError(422, "%s must be a positive integer" % key)
    if value > cap:
        raise ApiError(422, "%s exceeds server limit (%d > %d)" % (key, value, cap))
    return value


def language(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(422, '%s must be a language code string such as "de", or null' % key)
    return value


def min_confidence(body: dict[str, Any]):
    """The threshold in the core's validated form, refused with the core's own text."""
    value = body.get("min_confidence")
    if value is None:
        return None
    try:
        return check_min_confidence(value)
    except InvalidRequest as exc:
        raise ApiError(422, str(exc)) from None


def batch_size(body: dict[str, Any]) -> int | None:
    value = body.get("batch_size")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(422, "batch_size must be an integer")
    if value < 1:
        raise ApiError(422, "batch_size must be a positive integer, got %r" % (value,))
    return value


def sort_by_length(body: dict[str, Any]) -> bool | None:
    value = body.get("sort_by_length")
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ApiError(422, "sort_by_length must be a boolean")
    return value


def pass_memory_of(agent: Any) -> tuple[Any, int] | None:
    """The agent's (pass memory model, budget in bytes), or None for an agent without one."""
    model, budget = getattr(agent, "memory_model", None), getattr(agent, "max_pass_memory", None)
    if model is None or not isinstance(budget, int) or not hasattr(model, "max_rows"):
        return None
    return model, budget


def chunk_plan(
    n_states: int,
    n_questions: int,
    max_len: Any,
    token_budget: int,
    memory: tuple[Any, int] | None = None,
) -> int | None:
    """States per forward pass that keep one pass inside `token_budget` tokens and, given the
    agent's `memory` (model, budget), inside its pass memory budget; or None.

    Rows are assumed `max_len` wide (512 without one), as the token budget always assumed; the
    memory model prices that width with its length**2 attention term, which a linear token count
    cannot. None means the whole batch fits one pass and no `batch_size` is sent at all, so a
    batch that fits behaves exactly as it would without the plan (padding width moves float
    bits). The agent still splits any pass its real rows make too large, and refuses a row that
    cannot fit alone.
    """
    if n_states <= 0 or n_questions <= 0:
        return None
    width = (
        max_len
        if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0
        else BATCH_ROW_TOKENS_ASSUMED
    )
    rows = max(1, token_budget // width)
    if memory is not None:
        model, pass_budget = memory
        rows = min(rows, max(1, model.max_rows(width, pass_budget)))
    if n_states * n_questions <= rows and n_states * n_questions * width <= token_budget:
        return None
    return max(1, min(n_states, rows // n_questions))
