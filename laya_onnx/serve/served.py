"""What a server serves: a `laya_onnx.Router`, or one bundle as a Router of one (`OneBundle`).
`Served` is the agent the worker calls, how a body's `model` and `task` are taken
(docs/http-api.md#the-model-field), `/health`, `/v1/models`, idle unloading and the warm-up
(serve/README.md#several-checkpoints-serve-models_dir).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

from laya_onnx.core import settings
from laya_onnx.core.bundle import GRAPH_FILE, MANIFEST_FILE, Bundle, bundle_origin, sha256_file
from laya_onnx.core.errors import ConfigError, InvalidRequest
from laya_onnx.core.hooks import BaseHook, PredictContext
from laya_onnx.core.machine import provider_device
from laya_onnx.core.memory import process_rss
from laya_onnx.core.names import (
    BUNDLE_REPO,
    PUBLISHED_CHECKPOINTS,
    aliases_of,
    bundle_random_weights,
    canonical_name,
    published_ids,
    published_name,
    published_repos,
)
from laya_onnx.core.protocol import DecisionAgent
from laya_onnx.core.router import Router, bundles_in, is_bundle_dir
from laya_onnx.core.session import FallbackEntry, resolve_threads
from laya_onnx.serve.errors import ApiError

log = logging.getLogger("laya_onnx.serve")

#: Jev requires a string; a bundle records no release date of its checkpoint.
UNKNOWN_RELEASE_DATE = "unknown"
#: The controls of one batch item, as laya-serve copies them into every request of the batch.
ITEM_CONTROLS = ("model", "task", "lang", "lang_guess", "max_len", "head_max_len")


@runtime_checkable
class ServedAgent(DecisionAgent, Protocol):
    """What the server reads of an agent beside `DecisionAgent`, from the loop while a pass runs
    (each safe to read concurrently). `int8_kernel`: "u8s8", "u8u8" or None."""

    @property
    def name(self) -> str: ...

    @property
    def revision(self) -> str | None: ...

    @property
    def bundle(self) -> Bundle: ...

    @property
    def providers(self) -> list[str]: ...

    @property
    def requested_providers(self) -> list[str]: ...

    @property
    def int8_kernel(self) -> str | None: ...

    @property
    def fallbacks(self) -> dict[str, FallbackEntry]: ...


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
    """The Router of `laya-onnx serve MODELS_DIR` and `--model NAME=BUNDLE`; refusals are
    ConfigError, before any bundle is loaded."""
    models: dict[str, Any] = dict(bundles_in(models_dir)) if models_dir is not None else {}
    models.update(map(parse_model_option, named))
    models.update(settings.EXTRA_MODELS.read())
    options: dict[str, Any] = {"auto_task_detection": settings.AUTO_TASK.read()}
    max_loaded = settings.MAX_LOADED.read()
    if max_loaded is not None:
        options["max_loaded"] = max_loaded
    agent_kwargs: dict[str, Any] = {"strict_providers": True} if strict_providers else {}
    threads = resolve_threads(threads)
    if threads is not None:
        agent_kwargs["threads"] = threads
    try:
        router = Router(models, providers=providers, agent_kwargs=agent_kwargs, **options)
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


def is_models_dir(path: os.PathLike | str | None) -> bool:
    """A folder of bundle folders (`laya-onnx export --all`), rather than one bundle."""
    if path is None or not os.path.isdir(path) or is_bundle_dir(Path(path)):
        return False
    return any(child.is_dir() and is_bundle_dir(child) for child in Path(path).iterdir())


def load_agent(bundle: os.PathLike | str | None, models: Sequence[str] = (), **options: Any) -> Any:
    """A Router for a models directory or `models` (`NAME=BUNDLE`), else the bundle's `ONNXAgent`."""
    if models or bundle is None or is_models_dir(bundle):
        return build_router(bundle, models, **options)
    from laya_onnx import ONNXAgent

    return ONNXAgent(bundle, **options)


class ModelChoice(NamedTuple):
    """A body's `model` as the server took it: the checkpoint it pins (None: the router chooses),
    and its text when it named nothing here and was answered anyway (`X-Model-Fallback`)."""

    pinned: str | None = None
    fallback: str | None = None


def fallback_choice(text: str) -> ModelChoice:
    """A `model` naming nothing here: answered anyway, reported unless it is TypeSafe's "latest"."""
    return ModelChoice(None, None if text.lower() == "jev-latest" else text)


