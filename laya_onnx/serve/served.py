"""What a server serves: a `laya_onnx.Router`, over a models folder or over one bundle.

`Served.of(router_or_agent)` gives the decision path one object: the agent the worker calls
(`routed.RoutedAgent`), how a body's `model` and `task` are taken, the `routing` block, `/health`
and `/v1/models`, the idle-unload window and the warm-up a server runs before it is ready.

One bundle is served as a Router of one (`OneBundle`): the same path, with the bytes the
single-bundle wire has always had, all decided in that one class — its checkpoint's name in
place of the Router's, a `model` or `task` naming another laya checkpoint refused (nothing here
could answer it), the `routing` block saying `served bundle`, `/health` without the Router's
process keys, and `/v1/models` with the bundle's digests.
"""

from __future__ import annotations

import hashlib
import logging
import resource
from pathlib import Path
from typing import Any, NamedTuple

from laya_onnx.core import settings
from laya_onnx.core.bundle import GRAPH_FILE, MANIFEST_FILE, Bundle, bundle_origin
from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.hooks import BaseHook, PredictContext
from laya_onnx.core.memory import process_memory
from laya_onnx.core.names import (
    BUNDLE_REPO,
    PUBLISHED_CHECKPOINTS,
    aliases_of,
    bundle_random_weights,
    canonical_name,
    published_name,
)
from laya_onnx.core.router import Router
from laya_onnx.core.session import FallbackEntry
from laya_onnx.serve.errors import ApiError
from laya_onnx.serve.routed import ROUTER_NAME, IdleUnload, RoutedAgent, published_ids

log = logging.getLogger("laya_onnx.serve")

#: /health's status (with a 503) once a checkpoint's device keeps failing passes.
UNHEALTHY = "unhealthy"
#: Jev requires a string; a bundle records no release date of its checkpoint.
UNKNOWN_RELEASE_DATE = "unknown"
#: One bundle's `routing.reason`: nothing was routed, the one checkpoint answered.
ROUTING_REASON = "served bundle"
#: `model` values that ask for whatever this server answers with (TypeSafe's "latest" id): not
#: a fallback to report, unlike a name this server does not know.
GENERIC_MODEL_IDS = frozenset({"jev-latest"})
#: Row lengths the warm-up runs one pass at (each at most the bundle's own max_len): the shapes
#: onnxruntime meets first in real traffic, so the first requests do not pay for them.
WARM_LENGTHS = (32, 64, 128, 256, 512)


class ModelChoice(NamedTuple):
    """A body's `model` as the server took it."""

    #: The checkpoint it pins (None: the router chooses).
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


