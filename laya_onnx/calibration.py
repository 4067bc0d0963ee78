"""Calibration and decoding: graph logits -> answers, exactly as laya 0.4.15 computes them.

Temperatures are applied per question type and option-count bucket, clamped to
[TEMP_MIN, TEMP_MAX]; the softmax runs in float32 numpy in the reference's order so the
rounded numbers agree to the last digit (core.md §4).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laya_onnx.errors import InvalidRequest
from laya_onnx.questions import QTYPE_NAMES, Question
from laya_onnx.sequences import Row, render_criterion

TEMP_MIN = 0.5
TEMP_MAX = 5.0
MODEL_NAME = "laya-rl-agent-onnx"
#: Answers print every number with Python's round(x, 4), as the reference does (core.md §4.3).
ANSWER_DIGITS = 4


#: The option-count classes of the temperature and gate buckets, smallest first.
SIZE_CLASSES = ("2", "3-5", "6-10", "11+")


def size_class(k: int) -> str:
    return "2" if k <= 2 else "3-5" if k <= 5 else "6-10" if k <= 10 else "11+"


def temp_bucket(qtype: int, k: int) -> str:
    """Bucket name such as 'choice:3-5' for a question type and option count."""
    return "%s:%s" % (QTYPE_NAMES[int(qtype)], size_class(k))


def clamp_temperature(t: Any) -> float:
    """A usable temperature: numbers clamped to [0.5, 5]; bools, non-numbers, NaN and inf -> 1.0."""
    if isinstance(t, bool):
        return 1.0
    try:
        t = float(t)
    except (TypeError, ValueError):
        return 1.0
    if not math.isfinite(t):
        return 1.0
    return min(TEMP_MAX, max(TEMP_MIN, t))


def temperature_rejected(raw: Any, applied: float) -> bool:
    """Whether the clamp replaced `raw` (bools and non-numbers always count as replaced)."""
    if isinstance(raw, bool):
        return True
    try:
        return float(raw) != applied
    except (TypeError, ValueError):
        return True


def clamp_temperatures(
    per_type_raw: Sequence[Any],
    by_options_raw: Mapping[Any, Any],
    *,
    report_per_type: bool = True,
    buckets_first: bool = False,
) -> tuple[list[float], dict[Any, float], str]:
    """Clamp the three per-type temperatures and the bucket map.

    Returns them with what the clamp replaced, as "name=raw -> applied, ..." ("" when nothing
    was). `report_per_type` and `buckets_first` choose which entries that names and in which
    order, as the reference words its checkpoint and language-override warnings.
    """
    per_type = [clamp_temperature(t) for t in per_type_raw]
    by_options = {k: clamp_temperature(v) for k, v in by_options_raw.items()}
    pairs = enumerate(zip(per_type_raw, per_type, strict=True)) if report_per_type else ()
    types = [("temperature[%d]" % i, raw, applied) for i, (raw, applied) in pairs]
    buckets = [(k, v, by_options[k]) for k, v in by_options_raw.items()]
    replaced = ", ".join(
        "%s=%r -> %g" % (name, raw, applied)
        for name, raw, applied in (buckets + types if buckets_first else types + buckets)
        if temperature_rejected(raw, applied)
    )
    return per_type, by_options, replaced


def resolve_lang_temperatures(
    raw: Mapping[Any, Any] | None, base: Sequence[Any]
) -> dict[str, dict[str, Any]]:
    """Parse per-language overrides into {lang: {temperature, temperature_by_options}} (clamped)."""
    out: dict[str, dict[str, Any]] = {}
    for lang, cfg in (raw or {}).items():
        if not isinstance(lang, str):
            raise InvalidRequest("Language override keys must be strings, got %r" % (lang,))
        norm = lang.split("-")[0].lower()
        cfg = {} if cfg is None else cfg
        if not isinstance(cfg, dict):
            raise InvalidRequest(
                "Language override %r must be a mapping, got %s" % (lang, type(cfg).__name__)
            )
        t_raw = cfg.get("temperature")
        inherited = t_raw is None
        if inherited:
            t_raw = base
        if not isinstance(t_raw, (list, tuple)) or len(t_raw) != 3:
            raise InvalidRequest(
                "Language override %r temperature must be a list of 3 floats, got %r" % (lang, t_raw)
            )
        tbo_raw = cfg.get("temperature_by_options") or {}
        if not isinstance(tbo_raw, dict):
            raise InvalidRequest(
                "Language override %r temperature_by_options must be a mapping of "
                "bucket -> float, got %s" % (lang, type(tbo_raw).__name__)
            )
        # An inherited list was already reported by the checkpoint's own warning.
        temps, by_options, replaced = clamp_temperatures(t_raw, tbo_raw, report_per_type=not inherited)
        if replaced:
            warnings.warn(
                "laya: language override %r ships invalid temperatures or values outside "
                "[%g, %g]; using %s. Treat confidence from the affected entries as uncalibrated."
                % (lang, TEMP_MIN, TEMP_MAX, replaced),
                RuntimeWarning,
                stacklevel=3,
            )
        out[norm] = {"temperature": temps, "temperature_by_options": by_options}
    return out


def apply_binning_map(confidence: float, bucket: str, binning_map: Mapping[str, Any]) -> float:
    """The binned `answer_confidence` for its bucket; unchanged for a bucket the map lacks."""
    entry = binning_map.get(bucket)
    if not entry:
        return float(confidence)
    bins = int(entry["bins"])
    return float(entry["values"][min(bins - 1, max(0, int(float(confidence) * bins)))])


@dataclass
class Calibration:
    """The temperatures a checkpoint answers with, and the binning map a calibration file may
    add (`laya_onnx.calibration_file`)."""

    temperature: list[float]
    temperature_by_options: dict[str, float]
    lang_temperatures: dict[str, dict[str, Any]] = field(default_factory=dict)
    binning_map: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], lang_temperatures=None) -> Calibration:
        raw = cfg.get("temperature", [1.0, 1.0, 1.0])
        tbo_raw = cfg.get("temperature_by_options", {}) or {}
        if not isinstance(raw, (list, tuple)) or len(raw) != 3:
            raise ValueError(
                "rl_agent_config.json: temperature must be a list of 3 floats "
                "(choice, score, noul), got %r" % (raw,)
            )
        if not isinstance(tbo_raw, dict):
            raise ValueError(
                "rl_agent_config.json: temperature_by_options must be a mapping of "
                "bucket -> float, got %r" % (tbo_raw,)
            )
        temps, by_options, replaced = clamp_temperatures(raw, tbo_raw, buckets_first=True)
        if replaced:
            warnings.warn(
                "laya-onnx: this checkpoint ships temperatures outside [%g, %g] which would distort "
                "confidence; clamping %s. Treat confidence from the affected buckets as uncalibrated."
                % (TEMP_MIN, TEMP_MAX, replaced),
                RuntimeWarning,
                stacklevel=3,
            )
        return cls(
            temperature=temps,
            temperature_by_options=by_options,
            lang_temperatures=resolve_lang_temperatures(lang_temperatures, raw),
        )

    def lang_override(self, lang: str | None) -> dict[str, Any] | None:
        if not lang:
            return None
        return self.lang_temperatures.get(lang.split("-")[0].lower())

    def temperature_for(self, qtype: int, k: int, lang: str | None = None) -> float:
        bucket = temp_bucket(qtype, k)
        override = self.lang_override(lang)
        if override is not None:  # an override replaces the checkpoint's buckets outright
            return override["temperature_by_options"].get(bucket, override["temperature"][qtype])
        return self.temperature_by_options.get(bucket, self.temperature[qtype])


def softmax_f32(logits_row: np.ndarray, t: float) -> np.ndarray:
    """Temperature softmax in float32, in the reference's operation order."""
    z = logits_row / t
    p = np.exp(z - z.max())
    p /= p.sum()
    return p


