"""The `LAYA_*` settings table: the only module that names a variable, and each variable's policy
for a value that cannot be read (laya-serve's own fall back as laya-serve does; ours are refused
with a ConfigError naming the variable)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from laya_onnx.core import parsers, settings
from laya_onnx.core.errors import ConfigError
from laya_onnx.core.setting import Setting, add_arguments, markdown

pytestmark = pytest.mark.usefixtures("no_laya_env")

PACKAGE = Path(settings.__file__).resolve().parents[1]
README = PACKAGE.parent / "serve" / "README.md"
#: Readers that take any text: no value of theirs can be bad.
TAKES_ANY_TEXT = {parsers.text, parsers.stripped, parsers.flag, parsers.name_list}
#: One unreadable value per variable whose reader can refuse a value.
BAD = {
    "LAYA_THREADS": "many",
    "LAYA_MAX_PASS_MEMORY": "lots",
    "LAYA_PORT": "80.5",
    "LAYA_LOG_LEVEL": "loud",
    "LAYA_MAX_CONCURRENT": "abc",
    "LAYA_BODY_READ_TIMEOUT": "inf",
    "LAYA_MAX_TOKEN_BUDGET": "lots",
    "LAYA_MAX_BATCH_TOKENS": "3.5",
    "LAYA_TOURNAMENT_GROUP": "101",
    "LAYA_ROOT_PATH": "laya",
    "LAYA_MAX_LOADED": "zero",
    "LAYA_EXTRA_MODELS": "{",
    "LAYA_IDLE_UNLOAD_SECONDS": "nan",
    "LAYA_JEV_PROFILE": "openai",
    "LAYA_BATCH_WINDOW_MS": "soon",
    "LAYA_BATCH_MAX_REQUESTS": "0",
    "LAYA_SHUTDOWN_GRACE_SECONDS": "-1",
    "LAYA_KEEPALIVE_TIMEOUT": "0",
    "LAYA_HEADER_READ_TIMEOUT": "never",
    "LAYA_ACCESS_LOG": "verbose",
    "LAYA_LOG_FORMAT": "yaml",
    "LAYA_INT8_KERNEL": "vnni",
    "LAYA_CPU_AMP": "fp16",
    "LAYA_MAX_REQUEST_SECONDS": "0",
    "LAYA_REQUEST_TIMEOUT": "forever",
    "LAYA_BODY_BUFFER": "-1M",
    "LAYA_SEND_TIMEOUT": "0",
    "LAYA_MAX_CONNECTIONS": "-1",
}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def variables_named_outside_the_table(root: Path) -> list[str]:
    """`path:line: text` of every string constant in code (docstrings and comments aside) under
    `root` that holds a `LAYA_` name, but for the table's own module."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.resolve() == Path(settings.__file__).resolve():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and settings.PREFIX in node.value
                and id(node) not in docstrings
            ):
                found.append("%s:%d: %r" % (path.relative_to(root.parent), node.lineno, node.value[:80]))
    return found


def test_only_the_settings_module_names_a_variable():
    assert variables_named_outside_the_table(PACKAGE) == []


def test_the_check_sees_a_name_in_code_but_not_in_a_docstring(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "ok.py").write_text(
        '"""Reads LAYA_THREADS."""\n\n\ndef f():\n    """LAYA_PORT."""\n    # LAYA_HOST\n'
    )
    (pkg / "bad.py").write_text('import os\n\nN = os.environ.get("LAYA_THREADS")\nM = f"{N} LAYA_PORT"\n')
    found = variables_named_outside_the_table(pkg)
    assert [line.split(":")[:2] for line in found] == [["pkg/bad.py", "3"], ["pkg/bad.py", "4"]]


def test_the_documentation_table_is_the_generated_one():
    text = README.read_text(encoding="utf-8")
    start = text.index("\n", text.index("<!-- settings table")) + 1
    end = text.index("<!-- end of settings table -->")
    assert text[start:end] == markdown(settings.TABLE.values()), (
        "serve/README.md's settings table is out of date: replace it with the output of "
        "python -m laya_onnx.core.settings --markdown"
    )


def test_the_table_is_every_setting_once():
    entries = [v for v in vars(settings).values() if isinstance(v, Setting)]
    assert {s.env for s in entries} == set(settings.TABLE)
    assert len(entries) == len(settings.TABLE)
    for s in entries:
        assert s.env.startswith(settings.PREFIX) and s.help and s.layer in ("core", "serve", "bench")
        assert s.compat or s.on_bad == "refuse", "%s is ours: a bad value is refused" % s.env


