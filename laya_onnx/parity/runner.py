"""Run one suite through the reference `laya.Agent` (torch) and our `ONNXAgent`, and judge.

Each request is observed on both runtimes (`observe.py`: the printed result or refusal, the rows'
token ids and markers, and the answers decoded unrounded from each side's own logits) and the two
observations are judged by the parity rule (`rule.py`). The report records, per request, what the
rule found, the rounding flips (information only), max |Δp| and |Δact| before rounding, and the
tool versions it was made with.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from laya_onnx.core.errors import SourceNotFound
from laya_onnx.core.judge import CATEGORIES, DEFAULT_ACT_TOLERANCE, DEFAULT_TOLERANCE, Verdict, judge
from laya_onnx.parity.observe import Observation, RowCapture, instrument_agent, observe, observe_agent
from laya_onnx.parity.suite import load_suite, suite_text
from laya_onnx.parity.versions import tool_versions


@dataclass
class CaseResult:
    name: str
    passed: bool
    rows: int = 0
    failed: list[str] = field(default_factory=list)  # rule categories that failed
    rounding_flips: int = 0
    identical_text: bool = True
    max_abs_dp: float = 0.0
    max_abs_dact: float = 0.0
    max_abs_delta: float = 0.0
    abs_dps: list[float] = field(default_factory=list)  # every probability's |Δp| (3 digits)
    details: list[str] = field(default_factory=list)  # the differences, then the flips
    flips: list[str] = field(default_factory=list)

    @classmethod
    def from_verdict(cls, name: str, verdict: Verdict) -> CaseResult:
        return cls(
            name=name,
            passed=verdict.passed,
            rows=verdict.rows,
            failed=[c for c in CATEGORIES if verdict.failed(c)],
            rounding_flips=len(verdict.flips),
            identical_text=verdict.identical_text,
            max_abs_dp=verdict.max_abs_dp,
            max_abs_dact=verdict.max_abs_dact,
            max_abs_delta=verdict.max_abs_delta,
            abs_dps=[float("%.3g" % d) for d in verdict.dps],
            details=verdict.describe(limit=20),
            flips=verdict.flips,
        )


@dataclass
class ParityReport:
    checkpoint: str
    bundle: str
    suite: str
    tolerance: float
    act_tolerance: float = DEFAULT_ACT_TOLERANCE
    cases: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0
    tools: dict[str, str | None] = field(default_factory=tool_versions)

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    def summary(self) -> dict[str, Any]:
        def clean(category: str) -> bool:
            return all(category not in c.failed for c in self.cases)

        return {
            "suite": self.suite,
            "requests": len(self.cases),
            "rows": sum(c.rows for c in self.cases),
            "tokens_identical": clean("tokens"),
            "decisions_identical": clean("decision"),
            "refusals_identical": clean("refusal"),
            "within_tolerance": clean("tolerance"),
            "json_equal": clean("json"),
            "json_identical_text": all(c.identical_text for c in self.cases),
            "rounding_flips": sum(c.rounding_flips for c in self.cases),
            "max_abs_dp": max((c.max_abs_dp for c in self.cases), default=0.0),
            "max_abs_dact": max((c.max_abs_dact for c in self.cases), default=0.0),
            "max_abs_delta": max((c.max_abs_delta for c in self.cases), default=0.0),
            "tolerance": self.tolerance,
            "act_tolerance": self.act_tolerance,
            "passed": self.passed,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "bundle": self.bundle,
            "seconds": round(self.seconds, 2),
            "rule": "laya_onnx/core/judge.py (README 'Proof')",
            "tools": self.tools,
            "summary": self.summary(),
            "cases": [asdict(c) for c in self.cases],
        }


def instrument_reference(ref) -> RowCapture:
    """Capture every forward pass of a `laya.Agent` (its `_forward`: numpy logits, act softmax)."""
    capture = RowCapture()
    forward = ref._forward

    def captured_forward(b):
        logits, act = forward(b)
        capture.add(
            b["input_ids"].cpu().numpy(),
            b["attention_mask"].cpu().numpy(),
            b["marker_mask"].cpu().numpy(),
            logits,
            act,
        )
        return logits, act

    ref._forward = captured_forward
    return capture


def reference_rows(ref, questions: dict[Any, Any]):
    """The reference's own rows for `questions` (its `_encode_state`), as (qid, ids, markers)."""
    internal = {qid: ref._to_internal(questions[qid]) for qid in questions}

    def encode(state, max_len, head_max_len):
        items = ref._encode_state(state, list(questions), internal, max_len, head_max_len)
        return [
            (qid, [int(t) for t in item["ids"]], [int(m) for m in item["markers"]])
            for qid, item in zip(questions, items, strict=True)
        ]

    return encode


def load_reference(checkpoint: str | Path):
    """`laya.Agent` on CPU for a local checkpoint, offline; its load-time clamp warnings silenced."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import warnings

    from laya.agent import Agent  # the reference; needs torch (dev extra)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            return Agent(str(checkpoint), device="cpu")
        except FileNotFoundError as exc:  # the reference's word for a path that holds no checkpoint
            raise SourceNotFound(str(exc)) from exc


def load_runtimes(checkpoint: str | Path, bundle: str | Path, **ours_kwargs):
    """(laya.Agent on CPU, ONNXAgent) for one checkpoint and its bundle, offline.

    Both warn about clamped temperatures at load; the comparison tools silence that here.
    """
    import warnings

    from laya_onnx.core.agent import ONNXAgent

    ref = load_reference(checkpoint)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return ref, ONNXAgent(bundle, **ours_kwargs)


class Observer:
    """The reference and our agent on one checkpoint, instrumented: `observe(req)` runs a request
    on both and returns (reference, ours) observations for the rule."""

    def __init__(self, ref, ours):
        self.ref, self.ours = ref, ours
        self.ref_capture, self.our_capture = instrument_reference(ref), instrument_agent(ours)

    def observe(self, req: dict[str, Any]) -> tuple[Observation, Observation]:
        # both sides decode with the bundle's calibration: the bundle carries the checkpoint's config
        ref = self.ref
        theirs = observe(ref, req, self.ref_capture, lambda q: reference_rows(ref, q), self.ours.calibration)
        return theirs, observe_agent(self.ours, req, self.our_capture)


def write_json(path: str | Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False, default=repr) + "\n", encoding="utf-8")


def run_parity(
    checkpoint: str | Path,
    bundle: str | Path,
    suite: str | Path = "core",
    tolerance: float = DEFAULT_TOLERANCE,
    act_tolerance: float = DEFAULT_ACT_TOLERANCE,
    providers=None,
    report_path: str | Path | None = None,
    progress=None,
) -> ParityReport:
    """Run `suite` through both runtimes, judge each request; write the JSON report if asked."""
    started = time.perf_counter()
    suite_text(suite)  # an unknown suite is refused before either runtime loads
    observer = Observer(*load_runtimes(checkpoint, bundle, providers=providers))
    report = ParityReport(
        checkpoint=str(checkpoint),
        bundle=str(bundle),
        suite=str(suite),
        tolerance=tolerance,
        act_tolerance=act_tolerance,
    )
    for req in load_suite(suite, observer.ours.tok.mask_token):
        ref_obs, our_obs = observer.observe(req)
        verdict = judge(
            ref_obs, our_obs, tolerance, act_tolerance, expect_refusal=bool(req.get("expect_error"))
        )
        case = CaseResult.from_verdict(req["name"], verdict)
        report.cases.append(case)
        if progress:
            progress(case)
    report.seconds = time.perf_counter() - started
    if report_path:
        write_json(report_path, report.as_dict())
    return report
