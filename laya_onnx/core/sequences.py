"""Sequence building: one row of token ids per (state, question), and the graph's feed.

Layout of a row (laya 0.4.15, sequential option layout, docs/semantics.md#rows-and-sequences):

    [CLS] <type> question: <instructions> [SEP] [MASK] opt0 [MASK] opt1 ... [SEP] <state> [SEP]

The question half (the "head") depends only on the question and `head_max_len`, so it is built
once per call and shared by every state; each state is tokenized once and shared by every
question. This module is the single home of these rules: the runtime, export validation and
the parity tool all call it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from laya_onnx.core.bundle import GRAPH_INPUTS, MIN_MARKER_COLUMNS
from laya_onnx.core.errors import InvalidRequest, InvalidRequestType, caller_value
from laya_onnx.core.questions import Question, noul_labels, render_criterion
from laya_onnx.core.tokenizer import OPTION_MAX_TOKENS, LayaTokenizer

#: An option budget below this many tokens shrinks every option to an equal share.
OPTION_SHRINK_BELOW = 16
#: The instruction keeps at least this many tokens however many the options take.
INSTRUCTION_FLOOR = 8
#: A shrunk option keeps at least this many tokens (its [MASK] included).
OPTION_FLOOR = 4
_NOUL_DEFAULTS = ("no, the statement does not hold", "yes, the statement holds")
#: The option layout rows are built in (laya's default); the exported graph is traced for it.
OPTION_LAYOUT = "sequential"


def require_state_sequence(states: Any) -> None:
    """A batch call's states must be a sequence of states, not one state."""
    if isinstance(states, (str, bytes, dict)):
        raise InvalidRequestType(
            "predict_batch expects a list of states; pass a single state to predict()/system_one()."
        )


def checked_states(states: Sequence[Any], budgets: Mapping[str, Any]) -> list[Any]:
    """A call's states as a list, none of them None, once each of its `budgets` (`max_len`,
    `head_max_len`, `batch_size`) is checked to be an integer or None. Any int goes through as
    laya takes it (a budget too small is refused with the marker diagnosis); a non-integer would
    otherwise fail deep inside slicing."""
    for name, value in budgets.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidRequestType("%s must be an integer or None, got %r" % (name, value))
    listed = list(states)
    if any(s is None for s in listed):
        raise InvalidRequestType("state must not be None; pass a string, dict, or list")
    return listed


def check_option_layout(cfg: Mapping[str, Any], source: str) -> None:
    """Refuse a config (checkpoint or bundle `source`) that asks for another option layout."""
    layout = cfg.get("option_layout", OPTION_LAYOUT)
    if layout != OPTION_LAYOUT:
        raise ValueError(
            f"{source}: option_layout={layout!r} is not supported; laya-onnx builds rows and "
            f"traces the graph for the {OPTION_LAYOUT} layout only"
        )


def unencodable_at(text: str) -> int | None:
    """Where `text` first holds a character UTF-8 cannot encode (an unpaired surrogate), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def require_encodable(text: str, subject: str) -> str:
    """`text` itself, or InvalidRequest naming `subject` when the tokenizer could not take it.

    `tokenizers` takes only text that encodes as UTF-8; an unpaired surrogate (a JSON "\\ud800"
    escape on its own, or a non-UTF-8 byte decoded with surrogateescape) would otherwise fail
    inside it as a bare "TextInputSequence must be str" TypeError.
    """
    at = unencodable_at(text)
    if at is None:
        return text
    where = "after %r" % (text[max(0, at - 24) : at],) if at else "at its start"
    raise InvalidRequest(
        "%s contains an unpaired surrogate %r (%s); text must encode as UTF-8, so a surrogate "
        "escape such as \\ud800 is only valid as half of a pair" % (subject, text[at], where)
    )


def option_subject(q: Question, index: int) -> str:
    """Names the part of option `index` of `q` that cannot be encoded (for require_encodable)."""
    if q.type == "score":
        return "question %r criterion %d" % (q.qid, index)
    if q.type == "choice":
        label = list(q.criteria)[index]
        part = "label" if unencodable_at(str(label)) is not None else "description"
        return "question %r criterion %r (its %s)" % (q.qid, label, part)
    key = ("false", "true")[index]
    label = noul_labels(q.labels)[index]
    if unencodable_at(label) is not None:
        return "question %r labels[%r]" % (q.qid, key)
    return "question %r criterion %r" % (q.qid, key)


def serialize_state(state: Any) -> str:
    """A state as the text the model reads: strings verbatim, anything else as JSON."""
    if isinstance(state, str):
        return state
    with caller_value():  # a state json cannot encode (a set, an object) is the caller's
        return json.dumps(state, ensure_ascii=False)


def render_options(q: Question) -> list[str]:
    """Option texts in option-index order; a noul is always [false, true]."""
    if q.type == "choice":
        return [
            str(k) if v is None or v == "" else "%s: %s" % (k, render_criterion(v))
            for k, v in q.criteria.items()
        ]
    if q.type == "score":
        return ["level %d: %s" % (i, render_criterion(c)) for i, c in enumerate(q.criteria)]
    crit = q.criteria or {}
    texts = []
    for label, key, default in zip(noul_labels(q.labels), ("false", "true"), _NOUL_DEFAULTS, strict=False):
        desc = crit.get(key)
        texts.append(label + ": " + (render_criterion(desc) if desc not in (None, "") else default))
    return texts


@dataclass(frozen=True)
class Head:
    """The question half of a row: ids, each option slot's [MASK] position, option stats."""

    ids: list[int]
    markers: tuple[int, ...]  # a tuple: rows share it, and the head is cached across calls
    options: dict[str, Any]


