"""Serving several bundles through a `laya_onnx.Router`: what the server does differently then.

`laya-onnx serve MODELS_DIR` (or `--model NAME=BUNDLE`) builds a Router (`build_router`) and the
app serves it through three adapters, so the HTTP contract (`contract.py`) stays one code path:

  * `RoutedAgent` — the Router as the one `ServedAgent` the worker calls: the body's routing
    controls (`model`, `task`, `lang`, `lang_guess`) reach `Router.predict` / `predict_batch`;
  * `RoutedCheckpoints` — the "checkpoint" role of `wire.Checkpoint`: a body's `model` resolved
    as laya-serve 0.4.15 resolves it (docs/http-api.md, "The model field"), the Router's own `routing` block kept, and
    `/health` over every resident checkpoint (laya-serve's keys, our `providers` /
    `provider_fallbacks` per checkpoint, the idle-unload window, the process RSS);
  * `RoutedCatalog` — `/v1/models` lists every checkpoint that has a bundle.

`IdleUnload` is LAYA_IDLE_UNLOAD_SECONDS: after that long without a decision request the resident
checkpoints are unloaded on the inference worker (never beside a pass); the next request reloads
its checkpoint, and every load is logged with its time (the cold start).

Framework-free, like `contract.py`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from collections.abc import Callable, Sequence
from typing import Any

from laya_onnx.core import settings
from laya_onnx.core.errors import ConfigError
from laya_onnx.core.hooks import BaseHook, PredictContext
from laya_onnx.core.memory import process_memory
from laya_onnx.core.names import BUNDLE_REPO, PUBLISHED_CHECKPOINTS, aliases_of, bundle_random_weights
from laya_onnx.core.router import Router, bundles_in
from laya_onnx.core.session import FallbackEntry, resolve_threads
from laya_onnx.serve.catalog import describe_checkpoint, int8_kernels_block, random_weights_block
from laya_onnx.serve.errors import ApiError
from laya_onnx.serve.wire import (
    ModelChoice,
    cpu_fallbacks,
    fallback_baseline,
    fallback_choice,
    names_a_path,
    preferred_device,
    provider_device,
)

log = logging.getLogger("laya_onnx.serve")

#: What `RoutedCheckpoints.name` reports in log lines (no single checkpoint answers every request).
ROUTER_NAME = "router"
#: The controls of one batch item, as laya-serve copies them into every request of the batch.
ITEM_CONTROLS = ("model", "task", "lang", "lang_guess", "max_len", "head_max_len")


# -- configuration ---------------------------------------------------------------------------


def parse_model_option(text: str) -> tuple[str, str]:
    """`--model NAME=BUNDLE` -> (NAME, BUNDLE)."""
    name, sep, bundle = text.partition("=")
    if not sep or not name.strip() or not bundle.strip():
        raise ConfigError("--model takes NAME=BUNDLE (a bundle folder or a Hub id), got %r" % (text,))
    return name.strip(), bundle.strip()


def build_router(
    models_dir: str | os.PathLike | None = None,
    named: Sequence[str] = (),
    providers: Sequence[Any] | None = None,
    strict_providers: bool = False,
    threads: int | None = None,
) -> Router:
    """The Router `laya-onnx serve` runs, from a models directory, `--model NAME=BUNDLE` options and
    the environment (laya-serve's names: LAYA_MAX_LOADED, LAYA_EXTRA_MODELS, LAYA_DEFAULT_MODEL,
    LAYA_AUTO_TASK, LAYA_PRELOAD (default on), LAYA_MODELS (the names preloaded; default all),
    LAYA_THREADS, which `threads` overrides). Refusals are ConfigError, before any bundle is loaded."""
    models: dict[str, Any] = dict(bundles_in(models_dir)) if models_dir is not None else {}
    for option in named:
        name, bundle = parse_model_option(option)
        models[name] = bundle
    models.update(settings.EXTRA_MODELS.read())
    options: dict[str, Any] = {"auto_task_detection": settings.AUTO_TASK.read()}
    max_loaded = settings.MAX_LOADED.read()
    if max_loaded is not None:
        options["max_loaded"] = max_loaded
    agent_kwargs: dict[str, Any] = {"strict_providers": True} if strict_providers else {}
    threads = resolve_threads(threads)
    if threads is not None:
        agent_kwargs["threads"] = threads
    if agent_kwargs:
        options["agent_kwargs"] = agent_kwargs
    try:
        router = Router(models, providers=providers, **options)
        default = settings.DEFAULT_MODEL.read()
        if default is not None:
            try:
                router.default = router.resolve(default)
            except ValueError as exc:
                raise settings.DEFAULT_MODEL.invalid(default, str(exc)) from None
        names = settings.MODELS.read()
        for name in names or ():
            router.resolve(name)  # an unknown name refuses the start, not the first request
    except ConfigError:
        raise
    except (ValueError, TypeError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    if not any(router.models.values()):
        raise ConfigError("no bundle to serve: give a models directory or --model NAME=BUNDLE")
    if settings.PRELOAD.read():
        router.preload(names)
    return router


# -- the adapters ----------------------------------------------------------------------------


class _ColdStarts(BaseHook):
    """Logs every load with its time and keeps each agent's fallback baseline from its load."""

    def __init__(self, router: Router):
        self.router = router
        self.baselines: dict[str, dict[str, int]] = {}

    def on_load(self, ctx: PredictContext) -> None:
        name = str(ctx.model)
        self.baselines[name] = fallback_baseline(getattr(ctx.agent, "fallbacks", {}))
        log.info("loaded checkpoint %s in %.2fs", name, self.router.load_seconds.get(name, 0.0))

    def on_evict(self, ctx: PredictContext) -> None:
        log.info("unloaded checkpoint %s", ctx.model)


