"""The published Laya checkpoints and the names they answer to (laya 0.4.15 `router.py`).

One table, read by the Hub loader (which name a downloaded checkpoint reports) and by the server
(which `model` / `task` values name the checkpoint it serves). Restated here because the
reference package is a dev dependency only.
"""

from __future__ import annotations

from typing import Any

#: The Hub repo that bundles all three checkpoints: english at its root, the others in
#: subfolders. As a request's `model` it means "let the router choose".
BUNDLE_REPO = "convaiinnovations/laya"
#: name -> where the checkpoint is published: (repo, subfolder) in the bundle repo, then its
#: standalone repo, if it has one of its own.
PUBLISHED_CHECKPOINTS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "english": ((BUNDLE_REPO, None),),
    "multilingual": ((BUNDLE_REPO, "multilingual"), ("convaiinnovations/laya-multilingual", None)),
    "typed-decisions": (
        (BUNDLE_REPO, "typed-decisions"),
        ("convaiinnovations/laya-typed-decisions", None),
    ),
}
#: Names people are likely to type for a published checkpoint.
ALIASES = {
    "en": "english",
    "laya": "english",
    "default": "english",
    "multi": "multilingual",
    "ml": "multilingual",
    "laya-multilingual": "multilingual",
    "typed": "typed-decisions",
    "typed_decisions": "typed-decisions",
    "laya-typed-decisions": "typed-decisions",
    "decisions": "typed-decisions",
}

_BY_LOCATION = {
    (repo.lower(), sub): name for name, places in PUBLISHED_CHECKPOINTS.items() for repo, sub in places
}


def canonical_name(name: Any) -> str:
    """A checkpoint name trimmed, lowercased and with its alias resolved (`" EN "` -> english)."""
    key = str(name).strip().lower()
    return ALIASES.get(key, key)


def published_name(repo: str, subfolder: str | None = None) -> str | None:
    """The name of the published checkpoint at `repo[/subfolder]` (case-insensitive), or None."""
    sub = (subfolder or "").strip("/").lower() or None
    return _BY_LOCATION.get((repo.strip().lower(), sub))


def published_repos(name: str) -> list[str]:
    """The standalone Hub repos checkpoint `name` is published under (not the bundle repo, which
    as a request's `model` means "let the router choose")."""
    return sorted(
        repo for repo, sub in PUBLISHED_CHECKPOINTS.get(name, ()) if sub is None and repo != BUNDLE_REPO
    )


def published_ids() -> dict[str, str]:
    """Standalone Hub ids (lowercased) a client may send as `model` -> the checkpoint name."""
    return {repo.lower(): name for name in PUBLISHED_CHECKPOINTS for repo in published_repos(name)}


#: The `encoder` every checkpoint `laya-onnx make-checkpoint` writes starts with this: random weights
#: in the release layout, for tests and speed work (`laya_onnx.checkpoints.presets`).
TEST_ENCODER_PREFIX = "laya-onnx/"


def random_weights_preset(config: Any) -> str | None:
    """The test preset a checkpoint or bundle config was made from (`tiny-english`, ...), or None
    for a real checkpoint: its answers carry no meaning, and it must never pass for one."""
    encoder = config.get("encoder") if isinstance(config, dict) else None
    if not isinstance(encoder, str) or not encoder.startswith(TEST_ENCODER_PREFIX):
        return None
    return encoder[len(TEST_ENCODER_PREFIX) :].removesuffix("-encoder") or encoder


def bundle_random_weights(folder: Any) -> str | None:
    """`random_weights_preset` of the bundle or checkpoint folder `folder` (its
    rl_agent_config.json, read quietly: None when unreadable), without loading it."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(folder) / "rl_agent_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None
    return random_weights_preset(config)


#: A test preset named this prefix + a published checkpoint's name stands in for that checkpoint.
TEST_PRESET_PREFIX = "tiny-"


def stand_in_role(folder_name: str, preset: str | None) -> str | None:
    """The published checkpoint a models directory's test bundle fills the place of: a folder
    `tiny-english/` holding the tiny-english preset's random weights stands in for `english` (so
    a Router over a directory of test bundles routes as over the real ones, while the folder and
    the bundle keep the test preset's name). None for anything else."""
    if preset is None or canonical_name(folder_name) != preset or not preset.startswith(TEST_PRESET_PREFIX):
        return None
    role = preset[len(TEST_PRESET_PREFIX) :]
    return role if role in PUBLISHED_CHECKPOINTS else None


def aliases_of(name: str) -> list[str]:
    """The aliases that resolve to `name`, sorted."""
    return sorted(alias for alias, target in ALIASES.items() if target == name)


__all__ = [
    "ALIASES",
    "BUNDLE_REPO",
    "PUBLISHED_CHECKPOINTS",
    "aliases_of",
    "bundle_random_weights",
    "canonical_name",
    "published_ids",
    "published_name",
    "published_repos",
    "random_weights_preset",
    "stand_in_role",
]
