"""`laya-onnx demo`: the whole path on the built-in tiny checkpoint, in one command.

make-checkpoint -> export (validated) -> ONNXAgent.predict on the README's request. Reuses what an
earlier run left in the work directory, and says so, so the second run is quick (`--fresh` makes
both again); a run that fails removes the folders it created and left empty or half-written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from laya_onnx.cli.common import EXIT_OK, invocation

DEFAULT_PRESET = "tiny-english"


NAME = "demo"
HELP = "make a tiny checkpoint, export it and answer a request, in one go (needs the export extra)"


def add_parser(sub) -> argparse.ArgumentParser:
    from laya_onnx.checkpoints.presets import PRESETS  # torch-free: the names only

    p = sub.add_parser(
        NAME,
        help=HELP,
        description="Make a test checkpoint, export it and answer the README's request; a second "
        "run reuses what the first left in the work directory.",
    )
    p.add_argument("--workdir", default="work/demo", help="where the checkpoint and bundle go")
    p.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        choices=sorted(PRESETS),
        metavar="PRESET",
        help="checkpoint preset (default %(default)s; see make-checkpoint --help): "
        + "; ".join(sorted(PRESETS)),
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="make the checkpoint and export the bundle again, even where an earlier run left them",
    )
    return p


def run(args: argparse.Namespace) -> int:
    from laya_onnx import ONNXAgent
    from laya_onnx.bench.sample import README_REQUEST
    from laya_onnx.checkpoints import make_checkpoint
    from laya_onnx.core.bundle import WEIGHTS_FILE
    from laya_onnx.export import export_bundle

    preset = args.preset
    workdir = Path(args.workdir)
    checkpoint, bundle = workdir / preset / "checkpoint", workdir / preset / "bundle"
    created = [d for d in (workdir, workdir / preset, checkpoint, bundle) if not d.exists()]
    try:
        if args.fresh or not (checkpoint / WEIGHTS_FILE).exists():
            make_checkpoint(preset, checkpoint, seed=0, force=True)
        else:
            print(f"reusing the checkpoint an earlier run made: {checkpoint} (--fresh makes it again)")
        if args.fresh or not (bundle / "manifest.json").exists():
            export_bundle(checkpoint, bundle, force=True, name=preset)
        else:
            print(f"reusing the bundle an earlier run exported: {bundle} (--fresh exports it again)")
        agent = ONNXAgent(bundle)
    except BaseException:
        remove_leftovers(created, checkpoint / WEIGHTS_FILE, bundle / "manifest.json")
        raise
    started = time.perf_counter()
    result = agent.predict(README_REQUEST["state"], README_REQUEST["questions"])
    ms = (time.perf_counter() - started) * 1000
    print(
        f"\nONNXAgent({str(bundle)!r}) on {', '.join(agent.providers)} answered in {ms:.1f} ms "
        f"(a tiny random checkpoint: the answers exercise the pipeline, they mean nothing):"
    )
    print(json.dumps(result, indent=2, ensure_ascii=False))
    print(f"\nserve it:  {invocation()} serve {bundle} --port 8000")
    return EXIT_OK


def remove_leftovers(created: list[Path], *complete: Path) -> None:
    """After a failed run: remove each folder of `created` (this run made it) that is empty, or that
    lacks the file of `complete` inside it that would make it whole; innermost first."""
    for folder in reversed(created):
        if not folder.is_dir():
            continue
        whole = any(path.parent == folder and path.exists() for path in complete)
        if not whole and (not any(folder.iterdir()) or any(path.parent == folder for path in complete)):
            shutil.rmtree(folder, ignore_errors=True)
