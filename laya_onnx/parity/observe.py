"""Observe one request on one runtime: what the rule (`laya_onnx.core.judge`) judges.

A runtime is observed through its forward passes: `RowCapture` keeps every row's option logits
and act probabilities, keyed by the row's token ids, and `observe` decodes them again with the
core decoder *unrounded* (`digits=None`), into the same answer structure the caller got. The
reference (`laya.Agent`, instrumented in `runner.py`) and `ONNXAgent` (here) are observed the
same way. Torch-free: the golden-answer tests run this on a box without torch.
"""

from __future__ import annotations

import copy
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from laya_onnx.core.calibration import Calibration, act_probabilities, decode_answer
from laya_onnx.core.errors import reference_kind
from laya_onnx.core.judge import Observation
from laya_onnx.core.questions import normalize_questions
from laya_onnx.core.sequences import encode_state
from laya_onnx.parity.hook_cases import hook_case

#: Request controls passed through to predict / predict_batch.
CONTROLS = ("max_len", "head_max_len", "min_confidence", "lang")
#: What a refused request raises (compared by `reference_kind` and text).
REFUSALS = (ValueError, TypeError, KeyError)

#: (state, max_len or None, head_max_len or None) -> [(qid, ids, markers)], one per question.
RowEncoder = Callable[[Any, Any, Any], list[tuple[Any, list[int], list[int]]]]


class RowCapture:
    """Per-row outputs of every forward pass, keyed by token ids; taken back in the order seen.

    Taking in order matters when one request sends the same row twice (duplicate states in
    different chunks): each occurrence gets the logits of its own forward pass.
    """

    def __init__(self) -> None:
        self.rows: dict[tuple[int, ...], deque] = defaultdict(deque)

    def add(self, ids, attention_mask, marker_mask, logits, act_probs) -> None:
        for i in range(ids.shape[0]):
            key = tuple(int(t) for t in ids[i, : int(attention_mask[i].sum())])
            k = int(marker_mask[i].sum())
            self.rows[key].append(
                (np.array(logits[i, :k], dtype=np.float32), np.array(act_probs[i], dtype=np.float32))
            )

    def take(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray] | None:
        seen = self.rows.get(tuple(ids))
        return seen.popleft() if seen else None

    def clear(self) -> None:
        self.rows.clear()


def instrument_agent(agent) -> RowCapture:
    """Capture every forward pass of an `ONNXAgent` (its session's run)."""
    capture = RowCapture()
    run = agent.session.run

    def captured_run(feeds, **options):
        logits, act_logits = run(feeds, **options)
        capture.add(
            feeds["input_ids"],
            feeds["attention_mask"],
            feeds["marker_mask"],
            logits,
            act_probabilities(act_logits),
        )
        return logits, act_logits

    agent.session.run = captured_run
    return capture


def agent_rows(agent, questions: dict[Any, Any]) -> RowEncoder:
    """`ONNXAgent`'s rows for `questions`, encoded by the runtime core."""
    qs = normalize_questions(questions)

    def encode(state, max_len, head_max_len):
        rows = encode_state(
            agent.tok,
            state,
            qs,
            agent.max_len if max_len is None else max_len,
            agent.head_max_len if head_max_len is None else head_max_len,
        )
        return [(r.qid, list(r.ids), list(r.markers)) for r in rows]

    return encode


#: The scan controls of a `"call": "predict_long"` request.
LONG_CONTROLS = ("window", "stride", "aggregate", "batch_size", "lang")


