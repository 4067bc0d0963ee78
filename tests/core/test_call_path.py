"""The per-call fast path: questions prepared once (bounded, safely keyed cache) and answers
decoded for all rows of a question at once, bit-identical to decoding row by row."""

import copy

import numpy as np
import pytest

from laya_onnx import ONNXAgent
from laya_onnx.core.calibration import (
    SHARED_WIDTH_MAX,
    Calibration,
    CallLogits,
    decode_answers,
    decode_questions,
)
from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.question_cache import QuestionCache, question_key
from laya_onnx.core.questions import normalize_questions
from laya_onnx.core.sequences import Row

QUESTIONS = {
    "queue": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "money", "tech": None},
    },
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["no", {"level": "soon"}, "now"]},
    "refund": {"type": "noul", "instructions": "Refund?"},
}


@pytest.fixture(scope="module")
def agent(bundle_factory):
    return ONNXAgent(bundle_factory("tiny-english"))


def _row_alone(logits_row: np.ndarray, t: float, order):
    """The reference's per-row arithmetic, written out for one row (laya common.py)."""
    z = logits_row / t
    p = np.exp(z - z.max())
    p /= p.sum()
    if order is not None:
        out = np.empty_like(p)
        out[np.asarray(order)] = p
        p = out
    k = len(p)
    ent = -float((p * np.log(np.clip(p, 1e-12, 1.0))).sum())
    conf = 1.0 if k < 2 else min(1.0, max(0.0, 1.0 - ent / np.log(k)))
    return p, conf, float((np.arange(k) * p).sum())


@pytest.mark.parametrize("k", [1, 2, 3, 7, 8, 9, 16, 33, 100, 255])
def test_decoding_many_rows_at_once_is_bit_identical_to_each_row_alone(k):
    rng = np.random.default_rng(k)
    cal = Calibration.from_config({"temperature": [1.7, 0.9, 2.3]})
    crit = {"o%d" % i: None for i in range(k)}
    order = rng.permutation(k).tolist() if k > 1 else None
    defs = {
        "c": {"type": "choice", "instructions": "x", "criteria": crit},
        "p": {"type": "choice", "instructions": "x", "criteria": crit, "option_order": order or [0]},
        "s": {"type": "score", "instructions": "x", "criteria": ["l%d" % i for i in range(k)]},
    }
    for qid, q in normalize_questions(defs).items():
        logits = (rng.standard_normal((13, k + 5)) * 6).astype(np.float32)[:, :k]
        act = rng.uniform(size=(13, 1)).astype(np.float32)
        t = cal.temperature_for(q.qtype, k)
        many = decode_answers(q, logits, act, cal, digits=None)
        for i, answer in enumerate(many):
            p, conf, expected = _row_alone(logits[i], t, q.option_order)
            assert list(answer["probabilities"].values()) == p.tolist(), (qid, i)
            assert answer["confidence"] == conf and answer["action"]["act_probability"] == float(act[i, 0])
            if q.type == "score":
                assert answer["score"] == expected
    noul = normalize_questions({"n": {"type": "noul", "instructions": "x"}})["n"]
    logits = (rng.standard_normal((9, 2)) * 6).astype(np.float32)
    for i, answer in enumerate(decode_answers(noul, logits, np.ones((9, 1), np.float32), cal, digits=None)):
        assert answer["noul"] == float(_row_alone(logits[i], cal.temperature_for(2, 2), None)[0][1])


