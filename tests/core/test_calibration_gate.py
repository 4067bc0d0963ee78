"""Calibration maths and the confidence gate against the reference's own functions (imported
inside the `reference` tests, so the module collects without laya)."""

import warnings

import numpy as np
import pytest

from laya_onnx.core import calibration as cal
from laya_onnx.core import gate

WEIRD = [0.1006, 0.5, 1, 7, 5.0001, -3, True, False, None, "1.5", "x", float("nan"), float("inf"), [1]]


@pytest.mark.reference
@pytest.mark.parametrize("t", WEIRD, ids=repr)
def test_clamp_temperature_matches_reference(t):
    from laya import common

    assert cal.clamp_temperature(t) == common.clamp_temperature(t)
    applied = cal.clamp_temperature(t)
    assert cal.temperature_rejected(t, applied) == common.temperature_rejected(t, applied)


@pytest.mark.reference
@pytest.mark.parametrize("qtype", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 6, 10, 11, 40])
def test_temp_bucket_matches_reference(qtype, k):
    from laya import common

    assert cal.temp_bucket(qtype, k) == common.temp_bucket(qtype, k)


@pytest.mark.reference
def test_probability_maths_match_reference_bit_for_bit():
    from laya import common

    rng = np.random.default_rng(0)
    for k in (1, 2, 3, 7, 20):
        for _ in range(20):
            logits = (rng.standard_normal(k) * 4).astype(np.float32)
            t = float(rng.uniform(0.5, 5))
            p = cal.softmax_f32(logits, t)
            z = logits / t
            ref = np.exp(z - z.max())
            ref /= ref.sum()
            assert p.dtype == np.float32 and np.array_equal(p, ref)
            # the confidences as calibrated_numbers computes them, from the row's sums and tops
            row = p[None, :k]
            entropy = cal.confidences_from_entropy(cal.entropy_sums(row).tolist(), k)
            assert entropy == [common.confidence_from_probs(p, k)]
            assert cal.clamped(np.maximum.reduce(row, axis=-1).tolist()) == [common.answer_confidence(p, k)]
            order = list(rng.permutation(k))
            assert np.array_equal(cal.unpermute(p, order), common.unpermute_probs(p, order))


@pytest.mark.reference
def test_lang_temperatures_match_reference():
    from laya import common

    raw = {
        "de-DE": {"temperature": [2, 0.1, True], "temperature_by_options": {"choice:2": 9}},
        "FR": None,
        "es": {"temperature": None},
    }
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        resolved = cal.resolve_lang_temperatures(raw, [1.0, 1.2, 0.9])
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        assert resolved == common.resolve_lang_temperatures(raw, [1.0, 1.2, 0.9])
    # One warning per override that replaced something, naming the same entries in the same order.
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    assert len(ours) == 1 and "temperature[1]=0.1 -> 0.5, temperature[2]=True -> 1, choice:2=9" in str(
        ours[0].message
    )
    for bad in ({1: {}}, {"de": 3}, {"de": {"temperature": [1, 2]}}, {"de": {"temperature_by_options": [1]}}):
        with pytest.raises(ValueError) as ours:
            cal.resolve_lang_temperatures(bad, [1.0, 1.0, 1.0])
        with pytest.raises(ValueError) as ref:
            common.resolve_lang_temperatures(bad, [1.0, 1.0, 1.0])
        assert str(ours.value) == str(ref.value)


def test_checkpoint_temperatures_are_clamped_with_a_warning():
    cfg = {"temperature": [1.0, 9.0, 1.0], "temperature_by_options": {"choice:11+": 0.1006}}
    with pytest.warns(RuntimeWarning, match=r"choice:11\+=0.1006 -> 0.5.*temperature\[1\]=9.0 -> 5"):
        c = cal.Calibration.from_config(cfg)
    assert c.temperature_for(0, 12) == 0.5 and c.temperature_for(1, 3) == 5.0
    assert c.temperature_for(0, 3) == 1.0


@pytest.mark.reference
@pytest.mark.parametrize(
    "mc",
    [
        1.5,
        -0.1,
        True,
        "0.9",
        float("inf"),
        float("nan"),
        {},
        {"x": 0.5},
        {"choice:3-5": 2},
        {"default": None},
        [0.5],
    ],
    ids=repr,
)
def test_min_confidence_refusals_match_reference(mc):
    from laya import confidence

    with pytest.raises(ValueError) as ref:
        confidence.check_min_confidence(mc)
    with pytest.raises(ValueError) as ours:
        gate.check_min_confidence(mc)
    assert str(ours.value) == str(ref.value)


