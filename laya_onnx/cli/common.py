"""What several `laya-onnx` commands share: exit statuses, the two outcome types, reading a JSON
argument, the bundle/provider/thread options, and writing a report."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from laya_onnx.core.errors import UserError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# A character the terminal's bytes could not be decoded to: on POSIX, Python turns bytes that are
# not valid UTF-8 in argv into lone surrogates (surrogateescape); a JSON "\ud800" escape is ASCII.
_UNDECODED = re.compile("[\ud800-\udfff]")


def invocation() -> str:
    """How this command was started, for a hint the user can paste as printed: the script's path as
    typed (`.venv/bin/laya-onnx` works without an active venv), or `python -m laya_onnx`."""
    import os
    import shlex

    script = sys.argv[0] if sys.argv else ""
    if os.path.basename(script) == "laya-onnx":
        return shlex.quote(script)
    if script.endswith(os.path.join("laya_onnx", "__main__.py")):  # not another tool's -m
        return "%s -m laya_onnx" % shlex.quote(sys.executable)
    return "laya-onnx"


class UsageError(UserError, ValueError):
    """A command-line argument that cannot be used (exit 2)."""


def read_json_argument(value: str, option: str) -> Any:
    """The JSON document an option gives inline, as @FILE, or as - (stdin).

    Raises UsageError naming the option (and the file) for a file that cannot be read, bytes that
    are not UTF-8, or text that is not JSON.
    """
    if value == "-":
        source, data = f"{option} - (stdin)", sys.stdin.buffer.read()
    elif value.startswith("@"):
        path = Path(value[1:])
        source = f"{option} file {str(path)!r}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise UsageError(f"{source} does not exist") from None
        except IsADirectoryError:
            raise UsageError(f"{source} is a directory, not a JSON file") from None
        except OSError as exc:
            raise UsageError(f"{source} cannot be read ({exc.strerror or exc})") from None
    else:
        source, data = option, None
        bad = _UNDECODED.search(value)
        if bad:
            raise UsageError(
                f"{option} is not valid UTF-8 (undecodable bytes after {value[: bad.start()]!r})"
            )
        text = value
    if data is not None:
        try:
            text = data.decode("utf-8-sig")  # a leading byte-order mark is fine
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"{source} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
            ) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{source} is not valid JSON ({exc}){file_hint(value, option)}") from None


def file_hint(value: str, option: str) -> str:
    """`; to read the file 'x.json', write OPTION @x.json` for an inline value that names a file
    (or looks like a file name), else ""."""
    if value == "-" or value.startswith("@") or "\n" in value or len(value) > 4096:
        return ""
    stripped = value.strip()
    try:
        is_file = Path(stripped).is_file()
    except (OSError, ValueError):
        is_file = False
    if not is_file and not stripped.lower().endswith((".json", ".jsonl")):
        return ""
    exists = "" if is_file else " (it does not exist here)"
    return f"; to read the file {stripped!r}{exists}, write {option} @{stripped}"


#: What a bench prints under its table when no `--json PATH` was given.
JSON_HINT = "every figure, as JSON: --json PATH"


def emit_report(report: Any, path: str | None, table: str | None = None) -> int:
    """A bench's report: written to `path` as JSON; without one, `table` (a few lines a person
    reads; None where the progress lines already were the table) and where the rest is."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"report written: {path}")
    else:
        if table:
            print(table)
        print(JSON_HINT)
    return EXIT_OK


def parse_providers(value: str | None):
    """`auto`, or a comma list of NAME or NAME:KEY=VALUE;KEY=VALUE (onnxruntime provider options)."""
    if value is None or value.strip().lower() == "auto":
        return None
    out: list[Any] = []
    for item in (p.strip() for p in value.split(",")):
        if not item:
            continue
        name, _, options = item.partition(":")
        if not options:
            out.append(name.strip())
            continue
        pairs = {}
        for option in (o.strip() for o in options.split(";")):
            key, eq, val = option.partition("=")
            if not eq or not key.strip():
                raise argparse.ArgumentTypeError(
                    f"provider option {option!r} of {name.strip()!r} is not KEY=VALUE"
                )
            pairs[key.strip()] = val.strip()
        out.append((name.strip(), pairs))
    return out


def add_bundle_and_providers(
    parser: argparse.ArgumentParser, optional: bool = False, flag: bool = False, what: str | None = None
) -> None:
    """The bundle and execution providers of the commands that run one (predict, serve, score)."""
    what = what or "bundle directory, or a Hub repo id[/subfolder] holding one"
    if flag:
        parser.add_argument("--bundle", required=True, help=what)
    else:
        parser.add_argument("bundle", nargs="?" if optional else None, help=what)
    parser.add_argument(
        "--providers",
        type=parse_providers,
        default=None,
        help="comma list of onnxruntime execution providers in order of preference, full names "
        "(CUDAExecutionProvider) or cpu/cuda/gpu/coreml/tensorrt, each optionally with onnxruntime "
        "provider options as NAME:KEY=VALUE;KEY=VALUE (e.g. cuda:device_id=1;gpu_mem_limit=2147483648); "
        "CPU is always added last. Default 'auto': CUDA, then CoreML, then CPU, whichever this build offers",
    )


def add_strict_providers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--strict-providers",
        action="store_true",
        help="refuse to run when a requested accelerator does not attach, instead of falling back to CPU",
    )


def add_checkpoint_and_bundle(parser: argparse.ArgumentParser) -> None:
    """The two positionals of the commands that hold a bundle against the reference."""
    parser.add_argument("checkpoint", help="the checkpoint the bundle was exported from")
    parser.add_argument("bundle", help="the bundle directory")
