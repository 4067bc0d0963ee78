"""Warnings as the command line and the server show them: one log line each, no file, line or
source text, the library's prefix dropped, and the same text never twice."""

from __future__ import annotations

import logging
import warnings

import pytest

from laya_onnx.core.notices import log_warnings, one_line


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