def test_questions_decoded_together_answer_bit_for_bit_as_each_alone():
    """Questions of different widths share one padded array (`width_groups`): every number must
    keep the bits it has when the question is decoded alone and when its row is decoded alone."""
    rng = np.random.default_rng(7)
    cal = Calibration.from_config(
        {"temperature": [1.3, 0.7, 2.9], "temperature_by_options": {"choice:2": 0.6}}
    )
    defs: dict = {"n": {"type": "noul", "instructions": "x"}}
    for k in list(range(1, SHARED_WIDTH_MAX + 3)) + [16]:
        crit = {"o%d" % i: None for i in range(k)}
        defs["c%d" % k] = {"type": "choice", "instructions": "x", "criteria": crit}
        defs["p%d" % k] = {
            "type": "choice",
            "instructions": "x",
            "criteria": crit,
            "option_order": rng.permutation(k).tolist(),
        }
        defs["s%d" % k] = {"type": "score", "instructions": "x", "criteria": ["l%d" % i for i in range(k)]}
    qs = list(normalize_questions(defs).values())
    n, m = 6, len(qs)
    scale = rng.choice([0.3, 4.0, 40.0], size=(n * m, 1))
    logits = (rng.standard_normal((n * m, 16)) * scale).astype(
        np.float32
    )  # row i * m + j: state i, question j
    act = rng.uniform(size=(n * m, 2)).astype(np.float32)
    for digits in (None, 4):
        together = decode_questions(qs, logits, act, cal, digits=digits)
        for j, (q, answers) in enumerate(zip(qs, together, strict=True)):
            k = q.n_options
            assert answers == decode_answers(q, logits[j::m, :k], act[j::m], cal, digits=digits), q.qid
            if digits is None and q.type != "noul":
                for i, answer in enumerate(answers):
                    p, conf, expected = _row_alone(
                        logits[i * m + j, :k], cal.temperature_for(q.qtype, k), q.option_order
                    )
                    assert list(answer["probabilities"].values()) == p.tolist(), (q.qid, i)
                    assert answer["confidence"] == conf, (q.qid, i)
                    assert q.type != "score" or answer["score"] == expected


def test_rows_gathered_from_shuffled_passes_decode_as_one_pass_in_order():
    qs = normalize_questions(QUESTIONS)
    n_states, n_q = 5, len(qs)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((n_states * n_q, 4)).astype(np.float32)
    act = rng.uniform(size=(n_states * n_q, 2)).astype(np.float32)
    rows = [
        [
            Row(
                qid=qid,
                ids=[1] * (3 + i),
                markers=[0] * q.n_options,
                qtype=q.qtype,
                options={},
                state_stats={"state_tokens": 3, "state_tokens_dropped": 0, "truncated": False},
            )
            for qid, q in qs.items()
        ]
        for i in range(n_states)
    ]
    for r in rows:
        for row in r:
            row.options = {
                "options": len(row.markers),
                "options_distinct": len(row.markers),
                "tokens_per_option": None,
            }
    cal = Calibration.from_config({})
    natural = CallLogits(qs, n_states)
    natural.add([divmod(r, n_q) for r in range(n_states * n_q)], logits, act)
    order = rng.permutation(n_states * n_q)
    split = CallLogits(qs, n_states)
    for piece in (order[:7], order[7:]):
        split.add([divmod(int(r), n_q) for r in piece], logits[piece], act[piece])
    assert split.decode(rows, cal) == natural.decode(rows, cal)


def test_question_keys_keep_apart_what_renders_differently():
    base = {"q": {"type": "choice", "instructions": "x", "criteria": {"a": 1}}}
    variants = [
        {"q": {"type": "choice", "instructions": "x", "criteria": {"a": v}}}
        for v in (1.0, True, "1", -0.0, 0.0)
    ]
    keys = {question_key(base)} | {question_key(v) for v in variants}
    assert len(keys) == 6
    reordered = {"q": {"criteria": {"a": 1}, "instructions": "x", "type": "choice"}}
    assert question_key(reordered) != question_key(base)
    assert question_key(
        {"q": {"type": "choice", "instructions": "x", "criteria": ["a", "b"]}}
    ) != question_key({"q": {"type": "choice", "instructions": "x", "criteria": ("a", "b")}})
    assert question_key(copy.deepcopy(base)) == question_key(base)

    class Text(str):
        pass

    assert question_key({"q": {"type": "noul", "instructions": Text("x")}}) is None
    assert question_key({"q": {"type": "score", "instructions": "x", "criteria": [object()]}}) is None


