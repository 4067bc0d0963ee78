"""The `laya-onnx` command line: help, version, reading requests, and one exit-status rule for all.

0 success; 1 the command ran and failed; 2 bad input, usage or configuration (argparse's code).
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import subprocess
import sys
import textwrap

import pytest

from laya_onnx import __version__
from laya_onnx.cli import build_parser, main
from laya_onnx.cli.common import EXIT_FAILED, EXIT_USAGE, UsageError, read_json_argument
from laya_onnx.cli.errors import exit_status

pytestmark = pytest.mark.runtime

REQUEST = {"state": "I was charged twice", "questions": {"r": {"type": "noul", "instructions": "Refund?"}}}


def _choices(parser):
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return {} if sub is None else sub.choices


def _subcommands():
    return _choices(build_parser())


def _parsers(parser=None, path=()):
    """Every parser that takes options, by its command words: ("bench", "http") and so on."""
    for name, sub in _choices(parser or build_parser()).items():
        yield (*path, name), sub
        yield from _parsers(sub, (*path, name))


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"laya-onnx {__version__}"


_ALL_PARSERS = sorted(_parsers())


@pytest.mark.parametrize("words, parser", _ALL_PARSERS, ids=[" ".join(words) for words, _ in _ALL_PARSERS])
def test_every_option_says_what_it_does(words, parser):
    for action in parser._actions:
        assert action.help and action.help.strip(), f"{words} {action.option_strings or action.dest}"


def test_top_level_help_speaks_to_a_user(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in _subcommands():
        assert command in out
    assert "examples:" in out and "laya-onnx predict" in out
    assert "exit status: 0 success; 1 the command ran and failed" in out and "2 bad input" in out
    assert "layer" not in out and "import" not in out


BLOCKED_HELP = textwrap.dedent("""
    import sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "transformers", "onnx", "onnxruntime", "aiohttp", "laya"):
                raise ImportError("blocked in this test: " + name)

    sys.meta_path.insert(0, Block())
    from laya_onnx.cli import main
    main(sys.argv[1:])
