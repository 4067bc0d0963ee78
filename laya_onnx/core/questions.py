"""Question validation and normalisation.

Every rule and error text here is the reference's contract (laya 0.4.15 `Agent._check_question`,
docs/semantics.md#question-validation): a caller moving between laya and laya-onnx must get the same
`ValueError` for the same bad question. They are raised as `InvalidRequest` / `InvalidRequestType`
(ValueError / TypeError subclasses, laya_onnx.core.errors), which the HTTP edge turns into 422s
verbatim.
"""

from __future__ import annotations

import difflib
import json
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from laya_onnx.core.errors import InvalidRequest, InvalidRequestType, UnknownFieldWarning, caller_value
from laya_onnx.core.notices import brief

QTYPES: dict[str, int] = {"choice": 0, "score": 1, "noul": 2}
QTYPE_NAMES: dict[int, str] = {v: k for k, v in QTYPES.items()}
DEFAULT_NOUL_LABELS = {"false": "false", "true": "true"}
NOUL_LABELS_ERROR = "noul labels must map exactly 'false' and 'true' to distinct non-empty strings"
_ADD_TEXT = "add the text the model should answer"
#: The fields a question definition is read for; any other is accepted and ignored, as laya does,
#: and named in an `UnknownFieldWarning`.
QUESTION_FIELDS = ("type", "instructions", "criteria", "labels", "option_order")
#: The fields of one request the HTTP route reads (docs/http-api.md#request-fields).
REQUEST_FIELDS = (
    "state",
    "questions",
    "model",
    "max_len",
    "head_max_len",
    "task",
    "lang",
    "lang_guess",
    "min_confidence",
    "hooks",
    "on_predict_start",
    "on_predict_end",
    "hooks_raise",
    "hooks_timeout",
)


@dataclass(frozen=True)
class Question:
    """A validated question in the form sequence building and decoding read.

    `criteria` is the normalised form: a choice is an ordered ``{label: description|None}``
    (the caller's original labels, so an int or bool label comes back as itself), a score a list
    of levels, a noul a ``{"true"/"false": description}`` dict or None.
    """

    qid: Any
    type: str
    instructions: str
    criteria: Any
    labels: dict[str, str] | None = None
    option_order: tuple[int, ...] | None = None

    # Cached: a question is prepared once and read on every call that asks it.
    @cached_property
    def qtype(self) -> int:
        return QTYPES[self.type]

    @cached_property
    def n_options(self) -> int:
        return 2 if self.type == "noul" else len(self.criteria)

    @cached_property
    def answer_keys(self) -> list[Any]:
        """The keys of a choice's or score's `probabilities`: its labels, or its levels "0".."k-1"."""
        if self.type == "choice":
            return list(self.criteria)
        return [str(i) for i in range(self.n_options)]

    @cached_property
    def legend(self) -> dict[str, str]:
        """A score question's levels as answers print them ({"0": text, ...}); read-only, copy it."""
        return {str(i): render_criterion(c) for i, c in enumerate(self.criteria)}


