"""The parity rule (laya_onnx/core/judge.py) on hand-made observations: what passes, what fails.

Torch-free. Each failing case is one way an answer can differ from the reference's; the rule
must catch every one, and must let through only a proven one-unit rounding flip.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from laya_onnx.core.calibration import Calibration, decode_answer
from laya_onnx.core.errors import InvalidRequest, InvalidRequestType
from laya_onnx.core.judge import Observation, judge
from laya_onnx.core.questions import normalize_questions
from laya_onnx.parity.observe import refusal
from tests.parity_support import observation_from_json


def _observation(confidence=0.2604, u_confidence=0.2604488578729113, p=(0.3361, 0.6639), u_p=None, act=0.021):
    u_p = u_p if u_p is not None else (0.33614882826805115, 0.66385117173194885)
    printed = {
        "model": "laya-rl-agent",
        "answers": {
            "q": {
                "type": "choice",
                "choice": "b" if p[1] >= p[0] else "a",
                "probabilities": {"a": p[0], "b": p[1]},
                "confidence": confidence,
                "answer_confidence": max(p),
                "action": {"act_probability": act},
            }
        },
        "usage": {"input_tokens": 12, "output_tokens": 0},
    }
    unrounded = {
        "answers": {
            "q": {
                "type": "choice",
                "choice": "b" if u_p[1] >= u_p[0] else "a",
                "probabilities": {"a": u_p[0], "b": u_p[1]},
                "confidence": u_confidence,
                "answer_confidence": max(u_p),
                "action": {"act_probability": act + 1e-7},
            }
        }
    }
    return Observation(
        printed=printed,
        rows=[[{"qid": "q", "ids": [1, 5, 9, 2], "markers": [2, 3]}]],
        unrounded=[unrounded],
    )


def test_identical_observations_pass():
    verdict = judge(_observation(), _observation())
    assert verdict.passed and verdict.flips == [] and verdict.identical_text and verdict.rows == 1


def test_a_proven_rounding_flip_passes_and_is_counted():
    ours = _observation(confidence=0.2605, u_confidence=0.2604509195433703)
    verdict = judge(_observation(), ours)
    assert verdict.passed, verdict.differences
    assert len(verdict.flips) == 1 and "confidence" in verdict.flips[0]
    assert not verdict.identical_text


def test_flip_claimed_without_straddling_the_boundary_fails():
    # ours prints 0.2605 but its unrounded value rounds to 0.2604: nothing straddles 0.26045
    ours = _observation(confidence=0.2605, u_confidence=0.2604489)
    verdict = judge(_observation(), ours)
    assert not verdict.passed and verdict.failed("json") and not verdict.flips


def test_two_unit_difference_fails():
    # both unrounded values print as their own side's, a boundary lies between them, and they are
    # within the (loose) tolerance: only the two-unit distance is wrong
    ours = _observation(confidence=0.2606, u_confidence=0.26056)
    ref = _observation(confidence=0.2604, u_confidence=0.26044)
    verdict = judge(ref, ours, tolerance=1e-3)
    assert not verdict.passed and not verdict.flips
    assert [c for c, _ in verdict.differences] == ["json"]
    assert "not a one-unit rounding flip" in verdict.differences[0][1]


@pytest.mark.parametrize(
    "path, value",
    [
        (("answers", "q", "choice"), "a"),  # a label
        (("usage", "input_tokens"), 13),  # an int
        (("answers", "q", "type"), "score"),  # a string
        (("usage", "input_tokens"), 12.0),  # same number, other type
    ],
)
def test_non_float_difference_fails(path, value):
    ours = _observation()
    node = ours.printed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    verdict = judge(_observation(), ours)
    assert not verdict.passed and verdict.failed("json")


def test_key_order_matters_but_model_does_not():
    ours = _observation()
    ours.printed["model"] = "laya-rl-agent-onnx"
    assert judge(_observation(), ours).passed
    probs = ours.printed["answers"]["q"]["probabilities"]
    ours.printed["answers"]["q"]["probabilities"] = {"b": probs["b"], "a": probs["a"]}
    verdict = judge(_observation(), ours)
    assert not verdict.passed and verdict.failed("json")


def test_unrounded_difference_over_tolerance_fails_even_when_printed_alike():
    ours = _observation(u_p=(0.33614882826805115 - 2e-5, 0.66385117173194885 + 2e-5))
    verdict = judge(_observation(), ours)
    assert not verdict.passed and verdict.failed("tolerance")
    assert verdict.max_abs_dp == pytest.approx(2e-5, rel=1e-3)
    assert judge(_observation(), ours, tolerance=3e-5).passed


def _score_observation(u_score: float) -> Observation:
    probs, u_probs = {"0": 0.5234, "1": 0.4316, "2": 0.045}, {"0": 0.52338, "1": 0.43158, "2": 0.04504}
    answer = {"type": "score", "score": 0.5216, "probabilities": probs}
    raw = {"type": "score", "score": u_score, "probabilities": u_probs}
    return Observation(printed={"answers": {"u": answer}}, unrounded=[{"answers": {"u": raw}}])


def test_a_score_gets_the_bound_its_probabilities_imply():
    # 3 levels: when each p_i moves by 1e-5, sum(i * p_i) moves by at most 2e-5
    ref = _score_observation(0.52162)
    assert judge(ref, _score_observation(0.52162 + 1.5e-5)).passed
    verdict = judge(ref, _score_observation(0.52162 + 2.5e-5))
    assert not verdict.passed and verdict.failed("tolerance")


def test_act_probability_has_its_own_tolerance():
    ours = _observation()
    ours.unrounded[0]["answers"]["q"]["action"]["act_probability"] += 2e-5
    assert judge(_observation(), ours).passed  # within 5e-5
    verdict = judge(_observation(), ours, act_tolerance=1e-5)
    assert not verdict.passed and verdict.failed("tolerance")


def test_unrounded_values_that_do_not_print_as_printed_fail():
    ours = _observation()
    ours.unrounded[0]["answers"]["q"]["confidence"] = 0.2703  # not what ours printed (0.2604)
    verdict = judge(_observation(), ours, tolerance=1.0)
    assert not verdict.passed and verdict.failed("json")


def test_a_printed_float_without_unrounded_values_must_be_identical():
    ref, ours = _observation(), _observation()
    ref.printed["answers"]["q"]["abstention_threshold"] = 0.6
    ours.printed["answers"]["q"]["abstention_threshold"] = 0.6001
    verdict = judge(ref, ours)
    assert not verdict.passed and verdict.failed("json")


def test_decision_difference_fails():
    # a score question whose two top levels tie in print but not unrounded: the argmax differs
    ref, ours = _observation(), _observation()
    for obs, u in ((ref, (0.5000001, 0.4999999)), (ours, (0.4999999, 0.5000001))):
        obs.printed["answers"]["q"].update(type="score", choice="x")
        obs.unrounded[0]["answers"]["q"].update(type="score", choice="x")
        obs.printed["answers"]["q"]["probabilities"] = {"0": 0.5, "1": 0.5}
        obs.unrounded[0]["answers"]["q"]["probabilities"] = {"0": u[0], "1": u[1]}
    verdict = judge(ref, ours)
    assert not verdict.passed and verdict.failed("decision") and not verdict.failed("json")


def test_token_or_marker_difference_fails():
    ours = _observation()
    ours.rows[0][0]["ids"] = [1, 5, 8, 2]
    assert judge(_observation(), ours).failed("tokens")
    ours = _observation()
    ours.rows[0][0]["markers"] = [2, 4]
    assert judge(_observation(), ours).failed("tokens")


def test_a_row_never_seen_in_a_forward_pass_fails():
    ours = _observation()
    ours.unrounded[0]["answers"]["q"] = None
    verdict = judge(_observation(), ours)
    assert not verdict.passed and verdict.failed("tokens")


def test_refusals_compare_by_builtin_kind_and_text():
    # the core raises InvalidRequest(ValueError) / InvalidRequestType(TypeError); the reference
    # raises the builtins; parity compares the builtin kind and the text
    assert refusal(InvalidRequest("question 'q': bad")) == refusal(ValueError("question 'q': bad"))
    assert refusal(InvalidRequestType("bad type")) == {"kind": "TypeError", "text": "bad type"}
    ref = Observation(refusal=refusal(ValueError("question 'q': bad")))
    assert judge(ref, Observation(refusal=refusal(InvalidRequest("question 'q': bad")))).passed
    for ours in (
        Observation(refusal=refusal(TypeError("question 'q': bad"))),  # other kind
        Observation(refusal=refusal(InvalidRequest("question 'q': worse"))),  # other text
        _observation(),  # answered instead
    ):
        verdict = judge(ref, ours)
        assert not verdict.passed and verdict.failed("refusal")


def test_a_request_the_suite_says_must_be_refused():
    verdict = judge(_observation(), _observation(), expect_refusal=True)
    assert not verdict.passed and verdict.failed("refusal")


def test_observations_survive_json():
    obs = _observation()
    assert judge(observation_from_json(obs.as_json()), copy.deepcopy(obs)).passed


def test_bad_tolerance_is_refused():
    with pytest.raises(ValueError, match="tolerance must be a finite number >= 0"):
        judge(_observation(), _observation(), tolerance=float("nan"))


def test_decoder_unrounded_values_round_to_the_printed_answer():
    """decode_answer(digits=None) is the same answer before rounding: each value rounds to the printed one."""
    questions = normalize_questions(
        {
            "c": {
                "type": "choice",
                "instructions": "x",
                "criteria": ["a", "b", "c"],
                "option_order": [2, 0, 1],
            },
            "s": {"type": "score", "instructions": "x", "criteria": ["lo", "mid", "hi"]},
            "n": {"type": "noul", "instructions": "x"},
        }
    )
    calib = Calibration.from_config({"temperature": [1.3, 0.8, 1.1]})
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(50):
        logits = rng.normal(size=3).astype(np.float32)
        act = np.array([0.3, 0.7], dtype=np.float32)
        for q in questions.values():
            k = 2 if q.type == "noul" else 3
            printed = decode_answer(q, logits, act, k, calib)
            raw = decode_answer(q, logits, act, k, calib, digits=None)
            assert list(raw) == list(printed)
            verdict = judge(
                Observation(printed={"answers": {"q": printed}}, unrounded=[{"answers": {"q": raw}}]),
                Observation(printed={"answers": {"q": printed}}, unrounded=[{"answers": {"q": raw}}]),
            )
            assert verdict.passed, verdict.differences
            checked += 1
            assert raw != printed  # really unrounded
    assert checked == 150
