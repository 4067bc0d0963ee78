"""Server settings from the environment and the CLI: port, host, log level, booleans, limits."""

from __future__ import annotations

import logging

import pytest

from laya_onnx.core import settings
from laya_onnx.core.errors import ConfigError
from laya_onnx.serve import settings as serve_settings

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]


@pytest.mark.parametrize("raw,expect", [(None, 16), ("", 16), ("abc", 16), ("0", 16), ("-3", 16), ("4", 4)])
def test_max_concurrent_env(monkeypatch, raw, expect):
    if raw is not None:
        monkeypatch.setenv("LAYA_MAX_CONCURRENT", raw)
    assert serve_settings.Settings.from_env().max_concurrent == expect


@pytest.mark.parametrize("raw,expect", [(None, 8000), ("", 8000), ("  ", 8000), (" 9000 ", 9000)])
def test_port_env(monkeypatch, raw, expect):
    if raw is not None:
        monkeypatch.setenv("LAYA_PORT", raw)
    assert serve_settings.resolve_port(None) == expect


@pytest.mark.parametrize("raw", ["abc", "0", "70000", "-1", "80.5"])
def test_bad_port_env_is_a_config_error(monkeypatch, raw):
    monkeypatch.setenv("LAYA_PORT", raw)
    with pytest.raises(ConfigError, match="invalid LAYA_PORT"):
        serve_settings.resolve_port(None)


def test_cli_port_wins_and_is_checked(monkeypatch):
    monkeypatch.setenv("LAYA_PORT", "nonsense")
    assert serve_settings.resolve_port(8123) == 8123
    with pytest.raises(ConfigError, match="invalid --port 70000"):
        serve_settings.resolve_port(70000)
    monkeypatch.setenv("LAYA_HOST", " 127.0.0.1 ")
    assert serve_settings.resolve_host(None) == "127.0.0.1"
    assert serve_settings.resolve_host("::1") == "::1"
    monkeypatch.delenv("LAYA_HOST")
    assert serve_settings.resolve_host(None) == "127.0.0.1"  # reachable from elsewhere only on request


def test_log_level_env(monkeypatch):
    assert settings.LOG_LEVEL.read() == logging.INFO
    monkeypatch.setenv("LAYA_LOG_LEVEL", " DEBUG ")
    assert settings.LOG_LEVEL.read() == logging.DEBUG
    monkeypatch.setenv("LAYA_LOG_LEVEL", "loud")
    with pytest.raises(ConfigError, match="invalid LAYA_LOG_LEVEL 'loud'"):
        settings.LOG_LEVEL.read()


def test_env_bool_and_settings(monkeypatch):
    for raw, want in (
        ("1", True),
        ("TRUE", True),
        (" on ", True),
        ("yes", True),
        ("0", False),
        ("off", False),
        ("2", False),
        ("", False),
    ):
        monkeypatch.setenv("LAYA_JEV_STRICT", raw)
        assert settings.JEV_STRICT.read() is want
    monkeypatch.setenv("LAYA_API_KEY", "")
    assert serve_settings.Settings.from_env().api_key is None
    monkeypatch.setenv("LAYA_API_KEY", " k ")  # no client could send it: refused at the start
    with pytest.raises(ConfigError, match="LAYA_API_KEY holds surrounding whitespace"):
        serve_settings.Settings.from_env()
    monkeypatch.delenv("LAYA_API_KEY")
    for raw, want in (("abc", 10.0), ("0", 10.0), ("inf", 10.0), ("nan", 10.0), ("2.5", 2.5)):
        monkeypatch.setenv("LAYA_BODY_READ_TIMEOUT", raw)
        assert serve_settings.Settings.from_env().body_read_timeout == want
    with pytest.raises(TypeError, match="unknown settings: nope"):
        serve_settings.Settings.from_env(nope=1)


def test_cli_serve_bad_port_exits_before_loading(tmp_path, capsys):
    from laya_onnx.cli import main
    from laya_onnx.cli.common import EXIT_USAGE

    assert main(["serve", str(tmp_path / "missing"), "--port", "70000"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "invalid --port 70000" in err and "missing" not in err  # the bundle was never looked at


@pytest.mark.parametrize(
    ("name", "raw"),
    [("LAYA_BATCH_WINDOW_MS", "soon"), ("LAYA_JEV_PROFILE", "openai"), ("LAYA_ROOT_PATH", "x")],
)
def test_cli_serve_bad_app_setting_exits_before_loading(monkeypatch, tmp_path, capsys, name, raw):
    from laya_onnx.cli import main
    from laya_onnx.cli.common import EXIT_USAGE

    monkeypatch.setenv(name, raw)
    assert main(["serve", str(tmp_path / "missing"), "--port", "1"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "invalid %s %r" % (name, raw) in err and "missing" not in err


@pytest.mark.parametrize(
    ("raw", "max_loaded", "tournament_group"),
    [
        (None, None, 0),
        ("", None, 0),
        ("many", None, 0),
        ("0", None, 0),
        ("-3", None, 0),
        (" 7 ", 7, 7),
        ("2", 2, 2),
        ("100", 100, 100),
        ("101", 101, 0),
        ("1", 1, 0),
        ("2.5", None, 0),
    ],
)
def test_int_variables_read_as_laya_serve_reads_them(monkeypatch, raw, max_loaded, tournament_group):
    for name in ("LAYA_MAX_LOADED", "LAYA_TOURNAMENT_GROUP"):
        if raw is not None:
            monkeypatch.setenv(name, raw)
    assert settings.MAX_LOADED.read() == max_loaded
    assert settings.TOURNAMENT_GROUP.read() == tournament_group