def option_spans(tok: LayaTokenizer, q: Question) -> list[list[int]]:
    """Each option's span in slot order: its [MASK] and up to OPTION_MAX_TOKENS tokens of its text."""
    mask = tok.mask_token
    texts = render_options(q)
    for i, text in enumerate(texts):
        if unencodable_at(text) is not None:
            require_encodable(text, option_subject(q, i))
    order = q.option_order if q.option_order is not None else range(len(texts))
    return [
        [tok.mask_token_id] + tok.truncate(tok.encode(" " + texts[i].replace(mask, " ")), OPTION_MAX_TOKENS)
        for i in order
    ]


def options_fit(span_lengths: Sequence[int], head_max_len: int) -> bool:
    """Whether options of these span lengths keep every token in one head (no shrinking)."""
    return head_max_len - sum(span_lengths) >= OPTION_SHRINK_BELOW


def build_head(tok: LayaTokenizer, q: Question, head_max_len: int) -> Head:
    spans = option_spans(tok, q)  # first: an option's encoding error is reported before the instructions'
    require_encodable(q.instructions, "question %r instructions" % (q.qid,))
    instruction = tok.encode("%s question: %s" % (q.type, q.instructions.replace(tok.mask_token, " ")))
    budget = head_max_len - sum(len(s) for s in spans)
    per_option = None
    if not options_fit([len(s) for s in spans], head_max_len):
        per_option = max(OPTION_FLOOR, (head_max_len - OPTION_SHRINK_BELOW) // max(1, len(spans)))
        spans = [s[:per_option] for s in spans]
        budget = head_max_len - sum(len(s) for s in spans)
    # The floors mean a head can exceed head_max_len; max_len is the hard ceiling later.
    ids = [tok.cls_token_id] + instruction[: max(INSTRUCTION_FLOOR, budget)] + [tok.sep_token_id]
    markers = []
    for span in spans:
        markers.append(len(ids))
        ids.extend(span)
    ids.append(tok.sep_token_id)
    stats = {
        "options": len(spans),
        "options_distinct": len({tuple(s) for s in spans}),
        "tokens_per_option": per_option,
    }
    return Head(ids=ids, markers=tuple(markers), options=stats)


def build_heads(tok: LayaTokenizer, questions: Mapping[Any, Question], head_max_len: int) -> dict[Any, Head]:
    return {qid: build_head(tok, q, head_max_len) for qid, q in questions.items()}


def room_after(head: Head, max_len: int) -> int:
    """How many state tokens a row with this head keeps inside `max_len` (-1: the closing [SEP])."""
    return max(0, max_len - len(head.ids) - 1)


def state_room(tok: LayaTokenizer, q: Question, max_len: int, head_max_len: int) -> int:
    """The state tokens question `q` leaves room for (what `build_row` keeps of a longer state)."""
    return room_after(build_head(tok, q, head_max_len), max_len)


def state_ids(tok: LayaTokenizer, state: Any, subject: str = "state") -> list[int]:
    """The state's tokens, once per state (the [MASK] string is blanked so it cannot act as a marker).

    `subject` names the state in an error (an unpaired surrogate anywhere in it).
    """
    text = require_encodable(serialize_state(state), subject)
    return tok.encode(text.replace(tok.mask_token, " "))


@dataclass
class Row:
    """One (state, question) sequence and what decoding and usage need to know about it."""

    qid: Any
    ids: list[int]
    markers: list[int]
    qtype: int
    options: dict[str, Any]
    state_stats: dict[str, Any] = field(default_factory=dict)


def build_row(
    tok: LayaTokenizer,
    head: Head,
    q: Question,
    tokens: list[int],
    max_len: int,
    head_max_len: int,
    truncate_left: bool,
) -> Row:
    room = room_after(head, max_len)
    # A conversation (a list state) keeps its newest end; anything else keeps its start.
    kept = tokens[max(0, len(tokens) - room) :] if truncate_left else tokens[:room]
    ids = head.ids + kept
    ids.append(tok.sep_token_id)
    if len(ids) > max_len:
        ids = ids[:max_len]
    # Every marker lies inside the head, so all fit when the head does.
    markers = list(head.markers) if len(head.ids) <= max_len else [m for m in head.markers if m < max_len]
    if len(markers) != head.options["options"]:
        refusal = InvalidRequest(
            "question %r: only %d of its %d option markers fit in max_len=%d with "
            "head_max_len=%d spent on the question; lower head_max_len, raise max_len, "
            "or use fewer options" % (q.qid, len(markers), head.options["options"], max_len, head_max_len)
        )
        # The text is laya's own (refusals must match it); the note names what answers it here.
        add_note(
            refusal,
            "A choice with many options can be answered by elimination: predict(..., tournament=True).",
        )
        raise refusal
    stats = {
        "state_tokens": len(tokens),
        "state_tokens_used": len(kept),
        "state_tokens_dropped": len(tokens) - len(kept),
        "truncated": len(kept) < len(tokens),
    }
    return Row(qid=q.qid, ids=ids, markers=markers, qtype=q.qtype, options=head.options, state_stats=stats)


def add_note(exc: BaseException, note: str) -> None:
    """`BaseException.add_note` (Python 3.11), also on 3.10: a hint beside a message that must stay
    the reference's own text."""
    notes = list(getattr(exc, "__notes__", None) or [])
    exc.__notes__ = [*notes, note]  # type: ignore[attr-defined]


def encode_state(
    tok: LayaTokenizer,
    state: Any,
    questions: Mapping[Any, Question],
    max_len: int,
    head_max_len: int,
    heads: Mapping[Any, Head] | None = None,
    subject: str = "state",
) -> list[Row]:
    """This state's rows, one per question in question order (`subject` names it in errors)."""
    if heads is None:
        heads = build_heads(tok, questions, head_max_len)
    tokens = state_ids(tok, state, subject)
    left = isinstance(state, list)
    return [
        build_row(tok, heads[qid], q, tokens, max_len, head_max_len, left) for qid, q in questions.items()
    ]


#: From this many rows on, `collate` fills its arrays with one vectorised copy each; below it,
#: row by row (numpy's per-call overhead outweighs the per-row copies of a few rows).
COLLATE_VECTOR_ROWS = 8


def collate(rows: Sequence[Row], pad_id: int) -> dict[str, np.ndarray]:
    """Pad rows into the graph's inputs (names and dtypes from the bundle's I/O declaration)."""
    if not rows:
        raise ValueError("collate needs at least one row")
    n = len(rows)
    lengths = [len(r.ids) for r in rows]
    counts = [len(r.markers) for r in rows]
    width = max(lengths)
    k_cols = max(MIN_MARKER_COLUMNS, max(counts))
    ids = np.full((n, width), pad_id, dtype=np.int64)
    mpos = np.zeros((n, k_cols), dtype=np.int64)
    if n < COLLATE_VECTOR_ROWS:
        att = np.zeros((n, width), dtype=np.int64)
        mmask = np.zeros((n, k_cols), dtype=bool)
        for i, r in enumerate(rows):
            ids[i, : lengths[i]] = r.ids
            att[i, : lengths[i]] = 1
            mpos[i, : counts[i]] = r.markers
            mmask[i, : counts[i]] = True
    else:
        used = np.arange(width) < np.array(lengths)[:, None]
        ids[used] = np.fromiter(chain.from_iterable(r.ids for r in rows), dtype=np.int64, count=sum(lengths))
        att = used.astype(np.int64)
        mmask = np.arange(k_cols) < np.array(counts)[:, None]
        mpos[mmask] = np.fromiter(
            chain.from_iterable(r.markers for r in rows), dtype=np.int64, count=sum(counts)
        )
    feeds = {
        "input_ids": ids,
        "attention_mask": att,
        "marker_pos": mpos,
        "marker_mask": mmask,
        "qtype": np.array([r.qtype for r in rows], dtype=np.int64),
    }
    return {name: feeds[name] for name in GRAPH_INPUTS}
