"""Ray Serve deployment: `/v1/systemone`, `/v1/systemone/batch` and `/health` on a Ray cluster,
with the aiohttp server's validation, limits, errors and shaping (`contract.py`, shared).

Two deployments, built by `build(args)` (the `import_path` of a Ray Serve config file,
`serve/ray/serve-config.yaml`):

  * `LayaModel` — one `ONNXAgent` per replica (or, given a models directory or `models`, the
    Router `laya-onnx serve` runs over several bundles), its passes on one worker thread.
    Single-state requests are micro-batched with `@serve.batch` and grouped as the aiohttp app's
    micro-batcher groups them (`core/grouping.py`: `group_key`, `run_group`): the same
    questions and controls share one `predict_batch`, and a state the agent refuses fails only
    its own request. Replicas,
    autoscaling, CPUs/GPUs per replica and the batch size/wait (its `user_config`) come from the
    config file's `deployments:` entry.
  * `LayaIngress` — the HTTP edge: routes (404/405/307 as the aiohttp app), the bearer check
    before a body byte is read, the 2 MiB cap and read timeout, Content-Encoding; then the raw
    body goes to a model replica. A replica that dies under a request (a killed or crashed
    actor) is retried on another one, so an accepted request is answered, not lost; when no
    replica answers after `RETRIES` tries the caller gets a 503 with Retry-After. `/metrics` is
    the edge's: the aiohttp server's request, latency, pass, row, token and busy metrics
    (`metrics.RequestMetrics`), as this ingress replica saw them.

`laya-onnx serve --ray CONFIG` is Ray's own `serve run CONFIG`.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, NoReturn, cast

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request
from starlette.responses import Response

from laya_onnx.core.errors import ConfigError
from laya_onnx.core.grouping import group_key, run_group
from laya_onnx.serve import contract
from laya_onnx.serve.catalog import ModelCard
from laya_onnx.serve.errors import (
    BODY_TIMEOUT,
    BODY_TOO_LARGE,
    BODY_UNDECODABLE,
    BUSY,
    UNAUTHORIZED,
    ApiError,
)
from laya_onnx.serve.metrics import CLIENT_GONE, UNMATCHED, RequestMetrics, work_done
from laya_onnx.serve.openapi import index_payload
from laya_onnx.serve.server import is_models_dir
from laya_onnx.serve.settings import Settings
from laya_onnx.serve.wire import Checkpoint, fallback_baseline, render

log = logging.getLogger("laya_onnx.serve")

#: Tries of one request on the model replicas before a 503 (a dead replica is skipped each time).
RETRIES = 3
DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_BATCH_WAIT_S = 0.005
#: (method, path) -> route name; the aiohttp app's decision, health, model-list and metrics routes.
ROUTES = {
    ("GET", "/"): "index",
    ("GET", "/health"): "health",
    ("POST", "/v1/systemone"): "systemone",
    ("POST", "/v1/systemone/batch"): "systemone_batch",
    ("GET", "/v1/models"): "models",
    ("GET", "/metrics"): "metrics",
}
#: The work of a successful pass a model replica reports with its answer, for the ingress's
#: metrics: its milliseconds, question rows and input tokens.
Work = tuple[float, int, int]


def timing_headers(ms: float) -> dict[str, str]:
    """The aiohttp app's timing headers of a successful decision: the pass on the worker, in ms
    (neither the queue nor the micro-batch wait is in it)."""
    return {"Server-Timing": "inference;dur=%.2f" % ms, "X-Inference-Time-Ms": "%.2f" % ms}


def _settings(overrides: dict[str, Any] | None) -> Settings:
    return Settings.from_env(**(overrides or {}))


@serve.deployment(name="LayaModel")
class LayaModel:
    """One agent per replica; answers a route's raw body with (status, headers, body bytes)."""

    def __init__(
        self,
        bundle: str | None,
        providers: list[str] | None = None,
        threads: int | None = None,
        settings: dict[str, Any] | None = None,
        models: list[str] | None = None,
    ):
        self.settings = _settings(settings)
        self.agent: Any
        self.checkpoint: contract.ServedCheckpoints
        self.catalog: Any  # `/v1/models`: a ModelCard, or the Router's catalog
        if models or is_models_dir(bundle):
            # several checkpoints: the Router `laya-onnx serve` runs (LAYA_* from the runtime_env)
            from laya_onnx.serve.routed import build_router, served_router

            router = build_router(bundle, models or (), providers=providers)
            self.agent, self.checkpoint, self.catalog, _ = served_router(router)
            self.baseline: dict[str, int] = {}  # per checkpoint, taken by the Router as each loads
        else:
            from laya_onnx import ONNXAgent

            self.agent = ONNXAgent(bundle, providers=providers, threads=threads)
            self.checkpoint = Checkpoint.of(self.agent)
            self.catalog = ModelCard.of(self.agent, self.checkpoint)
            self.baseline = fallback_baseline(self.agent.fallbacks)
        # one pass at a time per replica, off the replica's event loop (as the aiohttp app's worker)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="laya-infer")
        self.batches = {"batches": 0, "requests": 0, "largest": 0}

    def reconfigure(self, config: dict[str, Any]) -> None:
        """The config file's `user_config`: `max_batch_size`, `batch_wait_timeout_s`."""
        self.answer_one.set_max_batch_size(int(config.get("max_batch_size", DEFAULT_MAX_BATCH_SIZE)))
        self.answer_one.set_batch_wait_timeout_s(
            float(config.get("batch_wait_timeout_s", DEFAULT_BATCH_WAIT_S))
        )

    def micro_batches(self) -> dict[str, int]:
        """This replica's micro-batching so far: batches run, requests in them, the largest."""
        return dict(self.batches)

    async def health(self, full: bool) -> tuple[int, bytes]:
        payload = contract.health_payload(self.agent, self.checkpoint, self.baseline, full)
        return (503 if payload["status"] == contract.UNHEALTHY else 200), render(payload)

    async def models(self, full: bool) -> bytes:
        """`/v1/models`: the aiohttp app's listing (the x_ keys only when `full`)."""
        return render(self.catalog.listing(self.agent, full=full))

    def check_health(self) -> None:
        """Ray Serve's replica health check: a replica whose device keeps failing passes is
        reported unhealthy, and Serve replaces it (as the server's /health 503 asks a supervisor)."""
        sick = contract.unhealthy_checkpoints(self.agent, self.checkpoint)
        if sick:
            raise RuntimeError("the device failed pass after pass for %s; restart needed" % ", ".join(sick))

    async def decide(self, route: str, raw: bytes) -> tuple[int, dict[str, str], bytes, Work | None]:
        try:
            body, ms, result, headers = await self._decide(route, raw)
        except ApiError as exc:
            return exc.status, exc.headers, render(contract.api_error_body(self.settings, exc)), None
        return 200, {**timing_headers(ms), **headers}, body, (ms, *work_done(result))

    async def _decide(self, route: str, raw: bytes) -> tuple[bytes, float, Any, dict[str, str]]:
        """The payload, the milliseconds of the pass that answered it, the pass's result, and the
        answer's headers besides the timing ones (`contract.model_fallback_headers`)."""
        agent, checkpoint, settings = self.agent, self.checkpoint, self.settings
        if route == "systemone":
            decision: contract.OneDecision | contract.BatchDecision = contract.parse_systemone(
                raw, agent, checkpoint, settings
            )
            outcome = await self.answer_one(decision)
            if outcome.error is not None:
                raise contract.pass_refusal(outcome.error, decision.what, checkpoint.name)
            result, ms = outcome.result, (outcome.ended - outcome.started) * 1000.0
        else:
            decision = contract.parse_batch(raw, agent, checkpoint, settings)
            loop = asyncio.get_running_loop()
            try:
                result, ms = await loop.run_in_executor(
                    self.worker, _timed, partial(decision.run, agent, settings)
                )
            except Exception as exc:
                raise contract.pass_refusal(exc, decision.what, checkpoint.name) from None
        body = contract.render_payload(
            partial(decision.payload, result, checkpoint, settings), decision.what, checkpoint.name
        )
        return body, ms, result, contract.model_fallback_headers(decision, result, checkpoint)

    @serve.batch(max_batch_size=DEFAULT_MAX_BATCH_SIZE, batch_wait_timeout_s=DEFAULT_BATCH_WAIT_S)
    async def answer_one(self, decisions: list[contract.OneDecision]) -> list[Any]:
        """The micro-batch: one `grouping.Outcome` per decision, in order."""
        self.batches["batches"] += 1
        self.batches["requests"] += len(decisions)
        self.batches["largest"] = max(self.batches["largest"], len(decisions))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.worker, self._answer_grouped, decisions)

    def _answer_grouped(self, decisions: list[contract.OneDecision]) -> list[Any]:
        """Decisions that share a `grouping.group_key` run as one group (`run_group`, as the
        aiohttp app's micro-batcher runs them); one without a key runs alone."""
        groups: dict[Any, list[int]] = {}
        for i, decision in enumerate(decisions):
            key = group_key(decision.questions, decision.controls)
            groups.setdefault(("alone", i) if key is None else key, []).append(i)
        outcomes: list[Any] = [None] * len(decisions)
        for positions in groups.values():
            first = decisions[positions[0]]
            states = [decisions[i].state for i in positions]
            ran = run_group(
                self.agent, states, first.questions, first.controls, self.settings.tournament_group
            )
            for i, outcome in zip(positions, ran, strict=True):
                outcomes[i] = outcome
        return outcomes


