"""`laya-onnx score` in one process: every row answered as `predict_batch` answers it, in order,
bad rows reported in place, a rerun that resumes instead of starting over, Parquet like JSONL.

The Ray Data path of the same command is tests/serve/test_ray.py's (the `ray` tier).
"""

from __future__ import annotations

import json

import pytest

from laya_onnx.cli import main
from laya_onnx.core.errors import LayaInputError
from laya_onnx.score import scorer as score

pytestmark = pytest.mark.runtime

QUESTIONS = {
    "queue": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "billing and refunds", "tech": "login", "other": "else"},
    },
    "refund": {"type": "noul", "instructions": "Wants a refund?"},
}
STATES = [
    "I was charged twice",
    "the app will not log me in",
    {"msg": "hello", "n": 3},
    "refund please",
    "ok",
] * 5


def _write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _rows(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _score(tiny_english_agent, src, out, batch_size=4):
    scorer = score.local_scorer(tiny_english_agent, QUESTIONS, {}, batch_size)
    return score.score_file(src, out, QUESTIONS, {}, scorer, progress=False)


def test_every_row_equals_predict_batch_in_order(tiny_english_agent, tmp_path):
    src = _write_jsonl(
        tmp_path / "in.jsonl", [json.dumps({"state": s, "id": i}) for i, s in enumerate(STATES)]
    )
    summary = _score(tiny_english_agent, src, tmp_path / "out.jsonl", batch_size=4)
    want = json.loads(json.dumps(tiny_english_agent.predict_batch(STATES, QUESTIONS, batch_size=4)))
    got = _rows(tmp_path / "out.jsonl")
    assert [r["row"] for r in got] == list(range(len(STATES)))
    assert [r["id"] for r in got] == list(range(len(STATES)))
    assert [r["result"] for r in got] == want
    assert summary.as_json() == {"rows": 25, "resumed_after": 0, "written": 25, "errors": 0}


def test_bad_rows_are_reported_in_place_and_the_rest_answered(tiny_english_agent, tmp_path):
    lines = [
        json.dumps({"state": "first"}),
        "{not json",
        json.dumps(["a", "list"]),
        json.dumps({"text": "no state"}),
        json.dumps({"state": None}),  # a state the agent refuses: its own error, not the batch's
        "",
        json.dumps({"state": "last"}),
    ]
    src = _write_jsonl(tmp_path / "in.jsonl", lines)
    summary = _score(tiny_english_agent, src, tmp_path / "out.jsonl", batch_size=8)
    got = _rows(tmp_path / "out.jsonl")
    assert [r["row"] for r in got] == [0, 1, 2, 3, 4, 5]  # the blank line is not a row
    assert "line 2: not valid JSON" in got[1]["error"]
    assert got[2]["error"] == "line 3: a row must be a JSON object with a 'state' field"
    assert got[3]["error"] == "line 4: the row has no 'state' field"
    with pytest.raises(LayaInputError) as refused:
        tiny_english_agent.predict(None, QUESTIONS)
    assert got[4]["error"] == str(refused.value)
    want = json.loads(json.dumps(tiny_english_agent.predict_batch(["first", "last"], QUESTIONS)))
    assert [got[0]["result"], got[5]["result"]] == want
    assert summary.errors == 4


def test_a_rerun_resumes_after_the_rows_written_and_cuts_a_torn_line(tiny_english_agent, tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl", [json.dumps({"state": s}) for s in STATES])
    whole = tmp_path / "whole.jsonl"
    _score(tiny_english_agent, src, whole)
    expected = whole.read_text(encoding="utf-8").splitlines()

    out = tmp_path / "out.jsonl"
    (tmp_path / "out.jsonl.meta.json").write_text((tmp_path / "whole.jsonl.meta.json").read_text())
    out.write_text("\n".join(expected[:9]) + "\n" + expected[9][:20], encoding="utf-8")  # row 9 torn
    summary = _score(tiny_english_agent, src, out)
    assert summary.skipped == 9 and summary.rows == 25
    assert out.read_text(encoding="utf-8").splitlines() == expected
    assert _score(tiny_english_agent, src, out).as_json()["written"] == 0  # complete: nothing to do
    assert out.read_text(encoding="utf-8").splitlines() == expected


def test_a_rerun_with_other_questions_or_a_foreign_file_is_refused(tiny_english_agent, tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl", [json.dumps({"state": "x"})])
    out = tmp_path / "out.jsonl"
    _score(tiny_english_agent, src, out)
    other = {"refund": QUESTIONS["refund"]}
    with pytest.raises(score.ScoreError, match="written for other questions"):
        score.score_file(
            src, out, other, {}, score.local_scorer(tiny_english_agent, other, {}, 4), progress=False
        )
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"row": 0}\n', encoding="utf-8")
    with pytest.raises(score.ScoreError, match="not an output of laya-onnx score"):
        _score(tiny_english_agent, src, foreign)
    edited = tmp_path / "edited.jsonl"
    _score(tiny_english_agent, src, edited)
    edited.write_text('{"row": 5, "result": {}}\n', encoding="utf-8")
    with pytest.raises(score.ScoreError, match="line 1 is not score row 0"):
        _score(tiny_english_agent, src, edited)


def test_parquet_input_equals_jsonl(tiny_english_agent, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    states = [s for s in STATES if isinstance(s, str)]
    pq.write_table(
        pa.table({"state": states, "id": [f"r{i}" for i in range(len(states))]}), tmp_path / "in.parquet"
    )
    _write_jsonl(
        tmp_path / "in.jsonl", [json.dumps({"state": s, "id": f"r{i}"}) for i, s in enumerate(states)]
    )
    _score(tiny_english_agent, tmp_path / "in.parquet", tmp_path / "a.jsonl")
    _score(tiny_english_agent, tmp_path / "in.jsonl", tmp_path / "b.jsonl")
    assert _rows(tmp_path / "a.jsonl") == _rows(tmp_path / "b.jsonl")
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "nostate.parquet")
    with pytest.raises(score.ScoreError, match="no 'state' column"):
        list(score.read_rows(tmp_path / "nostate.parquet"))


def test_cli_scores_a_file_and_reports_bad_input(tiny_english, tiny_english_agent, tmp_path, capsys):
    src = _write_jsonl(tmp_path / "in.jsonl", [json.dumps({"state": s}) for s in STATES[:6]])
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps(QUESTIONS), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = ["score", str(src), "-o", str(out), "--questions", str(questions), "--bundle", str(tiny_english)]
    assert main([*argv, "--no-progress", "--batch-size", "4"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["written"] == 6
    want = json.loads(json.dumps(tiny_english_agent.predict_batch(STATES[:6], QUESTIONS, batch_size=4)))
    assert [r["result"] for r in _rows(out)] == want

    (tmp_path / "in.csv").write_text("state\nx\n", encoding="utf-8")
    assert (
        main(
            [
                "score",
                str(tmp_path / "in.csv"),
                "-o",
                str(tmp_path / "o.jsonl"),
                "--questions",
                str(questions),
                "--bundle",
                str(tiny_english),
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "unknown format '.csv'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["serve"], "give a bundle to serve"),
        (
            ["serve", "some-bundle", "--ray", "c.yaml"],
            "--ray CONFIG takes the bundle, host and port from the config",
        ),
    ],
)
def test_serve_names_its_bundle_or_a_ray_config(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_reports_a_ray_that_cannot_start_as_a_failure(tiny_english, tmp_path, monkeypatch, capsys):
    """Ray failing to start (an overloaded machine, a wrong RAY_ADDRESS) is the machine's failure,
    exit 1 with Ray's reason, not "a bug in laya-onnx"; nothing is written."""
    import types

    fake_ray = types.ModuleType("ray")
    fake_ray.is_initialized = lambda: False

    def init(**_):
        raise Exception("The current node timed out during startup.")

    fake_ray.init = init
    monkeypatch.setitem(__import__("sys").modules, "ray", fake_ray)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    src = _write_jsonl(tmp_path / "in.jsonl", [json.dumps({"state": "x"})])
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps(QUESTIONS), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = ["score", str(src), "-o", str(out), "--questions", str(questions), "--bundle", str(tiny_english)]
    assert main([*argv, "--ray", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "failed: Ray could not join RAY_ADDRESS='10.0.0.9:6379': The current node timed out" in err
    assert "bug" not in err
    assert not out.exists() or out.read_text(encoding="utf-8") == ""
