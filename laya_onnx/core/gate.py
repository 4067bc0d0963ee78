"""The opt-in confidence gate (`min_confidence`), laya 0.4.15's semantics.

The rules are in docs/semantics.md#the-confidence-gate. With a threshold set, every answer gets
`abstention` (passed / abstained / unevaluated) and `abstention_threshold`, and
`low_confidence: True` when it abstained; without one nothing is written, so an ungated payload is
byte-identical to one from before the gate existed.
"""

from __future__ import annotations

import math
from typing import Any

from laya_onnx.core.calibration import SIZE_CLASSES, temp_bucket
from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.questions import QTYPES

DEFAULT_KEY = "default"
PASSED, ABSTAINED, UNEVALUATED = "passed", "abstained", "unevaluated"

Threshold = float | dict[str, float]


def bucket_keys() -> set:
    return {"%s:%s" % (t, s) for t in QTYPES for s in SIZE_CLASSES}


def _threshold(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0.0 or v > 1.0:
        raise InvalidRequest("min_confidence must be a float in [0.0, 1.0], got %r" % (v,))
    return float(v)


def check_min_confidence(v: Any) -> Threshold:
    """Validate a scalar threshold or a per-bucket map; returns the validated form."""
    if not isinstance(v, dict):
        return _threshold(v)
    if not v:
        raise InvalidRequest(
            "a min_confidence map must be a non-empty dict of bucket -> float, got %r" % (v,)
        )
    allowed = bucket_keys() | {DEFAULT_KEY}
    out = {}
    for key, val in v.items():
        if not isinstance(key, str) or key not in allowed:
            raise InvalidRequest(
                "min_confidence map keys must be a bucket like 'choice:3-5' or 'default', got %r" % (key,)
            )
        out[key] = _threshold(val)
    return out


def finite_number(v: Any) -> float | None:
    """`v` as a float when it is a finite non-bool number, else None."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def gate_number(answer: dict[str, Any]) -> float | None:
    """answer_confidence if usable, else confidence if usable, else None."""
    conf = finite_number(answer.get("answer_confidence"))
    return conf if conf is not None else finite_number(answer.get("confidence"))


def answer_bucket(answer: dict[str, Any]) -> str | None:
    kind = answer.get("type")
    if not isinstance(kind, str) or kind not in QTYPES:
        return None
    probs = answer.get("probabilities")
    if isinstance(probs, dict) and probs:
        k = len(probs)
    elif kind == "noul":
        k = 2
    else:
        return None
    return temp_bucket(QTYPES[kind], k)


def threshold_for(answer: dict[str, Any], mc: Threshold) -> float:
    if not isinstance(mc, dict):
        return mc
    key = answer_bucket(answer)
    if key is not None and key in mc:
        return mc[key]
    return mc.get(DEFAULT_KEY, 0.0)


def _answers(results: list[Any]):
    for res in results:
        answers = res.get("answers") if isinstance(res, dict) else None
        if isinstance(answers, dict):
            yield from (a for a in answers.values() if isinstance(a, dict))


def apply_confidence_gate(results: list[Any], mc: Threshold | None) -> None:
    """Mark every answer of `results` in place; does nothing when `mc` is None."""
    if mc is None:
        return
    for a in _answers(results):
        conf, thr = gate_number(a), threshold_for(a, mc)
        if conf is not None and conf < thr:
            a["low_confidence"] = True
        else:
            a.pop("low_confidence", None)
        if a.get("low_confidence"):
            a["abstention"] = ABSTAINED
        elif conf is None:
            a["abstention"] = UNEVALUATED
        else:
            a["abstention"] = PASSED
        a["abstention_threshold"] = float(thr)
