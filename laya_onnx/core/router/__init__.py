"""`Router`: several bundles behind one `predict`, each request sent to the checkpoint that fits.

One module per job: `registry` (names, aliases, bundle sources), `pool` (loaded checkpoints:
single-flight loading, LRU `max_loaded`, `on_load` / `on_evict`), `policy` (which checkpoint
answers, with laya's reasons), `answering` (predict, predict_batch, predict_long with the hook
lifecycle), and `router` (the `Router` class that puts them behind laya's signatures).
"""

from laya_onnx.core.names import BUNDLE_REPO
from laya_onnx.core.router.answering import question_schema
from laya_onnx.core.router.policy import (
    TYPED_DECISION_WORKFLOWS,
    RouteDecision,
    match_typed_decisions_workflow,
)
from laya_onnx.core.router.pool import DEFAULT_MAX_LOADED
from laya_onnx.core.router.registry import (
    BUILTIN_NAMES,
    DEFAULT_CHECKPOINT,
    ENGLISH,
    MULTILINGUAL,
    TYPED_DECISIONS,
    bundles_in,
    is_bundle_dir,
    near_builtin,
    published_location,
)
from laya_onnx.core.router.router import Router

__all__ = [
    "BUILTIN_NAMES",
    "BUNDLE_REPO",
    "DEFAULT_CHECKPOINT",
    "DEFAULT_MAX_LOADED",
    "ENGLISH",
    "MULTILINGUAL",
    "TYPED_DECISIONS",
    "TYPED_DECISION_WORKFLOWS",
    "RouteDecision",
    "Router",
    "bundles_in",
    "is_bundle_dir",
    "match_typed_decisions_workflow",
    "near_builtin",
    "published_location",
    "question_schema",
]