def render_criterion(value: Any) -> str:
    """A criterion description as text: strings verbatim, structure as one-line JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def noul_labels(labels: Any) -> tuple[str, str]:
    """The stripped (false, true) labels a noul renders with; InvalidRequest if they are unusable."""
    if labels is None:
        labels = DEFAULT_NOUL_LABELS
    if not isinstance(labels, dict) or set(labels) != {"false", "true"}:
        raise InvalidRequest(NOUL_LABELS_ERROR)
    f, t = labels["false"], labels["true"]
    if not isinstance(f, str) or not isinstance(t, str):
        raise InvalidRequest(NOUL_LABELS_ERROR)
    f, t = f.strip(), t.strip()
    if not f or not t or f == t:
        raise InvalidRequest(NOUL_LABELS_ERROR)
    return f, t


def _declared_options(qdef: Mapping[str, Any]) -> int:
    if qdef.get("type") == "noul":
        return 2
    crit = qdef.get("criteria")
    return len(crit) if isinstance(crit, (dict, list, tuple)) else 0


def _is_scalar_label(label: Any) -> bool:
    return isinstance(label, (str, int, float, bool))


def check_question(qid: Any, qdef: Any) -> None:
    """Raise InvalidRequest naming `qid` and the fix if the question cannot be answered."""
    if qid is None:
        raise InvalidRequest("question id must not be None")
    if not isinstance(qid, (str, int)) or (isinstance(qid, str) and not qid.strip()):
        raise InvalidRequest("question id must be a non-empty string, got %r" % (qid,))
    if not isinstance(qdef, dict):
        raise InvalidRequest("question %r: definition must be a dict, got %s" % (qid, type(qdef).__name__))
    t = qdef.get("type")
    if "type" not in qdef:
        near = nearest(QUESTION_FIELDS, [k for k in qdef if isinstance(k, str) and k not in QUESTION_FIELDS])
        raise InvalidRequest(
            "question %r: no 'type' field%s; add \"type\": one of %s"
            % (qid, "" if near is None else " (%r looks like a misspelling of it)" % near[1], sorted(QTYPES))
        )
    if not isinstance(t, str) or t not in QTYPES:
        raise InvalidRequest("question %r: unknown type %r; use one of %s" % (qid, t, sorted(QTYPES)))
    _check_instructions(qid, qdef)
    crit = qdef.get("criteria")
    if t == "choice":
        _check_choice(qid, crit)
    elif t == "score":
        _check_score(qid, crit)
    else:
        _check_noul(qid, crit)
    if "option_order" in qdef:
        order, n = qdef["option_order"], _declared_options(qdef)
        slots = (
            sorted(int(i) for i in order if isinstance(i, int) and not isinstance(i, bool))
            if isinstance(order, (list, tuple))
            else None
        )
        if slots is None or len(order) != n or slots != list(range(n)):
            raise InvalidRequest(
                "question %r: 'option_order' must be a permutation of range(%d) -- one slot per "
                "option, each option once -- got %r" % (qid, n, order)
            )
    if "labels" in qdef:
        if t != "noul":
            raise InvalidRequest("question %r: 'labels' is only supported for noul questions" % (qid,))
        try:
            noul_labels(qdef["labels"])
        except InvalidRequest as exc:
            raise InvalidRequest("question %r: %s" % (qid, exc)) from exc


def _check_instructions(qid: Any, qdef: Mapping[str, Any]) -> None:
    if "instructions" not in qdef:
        raise InvalidRequest("question %r: no 'instructions'; %s" % (qid, _ADD_TEXT))
    ins = qdef["instructions"]
    if ins is None:
        raise InvalidRequest("question %r: 'instructions' must not be None; %s" % (qid, _ADD_TEXT))
    if (isinstance(ins, str) and not ins.strip()) or (isinstance(ins, (list, dict)) and not ins):
        raise InvalidRequest("question %r: 'instructions' must not be empty; %s" % (qid, _ADD_TEXT))
    if not isinstance(ins, (str, dict, list, int, float)):
        raise InvalidRequest(
            "question %r: 'instructions' must be a string, dict, or list, got %s" % (qid, type(ins).__name__)
        )


def _check_choice(qid: Any, crit: Any) -> None:
    if not isinstance(crit, (dict, list)):
        raise InvalidRequest(
            "question %r: a choice question takes 'criteria' as a dict of "
            "label -> description, or a list of labels" % (qid,)
        )
    if not crit:
        raise InvalidRequest("question %r: a choice question needs at least one criterion" % (qid,))
    for i, label in enumerate(crit if isinstance(crit, list) else crit.keys()):
        if label is not None and not _is_scalar_label(label):
            raise InvalidRequest(
                "question %r: choice label %d is a %s; a label is rendered as option text "
                "and used as the answer key, so it must be a scalar (a string, number or "
                "bool), got %r" % (qid, i, type(label).__name__, label)
            )
        if label is None:
            raise InvalidRequest(
                "question %r: choice label %d is null; a label is rendered as option text "
                "and used as the answer key, so it must be a string, number or bool -- a "
                'null label renders as the text "None" while its answer key is "null"' % (qid, i)
            )
    if isinstance(crit, list):
        # Labels become dict keys, so values that compare equal (1, 1.0, True) are one key.
        seen: dict[Any, int] = {}
        for i, label in enumerate(crit):
            if label in seen:
                raise InvalidRequest(
                    "question %r: choice label %d (%r) repeats label %d; the labels are the "
                    "answer keys, so every option needs its own (1, 1.0 and True are one "
                    "key)" % (qid, i, label, seen[label])
                )
            seen[label] = i


def _check_score(qid: Any, crit: Any) -> None:
    if not isinstance(crit, list):
        raise InvalidRequest(
            "question %r: a score question takes 'criteria' as a list of level "
            "descriptions, index 0 first" % (qid,)
        )
    if not crit:
        raise InvalidRequest("question %r: a score question needs at least one level" % (qid,))
    null = null_level(crit)
    if null is not None:
        raise InvalidRequest(
            "question %r: score level %d is null; give every level a description, index 0 first" % (qid, null)
        )


def null_level(levels: list[Any]) -> int | None:
    """The index of a score rubric's first null level, or None when every level is described.

    The one home of this rule: the core refuses such a question with its text above, and the
    HTTP edge refuses it earlier, among its size limits, with laya-serve's own wording.
    """
    return levels.index(None) if None in levels else None


def _check_noul(qid: Any, crit: Any) -> None:
    if crit is None:
        return
    if not isinstance(crit, dict):
        raise InvalidRequest(
            "question %r: a noul question takes 'criteria' as a dict with optional "
            "'true'/'false' descriptions, or omits it" % (qid,)
        )
    keys = {str(k).lower() for k in crit}
    if not keys <= {"true", "false"}:
        raise InvalidRequest(
            "question %r: a noul question takes 'criteria' keyed only 'true'/'false' (either "
            "or both, and omitted is fine), got %s. Those keys are the option texts the model "
            "reads; any other key was silently dropped and replaced with the defaults. If you "
            "want the answer worded differently, keep 'criteria' keyed 'true'/'false' and set "
            "'labels' instead." % (qid, sorted(keys))
        )


def to_question(qid: Any, qdef: Mapping[str, Any]) -> Question:
    """Normalise an already validated definition (no checks of its own)."""
    t = qdef["type"]
    crit = qdef.get("criteria")
    if t == "choice" and isinstance(crit, list):
        crit = {label: None for label in crit}
    elif t == "noul" and isinstance(crit, dict):
        crit = {str(k).lower(): v for k, v in crit.items()}  # last spelling wins, as in laya
    ins = qdef["instructions"]
    if not isinstance(ins, str):
        with caller_value():  # a structure json cannot encode (a set inside a dict)
            ins = json.dumps(ins, ensure_ascii=False)
    return Question(
        qid=qid,
        type=t,
        instructions=ins,
        criteria=crit,
        labels=qdef.get("labels") if "labels" in qdef else None,
        option_order=tuple(int(i) for i in qdef["option_order"]) if "option_order" in qdef else None,
    )


def nearest(known: Iterable[str], names: Iterable[Any]) -> tuple[str, str] | None:
    """The first (known field, given name) pair where the name looks like a misspelling of the
    field (difflib's ratio >= 0.75), or None."""
    known = list(known)
    for name in names:
        if isinstance(name, str):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
            if close:
                return close[0], name
    return None


@dataclass(frozen=True)
class UnknownField:
    """A field of a request (`question` None) or of one question that nothing reads, and the known
    field it most resembles (`did_you_mean`, None when none is close)."""

    name: Any
    question: Any = None
    did_you_mean: str | None = None

    def __str__(self) -> str:
        where = "request" if self.question is None else "question %s:" % brief(self.question)
        hint = "" if self.did_you_mean is None else " (did you mean %r?)" % self.did_you_mean
        return "%s field %s is not read and has no effect%s" % (where, brief(self.name), hint)

    def as_json(self) -> dict[str, Any]:
        """The field for a JSON answer: {"field", "question"?, "did_you_mean"?}."""
        out: dict[str, Any] = {"field": str(self.name)}
        if self.question is not None:
            out["question"] = self.question
        if self.did_you_mean is not None:
            out["did_you_mean"] = self.did_you_mean
        return out


def _unknown(
    keys: Iterable[Any], known: tuple[str, ...], question: Any = None, most: int | None = None
) -> list[UnknownField]:
    out: list[UnknownField] = []
    for key in keys:
        if most is not None and len(out) >= most:
            break
        if key not in known:
            near = nearest(known, [key])
            out.append(UnknownField(key, question, None if near is None else near[0]))
    return out


def unknown_question_fields(questions: Any, most: int | None = None) -> list[UnknownField]:
    """The fields of each question (a dict of id -> definition) that nothing reads, in order;
    the first `most` of them when it is set."""
    if not isinstance(questions, Mapping):
        return []
    out: list[UnknownField] = []
    for qid, qdef in questions.items():
        if isinstance(qdef, Mapping):
            out += _unknown(qdef, QUESTION_FIELDS, qid, None if most is None else most - len(out))
    return out


def unknown_fields(
    request: Any, known: Iterable[str] = REQUEST_FIELDS, most: int | None = None
) -> list[UnknownField]:
    """The fields of one request (`known`: the fields its reader takes) and of its questions that
    nothing reads, each with the known field it most resembles: what a client should be told it
    got wrong when a misspelt optional field (`min_confidnce`, `critera`) would otherwise be
    ignored in silence. `most` bounds the work a body of many unknown keys costs."""
    if not isinstance(request, Mapping):
        return []
    top = _unknown(request, tuple(known), most=most)
    rest = None if most is None else most - len(top)
    return top + unknown_question_fields(request.get("questions"), rest)


def warn_unknown_fields(fields: list[UnknownField], stacklevel: int = 2) -> None:
    """One `UnknownFieldWarning` naming every field of `fields`; nothing when it is empty."""
    if fields:
        warnings.warn(
            "laya-onnx: " + "; ".join(str(f) for f in fields[:8]) + ("; ..." if len(fields) > 8 else ""),
            UnknownFieldWarning,
            stacklevel=stacklevel + 1,
        )


def require_questions_dict(questions: Any) -> None:
    """InvalidRequestType, with laya's text, for questions that are not a dict."""
    if not isinstance(questions, dict):
        raise InvalidRequestType(
            "questions must be a dict of question id -> definition, got %s" % type(questions).__name__
        )


def normalize_questions(questions: Any) -> dict[Any, Question]:
    """Validate every question (in key order) and normalise them; InvalidRequestType for a non-dict."""
    require_questions_dict(questions)
    for qid, qdef in questions.items():
        check_question(qid, qdef)
    warn_unknown_fields(unknown_question_fields(questions), stacklevel=3)
    return {qid: to_question(qid, qdef) for qid, qdef in questions.items()}