class ScoredCalls:
    """An end hook that records what each prediction call scored: its states and questions after
    the start hooks (what reached inference), its budgets, and whether a start hook answered it."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def on_predict_end(self, ctx) -> None:
        self.calls.append(
            {
                "states": list(ctx.states) if isinstance(ctx.states, (list, tuple)) else [ctx.states],
                "questions": dict(ctx.questions) if isinstance(ctx.questions, dict) else {},
                "max_len": ctx.max_len,
                "head_max_len": ctx.head_max_len,
            }
        )


def call(agent, req: dict[str, Any], scored: ScoredCalls | None = None) -> Any:
    """One suite request on an agent (either runtime): predict, predict_batch for `states`, or
    predict_long for `"call": "predict_long"` (with the named hook case, `laya_onnx.parity.hook_cases`,
    and `scored` recording what it scored)."""
    if req.get("call") == "predict_long":
        hooks = hook_case(req.get("hooks"))
        if scored is not None:
            hooks["on_predict_end"] = [*hooks.get("on_predict_end", []), scored.on_predict_end]
        kw = {k: req[k] for k in LONG_CONTROLS if k in req}
        # a copy per runtime: a hook case may rewrite the questions in place
        return agent.predict_long(req.get("state"), copy.deepcopy(req["questions"]), **kw, **hooks)
    kw = {k: req[k] for k in CONTROLS if k in req}
    if "states" in req:
        return agent.predict_batch(
            req["states"],
            req["questions"],
            batch_size=req.get("batch_size"),
            sort_by_length=req.get("sort_by_length", False),
            **kw,
        )
    return agent.predict(req["state"], req["questions"], **kw)


def refusal(exc: BaseException) -> dict[str, str]:
    return {"kind": reference_kind(exc), "text": str(exc)}


def _decode_seen(q, seen, calibration, lang, digits):
    """`seen` is ((logits, act), markers) of one row: its answer decoded to `digits`."""
    (logits, act), markers = seen
    return decode_answer(q, logits, act, len(markers), calibration, lang, digits)


def observe_long(
    printed: dict[str, Any],
    scored: ScoredCalls,
    capture: RowCapture,
    rows_for: Callable[[dict[Any, Any]], RowEncoder],
    calibration: Calibration,
    lang: str | None,
) -> Observation:
    """A predict_long answer observed: the rows of every state the call scored (the windows, or
    what a start hook left of them), and each answer's twin decoded unrounded from its deciding
    window's logits: the window `answer["window"]` names, else (a rewritten scan) the first scored
    state whose answer prints as the returned one. An answer no scored row prints (a hook's own)
    gets no twin, so the rule compares it exactly."""
    if not scored.calls or printed.get("usage", {}).get("windows") == 0:
        return Observation(printed=printed, rows=[], unrounded=[{"answers": {}}])
    (scan,) = scored.calls
    questions = scan["questions"]
    qs = normalize_questions(questions)
    encode = rows_for(questions)
    rows, per_state = [], []
    for state in scan["states"]:
        state_rows, seen = [], {}
        for qid, ids, markers in encode(state, scan["max_len"], scan["head_max_len"]):
            state_rows.append({"qid": qid, "ids": ids, "markers": markers})
            taken = capture.take(ids)
            if taken is not None:
                seen[qid] = (taken, markers)
        rows.append(state_rows)
        per_state.append(seen)
    answers: dict[Any, Any] = {}
    for qid, answer in (printed.get("answers") or {}).items():
        if qid not in qs:
            continue
        window = answer.get("window") if isinstance(answer, dict) else None
        if window is not None:
            candidates = [window["index"]]
        else:
            printed_alone = {k: v for k, v in answer.items() if k != "window"}
            candidates = [
                j
                for j, seen in enumerate(per_state)
                if qid in seen and _decode_seen(qs[qid], seen[qid], calibration, lang, 4) == printed_alone
            ][:1]
        for j in candidates:
            if j < len(per_state) and qid in per_state[j]:
                answers[qid] = _decode_seen(qs[qid], per_state[j][qid], calibration, lang, None)
    return Observation(printed=printed, rows=rows, unrounded=[{"answers": answers}])


def observe(
    agent,
    req: dict[str, Any],
    capture: RowCapture,
    rows_for: Callable[[dict[Any, Any]], RowEncoder],
    calibration: Calibration,
) -> Observation:
    """Run `req` on `agent` (whose forward passes feed `capture`) and observe it for the rule.

    `rows_for(questions)` encodes a state's rows the way this runtime does; `calibration` is the
    checkpoint's (both runtimes answer with the same config).
    """
    capture.clear()
    scored = ScoredCalls()
    try:
        printed = call(agent, req, scored)
    except REFUSALS as exc:
        return Observation(refusal=refusal(exc))
    if req.get("call") == "predict_long":
        return observe_long(printed, scored, capture, rows_for, calibration, req.get("lang"))
    questions = req["questions"]
    states = req["states"] if "states" in req else [req["state"]]
    if not questions:  # answered without tokenizing (empty result per state)
        return Observation(
            printed=printed, rows=[[] for _ in states], unrounded=[{"answers": {}} for _ in states]
        )
    encode = rows_for(questions)
    rows, unrounded = [], []
    for state in states:
        state_rows, answers = observe_state(state, questions, req, encode, capture, calibration)
        rows.append(state_rows)
        unrounded.append({"answers": answers})
    return Observation(printed=printed, rows=rows, unrounded=unrounded)


def observe_state(
    state: Any,
    questions: dict[Any, Any],
    req: dict[str, Any],
    encode: RowEncoder,
    capture: RowCapture,
    calibration: Calibration,
) -> tuple[list[dict[str, Any]], dict[Any, Any]]:
    """One state's rows and its answers decoded unrounded from the logits `capture` saw
    (None for a row no forward pass ran); `req` gives the budgets and `lang`."""
    qs = normalize_questions(questions)
    state_rows, answers = [], {}
    for qid, ids, markers in encode(state, req.get("max_len"), req.get("head_max_len")):
        state_rows.append({"qid": qid, "ids": ids, "markers": markers})
        seen = capture.take(ids)
        answers[qid] = (
            None
            if seen is None
            else _decode_seen(qs[qid], (seen, markers), calibration, req.get("lang"), None)
        )
    return state_rows, answers


def observe_agent(agent, req: dict[str, Any], capture: RowCapture) -> Observation:
    """`observe` for an `ONNXAgent` instrumented by `instrument_agent`."""
    return observe(agent, req, capture, lambda questions: agent_rows(agent, questions), agent.calibration)
