"""The README's "A first answer" works as printed: its commands make the bundle its Python opens,
and the Python prints the answer; its question table states the limits the code keeps."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## %s\n" % title)
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.DOTALL)]


def first_answer() -> tuple[list[str], str]:
    """The shell lines run before the Python, and the Python."""
    blocks = code_blocks(section("A first answer"))
    python = [i for i, (lang, _) in enumerate(blocks) if lang == "python"]
    assert python, "the section has no Python example"
    before = [code for lang, code in blocks[: python[0]] if lang == "bash"]
    return [line for code in before for line in code.splitlines()], blocks[python[0]][1]


def test_the_commands_before_the_python_make_the_bundle_it_opens():
    shell, python = first_answer()
    opened = re.search(r'ONNXAgent\("([^"]+)"\)', python)
    assert opened, "the Python opens no bundle folder"
    made = [
        line
        for line in shell
        if re.search(r"laya-onnx export \S+ -o %s(\s|$)" % re.escape(opened.group(1)), line)
    ]
    assert made, "no command before the Python writes %s" % opened.group(1)


def test_the_python_prints_the_answers(bundle_factory, tmp_path):
    _, python = first_answer()
    folder = re.search(r'ONNXAgent\("([^"]+)"\)', python).group(1)
    (tmp_path / folder).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / folder).symlink_to(bundle_factory("tiny-english"), target_is_directory=True)
    run = subprocess.run(
        [sys.executable, "-c", python], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["model"] == "laya-rl-agent-onnx"
    assert set(result["answers"]) == {"queue", "urgency", "refund"}
    assert result["answers"]["refund"]["abstention"] in {"passed", "abstained"}


def test_the_question_table_states_the_limits_the_code_keeps():
    """The question types' limits as the README states them are the ones the code keeps: no lower
    bound above one (the library answers one option and one level, as laya does) and the
    server's caps as its checks hold them."""
    pytest.importorskip("aiohttp")
    from laya_onnx.serve.schema import MAX_CHOICE_OPTIONS, MAX_REQUEST_SCORE_LEVELS

    text = README.read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(choice|score)` \|.*$", text, re.M)}
    assert set(rows) == {"choice", "score"}
    for kind, cap in (("choice", MAX_CHOICE_OPTIONS), ("score", MAX_REQUEST_SCORE_LEVELS)):
        stated = re.search(r"the server takes up to (\d+)", rows[kind])
        assert stated is not None and int(stated.group(1)) == cap, rows[kind]
        assert not re.search(r"\b[2-9] to \d+", rows[kind]), rows[kind]
    assert "one is answered with certainty" in rows["choice"]