class RoutedAgent:
    """The Router as the server's one agent: each call is routed (module docstring)."""

    name = ROUTER_NAME
    revision = None
    bundle = None

    def __init__(self, router: Router, on_call: Callable[[], None] | None = None):
        self.router = router
        self._on_call = on_call or (lambda: None)

    @property
    def providers(self) -> list[str]:
        for agent in self.router.resident().values():
            return list(agent.providers)
        return list(self.requested_providers)

    @property
    def requested_providers(self) -> list[str]:
        return [p if isinstance(p, str) else p[0] for p in (self.router.providers or [])]

    @property
    def fallbacks(self) -> dict[str, FallbackEntry]:
        """Every resident checkpoint's provider fallbacks, summed per provider."""
        total: dict[str, FallbackEntry] = {}
        for agent in self.router.resident().values():
            for provider, entry in agent.fallbacks.items():
                seen = total.setdefault(provider, {"count": 0, "last_reason": None})
                seen["count"] += entry["count"]
                seen["last_reason"] = entry["last_reason"] or seen["last_reason"]
        return total

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._on_call()
        try:
            return fn(*args, **kwargs)
        finally:
            self._on_call()  # on the worker, after the pass, failed or not (the idle clock)

    def predict(self, state: Any, questions: Any, **controls: Any) -> dict[str, Any]:
        return self._call(self.router.predict, state, questions, **controls)

    def predict_batch(self, states: Sequence[Any], questions: Any, **controls: Any) -> list[dict[str, Any]]:
        item = {k: controls.pop(k) for k in ITEM_CONTROLS if k in controls}
        item.setdefault("model", None)
        requests = [{"state": s, "questions": questions, **item} for s in states]
        return self._call(self.router.predict_batch, requests, **controls)

    def tournament_group_size(self, questions: Any, head_max_len: int | None = None) -> int | None:
        """The smallest group any resident checkpoint needs (its options then fit every head)."""
        sizes = [a.tournament_group_size(questions, head_max_len) for a in self.router.resident().values()]
        known = [s for s in sizes if s is not None]
        return min(known) if known else None


def _published_ids() -> dict[str, str]:
    """Standalone Hub ids a client may send as `model` -> the checkpoint name (not the bundle repo,
    which means "let the router choose")."""
    return {
        repo.lower(): name
        for name, places in PUBLISHED_CHECKPOINTS.items()
        for repo, sub in places
        if sub is None and repo != BUNDLE_REPO
    }


class RoutedCheckpoints:
    """The checkpoint role of `wire.Checkpoint` for a Router (module docstring)."""

    name = ROUTER_NAME

    def __init__(self, router: Router, idle: IdleUnload | None = None):
        self.router = router
        self.idle = idle
        self.cold = _ColdStarts(router)
        router.add_hook(self.cold)
        for name, agent in router.resident().items():  # preloaded before the hook existed
            self.cold.baselines[name] = fallback_baseline(agent.fallbacks)
            log.info("loaded checkpoint %s in %.2fs", name, router.load_seconds.get(name, 0.0))

    def check_model(self, model: Any) -> ModelChoice:
        """laya-serve's `_resolve_model`: auto-route for no model, the bundle repo or any other
        miss (the miss reported as a fallback); the checkpoint for a name, alias or published
        id; 422 for a path or Hub id."""
        if not model:
            return ModelChoice()
        text = str(model).strip()
        published = _published_ids().get(text.lower())
        if published is not None:
            return ModelChoice(published)
        if text.lower() == BUNDLE_REPO:
            return ModelChoice()
        try:
            return ModelChoice(self.router.resolve(model))
        except ValueError as exc:
            if names_a_path(text):
                raise ApiError(422, "%s, or omit model to let the router choose" % exc) from None
            return fallback_choice(text)

    def check_task(self, task: Any) -> None:
        """`task` reaches the Router, which refuses an unknown one (422) when it routes."""

    def routing_controls(self, model: str | None, task: Any, lang_guess: str | None) -> dict[str, Any]:
        controls: dict[str, Any] = {"model": model}
        if task is not None:
            controls["task"] = task
        if lang_guess is not None:
            controls["lang_guess"] = lang_guess
        return controls

    def with_routing(self, result: dict[str, Any]) -> dict[str, Any]:
        return result  # the Router's own block, already last

    def health(self) -> dict[str, Any]:
        """`/health`'s full payload: laya-serve's keys over the resident checkpoints, ours after."""
        resident = self.router.resident()
        providers = {name: list(agent.providers) for name, agent in resident.items()}
        fallbacks = {name: agent.fallbacks for name, agent in resident.items()}
        devices = {
            name: device
            for name, names in providers.items()
            if names and (device := provider_device(names[0])) is not None
        }
        measured = next(iter(devices.values()), None)
        payload: dict[str, Any] = {
            "status": "ok",
            "loaded": list(resident),
            "revisions": {name: getattr(agent, "revision", None) for name, agent in resident.items()},
            "device": measured or preferred_device(RoutedAgent(self.router).requested_providers),
            "device_is_preference": measured is None,
            "checkpoint_devices": devices,
            "cpu_fallbacks": {
                name: cpu_fallbacks(fallbacks[name], self.cold.baselines.get(name, {})) for name in resident
            },
            "providers": providers,
            "provider_fallbacks": fallbacks,
            **random_weights_block(resident),
            **int8_kernels_block(resident),
        }
        if self.idle is not None and self.idle.seconds:
            payload["idle_unload_seconds"] = self.idle.seconds
            payload["idle_seconds"] = round(self.idle.idle_for(), 1)
        payload["memory"] = process_rss()
        return payload


