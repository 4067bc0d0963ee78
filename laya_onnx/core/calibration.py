"""Calibration and decoding: graph logits -> answers, exactly as laya 0.4.15 computes them.

Temperatures are applied per question type and option-count bucket, clamped to
[TEMP_MIN, TEMP_MAX]; the softmax runs in float32 numpy in the reference's order so the
rounded numbers agree to the last digit (docs/semantics.md#calibration-and-decoding).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.questions import QTYPE_NAMES, Question
from laya_onnx.core.sequences import Row

TEMP_MIN = 0.5
TEMP_MAX = 5.0
MODEL_NAME = "laya-rl-agent-onnx"
#: Answers print every number with Python's round(x, 4), as the reference does
#: (docs/semantics.md#calibration-and-decoding).
ANSWER_DIGITS = 4


#: The option-count classes of the temperature and gate buckets, smallest first.
SIZE_CLASSES = ("2", "3-5", "6-10", "11+")


def size_class(k: int) -> str:
    return "2" if k <= 2 else "3-5" if k <= 5 else "6-10" if k <= 10 else "11+"


@functools.lru_cache(maxsize=1024)
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
    add (`laya_onnx.core.calibration_file`)."""

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


def softmax_f32(logits: np.ndarray, t: float | np.ndarray) -> np.ndarray:
    """Temperature softmax in float32, in the reference's operation order, over the last axis
    (one row [k] or many [n, k]; each row comes out bit-identical to that row alone)."""
    z = logits / t
    z -= np.maximum.reduce(z, axis=-1, keepdims=True)
    p = np.exp(z, out=z)
    p /= np.add.reduce(p, axis=-1, keepdims=True)
    return p


def unpermute(p: np.ndarray, order: Sequence[int] | None) -> np.ndarray:
    """Slot order -> option order (slot s showed option order[s]), along the last axis."""
    if order is None or len(order) != p.shape[-1]:
        return p
    out = np.empty_like(p)
    out[..., np.asarray(order, dtype=int)] = p
    return out


def entropy_sums(p: np.ndarray) -> np.ndarray:
    """sum(p log p) per row of p [n, k] (as the reference computes it)."""
    # The reference clips to [1e-12, 1]; a softmax output never exceeds 1 (each term is at most
    # the float sum it is divided by), so the lower bound alone gives the same bits, ~5x faster.
    logs = np.maximum(p, 1e-12)
    return np.add.reduce(np.log(logs, out=logs) * p, axis=-1)


def confidences_from_entropy(sums: Sequence[float], k: int) -> list[float]:
    """1 - H/log k per row from its `entropy_sums`, clamped to [0, 1]; 1.0 below two options."""
    if k < 2:
        return [1.0] * len(sums)
    log_k = math.log(k)
    return clamped([1.0 - -s / log_k for s in sums])


def clamped(values: Sequence[float]) -> list[float]:
    """min(1.0, max(0.0, v)) of each value, NaN and -0.0 to 0.0 as that gives, without the calls."""
    return [(v if v < 1.0 else 1.0) if v > 0.0 else 0.0 for v in values]


def act_probabilities(act_logits: np.ndarray) -> np.ndarray:
    # The ufuncs' reduce and in-place forms of max/sum and the division: the same numbers
    # without the array methods' Python wrappers and temporaries (a few microseconds a call).
    e = act_logits - np.maximum.reduce(act_logits, axis=-1, keepdims=True)
    np.exp(e, out=e)
    e /= np.add.reduce(e, axis=-1, keepdims=True)
    return e


def decode_answer(
    q: Question,
    logits_row: np.ndarray,
    act_row: np.ndarray,
    k: int,
    calibration: Calibration,
    lang: str | None = None,
    digits: int | None = ANSWER_DIGITS,
) -> dict[str, Any]:
    """One answer dict, keys in the reference's order (`decode_answers` for one row).

    `digits=None` leaves every number unrounded (the parity rule judges printed values against
    these); the answer is otherwise the same dict, built by the same code.
    """
    return decode_answers(q, logits_row[None, :k], act_row[None, :1], calibration, lang, digits)[0]


#: Questions of at most this many options are decoded in one array, padded to the widest of
#: them with probability 0 (logit -inf): numpy sums fewer than 8 numbers left to right, so the
#: zeros leave every row's sums bit for bit as they are alone. From 8 numbers on numpy sums in
#: 8 lanes and padding would regroup them, so a wider question is decoded on its own.
SHARED_WIDTH_MAX = 7


def width_groups(widths: Sequence[int]) -> list[list[int]]:
    """Indices of `widths` decoded in one array: every width up to SHARED_WIDTH_MAX together,
    each wider one alone."""
    shared = [j for j, k in enumerate(widths) if k <= SHARED_WIDTH_MAX]
    return ([shared] if shared else []) + [[j] for j, k in enumerate(widths) if k > SHARED_WIDTH_MAX]


