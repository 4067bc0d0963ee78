"""The parity rule: when an answer from laya-onnx counts as the reference's answer.

This is the only place the rule lives. `laya-onnx parity`, the export validation, the golden
answer tests and the parity tests all call `judge`. It compares plain JSON values, so it needs no
torch and no reference: a torch-free box judges its answers against recorded golden answers
(`parity/golden/`) with the very same code.

Each side of a comparison is an `Observation` of one request: what the caller got (`printed`, or
a `refusal`), the token ids and markers of every (state, question) row, and the same answers
decoded *unrounded* from the same logits (`laya_onnx.core.calibration.decode_answer(digits=None)`).
Two observations agree when all of these hold:

1. **Refusals**: both refused with the same builtin kind (`ValueError`, `TypeError`, ...; see
   `laya_onnx.core.errors.reference_kind`) and the same text, or neither refused.
2. **Rows**: every row's token ids and marker positions are identical.
3. **Unrounded values**: every unrounded number is within `tolerance` (1e-5) of the other
   side's, and rounds (4 decimals) to its own printed value. Two values get the bound their own
   scale implies: a score (sum of level x probability over k levels) `tolerance * floor(k*k/4)`,
   the most it can move when each probability moves by `tolerance`; the act probability
   `act_tolerance` (5e-5, below).
4. **Decisions**: choice label, most likely score level and noul side are identical.
5. **Printed JSON**: every value identical, keys and key order included (`model` aside), with one
   exception: a printed float may differ by ONE unit in its last printed digit (1e-4) where the
   two unrounded values straddle that rounding boundary - each rounds to its own printed value,
   the two are within `tolerance`, and the boundary (the midpoint of the two printed values) lies
   between them. Such a *rounding flip* is counted for information; there is no budget of flips
   and no other difference is forgiven.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from laya_onnx.core.calibration import ANSWER_DIGITS

#: Max |difference| between two unrounded values: option probabilities and the numbers computed
#: from them (noul, confidence, answer_confidence; a score on its own scale, `_Walk.tolerance_for`).
#: The contract: within 1e-5 in fp32.
DEFAULT_TOLERANCE = 1e-5
#: The same for `action.act_probability`, a softmax of the act head's own logits (no temperature).
#: The export validates those logits to 1e-4 of torch, and a softmax output moves at most half the
#: largest logit change, so 5e-5 is what a validated graph can promise; 1e-5 would be tighter than
#: that head's fp32 noise (docs/parity.md).
DEFAULT_ACT_TOLERANCE = 5e-5
#: One unit in the last printed digit.
ROUNDING_UNIT = 10.0**-ANSWER_DIGITS
#: Difference categories, in the order a report lists them.
CATEGORIES = ("refusal", "tokens", "tolerance", "decision", "json")


@dataclass
class Observation:
    """One runtime's answer to one request, as the rule needs it (all plain JSON values).

    printed:   the result as returned (a dict for predict, a list for predict_batch), or None
    refusal:   {"kind", "text"} when the call was refused, else None
    rows:      per state, per question: {"qid", "ids", "markers"}
    unrounded: per state, {"answers": {qid: answer decoded with digits=None, or None if unseen}}
    """

    printed: Any = None
    refusal: dict[str, str] | None = None
    rows: list[list[dict[str, Any]]] = field(default_factory=list)
    unrounded: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The observation as JSON would carry it (dict keys become strings, tuples lists)."""
        return json.loads(
            json.dumps(
                {
                    "printed": self.printed,
                    "refusal": self.refusal,
                    "rows": self.rows,
                    "unrounded": self.unrounded,
                },
                ensure_ascii=False,
            )
        )


@dataclass
class Verdict:
    """What the rule found: `differences` fail it; `flips` are information."""

    differences: list[tuple[str, str]] = field(default_factory=list)  # (category, text)
    flips: list[str] = field(default_factory=list)
    rows: int = 0
    max_abs_dp: float = 0.0  # option probabilities, before rounding
    max_abs_dact: float = 0.0  # act probabilities, before rounding
    max_abs_delta: float = 0.0  # any unrounded value
    identical_text: bool = True  # printed JSON identical as text (no flips either)
    dps: list[float] = field(default_factory=list)  # every option probability's |Δ|, before rounding

    @property
    def passed(self) -> bool:
        return not self.differences

    def track(self, delta: float, key: str, parent: str) -> None:
        self.max_abs_delta = max(self.max_abs_delta, delta)
        if parent == "probabilities" or key == "noul":
            self.max_abs_dp = max(self.max_abs_dp, delta)
            self.dps.append(delta)
        elif key == "act_probability":
            self.max_abs_dact = max(self.max_abs_dact, delta)

    def failed(self, category: str) -> bool:
        return any(c == category for c, _ in self.differences)

    def fail(self, category: str, text: str) -> None:
        assert category in CATEGORIES, category
        self.differences.append((category, text))

    def describe(self, limit: int = 5) -> list[str]:
        shown = [f"{c}: {t}" for c, t in self.differences[:limit]]
        if len(self.differences) > limit:
            shown.append(f"... {len(self.differences) - limit} more")
        return shown


