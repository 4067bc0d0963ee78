"""Question validation must refuse exactly what laya 0.4.15 refuses, with the same text.

The reference is imported inside the `reference` tests, so the module collects without laya."""

import pytest

from laya_onnx.core.questions import check_question, normalize_questions, null_level, to_question

BAD = [
    (None, {"type": "noul", "instructions": "x"}),
    ("", {"type": "noul", "instructions": "x"}),
    ("  ", {"type": "noul", "instructions": "x"}),
    (1.5, {"type": "noul", "instructions": "x"}),
    ("q", "not a dict"),
    ("q", {"type": "bool", "instructions": "x"}),
    ("q", {"type": None, "instructions": "x"}),
    ("q", {"type": "noul"}),
    ("q", {"type": "noul", "instructions": None}),
    ("q", {"type": "noul", "instructions": "   "}),
    ("q", {"type": "noul", "instructions": []}),
    ("q", {"type": "noul", "instructions": {}}),
    ("q", {"type": "noul", "instructions": set()}),
    ("q", {"type": "choice", "instructions": "x"}),
    ("q", {"type": "choice", "instructions": "x", "criteria": "a,b"}),
    ("q", {"type": "choice", "instructions": "x", "criteria": []}),
    ("q", {"type": "choice", "instructions": "x", "criteria": [["nested"]]}),
    ("q", {"type": "choice", "instructions": "x", "criteria": [None]}),
    ("q", {"type": "choice", "instructions": "x", "criteria": {(1, 2): "tuple"}}),
    ("q", {"type": "choice", "instructions": "x", "criteria": ["a", "a"]}),
    ("q", {"type": "choice", "instructions": "x", "criteria": [1, 1.0]}),
    ("q", {"type": "choice", "instructions": "x", "criteria": [True, 1]}),
    ("q", {"type": "choice", "instructions": "x", "criteria": ["", 0, False]}),
    ("q", {"type": "score", "instructions": "x", "criteria": {"a": 1}}),
    ("q", {"type": "score", "instructions": "x", "criteria": []}),
    ("q", {"type": "score", "instructions": "x", "criteria": ["a", None, None]}),
    ("q", {"type": "noul", "instructions": "x", "criteria": ["true"]}),
    ("q", {"type": "noul", "instructions": "x", "criteria": {"yes": "a", "TRUE": "b"}}),
    ("q", {"type": "choice", "instructions": "x", "criteria": ["a", "b"], "option_order": [0]}),
    ("q", {"type": "choice", "instructions": "x", "criteria": ["a", "b"], "option_order": [0, 0]}),
    ("q", {"type": "choice", "instructions": "x", "criteria": ["a", "b"], "option_order": [True, 0]}),
    ("q", {"type": "choice", "instructions": "x", "criteria": ["a", "b"], "option_order": "01"}),
    ("q", {"type": "noul", "instructions": "x", "option_order": [0, 1, 2]}),
    ("q", {"type": "choice", "instructions": "x", "criteria": ["a"], "labels": {"true": "y", "false": "n"}}),
    ("q", {"type": "noul", "instructions": "x", "labels": {"true": "y"}}),
    ("q", {"type": "noul", "instructions": "x", "labels": {"true": "same", "false": " same "}}),
    ("q", {"type": "noul", "instructions": "x", "labels": {"true": 1, "false": "n"}}),
    ("q", {"type": "noul", "instructions": "x", "labels": {"true": " ", "false": "n"}}),
]


def _reference_error(qid, qdef):
    from laya.agent import Agent

    try:
        Agent._check_question(qid, qdef)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.reference
@pytest.mark.parametrize("qid,qdef", BAD, ids=[str(i) for i in range(len(BAD))])
def test_refusals_match_reference_text(qid, qdef):
    expected = _reference_error(qid, qdef)
    assert expected is not None, "the reference accepts this case; the table is wrong"
    with pytest.raises(ValueError) as info:
        check_question(qid, qdef)
    assert str(info.value) == expected


GOOD = [
    ("q", {"type": "noul", "instructions": 12}),
    ("q", {"type": "noul", "instructions": 1.5, "criteria": None}),
    ("q", {"type": "noul", "instructions": {"a": 1}, "criteria": {"TRUE": "x", False: "y"}}),
    (7, {"type": "choice", "instructions": "x", "criteria": ["", 0, True, 2.5]}),
    (
        "q",
        {
            "type": "choice",
            "instructions": ["a"],
            "criteria": {"a": None, "b": {"x": 1}},
            "option_order": (1, 0),
        },
    ),
    ("q", {"type": "score", "instructions": "x", "criteria": [0, "a", {"b": 2}]}),
    ("q", {"type": "noul", "instructions": "x", "labels": None}),
    ("q", {"type": "noul", "instructions": "x", "labels": {"true": " yes", "false": "no "}}),
]


