"""`laya-onnx make-checkpoint`: a small deterministic test checkpoint in the release layout."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from laya_onnx.cli.common import EXIT_OK, UsageError

NAME = "make-checkpoint"
HELP = "write a small deterministic test checkpoint in the release layout (needs the export extra)"


def add_parser(sub) -> argparse.ArgumentParser:
    from laya_onnx.checkpoints.presets import PRESETS  # torch-free: the names only

    p = sub.add_parser(
        NAME,
        help=HELP,
        description=textwrap.fill(
            "Write a deterministic checkpoint with random weights in the layout laya's training "
            "writes; for tests, demos and benchmarks (its answers mean nothing).",
            88,
        ),
        epilog="presets:\n"
        + "\n".join(
            textwrap.fill(preset.description, 88, initial_indent=f"  {name}: ", subsequent_indent="      ")
            for name, preset in sorted(PRESETS.items())
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset", required=True, choices=sorted(PRESETS), metavar="PRESET", help="; ".join(sorted(PRESETS))
    )
    p.add_argument("-o", "--output", required=True, help="directory to write the checkpoint to")
    p.add_argument(
        "--seed", type=int, default=0, help="random seed of the weights; the same seed writes the same bytes"
    )
    p.add_argument("--force", action="store_true", help="replace a non-empty output directory")
    return p


def run(args: argparse.Namespace) -> int:
    if args.seed < 0:
        raise UsageError(f"--seed must be a whole number >= 0, got {args.seed}")
    from laya_onnx.checkpoints import make_checkpoint

    out = make_checkpoint(args.preset, Path(args.output), seed=args.seed, force=args.force)
    print(f"checkpoint written: {out}")
    return EXIT_OK