def _strip_model(result: Any) -> Any:
    return {k: v for k, v in result.items() if k != "model"} if isinstance(result, dict) else result


def _per_state(printed: Any) -> list[Any]:
    return printed if isinstance(printed, list) else [printed]


def _get(values: Any, key: Any) -> Any:
    return values.get(key) if isinstance(values, dict) else None


def _item(values: Any, i: int) -> Any:
    return values[i] if isinstance(values, list) and i < len(values) else None


def _is_float(v: Any) -> bool:
    return isinstance(v, float)


def _is_rounding_flip(ref: float, ours: float, u_ref: float, u_ours: float) -> bool:
    """Printed values one unit apart, with the rounding boundary between the unrounded values."""
    if not math.isclose(abs(ref - ours), ROUNDING_UNIT, rel_tol=1e-6):
        return False
    boundary = (ref + ours) / 2.0
    return min(u_ref, u_ours) <= boundary <= max(u_ref, u_ours)


@dataclass
class _Walk:
    """Rules 3 and 5 over one printed result and its unrounded twin, leaf by leaf."""

    verdict: Verdict
    tolerance: float
    act_tolerance: float
    levels: int = 0  # of the score answer being walked

    def tolerance_for(self, key: str) -> float:
        if key == "act_probability":
            return self.act_tolerance
        if key == "score":
            # the most sum(i * p_i) can move when every p_i moves by `tolerance` (and they still
            # sum to 1): +tolerance on the upper half of the levels, -tolerance on the lower half
            return self.tolerance * max(1, self.levels**2 // 4)
        return self.tolerance

    def value(
        self, path: str, ref: Any, ours: Any, u_ref: Any, u_ours: Any, key: str = "", parent: str = ""
    ) -> None:
        """`u_ref`/`u_ours` are the unrounded twins of `ref`/`ours` (None where there are none)."""
        if isinstance(ref, dict) and isinstance(ours, dict):
            if list(ref) != list(ours):
                self.verdict.fail("json", f"{path}: keys {list(ref)} vs {list(ours)}")
                return
            if ref.get("type") == "score":
                self.levels = len(ref.get("probabilities") or {})
            for k in ref:
                self.value(f"{path}.{k}", ref[k], ours[k], _get(u_ref, k), _get(u_ours, k), str(k), key)
            return
        if isinstance(ref, list) and isinstance(ours, list):
            if len(ref) != len(ours):
                self.verdict.fail("json", f"{path}: {len(ref)} items vs {len(ours)}")
                return
            for i, (a, b) in enumerate(zip(ref, ours, strict=True)):
                self.value(f"{path}[{i}]", a, b, _item(u_ref, i), _item(u_ours, i))
            return
        if type(ref) is not type(ours):
            self.verdict.fail("json", f"{path}: {ref!r} vs {ours!r} (types differ)")
            return
        if _is_float(ref) and (u_ref is not None or u_ours is not None):
            self.printed_float(path, ref, ours, u_ref, u_ours, key, parent)
        elif ref != ours:
            why = "no unrounded values to prove a rounding flip" if _is_float(ref) else "not a float"
            self.verdict.fail("json", f"{path}: {ref!r} vs {ours!r} ({why})")

    def printed_float(
        self, path: str, ref: float, ours: float, u_ref: Any, u_ours: Any, key: str, parent: str
    ):
        if not (_is_float(u_ref) and _is_float(u_ours)):
            self.verdict.fail("json", f"{path}: unrounded values {u_ref!r} / {u_ours!r} are not both floats")
            return
        usable = True
        for side, u, printed in (("reference", u_ref, ref), ("ours", u_ours, ours)):
            # u == printed: a value the decoder does not round (a float choice label) or one that
            # needed no rounding; anything else must round to what was printed
            if not (math.isfinite(u) and (u == printed or round(u, ANSWER_DIGITS) == printed)):
                self.verdict.fail("json", f"{path}: {side} unrounded {u!r} does not print as {printed!r}")
                usable = False
        delta = abs(u_ref - u_ours)
        tolerance = self.tolerance_for(key)
        if not delta <= tolerance:  # NaN fails too
            self.verdict.fail("tolerance", f"{path}: |{u_ref!r} - {u_ours!r}| = {delta:.3g} > {tolerance:g}")
            usable = False
        self.verdict.track(delta, key, parent)
        if ref == ours:
            return
        if usable and _is_rounding_flip(ref, ours, u_ref, u_ours):
            self.verdict.flips.append(f"{path}: {ref!r} vs {ours!r} (unrounded {u_ref!r} / {u_ours!r})")
            return
        self.verdict.fail(
            "json",
            f"{path}: {ref!r} vs {ours!r} is not a one-unit rounding flip of unrounded {u_ref!r} / {u_ours!r}",
        )


def decision(answer: dict[str, Any]) -> Any:
    """The decision an unrounded answer makes: choice label, most likely score level, noul side."""
    if answer.get("type") == "choice":
        return answer.get("choice")
    if answer.get("type") == "score":
        probs = list(answer.get("probabilities", {}).values())
        return probs.index(max(probs)) if probs else None
    return answer.get("noul", 0.0) >= 0.5


def decision_margin(answer: dict[str, Any]) -> float:
    """How far an unrounded answer is from flipping its `decision`: half the gap between its two
    most likely options (choice) or levels (score), |noul - 0.5| (noul). Moving every probability
    by less than this cannot flip it."""
    if answer.get("type") == "noul":
        return abs(answer.get("noul", 0.0) - 0.5)
    probs = sorted(answer.get("probabilities", {}).values())
    return (probs[-1] - probs[-2]) / 2 if len(probs) > 1 else math.inf


def _judge_rows(verdict: Verdict, ref: Observation, ours: Observation) -> None:
    if len(ref.rows) != len(ours.rows):
        verdict.fail("tokens", f"{len(ref.rows)} states encoded vs {len(ours.rows)}")
        return
    for s, (ref_rows, our_rows) in enumerate(zip(ref.rows, ours.rows, strict=True)):
        if [r["qid"] for r in ref_rows] != [r["qid"] for r in our_rows]:
            verdict.fail(
                "tokens",
                f"state {s}: rows for questions {[r['qid'] for r in ref_rows]} vs "
                f"{[r['qid'] for r in our_rows]}",
            )
            continue
        for a, b in zip(ref_rows, our_rows, strict=True):
            verdict.rows += 1
            if list(a["ids"]) != list(b["ids"]):
                verdict.fail("tokens", f"state {s}, question {a['qid']!r}: token ids differ")
            if list(a["markers"]) != list(b["markers"]):
                verdict.fail(
                    "tokens", f"state {s}, question {a['qid']!r}: markers {a['markers']} vs {b['markers']}"
                )


def _judge_decisions(verdict: Verdict, ref: Observation, ours: Observation) -> None:
    for s, (a, b) in enumerate(zip(ref.unrounded, ours.unrounded, strict=False)):
        ref_answers, our_answers = a.get("answers") or {}, b.get("answers") or {}
        for qid, ref_answer in ref_answers.items():
            our_answer = our_answers.get(qid)
            if ref_answer is None or our_answer is None:
                side = "the reference's" if ref_answer is None else "our"
                verdict.fail(
                    "tokens", f"state {s}, question {qid!r}: {side} row was not seen in a forward pass"
                )
            elif decision(ref_answer) != decision(our_answer):
                verdict.fail(
                    "decision",
                    f"state {s}, question {qid!r}: {decision(ref_answer)!r} vs {decision(our_answer)!r}",
                )


def _check_tolerance(name: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def judge(
    ref: Observation,
    ours: Observation,
    tolerance: float = DEFAULT_TOLERANCE,
    act_tolerance: float = DEFAULT_ACT_TOLERANCE,
    expect_refusal: bool = False,
) -> Verdict:
    """Apply the parity rule (module docstring) to two observations of the same request.

    `expect_refusal`: the suite says the reference must refuse this request.
    """
    walk = _Walk(
        Verdict(), _check_tolerance("tolerance", tolerance), _check_tolerance("act_tolerance", act_tolerance)
    )
    verdict = walk.verdict
    if expect_refusal and ref.refusal is None:
        verdict.fail("refusal", "the suite expects the reference to refuse this request; it answered")
    if ref.refusal is not None or ours.refusal is not None:
        if ref.refusal != ours.refusal:
            verdict.fail("refusal", f"reference {ref.refusal!r} vs ours {ours.refusal!r}"[:600])
        return verdict
    _judge_rows(verdict, ref, ours)
    ref_states, our_states = _per_state(ref.printed), _per_state(ours.printed)
    if len(ref_states) != len(our_states):
        verdict.fail("json", f"{len(ref_states)} results vs {len(our_states)}")
        return verdict
    for side, obs in (("reference", ref), ("ours", ours)):
        if len(obs.unrounded) != len(ref_states):
            verdict.fail(
                "json", f"{side}: unrounded answers for {len(obs.unrounded)} of {len(ref_states)} states"
            )
            return verdict
    for s, (a, b) in enumerate(zip(ref_states, our_states, strict=True)):
        walk.value(f"[{s}]", _strip_model(a), _strip_model(b), ref.unrounded[s], ours.unrounded[s])
    _judge_decisions(verdict, ref, ours)
    verdict.identical_text = json.dumps(
        [_strip_model(r) for r in ref_states], ensure_ascii=False, default=repr
    ) == json.dumps([_strip_model(r) for r in our_states], ensure_ascii=False, default=repr)
    return verdict


__all__ = [
    "DEFAULT_ACT_TOLERANCE",
    "DEFAULT_TOLERANCE",
    "ROUNDING_UNIT",
    "Observation",
    "Verdict",
    "decision",
    "decision_margin",
    "judge",
]
