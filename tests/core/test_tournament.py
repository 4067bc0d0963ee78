"""Large choices answered by elimination (`laya_onnx.core.tournament`, `ONNXAgent.predict(tournament=)`).

The first half runs on a fake `predict` whose preferences are known, so the elimination can be
checked against what it must find; the second half runs the tiny bundles; the `reference` tests
compare with laya 0.4.15's own tournament (`laya.shortlist.predict_tournament` and laya-serve's
`_predict_with_tournament`) on the same checkpoints.
"""

from __future__ import annotations

import warnings

import pytest

from laya_onnx.core.sequences import OPTION_SHRINK_BELOW
from laya_onnx.core.tournament import (
    check_group_size,
    fitting_group_size,
    large_choices,
    run_tournament,
    split_groups,
)

# -- a predict with known preferences ------------------------------------------------------


def weight(label: str) -> float:
    """A fixed preference for label "opt i" (i < 257): a scrambled order of distinct integers, so
    no two options tie even after the 4-decimal rounding of a probability."""
    i = int(label.split()[1])
    return float((i * 37) % 257 + 1)


class Recorder:
    """Answers every question by normalising the label weights it is shown (what a model that
    ranks options independently of their neighbours would do), and records each call."""

    def __init__(self):
        self.calls = []

    def __call__(self, state, questions, **kwargs):
        self.calls.append((questions, kwargs))
        answers = {}
        for qid, q in questions.items():
            if q["type"] == "noul":
                answers[qid] = {"type": "noul", "noul": 0.7, "confidence": 0.7}
                continue
            labels = list(q["criteria"])
            total = sum(weight(label) for label in labels)
            probs = {label: round(weight(label) / total, 4) for label in labels}
            answers[qid] = {
                "type": "choice",
                "choice": max(labels, key=weight),
                "probabilities": probs,
                "confidence": 0.5,
            }
        n_rows = len(questions)
        return {
            "model": "fake",
            "answers": answers,
            "usage": {"input_tokens": 7 * n_rows, "output_tokens": 0, "state_tokens": 3},
        }


def choice(n, **extra):
    return {"type": "choice", "instructions": "pick", "criteria": ["opt %d" % i for i in range(n)], **extra}


# -- pure helpers --------------------------------------------------------------------------


