"""Validate a graph against torch: the kit the export and its precision step share.

Torch's outputs on encoded requests (`reference_outputs`, every row unpadded), ONNX Runtime's on
the same feeds (`open_session`), both decoded into answers by the runtime's own decoder
(`decoded_answers`) and judged by the parity rule (`laya_onnx.core.judge`); `validate_graph`
returns the validation record, `failure_reason` says why one did not pass.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from laya_onnx.core.bundle import GRAPH_INPUTS, GRAPH_OUTPUTS
from laya_onnx.core.judge import Verdict
from laya_onnx.core.manifest import AnswersRecord, ValidationRecord
from laya_onnx.core.session import CPU, session_options
from laya_onnx.export.errors import ValidationError
from laya_onnx.export.progress import Steps


def to_torch(feeds: dict[str, np.ndarray]):
    import torch

    return tuple(torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in GRAPH_INPUTS)


def open_session(path: Path):
    """An ONNX Runtime CPU session on `path`, built as the runtime builds its own."""
    import onnxruntime as ort

    return ort.InferenceSession(str(path), sess_options=session_options(), providers=[CPU])


def _unpadded_groups(cases: list[dict[str, Any]]) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(case, row) of every row, grouped by (real length, marker columns): rows that can share a
    torch pass without any padding."""
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for c, case in enumerate(cases):
        feeds = case["feeds"]
        mask, columns = feeds["attention_mask"], int(feeds["marker_pos"].shape[1])
        for r, length in enumerate(mask.sum(axis=1)):
            n = int(length)
            if not mask[r, :n].all():  # not right-padded (collate always is): keep the row whole
                n = int(mask.shape[1])
            groups.setdefault((n, columns), []).append((c, r))
    return groups


def reference_outputs(model, cases: list[dict[str, Any]], steps: Steps | None = None) -> list[tuple]:
    """Torch's (logits, act_logits) for every case, so the model can be freed before ONNX Runtime
    loads its own copy of the weights (two full copies at once is what sets peak RSS).

    Torch runs every row WITHOUT padding: the rows of all cases that have the same length (and
    marker columns) share one pass. So torch pays for real tokens only (the export cases: 1.9k of
    their 2.8k padded tokens on the full-size English shape; the parity suite 8.8k of 12.7k), and
    ONNX Runtime's padded batches are compared with rows computed alone, which checks padding and
    neighbours as well: a graph whose answer depended on them would miss the tolerance.
    """
    import torch

    rows: list[list[Any]] = [[None] * case["rows"] for case in cases]
    groups = _unpadded_groups(cases)
    started = time.perf_counter()
    with torch.no_grad():
        for (length, _columns), members in groups.items():
            feeds = {
                name: np.stack(
                    [
                        cases[c]["feeds"][name][r, :length]
                        if name in ("input_ids", "attention_mask")
                        else cases[c]["feeds"][name][r]
                        for c, r in members
                    ]
                )
                for name in GRAPH_INPUTS
            }
            logits, act = (t.numpy() for t in model(*to_torch(feeds)))
            for i, (c, r) in enumerate(members):
                rows[c][r] = (logits[i].copy(), act[i].copy())
    if steps is not None:
        padded = sum(case["feeds"]["input_ids"].size for case in cases)
        real = sum(length * len(members) for (length, _), members in groups.items())
        steps.say(
            f"    {len(cases)} requests as {len(groups)} unpadded passes: {real} tokens "
            f"(padded {padded}), {time.perf_counter() - started:.2f}s"
        )
    return [tuple(np.stack(column) for column in zip(*case_rows, strict=True)) for case_rows in rows]


def decoded_answers(call, feeds: dict[str, np.ndarray], logits, act_logits, calibration):
    """One built-in call's outputs as the parity rule's observation: answers printed and unrounded."""
    from laya_onnx.core.calibration import act_probabilities, decode_answer
    from laya_onnx.core.judge import Observation
    from laya_onnx.core.questions import normalize_questions

    questions = normalize_questions(call.questions())
    act = act_probabilities(act_logits)
    lengths, counts = feeds["attention_mask"].sum(axis=1), feeds["marker_mask"].sum(axis=1)
    obs = Observation(printed=[])
    row = 0
    for _state in call.states:  # encode_calls: one row per question, in question order, per state
        rows, printed, unrounded = [], {}, {}
        for qid, q in questions.items():
            k = int(counts[row])
            rows.append(
                {
                    "qid": qid,
                    "ids": feeds["input_ids"][row, : int(lengths[row])].tolist(),
                    "markers": feeds["marker_pos"][row, :k].tolist(),
                }
            )
            printed[qid] = decode_answer(q, logits[row], act[row], k, calibration)
            unrounded[qid] = decode_answer(q, logits[row], act[row], k, calibration, digits=None)
            row += 1
        obs.rows.append(rows)
        obs.printed.append({"answers": printed})
        obs.unrounded.append({"answers": unrounded})
    return obs


