"""The Router's names: which checkpoint each name means and where its bundle comes from.

`english`, `multilingual` and `typed-decisions` always exist, with laya's aliases
(`laya_onnx.core.names`); more may be registered (`[a-z0-9][a-z0-9._-]*`, never `auto`). A name is
served by a bundle: a directory `laya-onnx export` wrote, or a bundle on the Hub
(`org/name[/subfolder]`). A models directory registers every bundle folder in it under the
folder's name.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from laya_onnx.core.bundle import GRAPH_FILE, bundle_origin, read_manifest_quietly
from laya_onnx.core.errors import InvalidRequest, InvalidRequestType, SourceNotFound
from laya_onnx.core.names import (
    ALIASES,
    PUBLISHED_CHECKPOINTS,
    bundle_random_weights,
    canonical_name,
    stand_in_role,
)

BUILTIN_NAMES = tuple(PUBLISHED_CHECKPOINTS)
ENGLISH, MULTILINGUAL, TYPED_DECISIONS = BUILTIN_NAMES
DEFAULT_CHECKPOINT = MULTILINGUAL

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
Source = str | os.PathLike | tuple | list | None


def published_location(name: str) -> str:
    """Where laya publishes a built-in checkpoint, as its Router names it (`org/repo[/sub]`)."""
    repo, sub = PUBLISHED_CHECKPOINTS[name][0]
    return "%s/%s" % (repo, sub) if sub else repo


def _osa_distance(a: str, b: str) -> int:
    """Edits from `a` to `b`: insert, delete, substitute, or swap two adjacent letters."""
    prev2: list[int] | None = None
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i]
        for j in range(1, len(b) + 1):
            best = min(cur[j - 1] + 1, prev[j] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if prev2 is not None and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                best = min(best, prev2[j - 2] + 1)
            cur.append(best)
        prev2, prev = prev, cur
    return prev[-1]


def near_builtin(key: str) -> str | None:
    """The built-in name one edit from `key` (a likely typo), else None."""
    for name in BUILTIN_NAMES:
        if abs(len(key) - len(name)) <= 1 and _osa_distance(key, name) == 1:
            return name
    return None


def is_bundle_dir(path: Path) -> bool:
    return (path / GRAPH_FILE).is_file()


def bundles_in(models_dir: str | os.PathLike) -> dict[str, Path]:
    """{name: bundle folder} for every bundle folder directly under `models_dir`, by folder name
    (trimmed, lowercased, alias resolved); folders that hold no bundle are not checkpoints.

    A test bundle in a folder named after its preset (`tiny-english/`, as `laya-onnx export
    --all` writes them) is registered under the checkpoint it stands in for (`english`), unless
    the directory also holds that checkpoint's own folder (`names.stand_in_role`)."""
    root = Path(models_dir)
    if not root.is_dir():
        raise SourceNotFound("models directory %r does not exist" % os.fspath(models_dir))
    found: dict[str, Path] = {}
    for child in sorted(root.iterdir()):
        if not (child.is_dir() and is_bundle_dir(child)):
            continue
        key = canonical_name(child.name)
        if key in found:
            raise InvalidRequest(
                "models directory %r has two bundles for %r: %r and %r"
                % (os.fspath(root), key, found[key].name, child.name)
            )
        found[key] = child
    for key, child in list(found.items()):
        role = stand_in_role(key, bundle_random_weights(child))
        if role is not None and role not in found:
            found[role] = found.pop(key)
    if not found:
        raise SourceNotFound(
            "models directory %r holds no bundle (a folder with %s); write one with "
            "'laya-onnx export --all -o %s'" % (os.fspath(root), GRAPH_FILE, os.fspath(root))
        )
    return found


def source_text(source: Source) -> str | None:
    """A bundle source as one string: a path, a Hub id, or `repo/subfolder` of a pair."""
    if source is None:
        return None
    if isinstance(source, (tuple, list)):
        repo, sub = (list(source) + [None])[:2]
        return "%s/%s" % (repo, sub) if sub else str(repo)
    return os.fspath(source)


