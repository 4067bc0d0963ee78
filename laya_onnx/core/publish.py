"""Publish a bundle to the Hugging Face Hub: one commit of its files and a model card.

`plan_push` opens the bundle (every sha256 checked, so a corrupted bundle is never published),
refuses random test weights unless allowed, and builds the commit: one huggingface_hub
`CommitOperationAdd` per file the manifest lists, the manifest itself and the card
(`laya_onnx.core.card`). `push_bundle` sends it with huggingface_hub's upload API: the repo is
created if missing (`private`), a `revision` branch if missing, then `create_commit`, which
uploads large files through the Hub's LFS/Xet storage and skips what the Hub already holds.

A pull (`laya_onnx.core.hub.fetch_bundle`) reads the manifest and downloads exactly the files it
lists, so files an earlier push left in the repo are never loaded; the push does not delete them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laya_onnx.core.bundle import MANIFEST_FILE, Bundle
from laya_onnx.core.card import model_card
from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.names import random_weights_preset

CARD_FILE = "README.md"


class PushError(OSError):
    """The Hub refused or could not be reached (an I/O failure: the CLI exits 1); the commit was
    not made, though a repo or branch created before it stays."""


@dataclass(frozen=True)
class PushPlan:
    """The commit a push sends: where, on which branch, with which message, and what."""

    repo_id: str  # org/name (a subfolder given in the id prefixes the operations' paths)
    revision: str | None  # the branch committed to (None: the repo's default)
    commit_message: str
    card: str
    operations: list[Any] = field(repr=False)  # huggingface_hub CommitOperationAdd


def plan_push(
    bundle: str | os.PathLike,
    repo_id: str,
    *,
    revision: str | None = None,
    commit_message: str | None = None,
    allow_random_weights: bool = False,
    license: str | None = None,
) -> PushPlan:
    """The commit that publishes the bundle folder `bundle` as `repo_id` (`org/name`, or
    `org/name/subfolder` to put it in a subfolder); refuses before anything is sent."""
    from huggingface_hub import CommitOperationAdd

    from laya_onnx.core.hub import split_repo_id

    opened = Bundle.open(Path(bundle), verify=True)
    preset = random_weights_preset(opened.config)
    if preset and not allow_random_weights:
        raise InvalidRequest(
            f"bundle {str(bundle)!r} holds random test weights (preset {preset!r}, laya-onnx "
            "make-checkpoint), whose answers carry no meaning; pass allow_random_weights=True "
            "(--allow-random-weights) to publish it anyway"
        )
    repo, sub = split_repo_id(repo_id)
    prefix = f"{sub}/" if sub else ""
    names = [*sorted(opened.manifest.files), MANIFEST_FILE]
    card = model_card(opened, repo_id, license=license)
    operations = [
        CommitOperationAdd(path_in_repo=prefix + name, path_or_fileobj=str(opened.root / name))
        for name in names
    ]
    operations.append(
        CommitOperationAdd(path_in_repo=prefix + CARD_FILE, path_or_fileobj=card.encode("utf-8"))
    )
    precision = opened.precision.precision
    message = commit_message or f"laya-onnx bundle ({precision}, {len(names)} files)"
    return PushPlan(
        repo_id=repo,
        revision=revision or None,
        commit_message=message,
        card=card,
        operations=operations,
    )


def push_bundle(
    bundle: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    allow_random_weights: bool = False,
    license: str | None = None,
    token: str | None = None,
) -> str:
    """Publish `bundle` as `repo_id` (see `plan_push`); returns the commit's URL.

    The repo is created when missing (`private` applies only then); `revision` names a branch,
    created from the default one when missing. The token is `token`, else huggingface_hub's
    (`HF_TOKEN`, `hf auth login`); the Hub is `HF_ENDPOINT`'s, else huggingface.co."""
    from huggingface_hub import HfApi

    plan = plan_push(
        bundle,
        repo_id,
        revision=revision,
        commit_message=commit_message,
        allow_random_weights=allow_random_weights,
        license=license,
    )
    api = HfApi(token=token)
    try:
        api.create_repo(plan.repo_id, private=private, exist_ok=True)
        if plan.revision:
            api.create_branch(plan.repo_id, branch=plan.revision, exist_ok=True)
        info = api.create_commit(
            plan.repo_id, plan.operations, commit_message=plan.commit_message, revision=plan.revision
        )
    except Exception as exc:  # no network, no token, no access, the Hub refused
        first = str(exc).splitlines()[0] if str(exc) else repr(exc)
        raise PushError(
            f"could not publish {str(bundle)!r} as {repo_id!r} at {api.endpoint} ({type(exc).__name__}: "
            f"{first}); check the network, the token (HF_TOKEN or `hf auth login`) and its write access"
        ) from exc
    return str(info.commit_url)


__all__ = ["CARD_FILE", "PushError", "PushPlan", "plan_push", "push_bundle"]