def unpermute(p: np.ndarray, order: Sequence[int] | None) -> np.ndarray:
    """Slot order -> option order (slot s showed option order[s])."""
    if order is None or len(order) != len(p):
        return p
    out = np.empty_like(p)
    out[np.asarray(order, dtype=int)] = p
    return out


def entropy_confidence(p: np.ndarray, k: int) -> float:
    """1 - H(p)/log k, clamped to [0, 1]; 1.0 below two options."""
    if k < 2:
        return 1.0
    pk = p[:k]
    ent = -float((pk * np.log(np.clip(pk, 1e-12, 1.0))).sum())
    return min(1.0, max(0.0, 1.0 - ent / math.log(k)))


def max_confidence(p: np.ndarray, k: int) -> float:
    if k < 1:
        return 1.0
    return min(1.0, max(0.0, float(p[:k].max())))


def act_probabilities(act_logits: np.ndarray) -> np.ndarray:
    e = np.exp(act_logits - np.max(act_logits, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def decode_answer(
    q: Question,
    logits_row: np.ndarray,
    act_row: np.ndarray,
    k: int,
    calibration: Calibration,
    lang: str | None = None,
    digits: int | None = ANSWER_DIGITS,
) -> dict[str, Any]:
    """One answer dict, keys in the reference's order.

    `digits=None` leaves every number unrounded (the parity rule judges printed values against
    these); the answer is otherwise the same dict, built by the same code.
    """

    def rnd(x: float) -> float:
        return float(x) if digits is None else round(float(x), digits)

    p = unpermute(softmax_f32(logits_row[:k], calibration.temperature_for(q.qtype, k, lang)), q.option_order)
    confidence = rnd(entropy_confidence(p, k))
    answer_conf = max_confidence(p, k)
    # A language override stands in for the whole calibration, so the map (fitted without it) is off.
    if calibration.binning_map and calibration.lang_override(lang) is None:
        answer_conf = apply_binning_map(answer_conf, temp_bucket(q.qtype, k), calibration.binning_map)
    answer_conf = rnd(answer_conf)
    action = {"act_probability": rnd(act_row[0])}
    if q.type == "choice":
        keys = list(q.criteria.keys())
        return {
            "type": "choice",
            "choice": keys[int(p.argmax())],
            "probabilities": {key: rnd(v) for key, v in zip(keys, p, strict=False)},
            "confidence": confidence,
            "answer_confidence": answer_conf,
            "action": action,
        }
    if q.type == "score":
        expected = float((np.arange(k) * p).sum())  # int64 x float32 -> float64 sum
        return {
            "type": "score",
            "score": rnd(expected),
            "legend": {str(i): render_criterion(c) for i, c in enumerate(q.criteria)},
            "probabilities": {str(i): rnd(v) for i, v in enumerate(p)},
            "confidence": confidence,
            "answer_confidence": answer_conf,
            "action": action,
        }
    p_true = float(p[1])
    return {
        "type": "noul",
        "noul": rnd(p_true),
        "confidence": rnd(max(p_true, 1.0 - p_true)),
        "answer_confidence": answer_conf,
        "action": action,
    }


def state_usage(rows: Sequence[Row], input_tokens: int) -> dict[str, Any]:
    """The usage block of one state's result."""
    dropped = max(r.state_stats["state_tokens_dropped"] for r in rows)
    usage: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": 0,
        "state_tokens": rows[0].state_stats["state_tokens"],
        "state_tokens_dropped": dropped,  # worst case: one state, several head budgets
        "truncated": dropped > 0,
        "truncated_questions": [r.qid for r in rows if r.state_stats["truncated"]],
    }
    collapsed = {
        r.qid: {
            "total": r.options["options"],
            "distinct": r.options["options_distinct"],
            "tokens_per_option": r.options["tokens_per_option"],
        }
        for r in rows
        if r.options["options_distinct"] < r.options["options"]
    }
    if collapsed:
        usage["options"] = collapsed
    return usage


def decode_state(
    questions: Mapping[Any, Question],
    rows: Sequence[Row],
    logits: np.ndarray | Sequence[np.ndarray],
    act: np.ndarray | Sequence[np.ndarray],
    offset: int,
    calibration: Calibration,
    lang: str | None = None,
) -> dict[str, Any]:
    """One state's result from the batch rows starting at `offset` (act already softmaxed).

    `logits`/`act` index by row: a pass's arrays, or per-row arrays gathered from several
    passes (whose marker widths may differ; each row reads only its own markers)."""
    answers = {}
    for r, row in enumerate(rows):
        answers[row.qid] = decode_answer(
            questions[row.qid], logits[offset + r], act[offset + r], len(row.markers), calibration, lang
        )
    return {
        "model": MODEL_NAME,
        "answers": answers,
        "usage": state_usage(rows, sum(len(row.ids) for row in rows)),
    }


def empty_result() -> dict[str, Any]:
    return {"model": MODEL_NAME, "answers": {}, "usage": {"input_tokens": 0, "output_tokens": 0}}