@pytest.mark.parametrize("n,g", [(17, 16), (255, 16), (101, 7), (100, 2), (33, 32)])
def test_split_groups_is_contiguous_near_equal_and_bounded(n, g):
    labels = list(range(n))
    groups = split_groups(labels, g)
    assert [x for part in groups for x in part] == labels
    sizes = {len(part) for part in groups}
    assert max(sizes) <= g and max(sizes) - min(sizes) <= 1
    assert len(groups) == -(-n // g)


@pytest.mark.parametrize("bad", [1, 0, -3, True, 2.0, "16", None])
def test_group_size_must_be_an_int_of_at_least_2(bad):
    with pytest.raises(ValueError, match="group_size must be an integer of at least 2"):
        check_group_size(bad)


def test_large_choices_picks_choices_over_the_group_in_question_order():
    qs = {"a": choice(5), "n": {"type": "noul", "instructions": "x"}, "b": choice(30), "c": choice(17)}
    assert list(large_choices(qs, 16)) == ["b", "c"]
    assert large_choices(qs, 30) == {}


def test_fitting_group_size_bounds_only_choices_that_do_not_fit():
    head = 192
    room = head - OPTION_SHRINK_BELOW  # 176 tokens for options without shrinking
    assert fitting_group_size([[3] * 10], head) is None  # 30 tokens: one pass reads them whole
    assert fitting_group_size([[4] * 100], head) == room // 4
    # the longest options set the bound: any g of them must fit (3 long ones + 14 short ones)
    assert fitting_group_size([[49] * 3 + [2] * 100], head) == 3 + (room - 3 * 49) // 2
    # several choices: the tightest non-fitting one wins, a fitting one is ignored
    assert fitting_group_size([[2] * 5, [8] * 50, [4] * 60], head) == room // 8
    # never below a pair
    assert fitting_group_size([[49] * 10], 60) == 2


# -- elimination on the fake ---------------------------------------------------------------


@pytest.mark.parametrize("n,g", [(255, 16), (255, 2), (101, 10), (40, 39), (17, 16)])
def test_elimination_finds_the_argmax_and_reports_every_option(n, g):
    predict = Recorder()
    qs = {"c": choice(n), "n": {"type": "noul", "instructions": "refund?"}}
    out = run_tournament(predict, "state", qs, g)
    answer = out["answers"]["c"]
    labels = qs["c"]["criteria"]
    assert answer["choice"] == max(labels, key=weight)
    assert list(answer["probabilities"]) == labels  # every option, criteria order
    assert abs(sum(answer["probabilities"].values()) - 1.0) < 1e-3
    assert answer["choice"] == max(answer["probabilities"], key=answer["probabilities"].get)
    finalists = answer["x_tournament"]["finalists"]
    assert len(finalists) <= g and answer["choice"] in finalists
    assert all(answer["probabilities"][label] == 0.0 for label in labels if label not in finalists)
    assert out["answers"]["n"] == {"type": "noul", "noul": 0.7, "confidence": 0.7}
    # rounds: one call each, then the final call with every question
    rounds = answer["x_tournament"]["rounds"]
    assert len(predict.calls) == rounds + 1
    assert set(predict.calls[-1][0]) == {"c", "n"}
    assert predict.calls[-1][0]["c"]["criteria"] == finalists
    # usage: input tokens over every call, the rest from the final call
    assert out["usage"] == {
        "input_tokens": 7 * sum(len(q) for q, _ in predict.calls),
        "output_tokens": 0,
        "state_tokens": 3,
    }


def test_rounds_share_one_call_across_questions_and_forward_controls():
    predict = Recorder()
    qs = {"a": choice(40), "b": choice(20), "s": choice(3)}
    out = run_tournament(predict, "s", qs, 8, max_len=300, min_confidence=0.4)
    first_round = predict.calls[0][0]
    # a: 40 -> 5 groups of 8; b: 20 -> 3 groups (7/7/6); numbered in question order
    assert list(first_round) == [str(i) for i in range(8)]
    assert [len(first_round[str(i)]["criteria"]) for i in range(8)] == [8, 8, 8, 8, 8, 6, 7, 7]
    assert all(kw == {"max_len": 300, "min_confidence": 0.4} for _, kw in predict.calls)
    assert out["answers"]["s"] == Recorder()("s", {"s": qs["s"]})["answers"]["s"]  # untouched
    assert "x_tournament" not in out["answers"]["s"]
    assert out["answers"]["a"]["x_tournament"]["rounds"] == 1  # 5 winners fit a group of 8
    assert out["answers"]["b"]["x_tournament"] == {
        "finalists": out["answers"]["b"]["x_tournament"]["finalists"],
        "rounds": 1,
    }


def test_no_large_choice_is_one_plain_call():
    predict = Recorder()
    qs = {"a": choice(16)}
    assert run_tournament(predict, "s", qs, 16) == Recorder()("s", qs)
    assert len(predict.calls) == 1


def test_dict_criteria_keep_descriptions_and_the_callers_questions_are_not_mutated():
    predict = Recorder()
    criteria = {"opt %d" % i: "about %d" % i for i in range(50)}
    qs = {
        "c": {"type": "choice", "instructions": "pick", "criteria": criteria, "option_order": list(range(50))}
    }
    before = repr(qs)
    with pytest.warns(RuntimeWarning, match="'option_order' was dropped"):
        out = run_tournament(predict, "s", qs, 10)
    assert repr(qs) == before
    for questions, _ in predict.calls:
        for q in questions.values():
            assert "option_order" not in q
            assert all(q["criteria"][k] == criteria[k] for k in q["criteria"])
    assert out["answers"]["c"]["x_tournament"]["option_order_dropped"] is True


def test_a_bad_question_is_refused_under_its_own_id_before_any_round():
    predict = Recorder()
    qs = {"big": choice(40), "bad": {"type": "choice", "instructions": "x", "criteria": ["a", "a"]}}
    with pytest.raises(ValueError, match="question 'bad': choice label 1 .* repeats label 0"):
        run_tournament(predict, "s", qs, 8)
    assert predict.calls == []


def test_a_reply_without_answers_is_named():
    with pytest.raises(TypeError, match="predict must return an answers dict"):
        run_tournament(lambda s, q, **kw: {"answers": None}, "s", {"c": choice(20)}, 4)


# -- ONNXAgent -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(bundle_factory):
    from laya_onnx import ONNXAgent

    return ONNXAgent(bundle_factory("tiny-english"))


LABELS = ["route %d to %s" % (i, team) for i, team in enumerate(["billing", "tech", "refunds", "sales"] * 64)]


def test_agent_tournament_is_opt_in_and_answers_every_option(agent):
    qs = {"q": {"type": "choice", "instructions": "Which queue?", "criteria": LABELS[:255]}}
    # one pass cannot even place 255 option markers in max_len=512
    with pytest.raises(ValueError, match="only 126 of its 255 option markers fit"):
        agent.predict("I was charged twice", qs)
    out = agent.predict("I was charged twice", qs, tournament=True)
    answer = out["answers"]["q"]
    group = agent.tournament_group_size(qs)
    assert group is not None and 2 <= group < 255
    assert list(answer["probabilities"]) == LABELS[:255]
    assert abs(sum(answer["probabilities"].values()) - 1.0) < 1e-3
    assert answer["choice"] == max(answer["probabilities"], key=answer["probabilities"].get)
    assert len(answer["x_tournament"]["finalists"]) <= group
    assert out == agent.predict("I was charged twice", qs, tournament=group)
    finalists = {"q": {**qs["q"], "criteria": answer["x_tournament"]["finalists"]}}
    final = agent.predict("I was charged twice", finalists)
    assert out["usage"]["input_tokens"] > final["usage"]["input_tokens"]  # rounds are counted
    assert answer["confidence"] == final["answers"]["q"]["confidence"]
    assert all(answer["probabilities"][k] == p for k, p in final["answers"]["q"]["probabilities"].items())


def test_agent_tournament_true_runs_no_round_when_every_choice_fits(agent):
    qs = {"q": {"type": "choice", "instructions": "Which?", "criteria": ["a", "b", "c"]}}
    assert agent.tournament_group_size(qs) is None
    assert agent.predict("x", qs, tournament=True) == agent.predict("x", qs)


def test_agent_derived_group_keeps_every_option_whole(agent):
    """At the derived group size no option is shrunk; one more option and some would be."""
    from laya_onnx.core.questions import normalize_questions
    from laya_onnx.core.sequences import build_head

    qs = {"q": {"type": "choice", "instructions": "Which?", "criteria": LABELS[:120]}}
    g = agent.tournament_group_size(qs)
    longest = sorted(LABELS[:120], key=lambda label: -len(agent.tok.encode(" " + label)))
    whole = normalize_questions({"q": {**qs["q"], "criteria": longest[:g]}})["q"]
    assert build_head(agent.tok, whole, agent.head_max_len).options["tokens_per_option"] is None
    over = normalize_questions({"q": {**qs["q"], "criteria": longest[: g + 1]}})["q"]
    assert build_head(agent.tok, over, agent.head_max_len).options["tokens_per_option"] is not None


def test_agent_batch_tournament_equals_predict_per_state(agent):
    qs = {"q": {"type": "choice", "instructions": "Which queue?", "criteria": LABELS[:150]}}
    states = ["I was charged twice", "the app will not log me in", "I want to buy more seats"]
    with pytest.raises(ValueError, match="option markers fit"):
        agent.predict_batch(states, qs)
    batch = agent.predict_batch(states, qs, tournament=True, batch_size=2)
    assert batch == [agent.predict(s, qs, tournament=True) for s in states]
    assert all("x_tournament" in r["answers"]["q"] for r in batch)
    with pytest.raises(TypeError, match="predict_batch expects a list of states"):
        agent.predict_batch("one state", qs, tournament=True)
    with pytest.raises(ValueError, match="tournament must be True"):
        agent.predict_batch(states, qs, tournament=1)


@pytest.mark.parametrize("bad", [1, 0, "yes", 2.5])
def test_agent_tournament_argument_is_checked(agent, bad):
    with pytest.raises(ValueError, match="tournament must be True, False/None, or a group size"):
        agent.predict(
            "x", {"q": {"type": "choice", "instructions": "x", "criteria": LABELS[:20]}}, tournament=bad
        )


# -- against the reference -----------------------------------------------------------------


@pytest.fixture(scope="module")
def runtimes(checkpoint_factory, bundle_factory):
    """preset -> (laya.Agent, ONNXAgent) on the same tiny checkpoint, loaded once per module."""
    pytest.importorskip("laya.serve")
    from laya_onnx.parity.runner import load_runtimes

    loaded = {}

    def get(preset):
        if preset not in loaded:
            loaded[preset] = load_runtimes(checkpoint_factory(preset), bundle_factory(preset))
        return loaded[preset]

    return get


DESCRIBED = {label: "tickets about %s" % label.split()[-1] for label in LABELS[:120]}
MIXED = {
    "q": {"type": "choice", "instructions": "Queue?", "criteria": DESCRIBED},
    "r": {"type": "choice", "instructions": "Team?", "criteria": LABELS[:30]},
    "s": {"type": "score", "instructions": "Urgency?", "criteria": ["low", "mid", "high"]},
    "n": {"type": "noul", "instructions": "Refund?"},
}
CONTROLS = {"min_confidence": 0.3, "max_len": 400, "head_max_len": 160}
# (preset, group, state, questions, controls): each preset once, every group shape once; the
# reference runs torch on CPU, so the cases are few and small.
CASES = [
    (
        "tiny-english",
        16,
        "I was charged twice",
        {"q": {"type": "choice", "instructions": "Queue?", "criteria": LABELS[:255]}},
        {},
    ),
    ("tiny-english", 5, {"ticket": 7, "body": "app crashes at login"}, MIXED, CONTROLS),
    (
        "tiny-english",
        2,
        ["hello", "I need a new invoice"],
        {"q": {"type": "choice", "instructions": "Queue?", "criteria": LABELS[:24]}},
        {},
    ),
    ("tiny-multilingual", 7, "Fui cobrado duas vezes", MIXED, {}),
    (
        "tiny-typed-decisions",
        16,
        "refund please",
        {"q": {"type": "choice", "instructions": "Queue?", "criteria": LABELS[:101]}},
        CONTROLS,
    ),
]


@pytest.mark.reference
@pytest.mark.torch
@pytest.mark.parametrize("preset,group,state,questions,controls", CASES)
def test_tournament_equals_laya_serve(runtimes, preset, group, state, questions, controls):
    """`predict(tournament=g)` is laya-serve's LAYA_TOURNAMENT_GROUP=g answer: same rounds, same
    finalists, same decisions and gate, probabilities within 1e-5, same usage."""
    from laya.serve import _predict_with_tournament

    ref, ours = runtimes(preset)
    theirs = _predict_with_tournament(ref, state, questions, group, **controls)
    mine = ours.predict(state, questions, tournament=group, **controls)
    assert mine["usage"] == theirs["usage"]
    assert any("x_tournament" in a for a in mine["answers"].values())
    for qid, a in theirs["answers"].items():
        b = mine["answers"][qid]
        assert list(b) == list(a), qid
        assert b.get("choice") == a.get("choice") and b.get("x_tournament") == a.get("x_tournament")
        assert b.get("abstention") == a.get("abstention")
        if "probabilities" in a:
            assert list(b["probabilities"]) == list(a["probabilities"])
            assert max(abs(a["probabilities"][k] - b["probabilities"][k]) for k in a["probabilities"]) <= 1e-5


@pytest.mark.reference
@pytest.mark.torch
def test_dropped_option_order_equals_laya_shortlist(runtimes):
    """A narrowed choice with an option_order: laya's predict_tournament drops it too."""
    from laya.shortlist import predict_tournament

    ref, ours = runtimes("tiny-english")
    qs = {
        "q": {
            "type": "choice",
            "instructions": "Queue?",
            "criteria": LABELS[:40],
            "option_order": list(range(40))[::-1],
        }
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        theirs = predict_tournament(ref, "refund please", qs, group_size=8)
        mine = ours.predict("refund please", qs, tournament=8)
    meta = theirs["tournament"]["q"]
    assert mine["answers"]["q"]["x_tournament"] == {
        "finalists": meta["labels"],
        "rounds": meta["rounds"],
        "option_order_dropped": True,
    }
    assert mine["answers"]["q"]["choice"] == theirs["answers"]["q"]["choice"]
    finals = theirs["answers"]["q"]["probabilities"]
    assert all(abs(mine["answers"]["q"]["probabilities"][k] - p) <= 1e-5 for k, p in finals.items())
