"""`laya_onnx.load(name_or_path, hooks=...)`: laya's `laya.load(...)` entry point, for bundles.

What the argument names, in this order:

1. A local bundle directory (it exists on disk) -> that bundle.
2. A checkpoint name or alias (`english`, `ml`, `typed-decisions`, ... as `laya.Router` spells
   them; any bare word, so an extra name works too) -> the bundle `MODELS_DIR/<name>`, where
   MODELS_DIR is `models_dir=` or `$LAYA_MODELS_DIR` (the directory `laya-onnx export --all`
   writes). The published checkpoints are torch checkpoints, not bundles, so a name is never
   looked up on the Hub.
3. A Hub id `org/name[/subfolder]` -> when it is where a built-in checkpoint is published
   (`convaiinnovations/laya` is english) and MODELS_DIR holds that checkpoint's bundle, that
   local bundle; otherwise a bundle published at that id (`ONNXAgent`'s Hub rules: revision,
   token, offline cache).

A path-like argument that does not exist is a FileNotFoundError, as `ONNXAgent` raises it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from laya_onnx.core import settings
from laya_onnx.core.errors import InvalidRequest, SourceNotFound
from laya_onnx.core.names import (
    ALIASES,
    PUBLISHED_CHECKPOINTS,
    TEST_PRESET_PREFIX,
    bundle_random_weights,
    canonical_name,
    published_name,
    stand_in_role,
)


def _looks_like_path(arg: str) -> bool:
    return arg.startswith((".", "~")) or os.path.isabs(arg) or "\\" in arg or os.sep in arg or "/" in arg


def _models_dir(models_dir: str | os.PathLike | None) -> Path | None:
    where = models_dir if models_dir is not None else settings.MODELS_DIR.read()
    return Path(where).expanduser() if where is not None else None


def resolve_bundle(
    name_or_path: str | os.PathLike, models_dir: str | os.PathLike | None = None, subfolder: str | None = None
) -> str:
    """What `load` hands to `ONNXAgent`: a local bundle directory or a Hub id (module docstring)."""
    arg = os.fspath(name_or_path)
    if not isinstance(arg, str) or not arg.strip():
        raise InvalidRequest(
            "load() needs a bundle path, a checkpoint name or a Hub id, got %r" % (name_or_path,)
        )
    if subfolder:
        arg = "%s/%s" % (arg.rstrip("/"), subfolder.strip("/"))
    if os.path.exists(arg):
        return arg
    root = _models_dir(models_dir)
    if not _looks_like_path(arg):
        name = canonical_name(arg)
        if root is not None and (root / name).is_dir():
            return str(root / name)
        stand_in = root / (TEST_PRESET_PREFIX + name) if root is not None else None
        if stand_in is not None and stand_in_role(stand_in.name, bundle_random_weights(stand_in)) == name:
            return str(stand_in)  # `laya-onnx export --all`'s test bundle in this checkpoint's place
        if name not in PUBLISHED_CHECKPOINTS:
            raise InvalidRequest(
                "unknown model %r; choose one of %s (or an alias: %s)"
                % (arg, sorted(PUBLISHED_CHECKPOINTS), sorted(ALIASES))
            )
        if root is None:
            raise InvalidRequest(
                "load(%r): a checkpoint name loads its bundle from a models directory; pass "
                "models_dir= or set %s (`laya-onnx export --all MODELS_DIR` writes one), or pass "
                "the bundle's path" % (arg, settings.MODELS_DIR.env)
            )
        raise SourceNotFound(
            "load(%r): no bundle for %r in the models directory %s (expected %s)"
            % (arg, name, root, root / name)
        )
    parts = arg.strip("/").split("/")
    if root is not None and len(parts) in (2, 3) and not arg.startswith((".", "~", "/")):
        published = published_name("/".join(parts[:2]), parts[2] if len(parts) == 3 else None)
        if published is not None and (root / published).is_dir():
            return str(root / published)
    return arg


def load(
    name_or_path: str | os.PathLike,
    *,
    models_dir: str | os.PathLike | None = None,
    subfolder: str | None = None,
    hooks: Any = None,
    on_predict_start: Any = None,
    on_predict_end: Any = None,
    hooks_raise: bool = True,
    hooks_concurrent: bool = True,
    hooks_timeout: float | None = None,
    **agent_kwargs: Any,
):
    """An `ONNXAgent` for a bundle path, a checkpoint name or a Hub id (see the module docstring).

    The hook arguments are laya's (`laya.load(..., hooks=..., on_predict_start=...)`); any
    other keyword (providers, threads, revision, token, ...) goes to `ONNXAgent` unchanged.
    """
    from laya_onnx.core.agent import ONNXAgent

    return ONNXAgent(
        resolve_bundle(name_or_path, models_dir, subfolder),
        hooks=hooks,
        on_predict_start=on_predict_start,
        on_predict_end=on_predict_end,
        hooks_raise=hooks_raise,
        hooks_concurrent=hooks_concurrent,
        hooks_timeout=hooks_timeout,
        **agent_kwargs,
    )


__all__ = ["load", "resolve_bundle"]