class Served:
    """A Router's checkpoints on the wire (module docstring); `OneBundle` for one bundle."""

    name = ROUTER_NAME

    def __init__(self, router: Router, agent: RoutedAgent, idle: IdleUnload | None = None):
        self.router = router
        self.agent = agent
        self.idle = idle
        #: Each checkpoint's provider fallbacks when it loaded (`cpu_fallbacks`).
        self.baselines: dict[str, dict[str, int]] = {}

    @classmethod
    def of(cls, served: Router | Any) -> Served:
        """A Router as it is (LAYA_IDLE_UNLOAD_SECONDS applies), or one loaded agent as a Router of one."""
        if not isinstance(served, Router):
            return OneBundle(served)
        seconds = settings.IDLE_UNLOAD_SECONDS.read()
        idle = IdleUnload(served, seconds) if seconds else None
        this = cls(served, RoutedAgent(served, on_call=idle.mark if idle else None), idle)
        served.add_hook(ColdStarts(served, this.baselines))
        for name, agent in served.resident().items():  # preloaded before the hook existed
            this.baselines[name] = fallback_baseline(agent.fallbacks)
            log.info("loaded checkpoint %s in %.2fs", name, served.load_seconds.get(name, 0.0))
        return this

    # -- a decision's model, task and routing ---------------------------------------------------

    def check_model(self, model: Any) -> ModelChoice:
        """laya-serve's `_resolve_model`: auto-route for no model, the bundle repo or any other
        miss (the miss reported as a fallback); the checkpoint for a name, alias or published
        id; 422 for a path or Hub id (docs/http-api.md, "The model field")."""
        if not model:
            return ModelChoice()
        text = str(model).strip()
        published = published_ids().get(text.lower())
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
        """What the Router is asked to route by (`RoutedAgent` passes it on)."""
        controls: dict[str, Any] = {"model": model}
        if task is not None:
            controls["task"] = task
        if lang_guess is not None:
            controls["lang_guess"] = lang_guess
        return controls

    def with_routing(self, result: dict[str, Any]) -> dict[str, Any]:
        return result  # the Router's own block, already last

    def mark(self) -> None:
        """A decision request was admitted: the idle window restarts."""
        if self.idle is not None:
            self.idle.mark()

    # -- /health ----------------------------------------------------------------------------------

    def resident(self) -> dict[str, Any]:
        """{name on the wire: agent} of the loaded checkpoints."""
        return self.router.resident()

    def requested_providers(self) -> list[str]:
        return [p if isinstance(p, str) else p[0] for p in (self.router.providers or [])]

    def unhealthy(self) -> list[str]:
        """The loaded checkpoints whose device failed pass after pass (`ONNXAgent.healthy`): the
        process needs a restart, which /health and /health/live ask for with a 503."""
        return [name for name, each in self.resident().items() if not getattr(each, "healthy", True)]

    def health(self, full: bool) -> tuple[int, dict[str, Any]]:
        """`/health`'s status and payload: liveness for anyone; the full payload only when `full`
        (no key, or its bearer). Reads attributes and the agents' fallback snapshots, never a
        pass, so it answers while a pass is running."""
        sick = self.unhealthy()
        payload: dict[str, Any] = self._health() if full else {"status": "ok"}
        if sick:
            payload["status"] = UNHEALTHY
            if full:
                payload["unhealthy"] = sick
        return (503 if sick else 200), payload

    def _health(self) -> dict[str, Any]:
        """laya-serve's keys over the resident checkpoints, ours after them."""
        resident = self.resident()
        providers = {name: list(agent.providers) for name, agent in resident.items()}
        fallbacks = {name: agent.fallbacks for name, agent in resident.items()}  # one snapshot each
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
            "device": measured or preferred_device(self.requested_providers()),
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
        return {**payload, **self._process()}

    def _process(self) -> dict[str, Any]:
        """The Router's own /health keys: the idle-unload window and the process's memory."""
        out: dict[str, Any] = {}
        if self.idle is not None and self.idle.seconds:
            out["idle_unload_seconds"] = self.idle.seconds
            out["idle_seconds"] = round(self.idle.idle_for(), 1)
        out["memory"] = process_rss()
        return out

    # -- /v1/models -------------------------------------------------------------------------------

    def listing(self, full: bool) -> dict[str, Any]:
        """`/v1/models`: every checkpoint with a bundle (Jev's keys; `x_` keys when `full`).
        Auth follows /health: never a 401; with LAYA_API_KEY set, the `x_` keys only for its
        bearer (docs/http-api.md, "Health")."""
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
                "release_date": UNKNOWN_RELEASE_DATE,
            }
            if full:
                # A test checkpoint's bundle answers to the route's name, never to a Hub id
                entry.update(
                    {
                        "x_aliases": aliases_of(name) + ([] if random else published_repos(name)),
                        "x_repo": None if random else self.router.repo(name),
                        "x_loaded": name in resident,
                        "x_revision": getattr(loaded, "revision", None),
                    }
                )
                entry.update(_optional(random, getattr(loaded, "int8_kernel", None)))
            models.append(entry)
        return {"models": models}

    # -- the warm-up --------------------------------------------------------------------------------

    def warm_up(self) -> None:
        """On the worker: each loaded bundle's speed probe and one pass per warm length (an agent
        without an onnxruntime session, such as a test's fake, has nothing to warm)."""
        from laya_onnx.core.memory import probe_feeds
        from laya_onnx.core.work import PROBE_LENGTH

        for agent in self.router.resident().values():
            clock, session = getattr(agent, "pass_clock", None), getattr(agent, "session", None)
            if clock is None or session is None:
                continue
            clock.seconds(1, PROBE_LENGTH)
            longest = int(getattr(agent, "max_len", 512) or 512)
            for length in WARM_LENGTHS:
                if length <= longest:
                    session.run(probe_feeds(1, length))
            log.info("warmed up %s", getattr(agent, "name", "the checkpoint"))


class ColdStarts(BaseHook):
    """Logs every load of a Router's checkpoint with its time and keeps its fallback baseline."""

    def __init__(self, router: Router, baselines: dict[str, dict[str, int]]):
        self.router = router
        self.baselines = baselines

    def on_load(self, ctx: PredictContext) -> None:
        name = str(ctx.model)
        self.baselines[name] = fallback_baseline(getattr(ctx.agent, "fallbacks", {}))
        log.info("loaded checkpoint %s in %.2fs", name, self.router.load_seconds.get(name, 0.0))

    def on_evict(self, ctx: PredictContext) -> None:
        log.info("unloaded checkpoint %s", ctx.model)


