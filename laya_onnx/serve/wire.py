"""What crosses the wire besides the agent's own answer: the checkpoint this server serves
(`model` / `task` resolution, the `routing` block, `/health` facts) and the response shaping
(`x_jev_confidence`, the strict Jev projection, JSON rendering).

laya-serve fronts a Router over several checkpoints; this server fronts exactly one bundle, so
"routing" always lands on it. The names and aliases below are laya 0.4.15's (router.py), restated
because the reference package is a dev dependency only.
"""

from __future__ import annotations

import json
import math
from typing import Any

from laya_onnx.serve.errors import ApiError

#: The Hub id whose documented meaning is "let the router choose" (bundle of all checkpoints).
BUNDLE_REPO = "convaiinnovations/laya"
BUILTIN_CHECKPOINTS = ("english", "multilingual", "typed-decisions")
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
#: Published standalone ids that pin a checkpoint (case-insensitive).
PUBLISHED_IDS = {
    "convaiinnovations/laya-multilingual": "multilingual",
    "convaiinnovations/laya-typed-decisions": "typed-decisions",
}
ROUTING_REASON = "served bundle"


def canonical(name: Any) -> str:
    key = str(name).strip().lower()
    return ALIASES.get(key, key)


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
    def of(cls, agent: Any) -> Checkpoint:
        name = str(getattr(agent, "name", None) or "english")
        return cls(name=name, repo=bundle_source(agent) or name)

    @property
    def aliases(self) -> list[str]:
        return sorted(alias for alias, target in ALIASES.items() if target == self.name)

    def _unknown(self, value: Any) -> str:
        return "unknown model %r; choose one of %s (or an alias: %s)" % (value, [self.name], self.aliases)

    def check_model(self, model: Any) -> None:
        """Accept a body's `model` or refuse it with 422 (http.md §2.3, one checkpoint).

        Falsy, the bundle id, this checkpoint's name/alias/published id, and any other name
        (a Jev id like `jev-1`) are answered by this checkpoint. A path or an unpublished Hub id
        is a 422: the caller named a checkpoint this server cannot load. So is another laya
        checkpoint's name: laya-serve would pin it, and answering it with this checkpoint
        instead would be the wrong answer the 422 exists to prevent.
        """
        if not model:
            return
        text = str(model).strip()
        low = text.lower()
        if low == BUNDLE_REPO:
            return
        target = PUBLISHED_IDS.get(low) or canonical(text)
        if target == self.name:
            return
        if target in BUILTIN_CHECKPOINTS or names_a_path(text):
            raise ApiError(422, self._unknown(model) + ", or omit model to let the router choose")

    def check_task(self, task: Any) -> None:
        """`task` pins a checkpoint by name; anything but this one is the core's unknown-model 422."""
        if task is None:
            return
        if canonical(task) != self.name:
            raise ApiError(422, self._unknown(task))

    def routing(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "repo": self.repo,
            "reason": ROUTING_REASON,
            "detection": None,
            "workflow": None,
        }


def bundle_source(agent: Any) -> str | None:
    """Where the served bundle came from: its Hub repo (`org/repo[/subfolder]`, from the
    manifest's `source`), else the bundle folder's name. Never the absolute bundle path: that
    would publish the host's filesystem layout."""
    bundle = getattr(agent, "bundle", None)
    manifest = getattr(bundle, "manifest", None)
    source = manifest.get("source") if isinstance(manifest, dict) else None
    repo = source.get("repo") if isinstance(source, dict) else None
    if isinstance(repo, str) and repo:
        sub = source.get("subfolder")
        return "%s/%s" % (repo, sub) if isinstance(sub, str) and sub else repo
    root = getattr(bundle, "root", None)
    return (getattr(root, "name", "") or None) if root is not None else None


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


def preferred_device(agent: Any) -> str:
    requested = getattr(agent, "requested_providers", None)
    if isinstance(requested, (list, tuple)) and requested:
        first = requested[0]
        name = first[0] if isinstance(first, (list, tuple)) and first else first
        return provider_device(name) or "cpu"
    return "cpu"


def read_fallbacks(agent: Any) -> dict[str, dict[str, Any]]:
    """The agent's `{provider: {count, last_reason}}` table, copied; {} when it has none.

    The worker thread may add a provider to the table while the event loop reads it, so a
    read that races a first fallback is simply retried.
    """
    for _ in range(3):
        try:
            table = getattr(agent, "fallbacks", None)
            if not isinstance(table, dict):
                return {}
            return {str(p): dict(entry) for p, entry in table.items() if isinstance(entry, dict)}
        except RuntimeError:  # dictionary changed size during iteration
            continue
    return {}


def _count(entry: dict[str, Any]) -> int:
    n = entry.get("count") or 0
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


def cpu_fallbacks(agent: Any, baseline: dict[str, int]) -> dict[str, Any]:
    """laya-serve's `{count, last_reason}`: passes that failed on an accelerator and were retried
    on CPU since the server started.

    `baseline` is the per-provider count when the app was built: those are the providers that
    never attached (a CPU-only build, no GPU), which laya-serve does not count as fallbacks —
    that case is what `device` reports. An agent with laya's own counters is read as is.
    """
    if hasattr(agent, "cpu_fallback_count"):
        return {
            "count": getattr(agent, "cpu_fallback_count", 0),
            "last_reason": getattr(agent, "last_fallback_reason", None),
        }
    count, reason = 0, None
    for provider, entry in read_fallbacks(agent).items():
        delta = _count(entry) - baseline.get(provider, 0)
        if delta > 0:
            count += delta
            reason = entry.get("last_reason")
    return {"count": count, "last_reason": reason}


def fallback_baseline(agent: Any) -> dict[str, int]:
    return {p: _count(entry) for p, entry in read_fallbacks(agent).items()}


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


def strict_projection(result: dict[str, Any]) -> dict[str, Any]:
    """`LAYA_JEV_STRICT`: exactly the Jev contract's keys; nothing is recomputed.

    A typed answer missing its own value key raises KeyError, which the handler reports as the
    500 it is (the agent broke the contract), as laya-serve does.
    """
    answers = {}
    for qid, a in (result.get("answers") or {}).items():
        kind = a.get("type") if isinstance(a, dict) else None
        if kind == "choice":
            answers[qid] = {
                "type": "choice",
                "choice": a["choice"],
                "confidence": a["confidence"],
                "probabilities": a["probabilities"],
            }
        elif kind == "score":
            answers[qid] = {
                "type": "score",
                "score": a["score"],
                "confidence": a["confidence"],
                "probabilities": a["probabilities"],
                "legend": a["legend"],
            }
        elif kind == "noul":
            answers[qid] = {"type": "noul", "noul": a["noul"]}
        else:
            answers[qid] = a
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


def render(payload: Any) -> bytes:
    """Compact UTF-8 JSON; a NaN or infinity raises ValueError (JSON has no such numbers)."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
