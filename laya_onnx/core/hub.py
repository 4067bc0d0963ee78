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
* A bundle is pulled by its manifest (`fetch_bundle`): `manifest.json` first, at the revision
  asked for, then exactly the files it lists, at the commit that manifest came from, each
  checked against its sha256. Whatever else the repo holds is never downloaded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laya_onnx.core import settings
from laya_onnx.core.bundle import MANIFEST_FILE, BundleError, is_safe_name, read_json_object, verify_files
from laya_onnx.core.errors import ConfigError, InvalidRequest, SourceNotADirectory, SourceNotFound
from laya_onnx.core.manifest import Manifest, ManifestError
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
    #: Every file was checked against the manifest's sha256 as it was pulled (`fetch_bundle`).
    verified: bool = False

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


def _local_source(text: str, what: str) -> CheckpointSource | None:
    """`text` as a local directory; None when it names a Hub repo instead."""
    if os.path.exists(text):
        path = Path(text)
        if not path.is_dir():
            raise SourceNotADirectory(f"{what} {text!r} is a file; expected a {what} directory")
        return CheckpointSource(path=path)
    if looks_like_path(text):
        raise missing_directory(text, what)
    return None


def _hub_kwargs(token: str | None, cache_dir: str | os.PathLike | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"token": token or os.environ.get("HF_TOKEN") or None}
    if cache_dir is not None:
        kwargs["cache_dir"] = os.fspath(cache_dir)
    return kwargs


def _not_provided(text: str, what: str, exc: Exception) -> SourceNotFound:
    return SourceNotFound(
        f"{what} {text!r} is not a local directory, and the Hugging Face Hub could not provide it "
        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else exc!r}). A local "
        "path: check its spelling; a Hub id (org/name): check the id, the network, or "
        "HF_HUB_OFFLINE=1 with the model in the local cache"
    )


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
    local = _local_source(text, what)
    if local is not None:
        return local
    repo, sub = split_repo_id(text)
    requested = resolve_revision(repo, revision)
    from huggingface_hub import snapshot_download

    prefix = f"{sub}/" if sub else ""
    kwargs = _hub_kwargs(token, cache_dir)
    kwargs["allow_patterns"] = [prefix + f for f in files]
    if requested:
        kwargs["revision"] = requested
    try:
        root = Path(snapshot_download(repo, **kwargs))
    except Exception as exc:  # offline, no such repo or revision, no network, no access
        raise _not_provided(text, what, exc) from exc
    commit = snapshot_revision(root) or requested
    path = root / sub if sub else root
    if sub and not path.is_dir():
        raise SourceNotFound(f"Subfolder {sub!r} not found in {repo!r}.")
    return CheckpointSource(path=path, repo=repo, subfolder=sub, revision=commit)


def _snapshot_commit(path: Path) -> str | None:
    """The commit of the Hub snapshot a downloaded file lies in (`.../snapshots/<sha>/...`)."""
    for parent in path.parents:
        if parent.parent.name == "snapshots":
            return parent.name
    return None


def _listed_names(manifest: Manifest, owner: str) -> list[str]:
    """The files the manifest lists, refused before any download if one could land outside the
    bundle (absolute, `..`, a backslash): a repo's manifest is not trusted to name paths."""
    names = sorted(manifest.files)
    for name in names:
        if not is_safe_name(name):
            raise BundleError(f"{owner}: {MANIFEST_FILE} lists an unsafe path {name!r}")
    return names


def fetch_bundle(
    arg: str | os.PathLike,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    verify: bool = True,
) -> CheckpointSource:
    """Resolve `arg` to a bundle directory, pulling a Hub bundle by its manifest.

    A local directory is returned as it is (`Bundle.open` checks it). A Hub id
    (`org/name[/subfolder]`) is pulled in two steps: `manifest.json` at `revision` (resolved as
    for checkpoints), then every file that manifest lists, at the commit the manifest came
    from, so a branch that moves in between cannot mix two bundles. With `verify` each file's
    sha256 is checked against the manifest (`BundleError` naming the file otherwise) and the
    source says `verified=True`, so the caller need not hash them again.
    """
    text = os.fspath(arg)
    local = _local_source(text, "bundle")
    if local is not None:
        return local
    repo, sub = split_repo_id(text)
    requested = resolve_revision(repo, revision)
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    prefix = f"{sub}/" if sub else ""
    kwargs = _hub_kwargs(token, cache_dir)
    at = f"{repo!r} at {requested!r}" if requested else repo
    try:
        manifest_path = Path(hf_hub_download(repo, prefix + MANIFEST_FILE, revision=requested, **kwargs))
    except EntryNotFoundError as exc:
        raise SourceNotFound(
            f"bundle {text!r}: {at} has no {prefix}{MANIFEST_FILE}; is it a laya-onnx bundle "
            "(laya-onnx push BUNDLE REPO_ID)?"
        ) from exc
    except Exception as exc:  # offline, no such repo or revision, no network, no access
        raise _not_provided(text, "bundle", exc) from exc
    root = manifest_path.parent
    commit = _snapshot_commit(manifest_path) or requested
    owner = f"bundle {text!r}"
    try:
        manifest = Manifest.parse(read_json_object(manifest_path, owner, BundleError))
    except ManifestError as exc:
        raise BundleError(f"{owner}: {exc}") from None
    for name in _listed_names(manifest, owner):
        try:
            hf_hub_download(repo, prefix + name, revision=commit, **kwargs)
        except EntryNotFoundError as exc:
            raise BundleError(
                f"{owner}: {MANIFEST_FILE} lists {name!r}, which {repo!r} does not hold at {commit}"
            ) from exc
        except Exception as exc:  # the network or the Hub failed part way
            raise _not_provided(text, "bundle", exc) from exc
    if verify:
        verify_files(root, manifest.files)
    return CheckpointSource(path=root, repo=repo, subfolder=sub, revision=commit, verified=verify)


__all__ = [
    "CHECKPOINT_FILES",
    "CheckpointSource",
    "PINNED_REVISIONS",
    "REVIEWED",
    "RUNTIME_FILES",
    "fetch_bundle",
    "fetch_checkpoint",
    "looks_like_path",
    "pinned_revision",
    "resolve_revision",
    "snapshot_revision",
    "split_repo_id",
]
