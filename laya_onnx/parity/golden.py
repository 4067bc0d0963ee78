"""Golden answers: the reference's own observations of a suite, recorded for a torch-free test tier.

    python -m laya_onnx.parity.golden                     # the three tiny presets -> parity/golden/
    python -m laya_onnx.parity.golden --preset tiny-english -o DIR

For each preset this makes the deterministic checkpoint (`laya_onnx.checkpoints`, seed 0), runs
every request of the suite through the reference `laya.Agent` and records what the parity rule
judges (`rule.Observation`): the printed answer JSON or the refusal (builtin kind and text), every
row's token ids and markers, and the answers decoded unrounded from the reference's own logits.
`tests/parity/test_golden.py` then judges an `ONNXAgent` on a bundle of the same checkpoint against the
file with the same rule, needing neither torch nor the reference.

A golden file names what it was made from, so a stale one is visible: the checkpoint's weights,
config and tokenizer sha256 (a bundle's manifest carries the same), the suite's sha256 and the
tool versions. Needs the `dev` and `export` extras (laya, torch).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from laya_onnx.core.bundle import CONFIG_FILE, TOKENIZER_DIR, WEIGHTS_FILE, read_json_object, sha256_file
from laya_onnx.parity.observe import observe
from laya_onnx.parity.suite import load_suite, suite_sha256
from laya_onnx.parity.versions import tool_versions

TINY_PRESETS = ("tiny-english", "tiny-multilingual", "tiny-typed-decisions")
GOLDEN_FORMAT = 1
#: The checkpoint files a golden file pins (path in the checkpoint == path in a bundle).
PINNED_FILES = (CONFIG_FILE, f"{TOKENIZER_DIR}/tokenizer.json")


def record_golden(preset: str, suite: str = "core", seed: int = 0) -> dict[str, Any]:
    """The reference's observation of every request of `suite` on checkpoint `preset`."""
    from laya_onnx.checkpoints import make_checkpoint
    from laya_onnx.core.calibration import Calibration
    from laya_onnx.core.tokenizer import LayaTokenizer
    from laya_onnx.parity.runner import instrument_reference, load_reference, reference_rows

    with tempfile.TemporaryDirectory(prefix="laya-golden-") as tmp:
        ckpt = make_checkpoint(preset, Path(tmp) / preset, seed=seed)
        ref = load_reference(ckpt)
        capture = instrument_reference(ref)
        config = read_json_object(ckpt / CONFIG_FILE, f"checkpoint {str(ckpt)!r}")
        with warnings.catch_warnings():  # the clamp warning is the runtime's, not the recorder's
            warnings.simplefilter("ignore", RuntimeWarning)
            # the calibration an ONNXAgent on this checkpoint's bundle answers with
            calibration = Calibration.from_config(config)
        mask_token = LayaTokenizer.from_dir(ckpt / TOKENIZER_DIR).mask_token
        requests = []
        for req in load_suite(suite, mask_token):
            obs = observe(ref, req, capture, lambda q: reference_rows(ref, q), calibration)
            if req.get("expect_error") and obs.refusal is None:
                raise ValueError(f"suite {suite!r}, request {req['name']!r}: the reference did not refuse it")
            requests.append({"name": req["name"], **obs.as_json()})
        checkpoint = {
            "preset": preset,
            "seed": seed,
            "weights_sha256": sha256_file(ckpt / WEIGHTS_FILE),
            "files_sha256": {name: sha256_file(ckpt / name) for name in PINNED_FILES},
        }
    return {
        "format": GOLDEN_FORMAT,
        "made_by": "python -m laya_onnx.parity.golden (the reference laya.Agent, CPU)",
        "checkpoint": checkpoint,
        "suite": suite,
        "suite_sha256": suite_sha256(suite),
        "tools": tool_versions(),
        "requests": requests,
    }


def write_golden(golden: dict[str, Any], path: Path) -> None:
    """Header indented, one request per line: readable diffs, and token ids stay compact."""
    head = {k: v for k, v in golden.items() if k != "requests"}
    lines = json.dumps(head, indent=1, ensure_ascii=False)[:-2]  # drop the closing "\n}"
    reqs = ",\n".join(
        "  " + json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in golden["requests"]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'{lines},\n "requests": [\n{reqs}\n ]\n}}\n', encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m laya_onnx.parity.golden", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--preset", action="append", choices=TINY_PRESETS, help="repeatable; default: all three"
    )
    parser.add_argument("--suite", default="core")
    parser.add_argument("-o", "--output-dir", default="parity/golden")
    args = parser.parse_args(argv)
    for preset in args.preset or TINY_PRESETS:
        golden = record_golden(preset, suite=args.suite)
        path = Path(args.output_dir) / f"{preset}.json"
        write_golden(golden, path)
        refused = sum(1 for r in golden["requests"] if r["refusal"] is not None)
        print(
            f"{path}: {len(golden['requests'])} requests ({refused} refused), weights {golden['checkpoint']['weights_sha256'][:12]}"
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