def test_every_reader_that_can_refuse_has_a_bad_example():
    can_refuse = {s.env for s in settings.TABLE.values() if s.parse not in TAKES_ANY_TEXT}
    assert can_refuse == set(BAD)


@pytest.mark.parametrize("name", sorted(BAD))
def test_an_unreadable_value_does_what_the_table_says(monkeypatch, caplog, name):
    entry = settings.TABLE[name]
    monkeypatch.setenv(name, BAD[name])
    caplog.set_level(logging.WARNING)
    if entry.on_bad == "refuse":
        with pytest.raises(ConfigError) as refusal:
            entry.read()
        assert str(refusal.value).startswith("invalid %s" % name)
        if entry.show_value:
            assert repr(BAD[name]) in str(refusal.value)
        return
    assert entry.compat  # only laya-serve's own variables fall back
    assert entry.read() == entry.default
    warned = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    if entry.on_bad == "warn":
        assert warned and warned[0].startswith("invalid %s %r: " % (name, BAD[name]))
    else:
        assert warned == []


def test_ours_are_refused_with_the_reason():
    cases = {
        "LAYA_BATCH_MAX_REQUESTS": "invalid LAYA_BATCH_MAX_REQUESTS '0': must be a positive integer",
        "LAYA_KEEPALIVE_TIMEOUT": "invalid LAYA_KEEPALIVE_TIMEOUT '0': must be a number of seconds > 0",
        "LAYA_ACCESS_LOG": "invalid LAYA_ACCESS_LOG 'verbose': must be one of text, json, off",
        "LAYA_LOG_FORMAT": "invalid LAYA_LOG_FORMAT 'yaml': must be one of text, json",
        "LAYA_MAX_PASS_MEMORY": "invalid LAYA_MAX_PASS_MEMORY 'lots': must be a byte count such as 2G",
    }
    for name, message in cases.items():
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(name, BAD[name])
            with pytest.raises(ConfigError) as refusal:
                settings.TABLE[name].read()
        assert str(refusal.value).startswith(message)


def test_laya_serve_fallbacks(monkeypatch):
    for raw, want in (("4", 4), ("0", 16), ("-3", 16), ("abc", 16), ("", 16), ("  ", 16)):
        monkeypatch.setenv("LAYA_MAX_CONCURRENT", raw)
        assert settings.MAX_CONCURRENT.read() == want
    for raw, want in (("2.5", 2.5), ("-4", 0.0), ("inf", 0.0), ("x", 0.0)):
        monkeypatch.setenv("LAYA_IDLE_UNLOAD_SECONDS", raw)
        assert settings.IDLE_UNLOAD_SECONDS.read() == want
    monkeypatch.setenv("LAYA_THREADS", " 3 ")
    assert settings.THREADS.read() == 3


def test_blank_is_unset_but_the_api_key_is_taken_as_set(monkeypatch):
    monkeypatch.setenv("LAYA_PORT", "  ")
    assert settings.PORT.read() == 8000
    monkeypatch.setenv("LAYA_API_KEY", "")
    assert settings.API_KEY.read() is None
    monkeypatch.setenv("LAYA_API_KEY", " k ")
    assert settings.API_KEY.read() == " k "
    assert settings.PORT.read({"LAYA_PORT": "9000"}) == 9000  # an environment of one's own


def test_flags_name_their_variable_and_default():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser, settings.PORT, settings.THREADS)
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["port"] == "port (default $LAYA_PORT, else 8000)"
    assert "$LAYA_THREADS" in helps["threads"]
    assert parser.parse_args([]).port is None and parser.parse_args(["--port", "1"]).port == 1
    with pytest.raises(AssertionError, match="LAYA_API_KEY has no command-line flag"):
        add_arguments(parser, settings.API_KEY)


def test_a_flag_refuses_what_its_variable_refuses(capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="serve")
    add_arguments(parser, settings.LOG_FORMAT)
    assert parser.parse_args(["--log-format", "json"]).log_format == "json"
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--log-format", "xml"])
    assert exit_.value.code == 2
    assert "argument --log-format: must be one of text, json" in capsys.readouterr().err


def test_without_settings_drops_every_variable():
    env = {"PATH": "/bin", "LAYA_PORT": "1", "LAYA_ANYTHING": "x"}
    assert settings.without_settings(env) == {"PATH": "/bin"}
