"""Long states: scan a state in overlapping token windows and aggregate the answers per question.

laya 0.4.15's `predict_long` semantics (docs/semantics.md#windows-predict_long): the window is sized
from the agent's config (never per-call budgets) and capped at the room the tightest question
leaves; the state is tokenized once, split into windows decoded back to text, and every window is
answered by one call (so windows share forward passes). Per question the deciding window is the one
with the highest P(true) for a noul, the highest `answer_confidence` for a choice or score; its
answer is returned with `answer["window"]`, and the windows' usage blocks are merged.

A probe appended after the caller's start hooks records what the hooks left for inference, so a
hook that answered the document, rewrote the windows or re-budgeted the scan is told apart.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from laya_onnx.core.calibration import MODEL_NAME
from laya_onnx.core.errors import InvalidRequest, InvalidRequestType, StateTruncatedWarning
from laya_onnx.core.gate import apply_confidence_gate
from laya_onnx.core.hooks import aggregate_usage
from laya_onnx.core.options import CallOptions
from laya_onnx.core.questions import Question, normalize_questions, require_questions_dict, to_question
from laya_onnx.core.sequences import state_ids, state_room
from laya_onnx.core.tokenizer import LayaTokenizer

#: The default window is the state budget the config leaves, never below this many tokens.
WINDOW_FLOOR = 64
#: Tokens the default window leaves for the row's own special tokens.
WINDOW_MARGIN = 8
#: A default window cut to 1/ratio of its size or less is worth a warning (ratio of passes).
WINDOW_CLAMP_WARN_RATIO = 2
#: Window batches are capped only when clamping multiplied the window count past this factor.
WINDOW_BATCH_BLOWUP = 2


def default_window(max_len: int, head_max_len: int) -> int:
    return max(WINDOW_FLOOR, max_len - head_max_len - WINDOW_MARGIN)


@dataclass(frozen=True)
class WindowPlan:
    """`size` state tokens per window, `step` tokens between window starts, the questions' `room`."""

    size: int
    step: int
    room: int


