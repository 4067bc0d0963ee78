"""Reading back what `laya_onnx.parity` records: golden files, observations as JSON carries them,
and a parity report's failed cases as one line each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from laya_onnx.core.bundle import read_json_object
from laya_onnx.core.judge import Observation
from laya_onnx.parity.golden import GOLDEN_FORMAT


def read_golden(path: str | Path) -> dict[str, Any]:
    golden = read_json_object(Path(path), "golden answers")
    if golden.get("format") != GOLDEN_FORMAT:
        raise ValueError(f"{path}: golden format {golden.get('format')!r}, expected {GOLDEN_FORMAT}")
    return golden


def observation_from_json(data: dict[str, Any]) -> Observation:
    """The inverse of `Observation.as_json` (a golden file's request holds one)."""
    return Observation(
        printed=data.get("printed"),
        refusal=data.get("refusal"),
        rows=data.get("rows") or [],
        unrounded=data.get("unrounded") or [],
    )


def failures(report: Any) -> str:
    """A `ParityReport`'s failed cases, one line each: the assertion message of a parity test."""
    return "\n".join(f"{c.name}: {'; '.join(c.details)}" for c in report.cases if not c.passed)