def _timed(fn: Any) -> tuple[Any, float]:
    """fn's result and the milliseconds it ran on the worker (not its wait for the worker)."""
    t0 = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - t0) * 1000.0


# -- the HTTP edge -------------------------------------------------------------------------


def _header(request: Request, name: bytes) -> str | None:
    """A header as aiohttp reads it (UTF-8, surrogateescape), so the bearer compares the wire's bytes."""
    for key, value in request.scope.get("headers", []):
        if key.lower() == name:
            return value.decode("utf-8", "surrogateescape")
    return None


def _decoder(encoding: str | None) -> Any:
    """A streaming decompressor for Content-Encoding, as aiohttp decodes it; None: identity."""
    coding = (encoding or "").strip().lower()
    if coding in ("", "identity"):
        return None
    if coding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if coding == "deflate":
        return zlib.decompressobj()
    if coding == "zstd":
        try:  # Python 3.14's, else the backport the serve extra brings for aiohttp
            zstd = importlib.import_module("compression.zstd")
        except ImportError:
            zstd = importlib.import_module("backports.zstd")
        return zstd.ZstdDecompressor()
    return None  # unknown codings reach the JSON parser as they are (and fail there as 400)


async def read_body(request: Request, timeout: float) -> bytes:
    """The decoded body, at most MAX_BODY_BYTES, delivered within `timeout` (413/408/400)."""
    if contract.declared_too_large(_header(request, b"content-length")):
        raise ApiError(413, BODY_TOO_LARGE)
    decoder = _decoder(_header(request, b"content-encoding"))

    async def collect() -> bytes:
        chunks: list[bytes] = []
        total = 0
        async for chunk in request.stream():
            if not chunk:
                continue
            if decoder is not None:
                try:
                    chunk = decoder.decompress(chunk)
                except Exception:  # zlib.error, zstd.ZstdError: the caller's bytes
                    raise ApiError(400, BODY_UNDECODABLE) from None
            total += len(chunk)
            contract.check_body_size(total)
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(collect(), timeout)
    except asyncio.TimeoutError:
        raise ApiError(408, BODY_TIMEOUT) from None


