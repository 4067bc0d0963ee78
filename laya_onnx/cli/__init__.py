"""`laya-onnx` command line: one entry point, one module per command.

Each command module has `NAME` and `HELP` (its line in `--help`), `add_parser(sub)` (its options)
and `run(args)` (the work), and imports the layer it runs only inside `run`: the runtime core is
torch-free, so `predict` and `serve` work on a box without torch. `main` builds the options of the
command it runs only, so `laya-onnx --help` imports no layer and each command's help reads the
defaults of its own layer alone (never torch or onnxruntime).

Exit status, the same for every command: 0 success; 1 the command ran and failed (a parity or
export-validation mismatch, an I/O or onnxruntime failure) or met a bug; 2 bad input, usage or
configuration (argparse's own code for a bad option); 130 interrupted. Which error types mean
which: `laya_onnx.cli.errors`.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from laya_onnx.cli import bench, demo, doctor, export, make_checkpoint, parity, predict, push, score, serve
from laya_onnx.cli.common import EXIT_FAILED, EXIT_INTERRUPTED
from laya_onnx.cli.errors import bug_message, exit_status

#: The commands, in the order `--help` lists them.
COMMANDS = (make_checkpoint, export, push, predict, serve, score, parity, bench, doctor, demo)

DESCRIPTION = """\
Run the Laya decision model (https://huggingface.co/convaiinnovations/laya) on ONNX Runtime,
without torch: export a checkpoint to a validated ONNX bundle once, then answer typed questions
about a text with it, from the command line or over HTTP. Answers equal laya 0.4.15's."""

EPILOG = """\
examples:
  laya-onnx demo                                   # the whole path on a tiny test checkpoint
  laya-onnx export convaiinnovations/laya -o work/laya-bundle
  laya-onnx export --all -o work/models              # tiny-english/ ... (random; --hub: the real three)
  laya-onnx predict work/laya-bundle --request '{"state": "I was charged twice",
      "questions": {"refund": {"type": "noul", "instructions": "Refund?"}}}'
  laya-onnx serve work/laya-bundle --port 8000

'laya-onnx COMMAND --help' describes each command's options.

exit status: 0 success; 1 the command ran and failed (a parity or export-validation mismatch,
an I/O or onnxruntime failure), or hit a bug in laya-onnx (--traceback shows where); 2 bad input,
usage or configuration (a bad option or request, a missing file, a missing extra); 130
interrupted."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `laya-onnx` parser; `command` given: only that command's options are built (the others
    are listed by their help line), so parsing imports only what that command's options need."""
    from laya_onnx import __version__

    p = argparse.ArgumentParser(
        prog="laya-onnx",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"laya-onnx {__version__}")
    p.add_argument(
        "--traceback",
        action="store_true",
        help="on an error, print Python's traceback before the one-line report (for a bug report)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        if command is None or module.NAME == command:
            parser = module.add_parser(sub)
        else:
            parser = sub.add_parser(module.NAME, help=module.HELP)
        parser.set_defaults(run=module.run, prog=parser.prog)
    return p


def command_word(argv: list[str]) -> str:
    """The command `argv` runs (no global option takes a value: the first word is the command);
    "" for none, as in `laya-onnx --help`."""
    return next((word for word in argv if not word.startswith("-")), "")


def report_warnings() -> None:
    """The library's warnings (a provider that fell back, a reduced-precision or random-weights
    bundle, a state cut at max_len) as one `laya-onnx: warning: ...` line each on stderr, once,
    without Python's file/line/source display (`laya_onnx.core.notices`)."""
    import logging

    from laya_onnx.core.notices import log_warnings

    # A no-op where the host already configured logging (the server reconfigures it its own way)
    logging.basicConfig(level=logging.WARNING, format="laya-onnx: %(levelname)s: %(message)s")
    log_warnings()


def parser_named(parser: argparse.ArgumentParser, prog: str) -> argparse.ArgumentParser:
    """The (sub)command parser of `parser` whose prog is `prog` ("laya-onnx bench http"), else
    `parser` itself."""
    if parser.prog == prog:
        return parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found = parser_named(child, prog)
                if found is not child or child.prog == prog:
                    return found
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed; an option the command does not take is reported under that command's usage
    (argparse reports it under the top-level one, which lists no command's options)."""
    parser = build_parser(command_word(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser_named(parser, args.prog).error("unrecognized arguments: %s" % " ".join(extra))
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    report_warnings()
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("laya-onnx: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (Exception, SystemExit) as exc:
        if isinstance(exc, SystemExit) and not isinstance(exc.code, str):
            raise
        if args.traceback:
            traceback.print_exc()
        status, message = exit_status(exc) or (EXIT_FAILED, bug_message(exc, args.prog))
        print(f"{args.prog}: {message}", file=sys.stderr)
        return status
