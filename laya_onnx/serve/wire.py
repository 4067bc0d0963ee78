"""What crosses the wire besides the agent's own answer: the checkpoint this server serves
(`model` / `task` resolution, the `routing` block, `/health` facts) and the response shaping
(`x_jev_confidence`, the strict Jev projection, JSON rendering).

laya-serve fronts a Router over several checkpoints; this server fronts exactly one bundle, so
"routing" always lands on it. The published names and aliases are the core's (`laya_onnx.core.names`).
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from laya_onnx.core.bundle import Bundle, bundle_origin
from laya_onnx.core.names import (
    BUNDLE_REPO,
    PUBLISHED_CHECKPOINTS,
    aliases_of,
    canonical_name,
    published_name,
)
from laya_onnx.core.session import FallbackEntry
from laya_onnx.serve.errors import ApiError
from laya_onnx.serve.protocol import ServedAgent

ROUTING_REASON = "served bundle"
#: `model` values that ask for whatever this server answers with (TypeSafe's "latest" id): not
#: a fallback to report, unlike a name this server does not know.
GENERIC_MODEL_IDS = frozenset({"jev-latest"})


class ModelChoice(NamedTuple):
    """A body's `model` as the server took it."""

    #: The checkpoint it pins (None: the router chooses, or the one checkpoint answers).
    pinned: str | None = None
    #: Its text when it named no checkpoint this server knows and was answered anyway (laya-serve
    #: routes such a name silently; this server says so: `contract.model_fallback_headers`).
    fallback: str | None = None


def fallback_choice(text: str) -> ModelChoice:
    """The choice for a `model` that named nothing here: answered anyway, reported as a fallback."""
    return ModelChoice(None, None if text.lower() in GENERIC_MODEL_IDS else text)


def names_a_path(text: str) -> bool:
    """A filesystem path or a Hub repo id rather than a checkpoint name."""
    if not text:
        return False
    return text[0] in ".~" or "/" in text or "\\" in text


class Checkpoint:
    """The one checkpoint behind this server, as the wire protocol names it."""

    def __init__(self, name: str, repo: str):
        self.name = name
        self.repo = repo

    @classmethod
    def of(cls, agent: ServedAgent) -> Checkpoint:
        return cls(name=agent.name, repo=bundle_source(agent.bundle) or agent.name)

    @property
    def aliases(self) -> list[str]:
        return aliases_of(self.name)

    def _unknown(self, value: Any) -> str:
        return "unknown model %r; choose one of %s (or an alias: %s)" % (value, [self.name], self.aliases)

    def check_model(self, model: Any) -> ModelChoice:
        """Accept a body's `model` or refuse it with 422 (docs/http-api.md, "The model field"; one checkpoint).

        Falsy, the bundle id, this checkpoint's name/alias/published id, and any other name
        (a Jev id like `jev-1`, a typo) are answered by this checkpoint — the last kind as a
        reported fallback. A path or an unpublished Hub id is a 422: the caller named a
        checkpoint this server cannot load. So is another laya checkpoint's name: laya-serve
        would pin it, and answering it with this checkpoint instead would be the wrong answer
        the 422 exists to prevent.
        """
        if not model:
            return ModelChoice()
        text = str(model).strip()
        low = text.lower()
        if low == BUNDLE_REPO:
            return ModelChoice()
        target = published_name(low) or canonical_name(text)
        if target == self.name:
            return ModelChoice()
        if target in PUBLISHED_CHECKPOINTS or names_a_path(text):
            raise ApiError(422, self._unknown(model) + ", or omit model to let the router choose")
        return fallback_choice(text)

    def check_task(self, task: Any) -> None:
        """`task` pins a checkpoint by name; anything but this one is the core's unknown-model 422."""
        if task is None:
            return
        if canonical_name(task) != self.name:
            raise ApiError(422, self._unknown(task))

    def routing_controls(self, model: str | None, task: Any, lang_guess: Any) -> dict[str, Any]:
        """Nothing to route: the checks above already refused a model or task this is not."""
        return {}

    def with_routing(self, result: dict[str, Any]) -> dict[str, Any]:
        return {**result, "routing": self.routing()}

    def routing(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "repo": self.repo,
            "reason": ROUTING_REASON,
            "detection": None,
            "workflow": None,
        }


def bundle_source(bundle: Bundle) -> str | None:
    """Where the served bundle came from (`laya_onnx.core.bundle.bundle_origin`)."""
    return bundle_origin(bundle.manifest, bundle.root)


# -- device facts for /health --------------------------------------------------------------

_PROVIDER_DEVICES = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "cuda",
    "TensorrtExecutionProvider": "cuda",
    "ROCMExecutionProvider": "rocm",
    "MIGraphXExecutionProvider": "rocm",
    "CoreMLExecutionProvider": "mps",
    "DmlExecutionProvider": "dml",
    "OpenVINOExecutionProvider": "openvino",
}


def provider_device(provider: Any) -> str | None:
    """The device label a provider computes on (`CUDAExecutionProvider` -> `cuda`)."""
    if not isinstance(provider, str) or not provider:
        return None
    if provider in _PROVIDER_DEVICES:
        return _PROVIDER_DEVICES[provider]
    return provider.replace("ExecutionProvider", "").lower() or None


