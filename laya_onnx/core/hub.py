"""Checkpoint sources: a local directory or a Hugging Face Hub repo, with revision pinning.

Torch-free (stdlib + huggingface_hub, imported lazily), so the exporter and the runtime share
one set of rules, which follow laya 0.4.15 (`revisions.py`, `Agent.__init__`):

* An argument that exists on disk is a local checkpoint. One that looks like a path
  (`/`, `./`, `../`, `~`, absolute) but does not exist is a `FileNotFoundError`, never a Hub
  lookup. Anything else is a repo id: `org/name`, or `org/name/subfolder` for a checkpoint
  that lives in a subfolder of a bundle repo (`convaiinnovations/laya/multilingual`).
* The revision is `revision`, else `$LAYA_REVISION`, stripped; empty means the Hub default.
  `"reviewed"` (any case) maps to the reviewed commit pinned for that repo, matched
  case-insensitively; a repo without a pin refuses, naming whichever of the two asked.
  A truthy but blank `revision` suppresses the environment variable.
* Only the checkpoint's files are fetched (`allow_patterns`), and the commit the snapshot
  resolved to is recorded (the `snapshots/<sha>` directory name).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laya_onnx.core import settings
from laya_onnx.core.errors import ConfigError, InvalidRequest, SourceNotADirectory, SourceNotFound
from laya_onnx.core.names import published_name

#: Reviewed commit SHAs of the published checkpoints (laya 0.4.15 revisions.py). Opt-in only.
PINNED_REVISIONS = {
    "convaiinnovations/laya": "55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851",
    "convaiinnovations/laya-multilingual": "e4e9ddf21a7b1903b7acffd8814ad4307bf63a67",
    "convaiinnovations/laya-typed-decisions": "1a793eb568e6718f15941d08f85432581df534e3",
}
REVIEWED = "reviewed"

#: What a checkpoint consists of; the runtime needs everything but the weights.
CHECKPOINT_FILES: tuple[str, ...] = ("rl_agent_config.json", "model.safetensors", "tokenizer/*", "encoder/*")
RUNTIME_FILES: tuple[str, ...] = ("rl_agent_config.json", "tokenizer/*", "encoder/*")
#: What a laya-onnx bundle published on the Hub is made of (no torch weights).
BUNDLE_FILES: tuple[str, ...] = (
    "laya.onnx",
    "laya.u8s8.onnx",  # only in int8 bundles: the u8 x s8 form for CPUs with VNNI
    "rl_agent_config.json",
    "tokenizer/*",
    "manifest.json",
    "calibration.json",  # only in bundles exported with --calibration
)

_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_REPO_RE = re.compile(rf"^(?P<repo>{_REPO_PART}/{_REPO_PART})(?:/(?P<sub>[^\s\\]+?))?/?$")


def pinned_revision(repo_id: str) -> str | None:
    """The reviewed SHA for `repo_id` (case-insensitive), or None."""
    wanted = repo_id.lower()
    for repo, sha in PINNED_REVISIONS.items():
        if repo.lower() == wanted:
            return sha
    return None


def resolve_revision(repo_id: str, revision: str | None = None) -> str | None:
    """The revision to request from the Hub for `repo_id` (None: the Hub default)."""
    value = (revision or settings.REVISION.read() or "").strip()
    if not value:
        return None
    if value.lower() != REVIEWED:
        return value
    sha = pinned_revision(repo_id)
    if sha is not None:
        return sha
    if revision:
        raise ConfigError(
            f"revision={revision!r} asks for the reviewed commit, but {repo_id!r} has no "
            "reviewed SHA pinned; pass a commit, branch or tag in revision= instead"
        )
    raise ConfigError(
        f"{settings.REVISION.env}={REVIEWED}, but {repo_id!r} has no reviewed SHA pinned; "
        f"set {settings.REVISION.env} to a commit or unset it"
    )


def snapshot_revision(path: str | os.PathLike) -> str | None:
    """The commit a Hub snapshot directory points at (`.../snapshots/<sha>`), else None."""
    real = os.path.realpath(os.fspath(path)).rstrip(os.sep)
    parent, base = os.path.split(real)
    return base if base and os.path.basename(parent) == "snapshots" else None


def looks_like_path(arg: str) -> bool:
    """A path by its form (`/`, `./`, `../`, `~`, absolute), or one whose first folder exists
    here (`work/tiny-bundel` when `work/` does): such an argument is never a Hub id."""
    if arg.startswith(("/", "./", "../", "~", ".\\", "..\\")) or os.path.isabs(arg):
        return True
    head = re.split(r"[/\\]", arg, maxsplit=1)[0]
    return head != arg and os.path.isdir(head)


def missing_directory(arg: str, what: str) -> SourceNotFound:
    """ "No such directory" for a local-looking argument, with the nearest names beside it."""
    import difflib

    path = Path(os.path.expanduser(arg))
    parent = path.parent if path.parent.is_dir() else None
    siblings = [p.name for p in parent.iterdir() if p.is_dir()] if parent else []
    close = difflib.get_close_matches(path.name, siblings, n=3, cutoff=0.6)
    hint = " (did you mean %s?)" % ", ".join(repr(str(parent / c)) for c in close) if close and parent else ""
    return SourceNotFound(f"{what} {arg!r}: no such directory{hint}")


def split_repo_id(arg: str) -> tuple[str, str | None]:
    """`org/name[/subfolder...]` -> (`org/name`, subfolder or None); ValueError otherwise."""
    m = _REPO_RE.match(arg.strip())
    if not m or any(part in ("", ".", "..") for part in (m.group("sub") or "x").split("/")):
        raise InvalidRequest(
            f"{arg!r} is neither an existing directory nor a Hub repo id ('org/name' or 'org/name/subfolder')"
        )
    return m.group("repo"), m.group("sub")


@dataclass(frozen=True)
class CheckpointSource:
    """Where a checkpoint came from and where its files are now."""

    path: Path  # the checkpoint directory (subfolder applied)
    repo: str | None = None  # Hub repo id; None for a local directory
    subfolder: str | None = None
    revision: str | None = None  # the commit the snapshot resolved to (or the request)

    @property
    def name(self) -> str:
        """The checkpoint's name as servers report it: a published checkpoint's registry name
        (english, multilingual, typed-decisions), else the subfolder, repo or directory name."""
        if self.repo:
            known = published_name(self.repo, self.subfolder)
            if known:
                return known
            return (self.subfolder or self.repo).rstrip("/").rsplit("/", 1)[-1]
        return self.path.resolve().name

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "path": str(self.path),
            "repo": self.repo,
            "subfolder": self.subfolder,
            "revision": self.revision,
        }


def fetch_checkpoint(
    arg: str | os.PathLike,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    files: Sequence[str] = CHECKPOINT_FILES,
    what: str = "checkpoint",
) -> CheckpointSource:
    """Resolve `arg` to a checkpoint directory, downloading its `files` from the Hub if needed.

    Offline (`HF_HUB_OFFLINE=1`) a Hub id resolves from the local cache (`cache_dir`, else
    `$HF_HUB_CACHE`). An argument that is neither a local directory nor something the Hub
    provides raises `SourceNotFound` naming both (the Hub's error is its `__cause__`); `what`
    names the thing in that message ("checkpoint", "bundle").
    """
    text = os.fspath(arg)
    if os.path.exists(text):
        path = Path(text)
        if not path.is_dir():
            raise SourceNotADirectory(f"checkpoint {text!r} is a file; expected a checkpoint directory")
        return CheckpointSource(path=path)
    if looks_like_path(text):
        raise missing_directory(text, what)
    repo, sub = split_repo_id(text)
    requested = resolve_revision(repo, revision)
    from huggingface_hub import snapshot_download

    prefix = f"{sub}/" if sub else ""
    kwargs: dict[str, Any] = {
        "allow_patterns": [prefix + f for f in files],
        "token": token or os.environ.get("HF_TOKEN") or None,
    }
    if requested:
        kwargs["revision"] = requested
    if cache_dir is not None:
        kwargs["cache_dir"] = os.fspath(cache_dir)
    try:
        root = Path(snapshot_download(repo, **kwargs))
    except Exception as exc:  # offline, no such repo or revision, no network, no access
        raise SourceNotFound(
            f"{what} {text!r} is not a local directory, and the Hugging Face Hub could not provide it "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else exc!r}). A local "
            "path: check its spelling; a Hub id (org/name): check the id, the network, or "
            "HF_HUB_OFFLINE=1 with the model in the local cache"
        ) from exc
    commit = snapshot_revision(root) or requested
    path = root / sub if sub else root
    if sub and not path.is_dir():
        raise SourceNotFound(f"Subfolder {sub!r} not found in {repo!r}.")
    return CheckpointSource(path=path, repo=repo, subfolder=sub, revision=commit)


__all__ = [
    "BUNDLE_FILES",
    "CHECKPOINT_FILES",
    "CheckpointSource",
    "PINNED_REVISIONS",
    "REVIEWED",
    "RUNTIME_FILES",
    "fetch_checkpoint",
    "looks_like_path",
    "pinned_revision",
    "resolve_revision",
    "snapshot_revision",
    "split_repo_id",
]