def test_repeat_calls_hit_the_cache_and_answer_as_the_first(agent):
    cache = agent.question_cache = QuestionCache(agent.tok)
    first = agent.predict("I was charged twice", QUESTIONS)
    again = agent.predict("I was charged twice", copy.deepcopy(QUESTIONS))
    assert again == first
    info = cache.info()
    assert (info.hits, info.misses) == (1, 1)
    agent.predict("I was charged twice", QUESTIONS, head_max_len=64)  # another head budget: its own entry
    assert cache.info().misses == 2


def test_a_caller_mutating_its_questions_after_a_call_changes_nothing_cached(agent):
    agent.question_cache = QuestionCache(agent.tok)
    questions = copy.deepcopy(QUESTIONS)
    original = agent.predict("late delivery", questions)
    questions["urgency"]["criteria"][1]["level"] = "within the hour"
    changed = agent.predict("late delivery", questions)
    assert changed["answers"]["urgency"]["legend"]["1"] == '{"level": "within the hour"}'
    assert agent.predict("late delivery", copy.deepcopy(QUESTIONS)) == original
    assert original["answers"]["urgency"]["legend"]["1"] == '{"level": "soon"}'


def test_cached_questions_answer_as_questions_prepared_afresh(agent):
    """One question set over other states and budgets, then mutated in place between calls:
    every answer through the cache equals the answer from questions prepared from scratch."""
    cached, fresh = QuestionCache(agent.tok), QuestionCache(agent.tok, maxsize=0)
    questions = copy.deepcopy(QUESTIONS)

    def both(state, **options):
        agent.question_cache = cached
        through_cache = agent.predict(state, questions, **options)
        agent.question_cache = fresh
        assert agent.predict(state, questions, **options) == through_cache, (state, options, questions)
        return through_cache

    first = both("I was charged twice")
    assert both("the app crashes on login")["usage"] != first["usage"]
    both(["hi", "I want a refund"])
    both("I was charged twice", head_max_len=20)
    both("I was charged twice", max_len=40)
    mutations = [
        lambda: questions["refund"].update(instructions="Does the user want money back?"),
        lambda: questions["queue"]["criteria"].update(tech="login problems"),
        lambda: questions["urgency"]["criteria"].append("on fire"),
        lambda: questions["urgency"]["criteria"][1].update(level="today"),
        lambda: questions["queue"].update(criteria=["billing", "tech", "other"]),
        lambda: questions["refund"].update(labels={"false": "no", "true": "yes"}),
        lambda: questions.pop("urgency"),
    ]
    for mutate in mutations:
        before = both("I was charged twice")
        mutate()
        after = both("I was charged twice")
        assert after != before
    assert cached.info().hits > 0
    assert after["answers"]["refund"]["type"] == "noul" and "urgency" not in after["answers"]


def test_uncacheable_questions_are_answered_and_refusals_are_never_cached(agent):
    cache = agent.question_cache = QuestionCache(agent.tok, maxsize=2)

    class Text(str):
        pass

    plain = agent.predict("x", {"n": {"type": "noul", "instructions": "Refund?"}})
    odd = agent.predict("x", {"n": {"type": "noul", "instructions": Text("Refund?")}})
    assert odd == plain
    bad = {"n": {"type": "noul"}}
    for _ in range(2):
        with pytest.raises(InvalidRequest, match="question 'n': no 'instructions'"):
            agent.predict("x", bad)
    for i in range(5):
        agent.predict("x", {"n%d" % i: {"type": "noul", "instructions": "Refund?"}})
    assert cache.info().currsize == 2


def _passes(agent, monkeypatch) -> list[int]:
    sizes: list[int] = []
    run = agent.session.run

    def counted(feeds, **options):
        sizes.append(len(feeds["input_ids"]))
        return run(feeds, **options)

    monkeypatch.setattr(agent.session, "run", counted)
    return sizes


