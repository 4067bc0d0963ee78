"""Reading back what `laya_onnx.parity` records: golden files, observations as JSON carries them,
and a parity report's failed cases as one line each; and a seeded part of a parity suite, for the
presets that do not need the whole of it."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from laya_onnx.core.bundle import read_json_object
from laya_onnx.core.judge import Observation
from laya_onnx.parity.golden import GOLDEN_FORMAT
from laya_onnx.parity.suite import suite_text


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


def suite_sample(suite: str, out_dir: Path, fraction: float = 1 / 3, seed: int = 0) -> Path:
    """A seeded part of the shipped parity suite `suite`, written to `out_dir` as a suite file.

    Requests are grouped by the first word of their name (choice-*, error-*, refuse-*, hook-*...);
    each group keeps `fraction` of its requests, rounded up, so every kind of request stays in.
    The reference comparisons run the whole suite on one preset and such a part on the others:
    the presets differ in their weights, vocabulary and heads, not in the code paths a request
    takes.
    """
    data = json.loads(suite_text(suite))
    groups: dict[str, list[str]] = {}
    for request in data["requests"]:
        groups.setdefault(request["name"].split("-")[0], []).append(request["name"])
    rng = random.Random(seed)
    kept = {name for names in groups.values() for name in rng.sample(names, math.ceil(len(names) * fraction))}
    data["requests"] = [r for r in data["requests"] if r["name"] in kept]
    path = out_dir / f"{suite}-sample-{seed}.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path