@pytest.mark.reference
@pytest.mark.parametrize("qid,qdef", GOOD, ids=[str(i) for i in range(len(GOOD))])
def test_acceptances_match_reference(qid, qdef):
    from laya.agent import Agent

    assert _reference_error(qid, qdef) is None
    check_question(qid, qdef)
    ours = to_question(qid, qdef)
    ref = Agent._to_internal(qdef)
    assert ours.type == ref["t"] and ours.instructions == ref["ins"] and ours.criteria == ref["crit"]
    assert ours.option_order == (tuple(ref["option_order"]) if "option_order" in ref else None)


def test_normalize_rejects_non_dict_questions():
    with pytest.raises(TypeError, match="questions must be a dict"):
        normalize_questions([{"type": "noul"}])


def test_normalize_keeps_question_order_and_original_labels():
    qs = normalize_questions(
        {
            "b": {"type": "choice", "instructions": "x", "criteria": [1, True == 0, "c"]},
            "a": {"type": "noul", "instructions": "y"},
        }
    )
    assert list(qs) == ["b", "a"]
    assert list(qs["b"].criteria) == [1, False, "c"]
    assert qs["a"].n_options == 2 and qs["b"].n_options == 3


def test_null_level_finds_the_first_hole():
    assert null_level(["a", None, "c", None]) == 1
    assert null_level([None]) == 0
    assert null_level(["a", "", 0, False]) is None


SIZES = {
    "one-level": {"type": "score", "instructions": "Urgent?", "criteria": ["only level"]},
    "one-option": {"type": "choice", "instructions": "Queue?", "criteria": ["billing"]},
    "twelve-levels": {
        "type": "score",
        "instructions": "Rate it",
        "criteria": ["level %d" % i for i in range(12)],
    },
    "101-options": {
        "type": "choice",
        "instructions": "Team?",
        "criteria": ["team %d" % i for i in range(101)],
    },
}


@pytest.mark.reference
@pytest.mark.torch
def test_question_sizes_are_answered_as_the_reference_answers_them(checkpoint_factory, bundle_factory):
    """No size limit of its own in the core: 1 level, 1 option, 12 levels and 101 options are
    answered, and pass the parity rule against the reference (a single option with confidence 1.0).
    The rule compares the unrounded probabilities: two printed values one rounding unit apart are
    a rounding flip, which the CPU's GEMM kernels can make on any of 101 options."""
    from laya_onnx.core.judge import judge
    from laya_onnx.parity.runner import Observer, load_runtimes

    observer = Observer(*load_runtimes(checkpoint_factory("tiny-english"), bundle_factory("tiny-english")))
    theirs, mine = observer.observe({"state": "a refund please", "questions": SIZES})
    verdict = judge(theirs, mine)
    assert verdict.passed, verdict.describe()
    answers = mine.printed["answers"]
    assert list(answers) == list(theirs.printed["answers"]) == list(SIZES)
    assert len(answers["101-options"]["probabilities"]) == 101
    assert len(answers["twelve-levels"]["probabilities"]) == 12
    assert answers["one-option"]["confidence"] == theirs.printed["answers"]["one-option"]["confidence"] == 1.0


def test_unknown_fields_are_named_with_the_nearest_known_one():
    from laya_onnx.core.questions import unknown_fields

    request = {
        "state": "s",
        "min_confidnce": 0.9,
        "extra": 1,
        "questions": {"q": {"type": "choice", "instructions": "x", "critera": ["a"], "criteria": ["a"]}},
    }
    found = unknown_fields(request)
    assert [f.as_json() for f in found] == [
        {"field": "min_confidnce", "did_you_mean": "min_confidence"},
        {"field": "extra"},
        {"field": "critera", "question": "q", "did_you_mean": "criteria"},
    ]
    assert str(found[0]) == (
        "request field 'min_confidnce' is not read and has no effect (did you mean 'min_confidence'?)"
    )
    assert (
        str(found[2])
        == "question 'q': field 'critera' is not read and has no effect (did you mean 'criteria'?)"
    )
    assert unknown_fields({"state": "s", "questions": {}}) == [] and unknown_fields("not a dict") == []


def test_a_question_with_an_unknown_field_is_answered_and_the_field_named():
    """Accepted, as laya accepts it, but no longer in silence."""
    import warnings

    from laya_onnx.core.errors import UnknownFieldWarning

    plain = {"q": {"type": "score", "instructions": "x", "criteria": ["a", "b"]}}
    typo = {"q": {"type": "score", "instructions": "x", "criteria": ["a", "b"], "critera": ["c"]}}
    with pytest.warns(
        UnknownFieldWarning, match=r"question 'q': field 'critera' .* \(did you mean 'criteria'\?\)"
    ):
        assert normalize_questions(typo) == normalize_questions(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        normalize_questions(plain)


def test_a_question_without_type_says_so_and_names_a_misspelling():
    with pytest.raises(
        ValueError,
        match=r"^question 'q': no 'type' field; add \"type\": one of \['choice', 'noul', 'score'\]$",
    ):
        check_question("q", {"instructions": "x"})
    with pytest.raises(
        ValueError, match=r"^question 'q': no 'type' field \('typ' looks like a misspelling of it\)"
    ):
        check_question("q", {"typ": "noul", "instructions": "x"})
