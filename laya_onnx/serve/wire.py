"""The response shaping of an answer: `x_jev_confidence`, the strict Jev projection, JSON
rendering. Which checkpoint answered, and its `routing` block, are `served.py`'s.
"""

from __future__ import annotations

import json
import math
from typing import Any

# -- response shaping ----------------------------------------------------------------------


def jev_confidence(answer: dict[str, Any]) -> float | None:
    """TypeSafe Jev's `confidence` for this answer's probabilities, or None if unusable.

    choice: (max p - 1/n) / (1 - 1/n); score: max(0, 1 - Σ p_i |i - mode| / D), D the same
    spread for a uniform distribution. 1.0 for a single option; a zero total reads as uniform.
    A boolean, non-numeric, negative or non-finite probability gives None, never a guess.
    """
    kind, probs = answer.get("type"), answer.get("probabilities")
    if kind not in ("choice", "score") or not isinstance(probs, dict) or not probs:
        return None
    if any(isinstance(v, bool) for v in probs.values()):
        return None
    try:
        keys = sorted(probs, key=int) if kind == "score" else list(probs)
        p = [float(probs[k]) for k in keys]
    except (TypeError, ValueError, OverflowError):
        return None
    if not all(math.isfinite(v) and v >= 0.0 for v in p):
        return None
    n = len(p)
    if n == 1:
        return 1.0
    total = sum(p)
    p = [v / total for v in p] if total else [1.0 / n] * n
    if kind == "choice":
        return (max(p) - 1.0 / n) / (1.0 - 1.0 / n)
    mode = max(range(n), key=p.__getitem__)
    spread = sum(v * abs(i - mode) for i, v in enumerate(p))
    center = (n - 1) / 2
    uniform = sum(abs(i - center) for i in range(n)) / n
    return max(0.0, 1.0 - spread / uniform)


def with_jev_confidence(result: dict[str, Any]) -> dict[str, Any]:
    """A copy of `result` whose choice/score answers carry `x_jev_confidence` (answers not mutated)."""
    answers = result.get("answers")
    if not isinstance(answers, dict):
        return result
    out = {}
    for qid, answer in answers.items():
        conf = jev_confidence(answer) if isinstance(answer, dict) else None
        out[qid] = answer if conf is None else {**answer, "x_jev_confidence": round(conf, 4)}
    return {**result, "answers": out}


#: The keys `LAYA_JEV_STRICT` keeps of each answer type, in laya-serve's order (the Jev contract's
#: keys, `schema.JevChoiceAnswer`...; laya-serve lists a score's probabilities before its legend).
STRICT_KEYS = {
    "choice": ("type", "choice", "confidence", "probabilities"),
    "score": ("type", "score", "confidence", "probabilities", "legend"),
    "noul": ("type", "noul"),
}


def strict_projection(result: dict[str, Any]) -> dict[str, Any]:
    """`LAYA_JEV_STRICT`: exactly the Jev contract's keys; nothing is recomputed.

    A typed answer missing one of its keys raises KeyError, which the handler reports as the
    500 it is (the agent broke the contract), as laya-serve does.
    """
    answers = {}
    for qid, a in (result.get("answers") or {}).items():
        keys = STRICT_KEYS.get(str(a.get("type"))) if isinstance(a, dict) else None
        answers[qid] = a if keys is None else {k: a[k] for k in keys}
    usage = result.get("usage") or {}
    return {
        "model": result["model"],
        "answers": answers,
        "usage": {
            "input_tokens": usage.get("input_tokens", 0),
            "output_tokens": usage.get("output_tokens", 0),
        },
    }


def shape(result: dict[str, Any], strict: bool) -> dict[str, Any]:
    return strict_projection(result) if strict else with_jev_confidence(result)


class NonFiniteNumber(ValueError):
    """A payload holds a NaN or an infinity, which JSON cannot carry."""


def render(payload: Any) -> bytes:
    """Compact UTF-8 JSON; NonFiniteNumber for a NaN or an infinity (JSON has no such numbers).

    json reports a non-finite float with a ValueError it also uses for other failures (a
    circular reference), so the payload is searched before the refusal is called non-finite.
    """
    try:
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        if has_non_finite(payload):
            raise NonFiniteNumber(str(exc)) from None
        raise
    return text.encode("utf-8")


def has_non_finite(value: Any) -> bool:
    """Whether a float anywhere in `value` (dict keys included) is a NaN or an infinity.

    Iterative, and each container is visited once, so deep or self-referencing payloads end.
    """
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, (dict, list, tuple)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            else:
                stack.extend(item)
    return False
