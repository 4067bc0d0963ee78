"""The Router behind the server: `build_router` (what `laya-onnx serve MODELS_DIR` runs),
`RoutedAgent` (the Router as the one agent the worker calls) and `IdleUnload`.

`RoutedAgent` hands a body's routing controls (`model`, `task`, `lang`, `lang_guess`) to
`Router.predict` / `predict_batch`; over one bundle (`served.OneBundle`) it also reads as that
bundle's agent (its name, its pass memory), so the batch plan is the one the bundle needs.

`IdleUnload` is LAYA_IDLE_UNLOAD_SECONDS: after that long without a decision request the resident
checkpoints are unloaded on the inference worker (never beside a pass); the next request reloads
its checkpoint, and every load is logged with its time (the cold start).

Framework-free, like `contract.py`; `served.py` puts it on the wire.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from laya_onnx.core import settings
from laya_onnx.core.errors import ConfigError
from laya_onnx.core.names import BUNDLE_REPO, PUBLISHED_CHECKPOINTS
from laya_onnx.core.router import Router, bundles_in
from laya_onnx.core.session import FallbackEntry, resolve_threads

log = logging.getLogger("laya_onnx.serve")

#: What a Router's `RoutedAgent.name` reports in log lines (no single checkpoint answers every request).
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


# -- the agent -------------------------------------------------------------------------------


class RoutedAgent:
    """The Router as the server's one agent: each call is routed (module docstring). Over one
    bundle (`lone`), what the server reads of an agent beyond these members is the bundle's."""

    def __init__(
        self,
        router: Router,
        on_call: Callable[[], None] | None = None,
        lone: Any = None,
        pin: str | None = None,
    ):
        self.router = router
        self._on_call = on_call or (lambda: None)
        self.lone = lone
        #: The checkpoint a call names no `model` for goes to (None: the Router routes it). Not
        #: a control of the call, so pinned calls still group into one pass (`core.grouping`).
        self.pin = pin

    def __getattr__(self, attr: str) -> Any:
        lone = self.__dict__.get("lone")
        if lone is None or attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(lone, attr)

    @property
    def name(self) -> str:
        return ROUTER_NAME if self.lone is None else self.lone.name

    @property
    def revision(self) -> str | None:
        return None if self.lone is None else self.lone.revision

    @property
    def providers(self) -> list[str]:
        for agent in self.router.resident().values():
            return list(agent.providers)
        return list(self.requested_providers)

    @property
    def requested_providers(self) -> list[str]:
        if self.lone is not None:
            return list(self.lone.requested_providers)
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
        controls.setdefault("model", self.pin)
        return self._call(self.router.predict, state, questions, **controls)

    def predict_batch(self, states: Sequence[Any], questions: Any, **controls: Any) -> list[dict[str, Any]]:
        item = {k: controls.pop(k) for k in ITEM_CONTROLS if k in controls}
        item.setdefault("model", self.pin)
        requests = [{"state": s, "questions": questions, **item} for s in states]
        return self._call(self.router.predict_batch, requests, **controls)

    def tournament_group_size(self, questions: Any, head_max_len: int | None = None) -> int | None:
        """The smallest group any resident checkpoint needs (its options then fit every head)."""
        sizes = [a.tournament_group_size(questions, head_max_len) for a in self.router.resident().values()]
        known = [s for s in sizes if s is not None]
        return min(known) if known else None


def published_ids() -> dict[str, str]:
    """Standalone Hub ids a client may send as `model` -> the checkpoint name (not the bundle repo,
    which means "let the router choose")."""
    return {
        repo.lower(): name
        for name, places in PUBLISHED_CHECKPOINTS.items()
        for repo, sub in places
        if sub is None and repo != BUNDLE_REPO
    }


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


__all__ = ["IdleUnload", "RoutedAgent", "build_router", "parse_model_option"]