def names_a_path(text: str) -> bool:
    """A filesystem path or a Hub repo id rather than a checkpoint name."""
    return bool(text) and (text[0] in ".~" or "/" in text or "\\" in text)


class Served(BaseHook):
    """A Router's checkpoints on the wire and the agent the worker calls; its hook logs (un)loads."""

    name = "router"  # in log lines: no single checkpoint answers every request
    reports_memory = True  # the process's memory in the full /health

    def __init__(self, router: Router, idle_seconds: float | None = None):
        self.router = router
        self.idle_seconds = idle_seconds  # None: never unload
        self.last = time.monotonic()  # when a decision last was admitted or ended
        self.baselines: dict[str, dict[str, int]] = {}

    @classmethod
    def of(cls, served: Router | Any) -> Served:
        """A Router as it is (LAYA_IDLE_UNLOAD_SECONDS applies), or one loaded agent as a Router of one."""
        if not isinstance(served, Router):
            return OneBundle(served)
        this = cls(served, settings.IDLE_UNLOAD_SECONDS.read() or None)
        served.add_hook(this)
        for name, agent in served.resident().items():  # preloaded before the hook existed
            this._loaded(name, agent)
        return this

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.mark()
        try:
            return fn(*args, **kwargs)
        finally:
            self.mark()  # on the worker, after the pass, failed or not (the idle clock)

    def predict(self, state: Any, questions: Any, **controls: Any) -> dict[str, Any]:
        return self._call(self.router.predict, state, questions, **controls)

    def predict_batch(self, states: Sequence[Any], questions: Any, **controls: Any) -> list[dict[str, Any]]:
        item = {k: controls.pop(k) for k in ITEM_CONTROLS if k in controls}
        requests = [{"state": s, "questions": questions, **item} for s in states]
        return self._call(self.router.predict_batch, requests, **controls)

    def tournament_group_size(self, questions: Any, head_max_len: int | None = None) -> int | None:
        """The smallest group any resident checkpoint needs (its options then fit every head)."""
        sizes = [a.tournament_group_size(questions, head_max_len) for a in self.resident().values()]
        known = [s for s in sizes if s is not None]
        return min(known) if known else None

    @property
    def fallbacks(self) -> dict[str, FallbackEntry]:
        """Every resident checkpoint's provider fallbacks, summed per provider."""
        total: dict[str, FallbackEntry] = {}
        for agent in self.resident().values():
            for provider, entry in agent.fallbacks.items():
                seen = total.setdefault(provider, {"count": 0, "last_reason": None})
                seen["count"] += entry["count"]
                seen["last_reason"] = entry["last_reason"] or seen["last_reason"]
        return total

    def on_load(self, ctx: PredictContext) -> None:
        self._loaded(str(ctx.model), ctx.agent)

    def _loaded(self, name: str, agent: Any) -> None:
        self.baselines[name] = fallback_baseline(getattr(agent, "fallbacks", {}))
        log.info("loaded checkpoint %s in %.2fs", name, self.router.load_seconds.get(name, 0.0))

    def on_evict(self, ctx: PredictContext) -> None:
        log.info("unloaded checkpoint %s", ctx.model)

    def describe(self) -> str:
        """What is served, for the startup log line."""
        served = sorted(n for n, source in self.router.models.items() if source)
        return "checkpoints %s (resident: %s)" % (served, ", ".join(self.router.loaded) or "none")

    def check_model(self, model: Any) -> ModelChoice:
        """laya-serve's `_resolve_model`: no model, or the bundle repo, lets the router choose."""
        if not model:
            return ModelChoice()
        text = str(model).strip()
        return ModelChoice() if text.lower() == BUNDLE_REPO else self._named(model, text)

    def _named(self, model: Any, text: str) -> ModelChoice:
        """A name, alias or published id pins its checkpoint; a path or Hub id is a 422; any other
        text is answered anyway, as a reported fallback."""
        published = published_ids().get(text.lower())
        if published is not None:
            return ModelChoice(published)
        try:
            return ModelChoice(self.router.resolve(model))
        except ValueError as exc:
            if names_a_path(text):
                raise ApiError(422, "%s, or omit model to let the router choose" % exc) from None
            return fallback_choice(text)

    def check_task(self, task: Any) -> None:
        """The Router refuses an unknown `task` (422) when it routes."""

    def routing_controls(self, model: str | None, task: Any, lang_guess: str | None) -> dict[str, Any]:
        sent = {"task": task, "lang_guess": lang_guess}
        return {"model": model, **{k: v for k, v in sent.items() if v is not None}}

    def with_routing(self, result: dict[str, Any]) -> dict[str, Any]:
        return result  # the Router's own block, already last

    def mark(self) -> None:
        """A decision request was admitted, or a pass ended: the idle window restarts."""
        self.last = time.monotonic()

    def unload_if_idle(self) -> None:
        """On the worker: unload the resident checkpoints once idle past LAYA_IDLE_UNLOAD_SECONDS."""
        idle = time.monotonic() - self.last
        if self.idle_seconds and idle >= self.idle_seconds and self.router.loaded:
            self.router.unload()
            log.info("idle for %.1fs: unloaded resident checkpoints", idle)

    def resident(self) -> dict[str, Any]:
        return self.router.resident()

    def unhealthy(self) -> list[str]:
        """The loaded checkpoints whose device failed pass after pass (`ONNXAgent.healthy`)."""
        return [name for name, each in self.resident().items() if not getattr(each, "healthy", True)]

    def health(self, full: bool) -> tuple[int, dict[str, Any]]:
        """`/health`'s status and payload (laya-serve's keys, then ours, when `full`), read mid-pass."""
        sick = self.unhealthy()
        status, code = ("unhealthy", 503) if sick else ("ok", 200)
        if not full:
            return code, {"status": status}
        resident = self.resident()
        providers = {name: list(agent.providers) for name, agent in resident.items()}
        fallbacks = {name: agent.fallbacks for name, agent in resident.items()}  # one snapshot each
        devices = {
            name: device
            for name, names in providers.items()
            if names and (device := provider_device(names[0])) is not None
        }
        measured = next(iter(devices.values()), None)
        requested = next(iter(self.router.providers or ()), None)  # a name, or (name, options)
        if requested is not None and not isinstance(requested, str):
            requested = requested[0]
        payload: dict[str, Any] = {
            "status": status,
            "loaded": list(resident),
            "revisions": {name: getattr(agent, "revision", None) for name, agent in resident.items()},
            "device": measured or provider_device(requested) or "cpu",
            "device_is_preference": measured is None,
            "checkpoint_devices": devices,
            "cpu_fallbacks": {
                name: cpu_fallbacks(fallbacks[name], self.baselines.get(name, {})) for name in resident
            },
            "providers": providers,
            "provider_fallbacks": fallbacks,
        }
        # absent unless some loaded bundle has them, as laya-serve's payload has no such keys
        for key, attr in (("random_weights", "random_weights"), ("int8_kernels", "int8_kernel")):
            found = {name: value for name, each in resident.items() if (value := getattr(each, attr, None))}
            if found:
                payload[key] = found
        if self.idle_seconds:
            payload["idle_unload_seconds"] = self.idle_seconds
            payload["idle_seconds"] = round(time.monotonic() - self.last, 1)
        if self.reports_memory:
            payload["memory"] = process_rss()
        if sick:
            payload["unhealthy"] = sick
        return code, payload

    def listing(self, full: bool) -> dict[str, Any]:
        """`/v1/models` (serve/README.md#v1models): Jev's keys, and the `x_` keys when `full`."""
        resident = self.resident()
        models = []
        for name, source in self._listed().items():
            loaded = resident.get(name)
            random = getattr(loaded, "random_weights", None) if loaded else bundle_random_weights(source)
            description = "laya %s checkpoint served by laya-onnx (ONNX Runtime)" % name
            if random:
                description = (
                    "%s: random test weights (preset %s) served by laya-onnx; its answers carry no meaning"
                    % (name, random)
                )
            entry = {"name": name, "description": description, "release_date": UNKNOWN_RELEASE_DATE}
            if full:
                entry.update(self._card(name, loaded, random))
                if random:
                    entry["x_random_weights"] = random
                if (kernel := getattr(loaded, "int8_kernel", None)) is not None:
                    entry["x_int8_kernel"] = kernel
            models.append(entry)
        return {"models": models}

    def _listed(self) -> dict[str, Any]:
        """{name: bundle source} of the checkpoints with a bundle, and of the loaded."""
        resident = self.resident()
        return {n: s for n, s in self.router.models.items() if s is not None or n in resident}

    def _card(self, name: str, loaded: Any, random: str | None) -> dict[str, Any]:
        """A listing entry's `x_` keys (a test checkpoint answers to no Hub id)."""
        return {
            "x_aliases": aliases_of(name) + ([] if random else published_repos(name)),
            "x_repo": None if random else self.router.repo(name),
            "x_loaded": loaded is not None,
            "x_revision": getattr(loaded, "revision", None),
        }

    def warm_up(self) -> None:
        """On the worker: each loaded checkpoint's `warm_up` (ONNXAgent's: probe, one pass per length)."""
        for name, agent in self.resident().items():
            if hasattr(agent, "warm_up"):
                agent.warm_up()
                log.info("warmed up %s", name)