def window_budget(
    tok: LayaTokenizer,
    questions: Sequence[Question],
    max_len: int,
    head_max_len: int,
    window: int | None = None,
    stride: int | None = None,
) -> WindowPlan:
    """The window and stride a scan uses (laya `window_budget`: same clamps, warnings, refusals)."""
    rooms = [state_room(tok, q, max_len, head_max_len) for q in questions]
    explicit = bool(window and window > 0)
    requested = window if explicit else default_window(max_len, head_max_len)
    assert requested is not None
    size = requested
    room = min(rooms) if rooms else size
    if room <= 0:
        raise InvalidRequest(
            "predict_long: the questions' options fill the whole sequence (max_len=%d,"
            " head_max_len=%d), leaving no room for the state; no window can carry any of it."
            " A label set this large is what laya.shortlist.predict_shortlist is for"
            % (max_len, head_max_len)
        )
    if size > room:
        if explicit:
            warnings.warn(
                "laya: predict_long: window=%d is wider than the %d state tokens these questions"
                " leave inside max_len=%d, so every window would be truncated to %d on the way to"
                " the model; scanning with window=%d instead" % (size, room, max_len, room, room),
                RuntimeWarning,
                stacklevel=4,
            )
        elif size >= room * WINDOW_CLAMP_WARN_RATIO:
            warnings.warn(
                "laya: predict_long: these questions leave only %d of max_len=%d for the state"
                " (their heads take the rest), so the scan window is capped %d -> %d and roughly"
                " %.1fx as many windows -- each a full forward pass -- are needed to read the"
                " document. Fewer or shorter options, a larger max_len, or"
                " laya.shortlist.predict_shortlist for a large label set will all cost less than"
                " scanning at this width" % (room, max_len, size, room, size / room),
                RuntimeWarning,
                stacklevel=4,
            )
        size = room
    half = max(1, size // 2)
    step = stride if (stride and stride > 0) else half
    if step > size:
        if size < requested and stride and stride <= requested:
            # The library shrank the window under a stride that fit the one asked for: shrink the
            # stride with it rather than refuse a self-consistent pair of arguments.
            warnings.warn(
                "laya: predict_long: stride=%d was a 50%% step for the window=%d you asked for, but"
                " the window was reduced to %d to fit the room these questions leave; scanning with"
                " stride=%d instead" % (step, requested, size, half),
                RuntimeWarning,
                stacklevel=4,
            )
            step = half
        else:
            raise InvalidRequest(
                "predict_long: stride=%d steps past the %d-token window%s, so %d tokens between"
                " every pair of windows would be read by no window at all; pass stride <= %d"
                % (
                    step,
                    size,
                    " these questions leave room for" if size < requested else "",
                    step - size,
                    size,
                )
            )
    return WindowPlan(size=size, step=step, room=room)


def window_batch_cap(n_windows: int, window: int, config_budget: int, batch_size: int | None) -> int | None:
    """Windows per pass: an explicit `batch_size`, else one pass unless clamping the window
    multiplied the window count past WINDOW_BATCH_BLOWUP (then as many windows as the unclamped
    scan would have had, so a pass is no wider than before the clamp)."""
    if batch_size and batch_size > 0:
        return batch_size
    if window >= config_budget:
        return None
    unclamped = max(1, -(-n_windows * max(1, window // 2) // max(1, config_budget // 2)))
    if n_windows <= unclamped * WINDOW_BATCH_BLOWUP:
        return None
    return unclamped


def split_windows(
    tok: LayaTokenizer, ids: Sequence[int], size: int, step: int
) -> tuple[list[str], list[int]]:
    """Window texts (each decoded back to text, so it is re-tokenized as a plain state) and starts."""
    texts: list[str] = []
    starts: list[int] = []
    i, n = 0, len(ids)
    while i < n:
        texts.append(tok.decode(ids[i : i + size]))
        starts.append(i)
        if i + size >= n:
            break
        i += step
    return texts, starts


class StartProbe:
    """The last start hook of a scan: records what the hook chain left for inference to run on.

    Only records, never judges: a check raised from inside the chain would fall under the
    caller's `hooks_raise`/`hooks_timeout`.
    """

    def __init__(self) -> None:
        self.answered = False
        self.states: list[Any] | None = None
        self.question_types: dict[Any, Any] | None = None
        self.max_len: int | None = None
        self.head_max_len: int | None = None
        self.questions: dict[Any, Any] = {}

    def on_predict_start(self, ctx) -> None:
        self.answered = ctx.results is not None
        self.states = list(ctx.states)
        if ctx.results is None and isinstance(ctx.questions, dict):
            self.question_types = {
                qid: qdef.get("type") if isinstance(qdef, dict) else None
                for qid, qdef in ctx.questions.items()
            }
        self.max_len = ctx.max_len
        self.head_max_len = ctx.head_max_len
        # Shallow on purpose: compared with the deep snapshot taken before the hooks, an in-place
        # rewrite of a nested definition shows up too.
        self.questions = dict(ctx.questions) if ctx.questions else {}


def check_scan_budget(
    tok: LayaTokenizer,
    probe: StartProbe,
    sized: int,
    max_len: int,
    head_max_len: int,
    asked: Mapping[Any, Any],
) -> None:
    """Refuse a scan whose start hooks left less room per window than it was sized for.

    A hook may set `ctx.max_len`/`ctx.head_max_len` or rewrite the questions; every window would
    then be re-truncated and parts of the document reach no model. Checked after the call (the
    pass has run), so the caller's hook policies cannot switch it off.
    """
    if probe.answered or not probe.questions:
        return
    eff_max_len = max_len if probe.max_len is None else probe.max_len
    eff_head = head_max_len if probe.head_max_len is None else probe.head_max_len
    if eff_max_len == max_len and eff_head == head_max_len and probe.questions == asked:
        return
    try:
        qs = [to_question(qid, qdef) for qid, qdef in probe.questions.items()]
    except Exception:
        return  # malformed questions are the validator's to report
    room = min(state_room(tok, q, eff_max_len, eff_head) for q in qs)
    if room >= sized:
        return
    raise ValueError(
        "predict_long: after the start hooks ran, the questions and token budget (max_len=%d "
        "head_max_len=%d) leave %d state tokens per window, but the scan was sized for %d from the "
        "agent's config (max_len=%d head_max_len=%d). Every window would be re-truncated and parts "
        "of the document would reach no model. Pass window=/stride= explicitly, or call "
        "predict_batch directly, if you need a start hook to change either."
        % (eff_max_len, eff_head, room, sized, max_len, head_max_len)
    )


def merge_usage(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The windows' usage folded in order: numbers (bools too) summed, dicts merged, the rest
    replaced (so `truncated` is a window count, `truncated_questions` the last window's list)."""
    usage: dict[str, Any] = {}
    for r in results:
        for key, val in r["usage"].items():
            prev = usage.get(key)
            if isinstance(val, (int, float)):
                usage[key] = (prev if isinstance(prev, (int, float)) else 0) + val
            elif isinstance(val, dict) and isinstance(prev, dict):
                usage[key] = {**prev, **val}
            else:
                usage[key] = val
    usage["output_tokens"] = 0
    usage["windows"] = len(results)
    return usage


def deciding_window(qtype: Any, answers: Sequence[Mapping[str, Any]]) -> int:
    """The first window with the highest P(true) (noul) or `answer_confidence` (choice, score)."""
    key = "noul" if qtype == "noul" else "answer_confidence"
    return max(range(len(answers)), key=lambda j: float(answers[j][key]))


def aggregate(
    results: Sequence[dict[str, Any]],
    question_types: Mapping[Any, Any],
    asked: Mapping[Any, Any],
    attribution: tuple[list[int], int, int] | None,
) -> dict[str, Any]:
    """One document answer from per-window results; `attribution` is (starts, size, n_tokens), or
    None for a scan a hook rewrote (its answers then carry no `window`)."""
    answers = {}
    for qid, qtype in question_types.items():
        missing = sum(qid not in r["answers"] for r in results)
        if missing:
            # End hooks may drop a question a start hook added, never one the caller asked.
            if missing == len(results) and qid not in asked:
                continue
            raise ValueError(
                "predict_long: answer %r is missing from %d of %d windows after prediction hooks"
                % (qid, missing, len(results))
            )
        per = [r["answers"][qid] for r in results]
        best = deciding_window(qtype, per)
        answer = per[best]
        if attribution is not None:
            starts, size, n = attribution
            answer["window"] = {
                "index": best,
                "token_start": starts[best],
                "token_end": min(starts[best] + size, n),
                "count": len(results),
            }
        answers[qid] = answer
    result = {"model": MODEL_NAME, "answers": answers, "usage": merge_usage(results)}
    apply_confidence_gate([result], None)  # no min_confidence here: writes nothing, as laya
    return result


#: True while `predict_long` runs its windows: a window cut to fit is part of the scan, not a state
#: the caller should be told to scan (`warn_if_truncated` reads it).
SCANNING: ContextVar[bool] = ContextVar("laya_onnx_scanning_windows", default=False)


def warn_if_truncated(name: str, results: Sequence[Mapping[str, Any]], stacklevel: int = 1) -> bool:
    """Warn that a state of `results` was cut to fit `max_len` (only its `usage.truncated` says so
    otherwise), naming `predict_long`, which reads a long state whole; True when it warned. Silent
    inside a window scan, whose windows are cut on purpose. `stacklevel` counts from the caller."""
    if SCANNING.get():
        return False
    usage = next((r["usage"] for r in results if (r.get("usage") or {}).get("truncated")), None)
    if usage is None:
        return False
    warnings.warn(
        "laya-onnx: bundle %r: a state of %d tokens was cut to fit max_len (%d tokens dropped; usage"
        ".truncated); predict_long(state, questions) reads a long state whole, in overlapping windows"
        % (name, usage["state_tokens"], usage["state_tokens_dropped"]),
        StateTruncatedWarning,
        stacklevel=stacklevel + 1,
    )
    return True


def predict_long(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """`scan` (below), marked as a window scan for its whole run (`SCANNING`)."""
    token = SCANNING.set(True)
    try:
        return scan(*args, **kwargs)
    finally:
        SCANNING.reset(token)


def scan(
    agent,
    state: Any,
    questions: dict[Any, Any],
    call: CallOptions,
    window: int | None = None,
    stride: int | None = None,
    aggregate_mode: str = "auto",
    batch_size: int | None = None,
    lang: str | None = None,
) -> dict[str, Any]:
    """`ONNXAgent.predict_long` (see its docstring): every answer is one `agent.run_call` under
    the caller's resolved options, with the probe as the last hook."""
    if state is None:
        raise InvalidRequestType("state must not be None; pass a string, dict, or list")
    require_questions_dict(questions)
    if aggregate_mode != "auto":
        raise InvalidRequest("predict_long: only aggregate='auto' is supported")
    tok = agent.tok
    max_len, head_max_len = agent.max_len, agent.head_max_len
    qs = normalize_questions(questions)
    plan = window_budget(tok, list(qs.values()), max_len, head_max_len, window=window, stride=stride)
    # Before any start hook can rewrite them (in place, too): what the scan was sized against.
    asked = copy.deepcopy(questions)
    ids = state_ids(tok, state)
    probe = StartProbe()
    call = call.with_hook(probe)
    explicit = bool(window and window > 0)
    if len(ids) <= (plan.size if explicit else plan.room):
        single = dict(agent.run_call([state], questions, call, lang=lang)[0])
        check_scan_budget(tok, probe, max(plan.size, len(ids)), max_len, head_max_len, asked)
        single["usage"] = {**(single.get("usage") or {}), "windows": 0 if probe.answered else 1}
        return single

    texts, starts = split_windows(tok, ids, plan.size, plan.step)
    cap = window_batch_cap(len(texts), plan.size, default_window(max_len, head_max_len), batch_size)
    # A copy, so a start hook that edits ctx.states in place cannot shift `starts`.
    results = agent.run_call(list(texts), questions, call, batch_size=cap, lang=lang)
    check_scan_budget(tok, probe, plan.size, max_len, head_max_len, asked)
    if probe.answered:
        if len(results) != 1:
            raise ValueError(
                "predict_long: a start hook answered this state with %d results; ctx.skip()"
                " takes one result for the document, not one per window" % len(results)
            )
        warnings.warn(
            "laya: predict_long: a hook answered the state before it was scanned, so "
            "no window decided the result and none is reported",
            RuntimeWarning,
            stacklevel=3,
        )
        document = dict(results[0])
        document["usage"] = dict(document.get("usage") or {})
        document["usage"]["windows"] = 0
        return document
    rewritten = probe.states is not None and probe.states != texts
    if len(results) != len(texts) and not rewritten:
        raise ValueError(
            "predict_long: the state was split into %d windows and the call returned %d results"
            % (len(texts), len(results))
        )
    if not results:
        warnings.warn(
            "laya: predict_long: a start hook left no states to score, so the call"
            " aggregated nothing and returns no answers",
            RuntimeWarning,
            stacklevel=3,
        )
        return {"model": MODEL_NAME, "answers": {}, "usage": {**aggregate_usage(results), "windows": 0}}
    # The probe is the last start hook and no hook answered, so it saw the questions inference
    # accepted (a dict).
    assert probe.question_types is not None
    attribution = None if rewritten else (starts, plan.size, len(ids))
    return aggregate(results, probe.question_types, asked, attribution)