def _results():
    return [
        {
            "answers": {
                "a": {
                    "type": "choice",
                    "choice": "x",
                    "probabilities": {"x": 0.7, "y": 0.2, "z": 0.1},
                    "confidence": 0.3,
                    "answer_confidence": 0.7,
                    "action": {},
                },
                "b": {
                    "type": "noul",
                    "noul": 0.55,
                    "confidence": 0.55,
                    "answer_confidence": 0.55,
                    "action": {},
                },
                "c": {
                    "type": "score",
                    "score": 1.0,
                    "probabilities": {"0": 0.5, "1": 0.5},
                    "confidence": float("nan"),
                    "answer_confidence": None,
                    "action": {},
                },
                "d": {"type": "choice", "probabilities": {}, "confidence": 0.9, "low_confidence": True},
                # a hook's rewrite with an unhashable type: no bucket, gated on the default
                "e": {"type": ["choice"], "probabilities": {"x": 1.0}, "confidence": 0.4},
            }
        },
        "not a dict",
        {"answers": None},
    ]


@pytest.mark.reference
@pytest.mark.parametrize(
    "mc", [None, 0.0, 0.6, 0.99, {"choice:3-5": 0.8, "default": 0.5}, {"noul:2": 0.9}], ids=repr
)
def test_gate_writes_what_reference_writes(mc):
    from laya import confidence

    ours, ref = _results(), _results()
    gate.apply_confidence_gate(ours, mc)
    confidence.apply_confidence_gate(ref, mc)
    assert repr(ours) == repr(ref)  # values and key order
    if mc is not None:
        assert all("abstention" in a for a in ours[0]["answers"].values())


def _at_threshold() -> list:
    return [
        {
            "answers": {
                "n": {"type": "noul", "noul": 0.75, "confidence": 0.75, "answer_confidence": 0.75},
                "c": {
                    "type": "choice",
                    "choice": "a",
                    "probabilities": {"a": 0.5, "b": 0.5},
                    "confidence": 0.5,
                },
            }
        }
    ]


@pytest.mark.parametrize("mc", [0.75, {"noul:2": 0.75, "choice:2": 0.5}], ids=repr)
def test_an_answer_exactly_at_the_threshold_passes(mc):
    """Confidence equal to min_confidence passes (the gate abstains strictly below it)."""
    results = _at_threshold()
    gate.apply_confidence_gate(results, mc)
    answers = results[0]["answers"]
    assert answers["n"]["abstention"] == "passed" and "low_confidence" not in answers["n"]
    if isinstance(mc, dict):
        assert answers["c"]["abstention"] == "passed" and "low_confidence" not in answers["c"]


@pytest.mark.reference
def test_an_answer_exactly_at_the_threshold_passes_in_the_reference():
    from laya import confidence

    ours, ref = _at_threshold(), _at_threshold()
    gate.apply_confidence_gate(ours, 0.75)
    confidence.apply_confidence_gate(ref, 0.75)
    assert ref[0]["answers"]["n"]["abstention"] == "passed"
    assert repr(ours) == repr(ref)


def test_clamped_matches_min_max_bit_for_bit():
    """`clamped` skips the min/max calls; NaN, -0.0, infinities and ints come out as they give."""
    values = [0.0, -0.0, 1.0, 1, 0, 2, -3, 5e-324, -1e-300, 0.5, 1.0000001, np.nan, np.inf, -np.inf]
    values += np.random.default_rng(3).uniform(-2.0, 3.0, 200).tolist()
    want = [min(1.0, max(0.0, v)) for v in values]
    got = cal.clamped(values)
    assert [(type(v), np.float64(v).tobytes()) for v in got] == [
        (type(v), np.float64(v).tobytes()) for v in want
    ]


def test_act_probabilities_match_the_plain_softmax_bit_for_bit():
    rng = np.random.default_rng(4)
    logits = (rng.standard_normal((64, 2)) * 8).astype(np.float32)
    logits[0] = [np.inf, 0.0]
    logits[1] = [np.nan, 1.0]
    before = logits.copy()
    with np.errstate(invalid="ignore"):
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        want = e / e.sum(axis=-1, keepdims=True)
        got = cal.act_probabilities(logits)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert logits.tobytes() == before.tobytes()  # the graph's output is left as it was