class OneBundle(Served):
    """One loaded agent as a Router of one, every call pinned to it, on the single-bundle wire."""

    reports_memory = False

    def __init__(self, agent: Any):
        router = Router(providers=agent.requested_providers)  # the single-bundle /health's device
        try:
            key = canonical_name(agent.name)
            router.attach(key, agent)
        except InvalidRequest:  # a name the Router cannot register: the wire still shows it
            key = "served"
            router.attach(key, agent)
        super().__init__(router)
        self.lone = agent
        self.key = key
        self.name: str = agent.name  # the checkpoint's, not "router"
        self.repo = bundle_origin(agent.bundle.manifest, agent.bundle.root) or agent.name
        self.baselines[self.name] = fallback_baseline(agent.fallbacks)
        try:  # manifest.json lists every file's digest: its own pins the bundle
            manifest_sha256: str | None = sha256_file(Path(agent.bundle.root) / MANIFEST_FILE)
        except OSError:  # removed or unreadable since the bundle was opened
            manifest_sha256 = None
        self.digests = (agent.bundle.manifest.digest(GRAPH_FILE), manifest_sha256)

    def describe(self) -> str:
        return "checkpoint %r (revision %s)" % (self.name, self.lone.revision)

    def _unknown(self, value: Any) -> str:
        aliases = aliases_of(self.name)
        return "unknown model %r; choose one of %s (or an alias: %s)" % (value, [self.name], aliases)

    def _named(self, model: Any, text: str) -> ModelChoice:
        """This checkpoint for its names and, as a reported fallback, any other; 422 for a path, a
        Hub id or another laya checkpoint's name (which this checkpoint would answer wrongly)."""
        target = published_name(text.lower()) or canonical_name(text)
        if target == self.name:
            return ModelChoice()
        if target in PUBLISHED_CHECKPOINTS or names_a_path(text):
            raise ApiError(422, self._unknown(model) + ", or omit model to let the router choose")
        return fallback_choice(text)

    def check_task(self, task: Any) -> None:
        """`task` pins a checkpoint by name; anything but this one is the core's unknown-model 422."""
        if task is not None and canonical_name(task) != self.name:
            raise ApiError(422, self._unknown(task))

    def routing_controls(self, model: str | None, task: Any, lang_guess: Any) -> dict[str, Any]:
        return {"model": self.key}  # the checks above refused a model or task it is not

    def with_routing(self, result: dict[str, Any]) -> dict[str, Any]:
        routing = {"model": self.name, "repo": self.repo, "reason": "served bundle"}
        return {**result, "routing": {**routing, "detection": None, "workflow": None}}

    def resident(self) -> dict[str, Any]:
        return {self.name: self.lone}

    def _listed(self) -> dict[str, Any]:
        return {self.name: None}

    def _card(self, name: str, loaded: Any, random: str | None) -> dict[str, Any]:
        """The bundle's `x_` keys; the bundle repo is last of its Hub ids (it means "auto")."""
        hub_ids = [] if random else [*published_repos(self.name), BUNDLE_REPO]
        return {
            "x_aliases": aliases_of(self.name) + hub_ids,
            "x_revision": self.lone.revision,
            "x_repo": self.repo,
            "x_graph_sha256": self.digests[0],
            "x_manifest_sha256": self.digests[1],
            "x_precision": self.lone.bundle.precision.precision,
            "x_providers": list(self.lone.providers),
        }


def cpu_fallbacks(fallbacks: dict[str, FallbackEntry], baseline: dict[str, int]) -> dict[str, Any]:
    """laya-serve's `{count, last_reason}`: the counts above `baseline`, those at load."""
    count, reason = 0, None
    for provider, entry in fallbacks.items():
        delta = entry["count"] - baseline.get(provider, 0)
        if delta > 0:
            count += delta
            reason = entry["last_reason"]
    return {"count": count, "last_reason": reason}


def fallback_baseline(fallbacks: dict[str, FallbackEntry]) -> dict[str, int]:
    return {provider: entry["count"] for provider, entry in fallbacks.items()}