@serve.deployment(name="LayaIngress")
class LayaIngress:
    """Routes, auth and the body; the answer comes from a `LayaModel` replica."""

    def __init__(self, model: Any, settings: dict[str, Any] | None = None):
        self.model = model
        self.settings = _settings(settings)
        self.metrics = RequestMetrics()

    def _json(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
        return Response(content=body, status_code=status, headers=headers, media_type="application/json")

    def _refusal(self, exc: ApiError) -> Response:
        return self._json(exc.status, render(contract.api_error_body(self.settings, exc)), exc.headers)

    async def __call__(self, request: Request) -> Response:
        """Route and answer, counted and timed as the aiohttp app's metrics middleware does: a
        refusal by its status, a caller gone before its answer as 499."""
        method = request.method.upper()
        path, root = request.scope.get("path", "/"), request.scope.get("root_path", "")
        if root and (path == root or path.startswith(root + "/")):
            path = path[len(root) :] or "/"  # the application's route_prefix
        label = path if (method, path) in ROUTES else UNMATCHED
        start = time.perf_counter()
        status, busy = 500, False
        try:
            with self.metrics.in_flight.labels(label).track_inprogress():
                response = await self._route(request, method, path, label)
            status = response.status_code
            return response
        except ApiError as exc:
            status, busy = exc.status, exc.status == 503 and exc.detail == BUSY
            return self._refusal(exc)
        except asyncio.CancelledError:
            status = CLIENT_GONE
            raise
        finally:
            self.metrics.answered(label, method, status, time.perf_counter() - start, busy)

    async def _route(self, request: Request, method: str, path: str, label: str) -> Response:
        route = ROUTES.get((method, path))
        if route is None:
            self._unrouted(method, path, request)
        if route == "index":  # no /docs or /openapi.json on Ray: the aiohttp server serves them
            public, root = self.settings.api_key is None, request.scope.get("root_path", "")
            return self._json(200, render(index_payload(ROUTES, root, public=public, docs=False)))
        full = contract.authorized(self.settings, _header(request, b"authorization"))
        if route == "health":
            return self._json(*await self._on_model("health", full))
        if route == "models":  # as /health: never 401; the x_ keys only with the right bearer
            return self._json(200, await self._on_model("models", full))
        if not full:
            raise ApiError(401, UNAUTHORIZED)
        if route == "metrics":
            body, content_type = self.metrics.exposition(_header(request, b"accept"))
            return Response(content=body, headers={"Content-Type": content_type})
        raw = await read_body(request, self.settings.body_read_timeout)
        status, headers, body, work = await self._on_model("decide", route, raw)
        if work is not None:
            ms, rows, tokens = work
            self.metrics.inference.labels(label).observe(ms / 1000.0)
            self.metrics.worked(rows, tokens)
        return self._json(status, body, headers)

    def _unrouted(self, method: str, path: str, request: Request) -> NoReturn:
        """404, 405, or the 307 from a trailing slash to its route (a JSON body, as every answer)."""
        allowed = sorted(m for (m, p) in ROUTES if p == path)
        if allowed:
            raise ApiError(405, "Method Not Allowed", {"Allow": ", ".join(allowed)})
        stripped = path.rstrip("/")
        if stripped != path and any(p == stripped for (_, p) in ROUTES):
            seen, query = request.scope.get("path", "/"), request.url.query
            prefix = seen[: len(seen) - len(path)]  # the route_prefix the request came under
            location = prefix + stripped + ("?" + query if query else "")
            raise ApiError(307, "Temporary Redirect", {"Location": location})
        raise ApiError(404, "Not Found")

    async def _on_model(self, method: str, *args: Any) -> Any:
        """Call a model replica; a replica that died under the call is retried on another one."""
        for attempt in range(1, RETRIES + 1):
            try:
                return await getattr(self.model, method).remote(*args)
            except BackPressureError:
                # every model replica is at max_ongoing_requests with max_queued_requests waiting:
                # the contract's busy answer (503 + Retry-After, our error body), not Ray's own
                raise ApiError(503, BUSY, {"Retry-After": "1"}) from None
            except RayActorError as exc:
                log.warning(
                    "a LayaModel replica died under a %s call (try %d of %d): %s",
                    method,
                    attempt,
                    RETRIES,
                    exc,
                )
        raise ApiError(503, BUSY, {"Retry-After": "1"})


def build(args: dict[str, Any]) -> Any:
    """The Ray Serve application of a config file's `args`:

    bundle (a bundle, or a models directory: a folder of bundles served through the Router, as
    `laya-onnx serve DIR`), models (a list of NAME=BUNDLE, as `--model`; with or without bundle),
    providers (list), threads (onnxruntime intra-op threads per replica; LAYA_THREADS behind a
    Router), settings (the aiohttp app's `Settings` overrides: api_key, max_token_budget,
    jev_profile, ...; unset ones come from the replica's LAYA_* environment, e.g. the config's
    runtime_env, which also carries the Router's LAYA_MAX_LOADED, LAYA_DEFAULT_MODEL, ...).
    """
    if not isinstance(args, dict) or not (args.get("bundle") or args.get("models")):
        raise ConfigError(
            "the Ray Serve config's args must name a bundle or models: args: {bundle: PATH} or "
            "{models: [NAME=BUNDLE, ...]}"
        )
    unknown = sorted(set(args) - {"bundle", "models", "providers", "threads", "settings"})
    if unknown:
        raise ConfigError("unknown args in the Ray Serve config: %s" % ", ".join(unknown))
    settings = args.get("settings") or {}
    _settings(settings)  # a bad setting is refused here, before any replica starts
    models = [str(m) for m in args.get("models") or ()]
    bundle = str(args["bundle"]) if args.get("bundle") else None
    # the decorated classes are Deployments (mypy sees the plain classes)
    model = cast(Any, LayaModel).bind(bundle, args.get("providers"), args.get("threads"), settings, models)
    return cast(Any, LayaIngress).bind(model, settings)


def run_config(config: str, blocking: bool = True) -> None:
    """`laya-onnx serve --ray CONFIG`: Ray's `serve run CONFIG` (joins the Ray instance this
    process is connected to, or RAY_ADDRESS, or starts a local one; deploys the config).

    Blocking, it runs until interrupted and then shuts the applications down; not blocking, it
    returns once the config is submitted (the tests, on their own `ray.init`).
    """
    from ray.serve.scripts import cli

    argv = ["run", config] + ([] if blocking else ["--non-blocking"])
    cli.main(argv, prog_name="laya-onnx serve --ray", standalone_mode=blocking)