class OneBundle(Served):
    """One loaded agent served as a Router of one, with the single-bundle wire (module docstring).

    laya-serve fronts a Router over several checkpoints; here every request is pinned to the one
    checkpoint, so its name, its `routing` block and its refusals are this class's.
    """

    def __init__(self, agent: Any):
        router = Router()
        try:
            key = canonical_name(agent.name)
            router.attach(key, agent)
        except InvalidRequest:  # a name the Router cannot register: the wire still shows it
            key = "served"
            router.attach(key, agent)
        super().__init__(router, RoutedAgent(router, lone=agent, pin=key))
        self.lone = agent
        self.key = key
        self.name: str = agent.name  # the checkpoint's, not ROUTER_NAME
        self.repo = bundle_source(agent.bundle) or agent.name
        self.baselines[self.name] = fallback_baseline(agent.fallbacks)
        random = getattr(agent, "random_weights", None)
        # A test checkpoint's bundle is never listed under the published checkpoints' Hub ids;
        # the bundle repo means "auto" and so lands here too (one checkpoint), listed last.
        hub_ids = [] if random else [*published_repos(self.name), BUNDLE_REPO]
        self.card = {
            "aliases": aliases_of(self.name) + hub_ids,
            # laya.onnx's digest as the manifest lists it (verified when the bundle was opened)
            "graph_sha256": agent.bundle.manifest.digest(GRAPH_FILE),
            "manifest_sha256": manifest_sha256(agent.bundle),
            "precision": agent.bundle.precision.precision,
        }

    def _unknown(self, value: Any) -> str:
        aliases = aliases_of(self.name)
        return "unknown model %r; choose one of %s (or an alias: %s)" % (value, [self.name], aliases)

    def check_model(self, model: Any) -> ModelChoice:
        """Falsy, the bundle id, this checkpoint's name/alias/published id, and any other name
        (a Jev id like `jev-1`, a typo) are answered by this checkpoint — the last kind as a
        reported fallback. A path or an unpublished Hub id is a 422: the caller named a
        checkpoint this server cannot load. So is another laya checkpoint's name: laya-serve
        would pin it, and answering it with this checkpoint instead would be the wrong answer
        the 422 exists to prevent."""
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
        if task is not None and canonical_name(task) != self.name:
            raise ApiError(422, self._unknown(task))

    def routing_controls(self, model: str | None, task: Any, lang_guess: Any) -> dict[str, Any]:
        """Nothing to route: the agent pins every call to the one checkpoint (`RoutedAgent.pin`),
        and the checks above refused a model or task it is not."""
        return {}

    def with_routing(self, result: dict[str, Any]) -> dict[str, Any]:
        routing = {"model": self.name, "repo": self.repo, "reason": ROUTING_REASON}
        return {**result, "routing": {**routing, "detection": None, "workflow": None}}

    def resident(self) -> dict[str, Any]:
        return {self.name: self.lone}

    def requested_providers(self) -> list[str]:
        return list(self.lone.requested_providers)

    def _process(self) -> dict[str, Any]:
        return {}  # the single-bundle /health has no process keys

    def listing(self, full: bool) -> dict[str, Any]:
        agent, card = self.lone, self.card
        random = getattr(agent, "random_weights", None)
        entry: dict[str, Any] = {
            "name": self.name,
            "description": describe_checkpoint(self.name, random),
            "release_date": UNKNOWN_RELEASE_DATE,
        }
        if full:
            entry.update(
                {
                    "x_aliases": list(card["aliases"]),
                    "x_revision": agent.revision,
                    "x_repo": self.repo,
                    "x_graph_sha256": card["graph_sha256"],
                    "x_manifest_sha256": card["manifest_sha256"],
                    "x_precision": card["precision"],
                    "x_providers": list(agent.providers),
                }
            )
            entry.update(_optional(random, agent.int8_kernel))
        return {"models": [entry]}


def _optional(random: str | None, kernel: str | None) -> dict[str, Any]:
    """A listing entry's `x_random_weights` and `x_int8_kernel`, each only when it applies."""
    out: dict[str, Any] = {}
    if random:
        out["x_random_weights"] = random
    if kernel is not None:
        out["x_int8_kernel"] = kernel
    return out


def published_repos(name: str) -> list[str]:
    """The standalone Hub repos laya publishes checkpoint `name` under (not the bundle repo)."""
    return sorted(
        repo for repo, sub in PUBLISHED_CHECKPOINTS.get(name, ()) if sub is None and repo != BUNDLE_REPO
    )


def describe_checkpoint(name: str, random_weights: str | None) -> str:
    """`/v1/models`'s description; a test checkpoint's bundle says what it is."""
    if random_weights:
        return "%s: random test weights (preset %s) served by laya-onnx; its answers carry no meaning" % (
            name,
            random_weights,
        )
    return "laya %s checkpoint served by laya-onnx (ONNX Runtime)" % name


def bundle_source(bundle: Bundle) -> str | None:
    """Where the served bundle came from (`laya_onnx.core.bundle.bundle_origin`)."""
    return bundle_origin(bundle.manifest, bundle.root)


def manifest_sha256(bundle: Bundle) -> str | None:
    """sha256 of manifest.json's bytes: it lists every file's digest, so it pins the bundle.
    None when it cannot be read."""
    try:
        return hashlib.sha256((Path(bundle.root) / MANIFEST_FILE).read_bytes()).hexdigest()
    except OSError:  # removed or unreadable since the bundle was opened
        return None


def process_rss() -> dict[str, int | None]:
    """This process's resident memory now and at its peak, in bytes (/proc; peak from getrusage
    where /proc is missing)."""
    try:
        memory = process_memory()
    except OSError:
        memory = {}
    peak = memory.get("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rss_bytes": memory.get("VmRSS"), "peak_rss_bytes": peak}


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
    on CPU since the checkpoint loaded.

    `fallbacks` is the agent's snapshot; `baseline` is the per-provider count when it loaded:
    those are the providers that never attached (a CPU-only build, no GPU), which laya-serve
    does not count as fallbacks — that case is what `device` reports.
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