def preferred_device(requested: list[str]) -> str:
    """The device the first requested provider computes on ("cpu" when none was requested)."""
    return (provider_device(requested[0]) if requested else None) or "cpu"


def cpu_fallbacks(fallbacks: dict[str, FallbackEntry], baseline: dict[str, int]) -> dict[str, Any]:
    """laya-serve's `{count, last_reason}`: passes that failed on an accelerator and were retried
    on CPU since the server started.

    `fallbacks` is the agent's snapshot; `baseline` is the per-provider count when the app was
    built: those are the providers that never attached (a CPU-only build, no GPU), which
    laya-serve does not count as fallbacks — that case is what `device` reports.
    """
    count, reason = 0, None
    for provider, entry in fallbacks.items():
        delta = entry["count"] - baseline.get(provider, 0)
        if delta > 0:
            count += delta
            reason = entry["last_reason"]
    return {"count": count, "last_reason": reason}


def fallback_baseline(fallbacks: dict[str, FallbackEntry]) -> dict[str, int]:
    return {provider: entry["count"] for provider, entry in fallbacks.items()}


# -- response shaping ----------------------------------------------------------------------


def jev_confidence(answer: dict[str, Any]) -> float | None:
    """TypeSafe Jev's `confidence` for this answer's probabilities, or None if unusable.

    choice: (max p - 1/n) / (1 - 1/n); score: max(0, 1 - Σ p_i |i - mode| / D), D the same
    spread for a uniform distribution. 1.0 for a single option; a zero total reads as uniform.
    A boolean, non-numeric, negative or non-finite probability gives None, never a guess.
    """
    kind, probs = answer.get("type"), answer.get("probabilities")
    if kind not in ("choice", "score") or not isinstance(probs, dict) or not probs:
        return None
    if any(isinstance(v, bool) for v in probs.values()):
        return None
    try:
        keys = sorted(probs, key=int) if kind == "score" else list(probs)
        p = [float(probs[k]) for k in keys]
    except (TypeError, ValueError, OverflowError):
        return None
    if not all(math.isfinite(v) and v >= 0.0 for v in p):
        return None
    n = len(p)
    if n == 1:
        return 1.0
    total = sum(p)
    p = [v / total for v in p] if total else [1.0 / n] * n
    if kind == "choice":
        return (max(p) - 1.0 / n) / (1.0 - 1.0 / n)
    mode = max(range(n), key=p.__getitem__)
    spread = sum(v * abs(i - mode) for i, v in enumerate(p))
    center = (n - 1) / 2
    uniform = sum(abs(i - center) for i in range(n)) / n
    return max(0.0, 1.0 - spread / uniform)


def with_jev_confidence(result: dict[str, Any]) -> dict[str, Any]:
    """A copy of `result` whose choice/score answers carry `x_jev_confidence` (answers not mutated)."""
    answers = result.get("answers")
    if not isinstance(answers, dict):
        return result
    out = {}
    for qid, answer in answers.items():
        conf = jev_confidence(answer) if isinstance(answer, dict) else None
        out[qid] = answer if conf is None else {**answer, "x_jev_confidence": round(conf, 4)}
    return {**result, "answers": out}


#: The keys `LAYA_JEV_STRICT` keeps of each answer type, in laya-serve's order (the Jev contract's
#: keys, `schema.JevChoiceAnswer`...; laya-serve lists a score's probabilities before its legend).
STRICT_KEYS = {
    "choice": ("type", "choice", "confidence", "probabilities"),
    "score": ("type", "score", "confidence", "probabilities", "legend"),
    "noul": ("type", "noul"),
}


def strict_projection(result: dict[str, Any]) -> dict[str, Any]:
    """`LAYA_JEV_STRICT`: exactly the Jev contract's keys; nothing is recomputed.

    A typed answer missing one of its keys raises KeyError, which the handler reports as the
    500 it is (the agent broke the contract), as laya-serve does.
    """
    answers = {}
    for qid, a in (result.get("answers") or {}).items():
        keys = STRICT_KEYS.get(str(a.get("type"))) if isinstance(a, dict) else None
        answers[qid] = a if keys is None else {k: a[k] for k in keys}
    usage = result.get("usage") or {}
    return {
        "model": result["model"],
        "answers": answers,
        "usage": {
            "input_tokens": usage.get("input_tokens", 0),
            "output_tokens": usage.get("output_tokens", 0),
        },
    }


def shape(result: dict[str, Any], strict: bool) -> dict[str, Any]:
    return strict_projection(result) if strict else with_jev_confidence(result)


class NonFiniteNumber(ValueError):
    """A payload holds a NaN or an infinity, which JSON cannot carry."""


def render(payload: Any) -> bytes:
    """Compact UTF-8 JSON; NonFiniteNumber for a NaN or an infinity (JSON has no such numbers).

    json reports a non-finite float with a ValueError it also uses for other failures (a
    circular reference), so the payload is searched before the refusal is called non-finite.
    """
    try:
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        if has_non_finite(payload):
            raise NonFiniteNumber(str(exc)) from None
        raise
    return text.encode("utf-8")


def has_non_finite(value: Any) -> bool:
    """Whether a float anywhere in `value` (dict keys included) is a NaN or an infinity.

    Iterative, and each container is visited once, so deep or self-referencing payloads end.
    """
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, (dict, list, tuple)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            else:
                stack.extend(item)
    return False