""")


def _blocked_help(*words):
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED_HELP, *words, "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_help_lists_the_presets_without_torch():
    from laya_onnx.checkpoints.presets import PRESETS

    out = _blocked_help("make-checkpoint")
    for name in PRESETS:
        assert name in out


def test_help_imports_neither_torch_nor_onnxruntime_nor_aiohttp():
    from laya_onnx.bench.http import DEFAULT_DEADLINE_S

    assert "0.15" in _blocked_help("export")  # the int8 gate, read from the exporter's table
    assert f"default {DEFAULT_DEADLINE_S}" in _blocked_help("bench", "http")
    for words in (("bench",), ("bench", "agent"), ("bench", "saturate"), ("bench", "memory"), ("serve",)):
        _blocked_help(*words)


def test_top_level_help_builds_no_commands_options():
    """`laya-onnx --help` lists the commands by their help line: no layer is imported for it."""
    code = (
        "import sys\n"
        "from laya_onnx.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print([m for m in sys.modules if m.split('.')[0] == 'numpy' or m.startswith("
        "('laya_onnx.export', 'laya_onnx.bench', 'laya_onnx.checkpoints', 'laya_onnx.core.judge'))])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_help_defaults_are_the_modules_own(monkeypatch):
    """What --help says a default is comes from the constant the code runs with."""
    from laya_onnx.bench import agent, http, memory, saturate
    from laya_onnx.core import bundle
    from laya_onnx.export import precision

    monkeypatch.setattr(http, "DEFAULT_DEADLINE_S", 12.5)
    monkeypatch.setattr(http, "DEFAULT_CLIENT_COUNTS", (2, 4))
    monkeypatch.setattr(saturate, "DEFAULT_CLIENTS", 7)
    monkeypatch.setattr(agent, "DEFAULT_REPEATS", 9)
    monkeypatch.setattr(memory, "DEFAULT_TOKENS", 1234)
    monkeypatch.setitem(
        precision.PRECISION_BARS, "int8", precision.PrecisionBar(max_abs_dp=0.33, min_agreement=0.77)
    )
    monkeypatch.setattr(
        precision, "DEFAULT_INT8_PLAN", precision.Int8Plan(keep_fp32=("mlp.Wo",), weight_bits=7)
    )
    monkeypatch.setattr(bundle, "DEFAULT_EXTERNAL_DATA_THRESHOLD", 3 << 20)
    parsers = dict(_parsers())

    def option(words, flag):
        return next(a for a in parsers[words]._actions if flag in a.option_strings)

    assert option(("bench", "http"), "--deadline").default == 12.5
    assert option(("bench", "http"), "--clients").default == "2,4"
    assert option(("bench", "saturate"), "--clients").default == 7
    assert option(("bench", "agent"), "--repeats").default == 9
    assert option(("bench", "memory"), "--tokens").default == 1234
    assert "int8 0.33" in option(("export",), "--gate-max-dp").help
    assert "int8 0.77" in option(("export",), "--gate-min-agreement").help
    assert "(default: mlp.Wo)" in option(("export",), "--int8-keep-fp32").help
    assert "(default: 7)" in option(("export",), "--int8-weight-bits").help
    assert "(default 3; 0: always)" in option(("export",), "--external-data-threshold").help


# -- reading --request ---------------------------------------------------------------------------
def test_request_from_a_missing_file_or_a_directory(tmp_path):
    with pytest.raises(UsageError, match=r"--request file '.*missing.json' does not exist"):
        read_json_argument(f"@{tmp_path / 'missing.json'}", "--request")
    with pytest.raises(UsageError, match="is a directory"):
        read_json_argument(f"@{tmp_path}", "--request")


def test_request_that_is_not_utf8(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"state": "x\xff", "questions": {}}')
    with pytest.raises(
        UsageError, match=r"--request file '.*bad.json' is not valid UTF-8 \(byte 0xff at offset 12\)"
    ):
        read_json_argument(f"@{bad}", "--request")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(bad.read_bytes())))
    with pytest.raises(UsageError, match=r"--request - \(stdin\) is not valid UTF-8"):
        read_json_argument("-", "--request")
    # What POSIX Python makes of a non-UTF-8 byte in argv (surrogateescape).
    undecoded = b'{"state": "x\xff"}'.decode("utf-8", "surrogateescape")
    with pytest.raises(UsageError, match="--request is not valid UTF-8"):
        read_json_argument(undecoded, "--request")


def test_request_that_is_not_json_and_one_that_is(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match=r"--request is not valid JSON \(Expecting"):
        read_json_argument('{"state": ', "--request")
    with_bom = tmp_path / "bom.json"
    with_bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(REQUEST).encode())
    assert read_json_argument(f"@{with_bom}", "--request") == REQUEST
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(REQUEST).encode())))
    assert read_json_argument("-", "--request") == REQUEST
    # A JSON surrogate escape is ASCII on the command line: it parses, and the core refuses it.
    assert read_json_argument('"\\ud800"', "--request") == "\ud800"


# -- exit status ---------------------------------------------------------------------------------
def _run(capsys, argv):
    status = main(argv)
    return status, capsys.readouterr()


def test_predict_exit_statuses(bundle_factory, tmp_path, capsys):
    bundle = str(bundle_factory("tiny-english"))
    status, out = _run(capsys, ["predict", bundle, "--compact", "--request", json.dumps(REQUEST)])
    assert status == 0 and set(json.loads(out.out)["answers"]) == {"r"}

    status, out = _run(capsys, ["predict", bundle, "--request", f"@{tmp_path / 'nope.json'}"])
    assert status == EXIT_USAGE
    assert out.err.strip().endswith("nope.json' does not exist") and "not valid JSON" not in out.err

    lone = json.dumps({**REQUEST, "state": "charged \ud800 twice"})  # json.dumps writes "\ud800"
    assert "\\ud800" in lone
    status, out = _run(capsys, ["predict", bundle, "--request", lone])
    assert status == EXIT_USAGE
    assert out.err.startswith("laya-onnx predict: error: state contains an unpaired surrogate")
    assert "TextInputSequence" not in out.err and len(out.err.strip().splitlines()) == 1

    status, out = _run(
        capsys, ["predict", bundle, "--request", json.dumps(REQUEST), "--providers", "FooExecutionProvider"]
    )
    assert status == EXIT_USAGE and out.out == ""
    assert out.err.startswith("laya-onnx predict: error: unknown execution provider 'FooExecutionProvider'")
    assert len(out.err.strip().splitlines()) == 1

    status, out = _run(capsys, ["predict", bundle, "--request", "[1]"])
    assert status == EXIT_USAGE and "must be a JSON object with 'state' and 'questions'" in out.err


def test_make_checkpoint_refuses_a_non_empty_directory_in_cli_words(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("precious")
    status, out = _run(capsys, ["make-checkpoint", "--preset", "tiny-english", "-o", str(tmp_path)])
    assert status == EXIT_USAGE
    assert out.err.strip() == (
        f"laya-onnx make-checkpoint: error: output {str(tmp_path)!r} is not empty; pass --force to replace it"
    )
    assert (tmp_path / "keep.txt").read_text() == "precious"


@pytest.mark.torch
def test_export_refuses_a_non_empty_directory_in_cli_words(checkpoint_factory, tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("precious")
    status, out = _run(capsys, ["export", str(checkpoint_factory("tiny-english")), "-o", str(tmp_path)])
    assert status == EXIT_USAGE
    assert (
        out.err.strip().endswith("is not empty; pass --force to replace it") and "force=True" not in out.err
    )


@pytest.mark.torch
def test_export_validation_failure_is_a_runtime_failure(monkeypatch, tmp_path, capsys):
    from laya_onnx import export
    from laya_onnx.export import ValidationError

    def disagrees(*args, **kwargs):
        raise ValidationError("ONNX Runtime disagrees with torch beyond tolerance 1e-06")

    monkeypatch.setattr(export, "export_bundle", disagrees)
    status, out = _run(capsys, ["export", str(tmp_path), "-o", str(tmp_path / "b")])
    assert status == EXIT_FAILED
    assert (
        out.err.strip()
        == "laya-onnx export: failed: ONNX Runtime disagrees with torch beyond tolerance 1e-06"
    )


@pytest.mark.serve
def test_serve_settings_errors_are_usage_errors(tmp_path, capsys):
    status, out = _run(capsys, ["serve", str(tmp_path / "missing"), "--port", "70000"])
    assert status == EXIT_USAGE
    assert out.err.strip() == "laya-onnx serve: error: invalid --port 70000: must be an integer 1-65535"


def test_argparse_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["predict"])
    assert exit_.value.code == EXIT_USAGE


def _own_errors():
    """One instance of each of the package's error types, with the exit status it means."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    from laya_onnx.core.bundle import BundleError, OutputExistsError
    from laya_onnx.core.calibration_file import CalibrationFileError
    from laya_onnx.core.errors import (
        ConfigError,
        InvalidRequest,
        InvalidRequestType,
        PassTooLarge,
        SourceNotFound,
    )
    from laya_onnx.core.session import ProviderError, ProviderUnavailable
    from laya_onnx.core.structured import SchemaError
    from laya_onnx.core.tokenizer import TokenizerError
    from laya_onnx.export.errors import CheckpointError, ExportError, ValidationError
    from laya_onnx.score.scorer import ScoreError

    return [
        (UsageError("--clients must be ..."), EXIT_USAGE),
        (InvalidRequest("question 'r': no 'instructions'"), EXIT_USAGE),
        (InvalidRequestType("questions must be a dict"), EXIT_USAGE),
        (PassTooLarge("one row needs 3 GiB"), EXIT_USAGE),
        (SchemaError("bad schema"), EXIT_USAGE),
        (SourceNotFound("checkpoint 'x': no such directory"), EXIT_USAGE),
        (ConfigError("invalid --port 70000"), EXIT_USAGE),
        (BundleError("bundle 'b' has no manifest.json"), EXIT_USAGE),
        (OutputExistsError("out"), EXIT_USAGE),
        (TokenizerError("bad tokenizer"), EXIT_USAGE),
        (ProviderError("unknown execution provider 'Foo'"), EXIT_USAGE),
        (CalibrationFileError("bad calibration"), EXIT_USAGE),
        (ExportError("opset must be >= 14"), EXIT_USAGE),
        (CheckpointError("checkpoint 'c' has no model.safetensors"), EXIT_USAGE),
        (ScoreError("unknown format '.csv'"), EXIT_USAGE),
        (ModuleNotFoundError("No module named 'torch'", name="torch"), EXIT_USAGE),
        (ValidationError("ONNX Runtime disagrees with torch"), EXIT_FAILED),
        (ProviderUnavailable("CUDA did not attach"), EXIT_FAILED),
        (OSError(errno.ENOSPC, "No space left on device"), EXIT_FAILED),
        (OSError(errno.EADDRINUSE, "address already in use"), EXIT_FAILED),
        (PermissionError(errno.EACCES, "Permission denied"), EXIT_FAILED),
        (Fail("CUDA failure 2: out of memory"), EXIT_FAILED),
    ]