def test_a_large_batch_runs_in_length_buckets_and_answers_in_input_order(agent, monkeypatch):
    states = ["word " * (3 + (7 * i) % 50) + "state %d" % i for i in range(40)]
    questions = {k: QUESTIONS[k] for k in ("queue", "refund")}  # 80 rows
    one_pass = ONNXAgent(agent.bundle.root, bucket_rows=0).predict_batch(states, questions)
    sizes = _passes(agent, monkeypatch)
    bucketed = agent.predict_batch(states, questions)
    assert sizes == [16] * 5
    assert len(bucketed) == len(one_pass)
    for got, want in zip(bucketed, one_pass, strict=True):
        assert got["usage"] == want["usage"]
        for qid, answer in want["answers"].items():
            assert got["answers"][qid].keys() == answer.keys()
            if "choice" in answer:
                assert got["answers"][qid]["choice"] == answer["choice"]
            for key, p in answer.get("probabilities", {"noul": answer.get("noul")}).items():
                mine = got["answers"][qid].get("probabilities", {"noul": got["answers"][qid].get("noul")})[
                    key
                ]
                assert abs(mine - p) <= 1e-4 + 1e-9  # printed values: one unit of the last digit at most
    sizes.clear()
    agent.predict_batch(states, questions, batch_size=10)  # explicit: laya's chunks, 10 states each
    assert sizes == [20] * 4
    sizes.clear()
    agent.predict_batch(states[:8], questions)  # 16 rows: one pass, as laya
    assert sizes == [16]


def test_threads_come_from_the_argument_then_laya_threads(bundle_factory, monkeypatch, caplog):
    bundle = bundle_factory("tiny-english")
    monkeypatch.setenv("LAYA_THREADS", "2")
    assert ONNXAgent(bundle).threads == 2
    assert ONNXAgent(bundle, threads=1).threads == 1
    monkeypatch.setenv("LAYA_THREADS", "many")
    assert ONNXAgent(bundle).threads is None
    assert "invalid LAYA_THREADS 'many'" in caplog.text
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="threads must be a positive integer"):
            ONNXAgent(bundle, threads=bad)
    with pytest.raises(ValueError, match="bucket_rows must be"):
        ONNXAgent(bundle, bucket_rows=-1)


@pytest.mark.parametrize("n_rows", [1, 3, 7, 8, 9, 40])
def test_collate_fills_the_same_feeds_row_by_row_and_vectorised(n_rows, monkeypatch):
    from laya_onnx.core import sequences

    rng = np.random.default_rng(n_rows)
    rows = [
        Row(
            qid="q%d" % i,
            ids=rng.integers(3, 900, size=int(rng.integers(1, 30))).tolist(),
            markers=sorted(rng.choice(40, size=int(rng.integers(1, 6)), replace=False).tolist()),
            qtype=int(rng.integers(0, 3)),
            options={},
        )
        for i in range(n_rows)
    ]
    vectorised = sequences.collate(rows, pad_id=1)
    monkeypatch.setattr(sequences, "COLLATE_VECTOR_ROWS", 10**9)
    by_row = sequences.collate(rows, pad_id=1)
    assert list(vectorised) == list(by_row)
    for name, array in by_row.items():
        assert vectorised[name].dtype == array.dtype and np.array_equal(vectorised[name], array), name
    lengths = [len(r.ids) for r in rows]
    assert by_row["input_ids"].shape == (n_rows, max(lengths))
    assert by_row["attention_mask"].sum(axis=1).tolist() == lengths
    assert [by_row["input_ids"][i, : len(r.ids)].tolist() for i, r in enumerate(rows)] == [
        r.ids for r in rows
    ]
    assert (by_row["input_ids"][by_row["attention_mask"] == 0] == 1).all()
