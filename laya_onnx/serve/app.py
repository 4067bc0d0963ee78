"""The aiohttp application: `create_app(agent)` -> `web.Application`.

Layout:
  * state lives under typed `web.AppKey`s; the inference runtime (one-thread executor, the
    inference gate, the admission semaphore) is created and torn down by a `cleanup_ctx`, so
    it binds to the loop that actually runs the app;
  * middlewares, outermost first: the LAYA_ROOT_PATH prefix, the request id (`X-Request-Id` on
    every response, the id in every log line), errors (every refusal becomes
    `{"detail": ...}`), metrics (counts and times every request, `metrics.py`), the
    trailing-slash redirect, bearer auth, admission (and the drain), inference timing headers —
    auth and admission apply to the two decision routes only, and run before a body byte is read;
  * handlers are thin adapters over `contract.py` (the framework-neutral HTTP contract the Ray
    Serve ingress shares): read the body, parse it there, hand the agent call to the worker
    thread, render the contract's payload.

The model is ONNX Runtime and synchronous, so it never runs on the event loop: one worker
thread runs one pass at a time, and `/health` answers from the loop meanwhile. How a SIGTERM
drains the requests in flight is `drain.py`'s; the connection-level limits are `connection.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from aiohttp import web
from yarl import URL

from laya_onnx.core.router import Router
from laya_onnx.serve import contract
from laya_onnx.serve.catalog import ModelCard
from laya_onnx.serve.drain import Drain, InferenceGate
from laya_onnx.serve.errors import (
    BODY_TIMEOUT,
    BODY_TOO_LARGE,
    BODY_UNDECODABLE,
    BUSY,
    UNAUTHORIZED,
    ApiError,
)
from laya_onnx.serve.keys import INFERENCE_MS, PASS_RESULT, QUEUE_WAIT_MS, request_key
from laya_onnx.serve.logs import REQUEST_ID_HEADER, accept_request_id, current_request_id
from laya_onnx.serve.metrics import METRICS, Metrics, metrics_middleware
from laya_onnx.serve.microbatch import MicroBatcher
from laya_onnx.serve.openapi import docs_html, openapi_json
from laya_onnx.serve.protocol import ServedAgent
from laya_onnx.serve.routed import IdleUnload, RoutedCatalog, served_router
from laya_onnx.serve.settings import Settings
from laya_onnx.serve.wire import Checkpoint, fallback_baseline, render

log = logging.getLogger("laya_onnx.serve")

DECISION_ROUTES = frozenset({"systemone", "systemone_batch"})
WORKER_THREAD_PREFIX = "laya-infer"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Runtime:
    """Per-run inference machinery, built on the serving loop by `_runtime_ctx`."""

    max_concurrent: int
    executor: ThreadPoolExecutor | None = None
    gate: InferenceGate | None = None
    admission: asyncio.Semaphore | None = None
    #: Micro-batching of single decisions (LAYA_BATCH_WINDOW_MS); None when off.
    batcher: MicroBatcher | None = None


# Subscripted rather than given the type: a Protocol is not a concrete class.
AGENT = web.AppKey[ServedAgent]("agent")
CHECKPOINT = web.AppKey[contract.ServedCheckpoints]("checkpoint")
SETTINGS = web.AppKey("settings", Settings)
RUNTIME = web.AppKey("runtime", Runtime)
#: Shutdown state: the server's signal handler starts the drain, admission and the gate obey it.
DRAIN = web.AppKey("drain", Drain)
#: Provider fallback counts when the app was built (providers that never attached).
FALLBACK_BASELINE = web.AppKey("fallback_baseline", dict[str, int])
MODEL_CARD = web.AppKey[ModelCard | RoutedCatalog]("model_card")
#: LAYA_IDLE_UNLOAD_SECONDS behind a Router (absent otherwise).
IDLE = web.AppKey("idle_unload", IdleUnload)


# -- responses -----------------------------------------------------------------------------


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=render(payload), status=status, headers=headers, content_type="application/json")


def refusal(
    request: web.Request, status: int, detail: str, headers: dict[str, str] | None = None, errors=None
) -> web.Response:
    """An app-level error in the app's wire profile: laya-serve's `{"detail": "<string>"}`, or
    the Jev profile's shapes (`jev.error_payload`)."""
    return json_response(error_body(request.app, status, detail, errors), status=status, headers=headers)