@functools.lru_cache(maxsize=256)
def _columns_in_use(widths: tuple[int, ...]) -> np.ndarray | None:
    """[m, max width] True where question j has an option; None when no question is padded."""
    width = max(widths)
    if min(widths) == width:
        return None
    mask = np.arange(width) < np.asarray(widths)[:, None]
    mask.flags.writeable = False
    return mask


@dataclass
class RowNumbers:
    """The calibrated numbers of one question's n rows, as Python values: `probs` the rows'
    probabilities in option order, row after row (n * k values), `top` each row's largest,
    `entropy_sums` its sum(p log p), `best` its argmax (choice questions), `expected` its
    sum(i p_i) (score questions)."""

    probs: list[float]
    top: list[float]
    entropy_sums: list[float]
    best: list[int] | None
    expected: list[float] | None


def calibrated_numbers(
    questions: Sequence[Question],
    logits: np.ndarray,
    calibration: Calibration,
    lang: str | None = None,
) -> list[RowNumbers]:
    """Temperature softmax, option order and the reductions of every row of several questions at
    once: `logits` [n, m, >=k] holds state i's row for question j at [i, j] (columns past the
    question's k are ignored), the questions sharing one `width_groups` group. Every row's
    numbers are bit-identical to that row decoded alone."""
    widths = tuple(q.n_options for q in questions)
    x = logits[:, :, : max(widths)]
    in_use = _columns_in_use(widths)
    if in_use is not None:
        x = np.where(in_use, x, np.float32(-np.inf))
    # float32 / float32 is how an array divides by a Python float (NEP 50): one per question.
    temps = [calibration.temperature_for(q.qtype, k, lang) for q, k in zip(questions, widths, strict=True)]
    p = softmax_f32(x, np.array(temps, dtype=np.float32)[:, None])
    for m, (q, k) in enumerate(zip(questions, widths, strict=True)):
        if q.option_order is not None:
            p[:, m, :k] = unpermute(p[:, m, :k], q.option_order)
    top = np.maximum.reduce(p, axis=-1).T.tolist()
    kinds = {q.type for q in questions}
    entropy = entropy_sums(p).T.tolist() if kinds != {"noul"} else None  # a noul's confidence is max(p, 1-p)
    best = p.argmax(axis=-1).T.tolist() if "choice" in kinds else None
    wide = "score" in kinds and p.shape[-1] > SHARED_WIDTH_MAX
    # int64 x float32 -> float64 products and sums, as the reference computes the expected level.
    expected = np.add.reduce(np.arange(p.shape[-1]) * p, axis=-1).T.tolist() if wide else None
    out = []
    for m, (q, k) in enumerate(zip(questions, widths, strict=True)):
        probs = p[:, m, :k].reshape(-1).tolist()
        levels = None
        if q.type == "score":
            levels = expected[m] if expected is not None else _expected_levels(probs, k)
        out.append(
            RowNumbers(
                probs=probs,
                top=top[m],
                entropy_sums=[] if entropy is None else entropy[m],
                best=None if best is None else best[m],
                expected=levels,
            )
        )
    return out


def _expected_levels(probs: list[float], k: int) -> list[float]:
    """sum(i * p_i) of each row of k probabilities (fewer than 8) in float64, left to right: the
    products and the order numpy uses for the int64 x float32 sum of so few numbers."""
    out = []
    for start in range(0, len(probs), k):
        total = 0.0
        for i, v in enumerate(probs[start : start + k]):
            total += i * v
        out.append(total)
    return out


def _rounded(values: list[float], digits: int | None) -> list[float]:
    if digits is None:
        return [float(v) for v in values]
    return list(map(round, values, repeat(digits)))


def answer_dicts(
    q: Question,
    numbers: RowNumbers,
    act: list[float],
    calibration: Calibration,
    lang: str | None = None,
    digits: int | None = ANSWER_DIGITS,
) -> list[dict[str, Any]]:
    """The answers of `q` from its rows' `numbers` and act probabilities, keys in the reference's
    order; `digits=None` leaves every number unrounded (each is rounded with Python's round,
    all of a question's numbers in one pass)."""
    k, n = q.n_options, len(act)
    answer_conf = clamped(numbers.top)
    # A language override stands in for the whole calibration, so the map (fitted without it) is off.
    if calibration.binning_map and calibration.lang_override(lang) is None:
        bucket = temp_bucket(q.qtype, k)
        answer_conf = [apply_binning_map(c, bucket, calibration.binning_map) for c in answer_conf]
    if q.type == "noul":
        true = numbers.probs[1::2]
        values = _rounded(act + answer_conf + true + [max(t, 1.0 - t) for t in true], digits)
        return [
            {
                "type": "noul",
                "noul": values[2 * n + i],
                "confidence": values[3 * n + i],
                "answer_confidence": values[n + i],
                "action": {"act_probability": values[i]},
            }
            for i in range(n)
        ]
    confidence = confidences_from_entropy(numbers.entropy_sums, k)
    if q.type == "choice":
        keys = q.answer_keys
        values = _rounded(act + answer_conf + confidence + numbers.probs, digits)
        at = 3 * n
        return [
            {
                "type": "choice",
                "choice": keys[best],
                "probabilities": dict(zip(keys, values[at + i * k : at + i * k + k], strict=True)),
                "confidence": values[2 * n + i],
                "answer_confidence": values[n + i],
                "action": {"act_probability": values[i]},
            }
            for i, best in enumerate(numbers.best or ())
        ]
    legend, levels = q.legend, q.answer_keys
    values = _rounded(act + answer_conf + confidence + (numbers.expected or []) + numbers.probs, digits)
    at = 4 * n
    return [
        {
            "type": "score",
            "score": values[3 * n + i],
            "legend": dict(legend),
            "probabilities": dict(zip(levels, values[at + i * k : at + i * k + k], strict=True)),
            "confidence": values[2 * n + i],
            "answer_confidence": values[n + i],
            "action": {"act_probability": values[i]},
        }
        for i in range(n)
    ]


