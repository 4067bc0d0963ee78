"""Run one suite through the reference `laya.Agent` (torch) and our `ONNXAgent`, and compare.

Compared per request: the error (type and text) when the reference refuses it; otherwise, per
(state, question), the token ids and marker positions, every option probability before rounding
(max |Δp| against `tolerance`), the act probability, the decision (choice label, most likely score
level, noul side), and the whole result JSON, key order included, apart from `model`.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from laya_onnx.calibration import Calibration, act_probabilities, softmax_f32, unpermute
from laya_onnx.errors import reference_kind
from laya_onnx.parity.suite import load_suite
from laya_onnx.questions import normalize_questions
from laya_onnx.sequences import build_heads, encode_state

_CONTROLS = ("max_len", "head_max_len", "min_confidence", "lang")


@dataclass
class CaseResult:
    name: str
    rows: int = 0
    tokens_equal: bool = True
    decisions_equal: bool = True
    json_equal: bool = True
    json_strict_equal: bool = True
    rounding_flips: int = 0
    errors_equal: bool = True
    max_abs_dp: float = 0.0
    max_abs_dact: float = 0.0
    details: list[str] = field(default_factory=list)

    def passed(self, tolerance: float) -> bool:
        return (
            self.tokens_equal
            and self.decisions_equal
            and self.json_equal
            and self.errors_equal
            and self.max_abs_dp <= tolerance
        )


@dataclass
class ParityReport:
    checkpoint: str
    bundle: str
    suite: str
    tolerance: float
    cases: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed(self.tolerance) for c in self.cases)

    def summary(self) -> dict[str, Any]:
        rows = sum(c.rows for c in self.cases)
        return {
            "suite": self.suite,
            "requests": len(self.cases),
            "rows": rows,
            "tokens_identical": all(c.tokens_equal for c in self.cases),
            "decisions_identical": all(c.decisions_equal for c in self.cases),
            "json_equal": all(c.json_equal for c in self.cases),
            "json_strict_equal": all(c.json_strict_equal for c in self.cases),
            "rounding_flips": sum(c.rounding_flips for c in self.cases),
            "errors_identical": all(c.errors_equal for c in self.cases),
            "max_abs_dp": max((c.max_abs_dp for c in self.cases), default=0.0),
            "max_abs_dact": max((c.max_abs_dact for c in self.cases), default=0.0),
            "tolerance": self.tolerance,
            "passed": self.passed,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "bundle": self.bundle,
            "seconds": round(self.seconds, 2),
            "summary": self.summary(),
            "cases": [asdict(c) for c in self.cases],
        }

    def failures(self) -> list[str]:
        return [
            f"{c.name}: {'; '.join(c.details) or 'max |dp| %.3g' % c.max_abs_dp}"
            for c in self.cases
            if not c.passed(self.tolerance)
        ]


class _Capture:
    """Rows seen by a forward pass, keyed by their token ids: (option logits, act probabilities)."""

    def __init__(self):
        self.rows: dict[tuple, list[tuple]] = defaultdict(list)

    def add(self, ids, att, mmask, logits, act) -> None:
        for i in range(ids.shape[0]):
            key = tuple(int(t) for t in ids[i, : int(att[i].sum())])
            k = int(mmask[i].sum())
            self.rows[key].append(
                (np.array(logits[i, :k], dtype=np.float32), np.array(act[i], dtype=np.float32))
            )

    def get(self, ids: Sequence[int]):
        found = self.rows.get(tuple(ids))
        return found[0] if found else None


def _instrument_reference(ref, capture: _Capture) -> None:
    forward = ref._forward

    def wrapped(b):
        logits, act = forward(b)
        capture.add(
            b["input_ids"].cpu().numpy(),
            b["attention_mask"].cpu().numpy(),
            b["marker_mask"].cpu().numpy(),
            logits,
            act,
        )
        return logits, act

    ref._forward = wrapped


def _instrument_ours(agent, capture: _Capture) -> None:
    run = agent.session.run

    def wrapped(feeds):
        logits, act_logits = run(feeds)
        capture.add(
            feeds["input_ids"],
            feeds["attention_mask"],
            feeds["marker_mask"],
            logits,
            act_probabilities(act_logits),
        )
        return logits, act_logits

    agent.session.run = wrapped


def _decision(q, p: np.ndarray):
    if q.type == "choice":
        return list(q.criteria.keys())[int(p.argmax())]
    if q.type == "score":
        return int(p.argmax())
    return bool(p[1] >= 0.5)


#: Results are rounded to 4 decimals, so two runtimes whose unrounded values differ by ~1e-6 can
#: straddle a rounding boundary and print numbers one unit (1e-4) apart. Such a pair is reported
#: as a rounding flip, not a JSON difference; everything else (keys, order, types, labels, any
#: larger difference) must be identical.
ROUNDING_UNIT = 1e-4


def _strip_model(results: Any) -> Any:
    def one(r):
        return {k: v for k, v in r.items() if k != "model"} if isinstance(r, dict) else r

    return [one(r) for r in results] if isinstance(results, list) else one(results)


def compare_json(ref: Any, ours: Any, path: str = "") -> tuple:
    """(differences, rounding flips) between two result payloads, key order included."""
    if isinstance(ref, dict) and isinstance(ours, dict):
        if list(ref) != [k for k in ours]:
            return [f"{path}: keys {list(ref)} vs {list(ours)}"], 0
        diffs, flips = [], 0
        for k in ref:
            d, f = compare_json(ref[k], ours[k], f"{path}.{k}")
            diffs += d
            flips += f
        return diffs, flips
    if isinstance(ref, list) and isinstance(ours, list):
        if len(ref) != len(ours):
            return [f"{path}: {len(ref)} items vs {len(ours)}"], 0
        diffs, flips = [], 0
        for i, (a, b) in enumerate(zip(ref, ours, strict=False)):
            d, f = compare_json(a, b, f"{path}[{i}]")
            diffs += d
            flips += f
        return diffs, flips
    if type(ref) is not type(ours):
        return [f"{path}: {ref!r} vs {ours!r} (types differ)"], 0
    if ref == ours:
        return [], 0
    if isinstance(ref, float) and abs(ref - ours) <= ROUNDING_UNIT * 1.0001:
        return [], 1
    return [f"{path}: {ref!r} vs {ours!r}"], 0


def _call(agent, req: dict[str, Any]):
    kw = {k: req[k] for k in _CONTROLS if k in req}
    if "states" in req:
        return agent.predict_batch(
            req["states"],
            req["questions"],
            batch_size=req.get("batch_size"),
            sort_by_length=req.get("sort_by_length", False),
            **kw,
        )
    return agent.predict(req["state"], req["questions"], **kw)


def _compare_case(req, ref, ours, calib: Calibration, ref_cap: _Capture, our_cap: _Capture) -> CaseResult:
    case = CaseResult(name=req["name"])
    outcome = {}
    for side, agent in (("ref", ref), ("ours", ours)):
        try:
            outcome[side] = ("ok", _call(agent, req))
        except (ValueError, TypeError) as exc:
            outcome[side] = ("error", f"{reference_kind(exc)}: {exc}")
    if outcome["ref"][0] == "error" or outcome["ours"][0] == "error":
        case.errors_equal = outcome["ref"] == outcome["ours"]
        if not case.errors_equal:
            case.details.append(f"reference {outcome['ref'][1]!r} vs ours {outcome['ours'][1]!r}"[:600])
        if req.get("expect_error") and outcome["ref"][0] != "error":
            case.errors_equal = False
            case.details.append("the suite expects the reference to refuse this request")
        return case
    ref_out, our_out = outcome["ref"][1], outcome["ours"][1]
    ref_json, our_json = _strip_model(ref_out), _strip_model(our_out)
    case.json_strict_equal = json.dumps(ref_json, ensure_ascii=False, default=repr) == json.dumps(
        our_json, ensure_ascii=False, default=repr
    )
    diffs, case.rounding_flips = compare_json(ref_json, our_json)
    case.json_equal = not diffs
    if diffs:
        case.details.append("result JSON differs: " + "; ".join(diffs[:5]))
    questions = req["questions"]
    if not questions:
        return case
    qs = normalize_questions(questions)
    max_len = req.get("max_len", ours.max_len)
    head_max_len = req.get("head_max_len", ours.head_max_len)
    heads = build_heads(ours.tok, qs, head_max_len)
    internal = {qid: ref._to_internal(questions[qid]) for qid in questions}
    for state in req.get("states", [req.get("state")]):
        our_rows = encode_state(ours.tok, state, qs, max_len, head_max_len, heads)
        ref_rows = ref._encode_state(state, list(questions), internal, max_len, head_max_len)
        for row, ref_row in zip(our_rows, ref_rows, strict=False):
            case.rows += 1
            if row.ids != list(ref_row["ids"]) or row.markers != list(ref_row["markers"]):
                case.tokens_equal = False
                case.details.append(f"question {row.qid!r}: token ids or markers differ")
                continue
            mine, theirs = our_cap.get(row.ids), ref_cap.get(row.ids)
            if mine is None or theirs is None:
                case.tokens_equal = False
                case.details.append(f"question {row.qid!r}: row not seen in a forward pass")
                continue
            q, k = qs[row.qid], len(row.markers)
            t = calib.temperature_for(q.qtype, k, req.get("lang"))
            p_ours = unpermute(softmax_f32(mine[0], t), q.option_order)
            p_ref = unpermute(softmax_f32(theirs[0], t), q.option_order)
            case.max_abs_dp = max(case.max_abs_dp, float(np.abs(p_ours - p_ref).max()))
            case.max_abs_dact = max(case.max_abs_dact, float(np.abs(mine[1][0] - theirs[1][0])))
            if _decision(q, p_ours) != _decision(q, p_ref):
                case.decisions_equal = False
                case.details.append(f"question {row.qid!r}: decision differs")
    return case


def load_runtimes(checkpoint: str | Path, bundle: str | Path, **ours_kwargs):
    """(laya.Agent on CPU, ONNXAgent) for one checkpoint and its bundle, offline.

    Both warn about clamped temperatures at load; the comparison tools silence that here.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import warnings

    from laya.agent import Agent  # the reference; needs torch (dev extra)

    from laya_onnx.agent import ONNXAgent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return Agent(str(checkpoint), device="cpu"), ONNXAgent(bundle, **ours_kwargs)


def run_parity(
    checkpoint: str | Path,
    bundle: str | Path,
    suite: str | Path = "core",
    tolerance: float = 1e-5,
    providers=None,
    report_path: str | Path | None = None,
    progress=None,
) -> ParityReport:
    """Run `suite` through both runtimes; write the JSON report to `report_path` if given."""
    started = time.perf_counter()
    ref, ours = load_runtimes(checkpoint, bundle, providers=providers)
    ref_cap, our_cap = _Capture(), _Capture()
    _instrument_reference(ref, ref_cap)
    _instrument_ours(ours, our_cap)
    report = ParityReport(
        checkpoint=str(checkpoint), bundle=str(bundle), suite=str(suite), tolerance=tolerance
    )
    for req in load_suite(suite, ours.tok.mask_token):
        case = _compare_case(req, ref, ours, ours.calibration, ref_cap, our_cap)
        report.cases.append(case)
        if progress:
            progress(case)
    report.seconds = time.perf_counter() - started
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(
            json.dumps(report.as_dict(), indent=1, ensure_ascii=False, default=repr) + "\n", encoding="utf-8"
        )
    return report