def error_body(app: web.Application, status: int, detail: str, errors=None) -> Any:
    """The error body in `app`'s wire profile; also used for the parser's refusals, which no
    handler or middleware sees (serve/connection.py)."""
    return contract.error_body(app[SETTINGS], status, detail, errors)


#: The request's id (the caller's X-Request-Id when acceptable, else generated).
REQUEST_ID: Any = request_key("request_id", str)
#: Set on the request routed again without LAYA_ROOT_PATH, so it is stripped once only.
_ROOT_STRIPPED: Any = request_key("root_path_stripped", bool)


# -- middlewares ---------------------------------------------------------------------------


def _under_root(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


@web.middleware
async def root_path_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """LAYA_ROOT_PATH=/laya: `/laya/health` answers as `/health` does; `/health` still answers.

    That is laya-serve's (Starlette's root_path) behaviour. aiohttp routes a request before any
    middleware runs, so a prefixed path that matched no route is routed again without the prefix,
    through the whole middleware chain; a route that really lives under the prefix keeps it.
    A redirect (the trailing-slash one) from that second pass gets the prefix back.
    """
    root = request.app[SETTINGS].root_path
    raw_path = request.rel_url.raw_path
    unmatched = getattr(request.match_info.http_exception, "status", None) == 404
    if not (root and unmatched and _under_root(raw_path, root) and not request.get(_ROOT_STRIPPED)):
        return await handler(request)
    rel_url = URL.build(
        path=raw_path[len(root) :] or "/", query_string=request.rel_url.raw_query_string, encoded=True
    )
    if "Expect" in request.headers:
        # the first routing already sent its "100 Continue"; the second must not send another
        inner = request.clone(
            rel_url=rel_url, headers=[(k, val) for k, val in request.headers.items() if k.lower() != "expect"]
        )
    else:
        inner = request.clone(rel_url=rel_url)
    inner[_ROOT_STRIPPED] = True
    try:
        # Application._handle routes and runs the middleware chain: aiohttp's one entry point for
        # "handle this request", with this signature from 3.9 through 3.14 and on its 4.0 branch.
        return await request.app._handle(inner)
    except web.HTTPException as exc:
        location = exc.headers.get("Location", "")
        if exc.status < 400 and location.startswith("/"):
            exc.headers["Location"] = root + location
        raise


@web.middleware
async def request_context_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """`X-Request-Id` on every response, the id on every log line about the request.

    Also closes the connection after each response once the server is draining, so a keep-alive
    client moves to another instance instead of sending its next request here.
    """
    request_id = request.get(REQUEST_ID) or accept_request_id(request.headers.get(REQUEST_ID_HEADER))
    request[REQUEST_ID] = request_id
    token = current_request_id.set(request_id)
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # a redirect: error_middleware turned every error into a response
        exc.headers[REQUEST_ID_HEADER] = request_id
        raise
    finally:
        current_request_id.reset(token)
    response.headers[REQUEST_ID_HEADER] = request_id
    if request.app[DRAIN].draining:
        response.force_close()
    return response


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as a `refusal` (`{"detail": "<string>"}`, or the Jev profile's
    shapes); nothing else ever reaches a client."""
    try:
        return await handler(request)
    except ApiError as exc:
        body = contract.api_error_body(request.app[SETTINGS], exc)
        return json_response(body, status=exc.status, headers=exc.headers)
    except web.RequestPayloadError:
        # aiohttp could not de-chunk or decompress the body: the caller's bytes, not our fault
        response = refusal(request, 400, BODY_UNDECODABLE)
        response.force_close()  # the rest of the stream cannot be framed either
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects keep aiohttp's own response
        headers = {
            k: val for k, val in exc.headers.items() if k.lower() not in ("content-type", "content-length")
        }
        return refusal(request, exc.status, exc.reason, headers)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.rel_url.path)
        return refusal(request, 500, "Internal Server Error")


def _route_name(request: web.Request) -> str | None:
    route = getattr(request.match_info, "route", None)
    return getattr(route, "name", None)


def _authorized(request: web.Request) -> bool:
    """Whether the request carries exactly `Bearer <key>` (`contract.authorized`)."""
    return contract.authorized(request.app[SETTINGS], request.headers.get("Authorization"))


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if _route_name(request) in DECISION_ROUTES and not _authorized(request):
        raise ApiError(401, UNAUTHORIZED)
    return await handler(request)


@web.middleware
async def admission_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """At most LAYA_MAX_CONCURRENT decision requests past auth; the excess is refused, not queued.

    The slot is taken before the body is read and held through inference, which bounds how many
    bodies are buffered at once; Retry-After: 1 because slots turn over at inference speed.
    Once the server is draining a new decision request is refused (503, Retry-After), and an
    admitted one is answered or refused by the drain (`Drain.run`), never left hanging.
    """
    if _route_name(request) not in DECISION_ROUTES:
        return await handler(request)
    runtime, drain = request.app[RUNTIME], request.app[DRAIN]
    if drain.draining:
        refusal = drain.refuse("arrived after the drain began")
        log.info("503 while draining: %s", refusal.reason)
        raise refusal
    if runtime.admission is None or runtime.admission.locked():
        raise ApiError(503, BUSY, {"Retry-After": "1"})
    async with runtime.admission:
        return await drain.run(handler(request))


@web.middleware
async def timing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """`Server-Timing` / `X-Inference-Time-Ms` on successful decisions only.

    The number is the worker's pass, measured by `infer` after the gate was acquired: queue
    wait, parsing and shaping are not in it. A refusal is raised, never returned, so no error
    response carries the headers.
    """
    response = await handler(request)
    ms = request.get(INFERENCE_MS)
    if ms is not None and response.status == 200:
        response.headers["Server-Timing"] = "inference;dur=%.2f" % ms
        response.headers["X-Inference-Time-Ms"] = "%.2f" % ms
    return response


# -- body ----------------------------------------------------------------------------------


async def read_body(request: web.Request) -> bytes:
    """The raw body, at most MAX_BODY_BYTES, delivered within the read timeout (413/408).

    Content-Length is a hint a client chooses and chunked uploads do not send it, so the stream
    itself is counted and abandoned as soon as it passes the cap.
    """
    if contract.declared_too_large(request.headers.get("Content-Length")):
        raise ApiError(413, BODY_TOO_LARGE)

    async def collect() -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = await request.content.readany()
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            contract.check_body_size(total)
            chunks.append(chunk)

    try:
        return await asyncio.wait_for(collect(), request.app[SETTINGS].body_read_timeout)
    except asyncio.TimeoutError:
        raise ApiError(408, BODY_TIMEOUT) from None


# -- inference -----------------------------------------------------------------------------


async def infer(request: web.Request, fn: Callable[[], Any], what: str) -> Any:
    """Run `fn` on the single worker once the gate is free, and time the pass.

    Its failures become the contract's refusals (`contract.pass_refusal`), mapped here on the
    loop so the log line carries the request id.
    """
    runtime = request.app[RUNTIME]
    if runtime.gate is None:  # _runtime_ctx makes it on startup; a request cannot come earlier
        raise RuntimeError("inference requested outside the app's run (no inference gate)")
    loop = asyncio.get_running_loop()
    queued = time.perf_counter()
    async with runtime.gate:
        t0 = time.perf_counter()
        request[QUEUE_WAIT_MS] = (t0 - queued) * 1000.0
        try:
            result = await loop.run_in_executor(runtime.executor, fn)
        except Exception as exc:
            raise contract.pass_refusal(exc, what, request.app[CHECKPOINT].name) from None
        request[INFERENCE_MS] = (time.perf_counter() - t0) * 1000.0
        request[PASS_RESULT] = result
        return result


async def infer_grouped(request: web.Request, batcher: MicroBatcher, decision: contract.OneDecision) -> Any:
    """`infer` for a single decision through the micro-batcher: the same facts left on the
    request (its wait, its group's pass time, its own result) and the same refusals."""
    queued = time.perf_counter()
    outcome = await batcher.submit(decision.state, decision.questions, decision.controls)
    if outcome.error is not None:
        raise contract.pass_refusal(outcome.error, decision.what, request.app[CHECKPOINT].name)
    request[QUEUE_WAIT_MS] = (outcome.started - queued) * 1000.0
    request[INFERENCE_MS] = (outcome.ended - outcome.started) * 1000.0
    request[PASS_RESULT] = outcome.result
    return outcome.result


async def decide(request: web.Request, parse: Callable[..., Any]) -> web.Response:
    """One decision route: the contract's checks, the pass on the worker, the contract's payload."""
    agent, checkpoint, settings = request.app[AGENT], request.app[CHECKPOINT], request.app[SETTINGS]
    if IDLE in request.app:
        request.app[IDLE].mark()  # admitted: the idle window restarts (and again after the pass)
    decision = parse(await read_body(request), agent, checkpoint, settings)
    batcher = request.app[RUNTIME].batcher
    if batcher is not None and isinstance(decision, contract.OneDecision):
        result = await infer_grouped(request, batcher, decision)
    else:
        result = await infer(request, partial(decision.run, agent, settings), decision.what)
    body = contract.render_payload(
        partial(decision.payload, result, checkpoint, settings), decision.what, checkpoint.name
    )
    return web.Response(body=body, content_type="application/json")


async def systemone(request: web.Request) -> web.Response:
    return await decide(request, contract.parse_systemone)


async def systemone_batch(request: web.Request) -> web.Response:
    return await decide(request, contract.parse_batch)


async def health(request: web.Request) -> web.Response:
    """Liveness for anyone; the full payload only without a key or with the right bearer.

    Reads attributes and the agent's fallback snapshot — never the worker or the inference
    gate — so it answers while a pass is running.
    """
    app = request.app
    payload = contract.health_payload(
        app[AGENT], app[CHECKPOINT], app[FALLBACK_BASELINE], full=_authorized(request)
    )
    return json_response(payload, status=503 if payload["status"] == contract.UNHEALTHY else 200)


async def list_models(request: web.Request) -> web.Response:
    """Jev's model list; the x_ keys only where /health would give its full payload."""
    return json_response(request.app[MODEL_CARD].listing(request.app[AGENT], full=_authorized(request)))


async def scrape_metrics(request: web.Request) -> web.Response:
    """Prometheus scrape; with a key set it takes the same bearer as the decision routes."""
    if not _authorized(request):
        raise ApiError(401, UNAUTHORIZED)
    body, content_type = request.app[METRICS].exposition(request.headers.get("Accept"))
    return web.Response(body=body, headers={"Content-Type": content_type})


async def openapi_route(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    return web.Response(body=openapi_json(settings.root_path, settings.jev), content_type="application/json")


async def docs_route(request: web.Request) -> web.Response:
    return web.Response(text=docs_html(request.app[SETTINGS].jev), content_type="text/html")


async def _on_worker(runtime: Runtime, fn: Callable[[], Any]) -> Any:
    """Run `fn` on the inference worker when the gate is free (the micro-batcher's executor)."""
    if runtime.gate is None or runtime.executor is None:
        raise RuntimeError("inference requested outside the app's run (no inference gate)")
    async with runtime.gate:
        return await asyncio.get_running_loop().run_in_executor(runtime.executor, fn)


def _queue_depth(runtime: Runtime) -> int:
    """Decision requests waiting for the worker now (0 before startup and after shutdown)."""
    return runtime.gate.waiting if runtime.gate is not None else 0


# -- lifecycle and factory -----------------------------------------------------------------


async def _runtime_ctx(app: web.Application):
    """Start the worker and the loop-bound primitives; drain the worker at shutdown."""
    runtime, drain = app[RUNTIME], app[DRAIN]
    runtime.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=WORKER_THREAD_PREFIX)
    runtime.gate = InferenceGate(drain)
    drain.bind(runtime.gate)
    runtime.admission = asyncio.Semaphore(runtime.max_concurrent)
    settings = app[SETTINGS]
    if settings.batch_window_ms > 0:
        runtime.batcher = MicroBatcher(
            app[AGENT],
            settings.batch_window_ms / 1000.0,
            partial(_on_worker, runtime),
            configured_group=settings.tournament_group,
            max_group=settings.batch_max_requests,
        )
    try:
        yield
    finally:
        executor, runtime.executor = runtime.executor, None
        runtime.admission = None
        runtime.batcher = None
        # A pass already on the worker finishes; queued ones are dropped. Off the loop so the
        # loop keeps turning while it drains. A pass the drain gave up on at its stop time is
        # not waited for: its client has its 503 and the process is due to exit.
        await asyncio.to_thread(executor.shutdown, wait=not drain.abandoned, cancel_futures=True)


async def _idle_ctx(app: web.Application):
    """The idle-unload reaper, started after the worker (and stopped before it)."""
    runtime = app[RUNTIME]

    def busy() -> bool:
        return runtime.gate is not None and (runtime.gate.busy or runtime.gate.waiting > 0)

    def run_on_worker(fn: Callable[[], None]) -> Any:
        return asyncio.get_running_loop().run_in_executor(runtime.executor, fn)

    reaper = asyncio.create_task(app[IDLE].reap(busy, run_on_worker))
    try:
        yield
    finally:
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper


def create_app(agent: ServedAgent | Router, **settings: Any) -> web.Application:
    """Build the server for one loaded agent, or for a `laya_onnx.Router` over several bundles
    (`serve/routed.py`: routing controls reach it, every answer carries its `routing` block).

    `settings` override the environment: api_key, max_concurrent, body_read_timeout, root_path,
    max_token_budget, max_batch_tokens, jev_strict, tournament_group, jev_profile (see `Settings`).
    """
    config = Settings.from_env(**settings)
    app = web.Application(
        middlewares=[
            root_path_middleware,
            request_context_middleware,
            error_middleware,
            metrics_middleware,
            web.normalize_path_middleware(
                append_slash=False,
                remove_slash=True,
                merge_slashes=False,
                redirect_class=web.HTTPTemporaryRedirect,
            ),
            auth_middleware,
            admission_middleware,
            timing_middleware,
        ]
    )
    if isinstance(agent, Router):
        routed, checkpoints, catalog, idle = served_router(agent)
        # Every member the decision path and the metrics read; `bundle` is None, read only by
        # the single-bundle Checkpoint and ModelCard, which a Router's app does not build.
        served = cast(ServedAgent, routed)
        app[AGENT] = served
        app[CHECKPOINT] = checkpoints
        app[MODEL_CARD] = catalog
        app[FALLBACK_BASELINE] = {}  # per checkpoint, taken when each one loads
    else:
        served, idle = agent, None
        app[AGENT] = agent
        app[CHECKPOINT] = checkpoint = Checkpoint.of(agent)
        app[FALLBACK_BASELINE] = fallback_baseline(agent.fallbacks)
        app[MODEL_CARD] = ModelCard.of(agent, checkpoint)
    app[SETTINGS] = config
    app[RUNTIME] = Runtime(max_concurrent=config.max_concurrent)
    app[DRAIN] = Drain()
    app[METRICS] = Metrics(served, config.max_concurrent, queue_depth=partial(_queue_depth, app[RUNTIME]))
    app.cleanup_ctx.append(_runtime_ctx)
    if idle is not None:
        app[IDLE] = idle
        app.cleanup_ctx.append(_idle_ctx)
    app.router.add_get("/health", health, name="health", allow_head=False)
    app.router.add_post("/v1/systemone", systemone, name="systemone")
    app.router.add_post("/v1/systemone/batch", systemone_batch, name="systemone_batch")
    app.router.add_get("/v1/models", list_models, name="models", allow_head=False)
    app.router.add_get("/metrics", scrape_metrics, name="metrics", allow_head=False)
    if config.api_key is None:  # as laya-serve: no API documentation on a keyed server (404)
        app.router.add_get("/openapi.json", openapi_route, name="openapi", allow_head=False)
        app.router.add_get("/docs", docs_route, name="docs", allow_head=False)
    return app