def process_rss() -> dict[str, int | None]:
    """This process's resident memory now and at its peak, in bytes (/proc; peak from getrusage
    where /proc is missing)."""
    try:
        memory = process_memory()
    except OSError:
        memory = {}
    peak = memory.get("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rss_bytes": memory.get("VmRSS"), "peak_rss_bytes": peak}


class RoutedCatalog:
    """`/v1/models` for a Router: every name with a bundle (Jev's keys; `x_` keys when `full`)."""

    def __init__(self, router: Router):
        self.router = router

    def listing(self, agent: Any, full: bool) -> dict[str, Any]:
        resident = self.router.resident()
        models = []
        for name, source in self.router.models.items():
            if source is None and name not in resident:
                continue
            loaded = resident.get(name)
            random = getattr(loaded, "random_weights", None) if loaded else bundle_random_weights(source)
            entry: dict[str, Any] = {
                "name": name,
                "description": describe_checkpoint(name, random),
                "release_date": "unknown",
            }
            if full:
                # A test checkpoint's bundle answers to the route's name, never to a Hub id
                published = (
                    []
                    if random
                    else sorted(
                        repo
                        for repo, sub in PUBLISHED_CHECKPOINTS.get(name, ())
                        if sub is None and repo != BUNDLE_REPO
                    )
                )
                entry.update(
                    {
                        "x_aliases": aliases_of(name) + published,
                        "x_repo": None if random else self.router.repo(name),
                        "x_loaded": name in resident,
                        "x_revision": getattr(loaded, "revision", None),
                    }
                )
                if random:
                    entry["x_random_weights"] = random
                kernel = getattr(loaded, "int8_kernel", None)
                if kernel is not None:
                    entry["x_int8_kernel"] = kernel
            models.append(entry)
        return {"models": models}


class IdleUnload:
    """LAYA_IDLE_UNLOAD_SECONDS (module docstring); `mark()` on every decision request and pass."""

    def __init__(self, router: Router, seconds: float):
        self.router = router
        self.seconds = seconds
        self.last = time.monotonic()

    def mark(self) -> None:
        self.last = time.monotonic()

    def idle_for(self) -> float:
        return time.monotonic() - self.last

    def unload_if_idle(self) -> None:
        """On the worker: re-checked there, so a pass that finished after the reaper looked counts."""
        idle = self.idle_for()
        if idle >= self.seconds and self.router.loaded:
            self.router.unload()
            log.info("idle for %.1fs: unloaded resident checkpoints", idle)

    async def reap(
        self, busy: Callable[[], bool], run_on_worker: Callable[[Callable[[], None]], Any]
    ) -> None:
        """Tick every max(0.05, min(seconds / 4, 5)) s; skip while a pass runs or waits."""
        interval = max(0.05, min(self.seconds / 4.0, 5.0))
        while True:
            await asyncio.sleep(interval)
            if busy() or self.idle_for() < self.seconds:
                continue
            try:
                await run_on_worker(self.unload_if_idle)
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed unload must not stop the next attempt
                log.exception("idle unload failed")


def served_router(router: Router) -> tuple[RoutedAgent, RoutedCheckpoints, RoutedCatalog, IdleUnload | None]:
    """The app's adapters for `router` (IdleUnload only when LAYA_IDLE_UNLOAD_SECONDS is on)."""
    seconds = settings.IDLE_UNLOAD_SECONDS.read()
    idle = IdleUnload(router, seconds) if seconds else None
    agent = RoutedAgent(router, on_call=idle.mark if idle else None)
    return agent, RoutedCheckpoints(router, idle), RoutedCatalog(router), idle


__all__ = [
    "IdleUnload",
    "RoutedAgent",
    "RoutedCatalog",
    "RoutedCheckpoints",
    "build_router",
    "parse_model_option",
    "served_router",
]
