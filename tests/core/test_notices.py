"""Warnings as the command line and the server show them: one log line each, no file, line or
source text, the library's prefix dropped, and the same text never twice."""

from __future__ import annotations

import logging
import warnings

import pytest

from laya_onnx.core.notices import MAX_LINE, SeenTexts, brief, log_warnings, one_line


@pytest.fixture
def restored_warnings():
    with warnings.catch_warnings():
        yield


def warn_from_two_places(text: str) -> None:
    warnings.warn(text, RuntimeWarning, stacklevel=1)
    warnings.warn(text, RuntimeWarning, stacklevel=1)


def test_each_warning_is_one_line_once(restored_warnings, caplog):
    log_warnings()
    with caplog.at_level(logging.WARNING, logger="laya_onnx"):
        warnings.warn(
            "laya-onnx: provider fallback: CUDAExecutionProvider\n  did not attach",
            RuntimeWarning,
            stacklevel=1,
        )
        warn_from_two_places("laya-onnx: bundle 'b' runs in int8")
        warnings.warn("laya-onnx: bundle 'b' runs in int8", UserWarning, stacklevel=1)
    lines = [r.getMessage() for r in caplog.records if r.name == "laya_onnx"]
    assert lines == ["provider fallback: CUDAExecutionProvider did not attach", "bundle 'b' runs in int8"]
    assert all(".py:" not in line and "warnings.warn" not in line for line in lines)


def warn_here(text: str) -> None:
    warnings.warn(text, RuntimeWarning, stacklevel=1)


def test_distinct_huge_warnings_stay_in_bounded_memory(restored_warnings, caplog):
    """A server warned with a fresh 100 000-character text per request: what it remembers to
    deduplicate stays at its cap, Python's registries gain nothing, and each line is cut short
    (every text used to be kept whole twice: in a set and in `__warningregistry__`)."""
    import sys

    module = sys.modules[__name__]
    vars(module).pop("__warningregistry__", None)
    once_before = len(warnings.onceregistry)
    seen = log_warnings(seen=SeenTexts(size=64))
    with caplog.at_level(logging.WARNING, logger="laya_onnx"):
        for i in range(300):
            warn_here("question %d %s" % (i, "x" * 100_000))
        warn_here("question 299 " + "x" * 100_000)  # among the recent ones: not shown again
    lines = [r.getMessage() for r in caplog.records if r.name == "laya_onnx"]
    assert len(lines) == 300
    assert max(map(len, lines)) <= MAX_LINE + 40
    assert len(seen) == 64
    assert len(getattr(module, "__warningregistry__", {})) <= 1  # at most its "version" entry
    assert len(warnings.onceregistry) == once_before


def test_seen_texts_forget_the_oldest_past_their_size():
    seen = SeenTexts(size=2)
    assert [seen.first(t) for t in ("a", "b", "a", "c", "b", "a")] == [True, True, False, True, True, True]
    assert len(seen) == 2


def test_brief_cuts_a_user_string_and_says_its_length():
    assert brief("q1") == "'q1'"
    assert brief(7) == "7"
    cut = brief("y" * 1_500_000)
    assert cut.startswith("'yyy") and cut.endswith("... (1500000 characters)") and len(cut) < 120


def test_the_tournament_names_a_huge_question_id_cut_short(restored_warnings):
    from laya_onnx.core.tournament import run_tournament

    qid = "q" * 1_500_000
    criteria = {"opt %d" % i: "about %d" % i for i in range(30)}
    qs = {
        qid: {"type": "choice", "instructions": "pick", "criteria": criteria, "option_order": list(range(30))}
    }

    def predict(state, questions, **kwargs):
        return {
            "answers": {
                k: {
                    "type": "choice",
                    "choice": next(iter(q["criteria"])),
                    "confidence": 1.0,
                    "probabilities": {label: 1.0 / len(q["criteria"]) for label in q["criteria"]},
                }
                for k, q in questions.items()
            }
        }

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_tournament(predict, "s", qs, 10)
    texts = [str(w.message) for w in caught if "'option_order' was dropped" in str(w.message)]
    assert len(texts) == 1 and len(texts[0]) < 400 and "(1500000 characters)" in texts[0]


def test_one_line_drops_the_prefixes_and_folds_whitespace():
    assert one_line("laya: a\n   b") == "a b"
    assert one_line(RuntimeWarning("laya-onnx: x")) == "x"
    assert one_line("plain") == "plain"


def test_the_cli_reports_each_warning_once_as_one_line(bundle_factory, capfd, caplog, restored_warnings):
    """`predict --providers cuda` on a CPU build: the fallback once, the random-weights bundle once,
    as log lines, and no Python warning display on stderr (it used to print twice, once with
    `cli.py:186:` and the source line)."""
    import json

    from laya_onnx.cli import main

    request = json.dumps({"state": "x", "questions": {"r": {"type": "noul", "instructions": "R?"}}})
    with caplog.at_level(logging.WARNING, logger="laya_onnx"):
        assert (
            main(
                ["predict", str(bundle_factory("tiny-english")), "--providers", "cuda", "--request", request]
            )
            == 0
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "laya_onnx"]
    assert sum("CUDAExecutionProvider is not available" in line for line in lines) == 1
    assert sum("holds random test weights" in line for line in lines) == 1
    err = capfd.readouterr().err
    assert "Warning:" not in err and ".py:" not in err and "ONNXAgent(" not in err


def test_a_cut_state_warns_once_and_names_predict_long(bundle_factory, restored_warnings):
    from laya_onnx import ONNXAgent
    from laya_onnx.core.errors import StateTruncatedWarning

    questions = {"r": {"type": "noul", "instructions": "Refund?"}}
    long_state = "word " * 2000
    agent = ONNXAgent(bundle_factory("tiny-english"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agent.predict("short", questions)  # nothing cut: nothing said
        first = agent.predict(long_state, questions)
        agent.predict_batch([long_state, long_state], questions)  # said once per agent
    cut = [w for w in caught if issubclass(w.category, StateTruncatedWarning)]
    assert first["usage"]["truncated"] is True and len(cut) == 1
    assert "predict_long(state, questions)" in str(cut[0].message) and "tokens dropped" in str(cut[0].message)
    fresh = ONNXAgent(bundle_factory("tiny-english"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fresh.predict_long(long_state, questions)  # its windows are cut on purpose
    assert not [w for w in caught if issubclass(w.category, StateTruncatedWarning)]
