"""`GET /v1/models`: the served checkpoint in Jev's model-list shape.

Jev asks for `{"models": [{"name", "description", "release_date", ...}]}` and lets a server add
`x_`-prefixed keys (TypeSafe's Jev model list). One bundle is one checkpoint, so the list has one entry; the other
values a caller may send as `model` for it are its `x_aliases`, not entries of their own, so a
client that shows the list shows one model.

Auth follows `/health` (docs/http-api.md, "Health"): the route never answers 401, and with LAYA_API_KEY set
a caller without the right bearer gets only Jev's three keys — the name a client must send is
not a secret, while the bundle digest, revision and providers describe the deployment, like
the full health payload does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laya_onnx.core.bundle import GRAPH_FILE, MANIFEST_FILE, Bundle
from laya_onnx.core.names import BUNDLE_REPO, PUBLISHED_CHECKPOINTS
from laya_onnx.serve.protocol import ServedAgent
from laya_onnx.serve.wire import Checkpoint

#: Jev requires a string; a bundle records no release date of its checkpoint.
UNKNOWN_RELEASE_DATE = "unknown"


def describe_checkpoint(name: str, random_weights: str | None) -> str:
    """`/v1/models`'s description; a test checkpoint's bundle says what it is."""
    if random_weights:
        return "%s: random test weights (preset %s) served by laya-onnx; its answers carry no meaning" % (
            name,
            random_weights,
        )
    return "laya %s checkpoint served by laya-onnx (ONNX Runtime)" % name


def random_weights_block(agents: dict[str, Any]) -> dict[str, Any]:
    """`/health`'s `random_weights` ({name: test preset}) when a loaded bundle holds random test
    weights (`ONNXAgent.random_weights`); absent otherwise, as laya-serve's payload has no such key."""
    random = {
        name: preset for name, each in agents.items() if (preset := getattr(each, "random_weights", None))
    }
    return {"random_weights": random} if random else {}


def int8_kernels_block(agents: dict[str, Any]) -> dict[str, Any]:
    """`/health`'s `int8_kernels` ({name: "u8s8" or "u8u8"}) for the loaded int8 bundles
    (`ONNXAgent.int8_kernel`); absent when none is int8, as laya-serve's payload has no such key."""
    kernels = {
        name: kernel for name, each in agents.items() if (kernel := getattr(each, "int8_kernel", None))
    }
    return {"int8_kernels": kernels} if kernels else {}


def manifest_sha256(bundle: Bundle) -> str | None:
    """sha256 of manifest.json's bytes: it lists every file's digest, so it pins the bundle.
    None when it cannot be read."""
    try:
        return hashlib.sha256((Path(bundle.root) / MANIFEST_FILE).read_bytes()).hexdigest()
    except OSError:  # removed or unreadable since the bundle was opened
        return None


@dataclass(frozen=True)
class ModelCard:
    """What `/v1/models` says about the served checkpoint; digests are read once, at startup."""

    name: str
    repo: str
    random_weights: str | None
    aliases: tuple[str, ...]
    graph_sha256: str | None
    manifest_sha256: str | None
    precision: str

    @classmethod
    def of(cls, agent: ServedAgent, checkpoint: Checkpoint) -> ModelCard:
        # Standalone repos pin their checkpoint as `model`; the bundle repo means "auto" and so
        # lands here too (one checkpoint), and is listed last.
        random = getattr(agent, "random_weights", None)
        published = sorted(
            repo
            for repo, sub in PUBLISHED_CHECKPOINTS.get(checkpoint.name, ())
            if sub is None and repo != BUNDLE_REPO
        )
        # A test checkpoint's bundle is never listed under the published checkpoints' Hub ids
        hub_ids = [] if random else [*published, BUNDLE_REPO]
        return cls(
            name=checkpoint.name,
            repo=checkpoint.repo,
            random_weights=random,
            aliases=tuple(checkpoint.aliases + hub_ids),
            # laya.onnx's digest as the manifest lists it (verified when the bundle was opened)
            graph_sha256=agent.bundle.manifest.digest(GRAPH_FILE),
            manifest_sha256=manifest_sha256(agent.bundle),
            precision=agent.bundle.precision.precision,
        )

    def listing(self, agent: ServedAgent, full: bool) -> dict[str, Any]:
        """The response body; `full` adds our `x_` keys (see the module docstring for when)."""
        entry: dict[str, Any] = {
            "name": self.name,
            "description": describe_checkpoint(self.name, self.random_weights),
            "release_date": UNKNOWN_RELEASE_DATE,
        }
        if full:
            entry.update(
                {
                    "x_aliases": list(self.aliases),
                    "x_revision": agent.revision,
                    "x_repo": self.repo,
                    "x_graph_sha256": self.graph_sha256,
                    "x_manifest_sha256": self.manifest_sha256,
                    "x_precision": self.precision,
                    "x_providers": list(agent.providers),
                }
            )
            if self.random_weights:
                entry["x_random_weights"] = self.random_weights
            if agent.int8_kernel is not None:
                entry["x_int8_kernel"] = agent.int8_kernel
        return {"models": [entry]}