def answering_calibration(cfg: dict[str, Any]):
    """The calibration a bundle of `cfg` answers with; its clamp warning belongs to the runtime."""
    import warnings

    from laya_onnx.core.calibration import Calibration

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return Calibration.from_config(cfg)


def validate_graph(
    graph: Path,
    cases: list[dict[str, Any]],
    expected: list[tuple],
    tolerance: float,
    steps: Steps | None = None,
    calibration=None,
    calls=None,
) -> ValidationRecord:
    """Compare ONNX Runtime with torch's outputs on every encoded case; returns the validation record.

    With `calibration` (and `calls`, the built-in calls `cases` were encoded from), the answers
    decoded from both sides' outputs are also judged by the parity rule (`laya_onnx.core.judge`).
    """
    from laya_onnx.core.judge import judge

    loading = time.perf_counter()
    session = open_session(graph)
    if steps is not None:
        steps.say(f"    session loaded in {time.perf_counter() - loading:.1f}s")
    worst_logit = worst_act = 0.0
    rows = 0
    answers: list[tuple[str, Verdict]] = []
    for i, (case, (t_logits, t_act)) in enumerate(zip(cases, expected, strict=True)):
        feeds = case["feeds"]
        passing = time.perf_counter()
        o_logits, o_act = session.run(list(GRAPH_OUTPUTS), {k: feeds[k] for k in GRAPH_INPUTS})
        pass_seconds = time.perf_counter() - passing
        if o_logits.shape != t_logits.shape or o_act.shape != t_act.shape:
            raise ValidationError(
                f"case {case['name']!r}: ONNX output shapes {o_logits.shape}/{o_act.shape} "
                f"differ from torch's {t_logits.shape}/{t_act.shape}"
            )
        d_logit = float(np.max(np.abs(o_logits.astype(np.float64) - t_logits)))
        d_act = float(np.max(np.abs(o_act.astype(np.float64) - t_act)))
        if not (np.isfinite(d_logit) and np.isfinite(d_act)):
            d_logit = d_act = float("inf")
        worst_logit, worst_act = max(worst_logit, d_logit), max(worst_act, d_act)
        rows += case["rows"]
        if calibration is not None:
            call = calls[i]
            if call.name != case["name"] or case["rows"] != len(call.states) * len(call.question_ids):
                raise ValidationError(f"case {case['name']!r} was not encoded from call {call.name!r}")
            answers.append(
                (
                    case["name"],
                    judge(
                        decoded_answers(call, feeds, t_logits, t_act, calibration),
                        decoded_answers(call, feeds, o_logits, o_act, calibration),
                    ),
                )
            )
        if steps is not None:
            shape = "x".join(str(s) for s in feeds["input_ids"].shape)
            steps.say(
                f"    {case['name']:<42} rows x len {shape:<8} markers {feeds['marker_pos'].shape[1]:>2}"
                f"  |dlogit| {d_logit:.2e}  |dact| {d_act:.2e}  {pass_seconds:.2f}s"
            )
    within = worst_logit <= tolerance and worst_act <= tolerance
    judged = _answers_record(answers) if calibration is not None else None
    return ValidationRecord(
        cases=len(cases),
        rows=rows,
        max_abs_logit_diff=worst_logit,
        max_abs_act_diff=worst_act,
        tolerance=tolerance,
        passed=within and (judged is None or bool(judged.passed)),
        answers=judged,
    )


def _answers_record(answers: list[tuple[str, Verdict]]) -> AnswersRecord:
    """The parity rule's verdicts on every case, as one record."""
    from laya_onnx.core.judge import DEFAULT_ACT_TOLERANCE, DEFAULT_TOLERANCE

    return AnswersRecord(
        rule="laya_onnx/core/judge.py",
        tolerance=DEFAULT_TOLERANCE,
        act_tolerance=DEFAULT_ACT_TOLERANCE,
        max_abs_dp=max(v.max_abs_dp for _, v in answers),
        max_abs_dact=max(v.max_abs_dact for _, v in answers),
        rounding_flips=sum(len(v.flips) for _, v in answers),
        differences=[f"{name}: {d}" for name, v in answers for d in v.describe()][:20],
        passed=all(v.passed for _, v in answers),
    )


def failure_reason(validation: ValidationRecord) -> str:
    """Why a validation record did not pass, in one sentence."""
    tolerance = validation.tolerance or 0.0
    logit, act = validation.max_abs_logit_diff or 0.0, validation.max_abs_act_diff or 0.0
    if max(logit, act) <= tolerance:
        differences = validation.answers.differences if validation.answers is not None else []
        return "ONNX Runtime's answers differ from torch's by the parity rule: " + "; ".join(differences[:3])
    return (
        f"ONNX Runtime disagrees with torch beyond tolerance {tolerance:g}: max |dlogit| "
        f"{logit:.3e}, max |dact_logit| {act:.3e}"
    )