@pytest.mark.parametrize(
    "exc, status", _own_errors(), ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v)
)
def test_the_packages_own_errors_have_their_status(exc, status):
    assert exit_status(exc)[0] == status


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("could not broadcast input array from shape (3,) into shape (2,)"),
        TypeError("'NoneType' object is not subscriptable"),
        RuntimeError("dictionary changed size during iteration"),
        AttributeError("'NoneType' object has no attribute 'x'"),
        KeyError("input_ids"),
        ModuleNotFoundError("No module named 'laya_onnx.nope'", name="laya_onnx.nope"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_anything_else_is_a_bug(exc):
    assert exit_status(exc) is None


@pytest.mark.torch  # it imports every module of the package, the exporter's among them
def test_every_error_type_the_package_defines_is_classified():
    """A new error type must say what it means for the user: listed here, or internal on purpose."""
    import importlib
    import inspect
    import pkgutil

    import laya_onnx
    from laya_onnx.cli.errors import FAILURES, USER_ERRORS

    # raised inside the server and answered as HTTP (or never leave their module)
    internal = {
        "laya_onnx.serve.errors.ApiError",
        "laya_onnx.serve.contract.NonFiniteNumber",
        "laya_onnx.core.question_cache._Uncacheable",
        "laya_onnx.core.work.CallStopped",  # only under limits a server puts around a call
        "laya_onnx.core.session.RunTerminated",  # a stopped pass: the agent raises CallStopped
        "laya_onnx.export.graph_file.GraphWriteError",  # the trace disagrees with the model: a bug
    }
    listed = set(USER_ERRORS) | set(FAILURES)
    for name in listed:
        module, _, attr = name.rpartition(".")
        cls = getattr(importlib.import_module(module), attr)
        assert issubclass(cls, BaseException) and f"{cls.__module__}.{cls.__qualname__}" == name
    skip = ("laya_onnx.serve.ray", "laya_onnx.score.ray", "laya_onnx.bench.ray", "laya_onnx.parity.")
    for info in pkgutil.walk_packages(laya_onnx.__path__, "laya_onnx."):
        if info.name.startswith(skip) or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != info.name or not issubclass(cls, Exception) or issubclass(cls, Warning):
                continue
            name = f"{cls.__module__}.{cls.__qualname__}"
            covered = any(f"{c.__module__}.{c.__qualname__}" in listed | internal for c in cls.__mro__)
            assert covered, f"{name}: add it to laya_onnx.cli.errors (USER_ERRORS or FAILURES)"


def _raises(exc):
    def run(*args, **kwargs):
        raise exc

    return run


def test_a_bug_is_one_line_saying_so_and_how_to_see_the_traceback(monkeypatch, capsys):
    from laya_onnx.bench import http

    monkeypatch.setattr(http, "drive_server", _raises(KeyError("latency_ms_200")))
    monkeypatch.setattr(sys, "argv", ["laya-onnx"])  # the hint repeats the command as it was typed
    status, out = _run(capsys, ["bench", "http", "http://127.0.0.1:9", "--seconds", "1"])
    assert status == EXIT_FAILED and "Traceback" not in out.err
    assert out.err.strip() == (
        "laya-onnx bench http: internal error, a bug in laya-onnx: KeyError: 'latency_ms_200' "
        "(run 'laya-onnx --traceback bench http ...' again to see where it happened)"
    )

    status, out = _run(capsys, ["--traceback", "bench", "http", "http://127.0.0.1:9", "--seconds", "1"])
    assert status == EXIT_FAILED
    assert out.err.startswith("Traceback (most recent call last):") and "in drive_server" not in out.err
    assert "raise exc" in out.err and out.err.strip().splitlines()[-1].startswith(
        "laya-onnx bench http: internal error"
    )


def test_traceback_keeps_an_errors_status(monkeypatch, capsys):
    from laya_onnx.bench import http
    from laya_onnx.core.errors import InvalidRequest

    monkeypatch.setattr(http, "drive_server", _raises(InvalidRequest("no such thing")))
    status, out = _run(capsys, ["--traceback", "bench", "http", "http://127.0.0.1:9"])
    assert status == EXIT_USAGE and "Traceback (most recent call last):" in out.err
    assert out.err.strip().splitlines()[-1] == "laya-onnx bench http: error: no such thing"


def test_bench_http_refuses_bad_clients_and_deadline(capsys):
    # Refused before any request is sent: nothing listens on this URL.
    url = "http://127.0.0.1:9"
    for clients in ("0,8", "1,x", ","):
        status, out = _run(capsys, ["bench", "http", url, "--clients", clients])
        assert status == EXIT_USAGE
        assert out.err.startswith("laya-onnx bench http: error: --clients must be a comma list")
    status, out = _run(capsys, ["bench", "http", url, "--deadline", "0"])
    assert status == EXIT_USAGE and "--deadline must be a positive number of seconds" in out.err


def test_bench_refuses_unknown_workloads_and_configurations(capsys, tmp_path):
    status, out = _run(
        capsys, ["bench", "agent", str(tmp_path), str(tmp_path), "--workloads", "readme-1x3,nope"]
    )
    assert status == EXIT_USAGE
    assert out.err.startswith(
        "laya-onnx bench agent: error: --workloads: unknown nope; choose from readme-1x3"
    )
    status, out = _run(capsys, ["bench", "memory", str(tmp_path), "--only", "after,nope"])
    assert status == EXIT_USAGE
    assert out.err.startswith("laya-onnx bench memory: error: --only: unknown nope; choose from after")


@pytest.mark.parametrize("old", [["serve-bench", "B"], ["bench-memory", "B"], ["bench", "--serve", "URL"]])
def test_every_measurement_is_under_bench(old, capsys):
    assert set(_choices(_subcommands()["bench"])) == {
        "agent",
        "coldstart",
        "http",
        "saturate",
        "memory",
        "soak",
    }
    assert not any("bench" in name and name != "bench" for name in _subcommands())
    with pytest.raises(SystemExit) as exit_:
        main(old)
    assert exit_.value.code == EXIT_USAGE


# -- bench: a table a person reads, every figure as JSON only when asked --------------------

_LOAD = {
    "clients": 8,
    "window_s": 10.0,
    "statuses": {"200": 950, "503": 12},
    "answered_per_s": 95.0,
    "refused_503_without_retry_after": 0,
    "hung": 0,
    "client_errors": {},
    "latency_ms_200": {"n": 950, "p50": 80.5, "p99": 140.25, "max": 150.0},
}
_SERVER = {k: {"n": 950, "p50": 1.25, "p99": 3.0, "max": 4.0} for k in ("wall_ms", "gateway_overhead_ms")}
_MS = {"median": 2.5, "min": 2.0, "max": 3.0}
BENCH_REPORTS = {
    "agent": (
        "run_bench",
        ["bench", "agent", "CKPT", "BUNDLE"],
        {
            "threads": 2,
            "repeats": 9,
            "tools": {"onnxruntime": "1.x", "torch": "2.x"},
            "workloads": {
                "readme-1x3": {
                    "cpu": "AMD EPYC (AVX-512)",
                    "ms": {"reference": {**_MS, "median": 10.0}, "fp32": _MS},
                    "bundles": {
                        "fp32": {
                            "speedup_vs_reference": 4.0,
                            "speedup_range": [3.5, 4.5],
                            "python_ms": _MS,
                            "session_ms": _MS,
                            "agreement": {
                                "same_keys": True,
                                "decisions_identical": True,
                                "max_printed_gap": 0,
                            },
                        }
                    },
                    "process_peak_rss_mib": 900.0,
                    "peak_rss_alone_mib": {"reference": 812.0, "fp32": 95.0},
                }
            },
        },
        "readme-1x3   fp32",
    ),
    "saturate": (
        "run_saturate",
        ["bench", "saturate", "BUNDLE"],
        {
            "clients": 8,
            "sequential": {"client": {**_LOAD, "clients": 1}, "server": _SERVER},
            "saturated": {
                "client": _LOAD,
                "health": {"statuses": {"200": 90}, "hung": 0, "latency_ms": {"n": 90, "p50": 1, "p99": 2.5}},
                "server": _SERVER,
            },
            "providers": ["CPUExecutionProvider"],
            "max_concurrent": 16,
        },
        "saturated         8       95.0     80.5   140.25 200:950 503:12",
    ),
    "soak": (
        "run_soak",
        ["bench", "soak", "BUNDLE", "--minutes", "1"],
        {
            "bundle": "tiny-english",
            "minutes": 1.0,
            "cpu": "AMD EPYC, 2 cores",
            "honest": {"answered": 900, "refused_or_failed": {}, "latency_ms": {"p50": 5.0, "p99": 9.0}},
            "hostile": {"gzip-bomb": {"413": 12}},
            "health_ms": {"n": 1200, "p50": 1.0, "p99": 3.0, "max": 9.0, "over_250ms": 0},
            "rss_mib": {"idle_before": 100.0, "min": 100.0, "max": 140.0, "idle_after": 104.0},
            "fds": {"idle_before": 20, "max": 40, "idle_after": 20},
            "threads": {"idle_before": 9, "idle_after": 9},
            "samples_every_30s": [{"rss_mib": 100.0, "fds": 20}] * 40,
        },
        "honest: 900 answered",
    ),
    "http": (
        "drive_server",
        ["bench", "http", "http://127.0.0.1:9"],
        {"url": "http://127.0.0.1:9", "seconds": 10.0, "runs": {"8": _LOAD}},
        None,  # its progress lines, one per client count, are the table
    ),
}


@pytest.mark.parametrize("measurement", sorted(BENCH_REPORTS))
def test_bench_prints_a_short_table_and_writes_json_only_when_asked(
    measurement, monkeypatch, capsys, tmp_path
):
    import importlib

    runner, argv, report, row = BENCH_REPORTS[measurement]
    module = importlib.import_module("laya_onnx.bench." + measurement)
    monkeypatch.setattr(module, runner, lambda *a, **k: report)
    status, out = _run(capsys, argv)
    lines = out.out.strip().splitlines()
    assert status == 0 and len(lines) <= 12, out.out
    assert "{\n" not in out.out and lines[-1] == "every figure, as JSON: --json PATH"
    if row is not None:
        assert any(line.startswith(row) for line in lines), out.out
    path = tmp_path / "report.json"
    status, out = _run(capsys, [*argv, "--json", str(path)])
    assert status == 0 and out.out.strip() == "report written: %s" % path
    assert json.loads(path.read_text()) == report


def test_predict_names_a_misspelt_field_and_still_answers(bundle_factory, capsys, caplog):
    """`min_confidnce` used to be ignored in silence: no gate, no word."""
    import logging
    import warnings

    request = {
        "state": "refund please",
        "min_confidnce": 0.9,
        "questions": {"q": {"type": "noul", "instructions": "Refund?", "critera": {"true": "yes"}}},
    }
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="laya_onnx"):
        status = main(["predict", str(bundle_factory("tiny-english")), "--request", json.dumps(request)])
    assert status == 0
    assert "abstention" not in json.loads(capsys.readouterr().out)["answers"]["q"]
    lines = [r.getMessage() for r in caplog.records if r.name == "laya_onnx"]
    assert (
        "request field 'min_confidnce' is not read and has no effect (did you mean 'min_confidence'?)"
        in lines
    )
    assert "question 'q': field 'critera' is not read and has no effect (did you mean 'criteria'?)" in lines


def test_every_user_error_shares_one_base_the_cli_reports():
    """One base, `UserError`, instead of a list of class names: a new type deriving from it is
    reported as the user's error without being listed."""
    from laya_onnx.cli.errors import USER_ERRORS
    from laya_onnx.core.errors import UserError

    class NewMistake(UserError, ValueError):
        pass

    assert USER_ERRORS == ("laya_onnx.core.errors.UserError",)
    assert exit_status(NewMistake("bad thing")) == (EXIT_USAGE, "error: bad thing")
    assert all(
        isinstance(exc, UserError)
        for exc, status in _own_errors()
        if status == EXIT_USAGE and not isinstance(exc, ImportError)
    )
