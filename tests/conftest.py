"""Session-wide fixtures: tiny checkpoints and exported bundles, generated once per session.

    checkpoint_factory(preset="tiny-english", seed=0) -> Path   (make_checkpoint, cached)
    bundle_factory(preset="tiny-english") -> Path                (export_bundle, cached)

Everything is generated locally under pytest's tmp_path_factory; nothing touches the network
(HF_HUB_OFFLINE is forced on for the whole session). torch is imported only when a fixture
first runs, so torch-free tests that do not use them stay torch-free.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY_PRESETS = ("tiny-english", "tiny-multilingual", "tiny-typed-decisions")


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    """Callable preset[, seed] -> checkpoint directory; each (preset, seed) is written once."""
    root = tmp_path_factory.mktemp("checkpoints")
    cache = {}
    lock = threading.Lock()

    def make(preset: str = "tiny-english", seed: int = 0) -> Path:
        from laya_onnx.checkpoints import make_checkpoint

        with lock:
            key = (preset, seed)
            if key not in cache:
                cache[key] = make_checkpoint(preset, root / f"{preset}-seed{seed}", seed=seed)
            return cache[key]

    return make


@pytest.fixture(scope="session")
def bundle_factory(checkpoint_factory, tmp_path_factory):
    """Callable preset -> bundle directory exported (and validated) from checkpoint_factory(preset)."""
    root = tmp_path_factory.mktemp("bundles")
    cache = {}
    lock = threading.Lock()

    def make(preset: str = "tiny-english") -> Path:
        from laya_onnx.export import export_bundle

        with lock:
            if preset not in cache:
                out = root / preset
                export_bundle(checkpoint_factory(preset), out, verbose=False, name=preset)
                cache[preset] = out
            return cache[preset]

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(checkpoint_factory) -> Path:
    return checkpoint_factory("tiny-english")


@pytest.fixture
def no_laya_env(monkeypatch):
    """Unset every LAYA_* variable for one test, so the developer's shell cannot change it."""
    for key in list(os.environ):
        if key.startswith("LAYA_"):
            monkeypatch.delenv(key)