def check_name(name: Any, key: str) -> None:
    """Refuse a name that cannot be registered (the built-ins are always fine)."""
    if key in BUILTIN_NAMES:
        return
    if not isinstance(name, str) or not _NAME_RE.match(key):
        raise InvalidRequest(
            "invalid checkpoint name %r: use lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit" % (name,)
        )
    if key == "auto":
        raise InvalidRequest(
            "invalid checkpoint name %r: 'auto' means automatic routing in every model= argument" % (name,)
        )


def check_source(name: Any, source: Any) -> Source:
    """A bundle source as registered (`~` expanded), or a refusal naming the checkpoint."""
    if source is not None and not isinstance(source, (str, os.PathLike, tuple, list)):
        raise InvalidRequestType(
            "checkpoint source for %r must be a bundle directory, a Hub id or a (repo, subfolder) "
            "pair, got %s" % (name, type(source).__name__)
        )
    if isinstance(source, str) and source.startswith("~"):
        return os.path.expanduser(source)
    return source


class Registry:
    """name -> bundle source; the built-in names exist even without one (then they cannot load).

    `models` is the live table (a dict, read by the server's model listing)."""

    def __init__(self) -> None:
        self.models: dict[str, Source] = dict.fromkeys(BUILTIN_NAMES)
        self._lock = threading.Lock()

    def resolve(self, name: Any) -> str:
        """The canonical name of a checkpoint this Router knows (built-in, alias or registered)."""
        key = canonical_name(name)
        if key in self.models:
            return key
        raise InvalidRequest(
            "unknown model %r; choose one of %s (or an alias: %s)"
            % (name, sorted(self.models), sorted(ALIASES))
        )

    def add(self, name: Any, source: Source, stacklevel: int = 1) -> tuple[str, bool]:
        """Register `source` under `name`: (its key, whether it replaced another source).
        The warning about a name one edit from a built-in points `stacklevel` frames above the
        caller of this method (1: the caller itself)."""
        key = canonical_name(name)
        check_name(name, key)
        source = check_source(name, source)
        if key not in BUILTIN_NAMES:
            near = near_builtin(key)
            if near is not None:
                warnings.warn(
                    "laya: checkpoint name %r is one edit from the built-in %r; it is registered "
                    "as a separate checkpoint and %r is unchanged." % (key, near, near),
                    RuntimeWarning,
                    stacklevel=stacklevel + 1,
                )
        with self._lock:
            before = self.models.get(key, _MISSING)
            self.models[key] = source
        return key, before is not _MISSING and before != source

    def add_all(self, models: str | os.PathLike | Mapping[str, Source] | None, stacklevel: int = 1) -> None:
        """Register a models directory's bundles, or every entry of {name: source}."""
        if isinstance(models, (str, os.PathLike)):
            models = bundles_in(models)
        for name, source in (models or {}).items():
            self.add(name, source, stacklevel=stacklevel + 1)

    def source(self, key: str) -> Source:
        with self._lock:
            return self.models.get(key)

    def with_bundles(self) -> list[str]:
        """Every name that has a bundle to load from, in registration order."""
        with self._lock:
            return [name for name, source in self.models.items() if source is not None]

    def origin(self, name: str, agent: Any = None) -> str | None:
        """What `routing.repo` says for `name`: the bundle's Hub origin (of the loaded `agent`,
        else of its folder), else its folder's name (never an absolute path), else laya's
        published location of a built-in without a bundle."""
        bundle = getattr(agent, "bundle", None)
        if bundle is not None:
            return bundle_origin(bundle.manifest, bundle.root)
        source = self.source(name)
        if source is None:
            return published_location(name) if name in BUILTIN_NAMES else None
        text = source_text(source) or ""
        if os.path.isdir(text):
            return bundle_origin(read_manifest_quietly(Path(text)), Path(text))
        return text


_MISSING = object()
