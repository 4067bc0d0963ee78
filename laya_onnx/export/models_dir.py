"""`laya-onnx export --all`: the three checkpoints a Router routes between, as one models directory.

    MODELS_DIR/
      english/           a bundle (laya-onnx export), answering to the name `english`
      multilingual/
      typed-decisions/

which is what `Router(MODELS_DIR)` and `laya-onnx serve MODELS_DIR` read, from laya's bundle repo
on the Hub (`convaiinnovations/laya`: english at its root, the others in subfolders) or any repo or
local directory laid out the same way. Without a source the checkpoints are the tiny test presets
(no network, seconds) and nothing of theirs takes a real checkpoint's name:

    MODELS_DIR/
      tiny-english/          random weights; the bundle is named tiny-english, and a Router
      tiny-multilingual/     reading the directory routes to it where it would route to english
      tiny-typed-decisions/  (`core.router.registry.bundles_in`)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from laya_onnx.core.bundle import check_output_dir
from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.names import BUNDLE_REPO, PUBLISHED_CHECKPOINTS

#: name -> the tiny preset that stands in for it.
PRESET_FOR = {
    "english": "tiny-english",
    "multilingual": "tiny-multilingual",
    "typed-decisions": "tiny-typed-decisions",
}
#: The `source` that means laya's own bundle repo on the Hub.
HUB = "hub"


def checkpoint_sources(source: str | os.PathLike) -> dict[str, str]:
    """{name: checkpoint} for a bundle-repo layout: `source` itself for english, its
    `multilingual` and `typed-decisions` subfolders for the others (`hub` is laya's repo)."""
    text = BUNDLE_REPO if os.fspath(source) == HUB else os.fspath(source).rstrip("/")
    out = {}
    for name, places in PUBLISHED_CHECKPOINTS.items():
        _, sub = places[0]  # the bundle repo's layout
        out[name] = "%s/%s" % (text, sub) if sub else text
    return out


def export_models_dir(
    out_dir: str | os.PathLike,
    source: str | os.PathLike | None = None,
    *,
    force: bool = False,
    seed: int = 0,
    **export_options: Any,
) -> dict[str, Path]:
    """Export the three checkpoints into `out_dir/<name>`; returns {name: bundle folder}.

    `source` None: the tiny presets (made here, in a temporary directory), each into
    `out_dir/<preset>` under the preset's name. Otherwise `hub`, a Hub repo id or a local
    directory in the bundle repo's layout (`checkpoint_sources`).
    `export_options` go to every `export_bundle` call (revision, opset, tolerance, ...).
    Every output folder is checked before anything is exported, so a refusal writes nothing.
    """
    from laya_onnx.export.exporter import export_bundle

    out = Path(out_dir)
    # a test checkpoint never takes a real one's name: its folder and bundle are the preset's
    names = PRESET_FOR if source is None else {name: name for name in PUBLISHED_CHECKPOINTS}
    targets = {name: out / names[name] for name in PUBLISHED_CHECKPOINTS}
    if out.exists() and not out.is_dir():
        raise InvalidRequest(f"output {str(out)!r} exists and is not a directory")
    for folder in targets.values():
        check_output_dir(folder, force)
    verbose = export_options.pop("verbose", True)
    with tempfile.TemporaryDirectory(prefix="laya-onnx-export-all-") as scratch:
        if source is None:
            from laya_onnx.checkpoints import make_checkpoint

            sources = {
                name: str(make_checkpoint(preset, Path(scratch) / preset, seed=seed))
                for name, preset in PRESET_FOR.items()
            }
        else:
            sources = checkpoint_sources(source)
        for name, checkpoint in sources.items():
            if verbose:
                print(f"== {name}: {checkpoint}", flush=True)
            export_bundle(
                checkpoint, targets[name], force=force, name=names[name], verbose=verbose, **export_options
            )
    return targets


__all__ = ["HUB", "PRESET_FOR", "checkpoint_sources", "export_models_dir"]