def decode_questions(
    questions: Sequence[Question],
    logits: np.ndarray,
    act: np.ndarray,
    calibration: Calibration,
    lang: str | None = None,
    digits: int | None = ANSWER_DIGITS,
) -> list[list[dict[str, Any]]]:
    """Per question, its answer for every state: `logits` [n * m, >=max k] holds state i's row
    for question j at i * m + j (m questions; a question's columns past its own k are ignored),
    `act` [n * m, >=1] the softmaxed act probabilities in the same order.

    Vectorised over rows and over questions (`width_groups`), bit-identical to decoding each row
    alone: every reduction runs along a contiguous last axis, which numpy computes row by row in
    the order it uses for one row (tests/core/test_calibration_gate.py, tests/core/test_call_path.py).
    """
    m = len(questions)
    by_state = logits.reshape(-1, m, logits.shape[-1])
    acts = act[:, 0].reshape(-1, m).T.tolist()
    out: list[list[dict[str, Any]]] = [[] for _ in questions]
    for members in width_groups([q.n_options for q in questions]):
        block = by_state if len(members) == m else by_state[:, members]
        numbers = calibrated_numbers([questions[j] for j in members], block, calibration, lang)
        for j, nums in zip(members, numbers, strict=True):
            out[j] = answer_dicts(questions[j], nums, acts[j], calibration, lang, digits)
    return out


def decode_answers(
    q: Question,
    logits: np.ndarray,
    act: np.ndarray,
    calibration: Calibration,
    lang: str | None = None,
    digits: int | None = ANSWER_DIGITS,
) -> list[dict[str, Any]]:
    """The answers of `q` for many rows at once (`logits` [n, k], `act` [n, >=1]; `decode_questions`
    for one question)."""
    return decode_questions([q], logits, act, calibration, lang, digits)[0]


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


class CallLogits:
    """The logits of every row of one call, gathered across its passes into call order (state i's
    row for question j at i * m + j), so the whole call is decoded at once (`decode`)."""

    def __init__(self, questions: Mapping[Any, Question], n_states: int):
        self.questions = list(questions.values())
        self.n_states = n_states
        self.logits: np.ndarray | None = None
        self.act: np.ndarray | None = None

    def add(self, refs: Sequence[tuple[int, int]], logits: np.ndarray, act: np.ndarray) -> None:
        """One pass's outputs: row r of the pass is (state, question index) `refs[r]`; `act`
        already softmaxed. Rows of a pass may come from any states and questions."""
        m = len(self.questions)
        n_rows = self.n_states * m
        if (
            self.logits is None
            and len(refs) == n_rows
            and all(ref == divmod(r, m) for r, ref in enumerate(refs))
        ):
            self.logits, self.act = logits, act[:, :1]  # the whole call in one pass, in call order
            return
        if self.logits is None:
            width = max(q.n_options for q in self.questions)
            self.logits = np.zeros((n_rows, width), dtype=np.float32)
            self.act = np.zeros((n_rows, 1), dtype=np.float32)
        assert self.act is not None
        order = [i * m + j for i, j in refs]
        width = min(self.logits.shape[-1], logits.shape[-1])
        self.logits[order, :width] = logits[:, :width]
        self.act[order] = act[:, :1]

    def decode(
        self, encoded: Sequence[Sequence[Row]], calibration: Calibration, lang: str | None = None
    ) -> list[dict[str, Any]]:
        """Each state's result (`encoded[i]`: state i's rows, one per question in order)."""
        assert self.logits is not None and self.act is not None, "no pass was added"
        per_question = decode_questions(self.questions, self.logits, self.act, calibration, lang)
        qids = [q.qid for q in self.questions]
        return [
            {
                "model": MODEL_NAME,
                "answers": {qid: answers[i] for qid, answers in zip(qids, per_question, strict=True)},
                "usage": state_usage(rows, sum(len(row.ids) for row in rows)),
            }
            for i, rows in enumerate(encoded)
        ]


def empty_result() -> dict[str, Any]:
    return {"model": MODEL_NAME, "answers": {}, "usage": {"input_tokens": 0, "output_tokens": 0}}
