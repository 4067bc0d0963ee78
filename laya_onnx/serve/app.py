"""The aiohttp application: `create_app(agent)` -> `web.Application`.

Layout:
  * state lives under typed `web.AppKey`s; the inference runtime (one-thread executor, the
    inference gate, the admission semaphore, the body buffer) is created and torn down by a
    `cleanup_ctx`, so it binds to the loop that actually runs the app;
  * how aiohttp runs the connections travels with the app (`handler_args`), whatever runner
    serves it: bodies are not decoded by aiohttp, and a handler is cancelled when its client
    goes away;
  * middlewares, outermost first: the request id (`X-Request-Id` on every response, the id in
    every log line, the `cancelled` access line), errors (every refusal becomes
    `{"detail": ...}`), metrics (counts and times every request, `metrics.py`), the
    trailing-slash redirect, bearer auth (decision routes, before a body byte is read),
    inference timing headers; `on_response_prepare` gives what aiohttp answers by itself (an
    unknown `Expect`, a redirect) the same JSON body;
  * every route is registered again under LAYA_ROOT_PATH;
  * handlers are thin adapters over `contract.py` (the framework-neutral HTTP contract the Ray
    Serve ingress shares); the decision path — body, admission, limits, worker — is
    `runtime.py`'s.

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
from functools import partial
from typing import Any, cast

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from laya_onnx.core.router import Router
from laya_onnx.serve import contract
from laya_onnx.serve.body import BodyBuffer
from laya_onnx.serve.catalog import ModelCard
from laya_onnx.serve.drain import Drain, InferenceGate
from laya_onnx.serve.errors import BODY_UNDECODABLE, UNAUTHORIZED, ApiError
from laya_onnx.serve.keys import INFERENCE_MS, request_key
from laya_onnx.serve.logs import REQUEST_ID_HEADER, accept_request_id, current_request_id, log_cancelled
from laya_onnx.serve.metrics import METRICS, Metrics, metrics_middleware
from laya_onnx.serve.microbatch import MicroBatcher
from laya_onnx.serve.openapi import docs_html, index_payload, openapi_json
from laya_onnx.serve.protocol import ServedAgent
from laya_onnx.serve.routed import IdleUnload, RoutedCatalog, served_router
from laya_onnx.serve.rss import MemoryKeeper
from laya_onnx.serve.runtime import (
    CHECKPOINT,
    RUNTIME,
    WORKER_THREAD_PREFIX,
    Runtime,
    check_admission,
    infer,
    infer_grouped,
    on_worker,
    read_body,
    request_limits,
    within_deadline,
)
from laya_onnx.serve.settings import Settings
from laya_onnx.serve.wire import Checkpoint, fallback_baseline, render

log = logging.getLogger("laya_onnx.serve")

DECISION_ROUTES = frozenset({"systemone", "systemone_batch"})
#: How aiohttp runs this app's connections, whatever runner serves it (`handler_args`): bodies
#: are decoded by the app (`serve/body.py`: off the loop, only up to the cap), and a handler is
#: cancelled when its client goes away, so no further pass runs for nobody.
HANDLER_ARGS: dict[str, Any] = {"auto_decompress": False}
SERVER_ARGS: dict[str, Any] = {"handler_cancellation": True}
#: A route's name under LAYA_ROOT_PATH is its own name with this prefix (`root:systemone`).
ROOT_ROUTE = "root:"
#: Fixed details for statuses aiohttp produces itself (no request text is ever echoed).
AIOHTTP_DETAILS = {417: "only the Expect value 100-continue is supported"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# Subscripted rather than given the type: a Protocol is not a concrete class.
AGENT = web.AppKey[ServedAgent]("agent")
SETTINGS = web.AppKey("settings", Settings)
#: Shutdown state: the server's signal handler starts the drain, admission and the gate obey it.
DRAIN = web.AppKey("drain", Drain)
#: Provider fallback counts when the app was built (providers that never attached).
FALLBACK_BASELINE = web.AppKey("fallback_baseline", dict[str, int])
MODEL_CARD = web.AppKey[ModelCard | RoutedCatalog]("model_card")
#: LAYA_IDLE_UNLOAD_SECONDS behind a Router (absent otherwise).
IDLE = web.AppKey("idle_unload", IdleUnload)
#: What gives memory back after requests (`serve/rss.py`).
MEMORY = web.AppKey("memory", MemoryKeeper)
#: The access logger of the server running the app (None: no access log), for the requests
#: whose handler is cancelled: aiohttp writes no access line for those.
ACCESS_LOG = web.AppKey("access_log", AbstractAccessLogger)


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


# -- middlewares ---------------------------------------------------------------------------


@web.middleware
async def request_context_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """`X-Request-Id` on every response, the id on every log line about the request.

    Also closes the connection after each response once the server is draining, so a keep-alive
    client moves to another instance instead of sending its next request here; and writes the
    access line of a request whose client went away before its answer (`cancelled`).
    """
    request_id = accept_request_id(request.headers.get(REQUEST_ID_HEADER))
    request[REQUEST_ID] = request_id
    token = current_request_id.set(request_id)
    began = time.perf_counter()
    try:
        try:
            response = await handler(request)
        finally:
            current_request_id.reset(token)
    except web.HTTPException as exc:  # a redirect: error_middleware turned every error into a response
        exc.headers[REQUEST_ID_HEADER] = request_id
        raise
    except asyncio.CancelledError:
        # outside the id's context: the access line carries the id itself
        log_cancelled(request.app.get(ACCESS_LOG), request, request_id, time.perf_counter() - began)
        raise
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
        # aiohttp could not de-chunk the body: the caller's bytes, not our fault
        response = refusal(request, 400, BODY_UNDECODABLE)
        response.force_close()  # the rest of the stream cannot be framed either
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects keep aiohttp's own response (`_json_only` gives it a JSON body)
        headers = {
            k: val for k, val in exc.headers.items() if k.lower() not in ("content-type", "content-length")
        }
        return refusal(request, exc.status, exc.reason, headers)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.rel_url.path)
        return refusal(request, 500, "Internal Server Error")


def route_name(request: web.Request) -> str | None:
    """The matched route's name, the same with and without LAYA_ROOT_PATH (None: no route)."""
    route = getattr(request.match_info, "route", None)
    name = getattr(route, "name", None)
    return name[len(ROOT_ROUTE) :] if name and name.startswith(ROOT_ROUTE) else name


def _authorized(request: web.Request) -> bool:
    """Whether the request carries exactly one `Authorization`, `Bearer <key>`
    (`contract.authorized`): with two, which one counts would be a proxy's guess."""
    return contract.authorized(request.app[SETTINGS], request.headers.getall("Authorization", []))


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if route_name(request) in DECISION_ROUTES and not _authorized(request):
        raise ApiError(401, UNAUTHORIZED)
    return await handler(request)


@web.middleware
async def timing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """`Server-Timing` / `X-Inference-Time-Ms` on successful decisions only.

    The number is the worker's pass, measured by `infer` on the worker: queue wait, parsing
    and shaping are not in it. A refusal is raised, never returned, so no error response
    carries the headers.
    """
    response = await handler(request)
    ms = request.get(INFERENCE_MS)
    if ms is not None and response.status == 200:
        response.headers["Server-Timing"] = "inference;dur=%.2f" % ms
        response.headers["X-Inference-Time-Ms"] = "%.2f" % ms
    return response


async def _json_only(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: a redirect or an error aiohttp built itself — an unknown `Expect`
    (417, answered before any middleware runs), the trailing-slash 307 — leaves as the app's
    JSON error body with a request id, like every other answer. Its text is a fixed one."""
    if response.status < 300 or not isinstance(response, web.Response):
        return
    if response.headers.get("Content-Type", "").startswith("application/json"):
        return
    detail = AIOHTTP_DETAILS.get(response.status, response.reason)
    body = render(error_body(request.app, response.status, detail))
    response.body = body
    response.headers["Content-Type"] = "application/json"
    response.headers["Content-Length"] = str(len(body))
    if REQUEST_ID_HEADER not in response.headers:
        response.headers[REQUEST_ID_HEADER] = request.get(REQUEST_ID) or accept_request_id(None)


# -- handlers ------------------------------------------------------------------------------


async def decide(request: web.Request, parse: Callable[..., Any]) -> web.Response:
    """One decision route (past auth): the body, admission, then the answer within its limits
    (`serve/runtime.py` has the order and the reasons)."""
    app = request.app
    runtime, drain, settings = app[RUNTIME], app[DRAIN], app[SETTINGS]
    if drain.draining:
        raise _drain_refusal(drain)
    try:
        raw = await read_body(request, settings, runtime.body_buffer)
        if drain.draining:
            raise _drain_refusal(drain)
        check_admission(runtime)
        assert runtime.admission is not None  # check_admission refused otherwise
        async with runtime.admission:
            return await drain.run(within_deadline(_answer(request, raw, parse), settings))
    finally:
        # once this request's body and parsed objects are gone (the next turn of the loop)
        asyncio.get_running_loop().call_soon(app[MEMORY].after_request)


def _drain_refusal(drain: Drain) -> ApiError:
    """A decision request that arrives once the server is draining: 503, Retry-After."""
    refused = drain.refuse("arrived after the drain began")
    log.info("503 while draining: %s", refused.reason)
    return refused


async def _answer(request: web.Request, raw: bytes, parse: Callable[..., Any]) -> web.Response:
    """An admitted request: the contract's checks, the pass on the worker, the payload."""
    app = request.app
    agent, checkpoint, settings = app[AGENT], app[CHECKPOINT], app[SETTINGS]
    limits = request_limits(settings)
    if IDLE in app:
        app[IDLE].mark()  # admitted: the idle window restarts (and again after the pass)
    decision = parse(raw, agent, checkpoint, settings)
    del raw  # the parsed body is what is needed from here on
    batcher = app[RUNTIME].batcher
    if batcher is not None and isinstance(decision, contract.OneDecision):
        result = await infer_grouped(request, batcher, decision, limits)
    else:
        result = await infer(request, partial(decision.run, agent, settings), decision.what, limits)
    body = contract.render_payload(
        partial(decision.payload, result, checkpoint, settings), decision.what, checkpoint.name
    )
    headers = contract.model_fallback_headers(decision, result, checkpoint)
    return web.Response(body=body, content_type="application/json", headers=headers)


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
    document = openapi_json(settings.root_path, settings.jev, settings.max_token_budget)
    return web.Response(body=document, content_type="application/json")


async def docs_route(request: web.Request) -> web.Response:
    return web.Response(text=docs_html(request.app[SETTINGS].jev), content_type="text/html")


async def index_route(request: web.Request) -> web.Response:
    """`GET /`: the routes of this app, where its documentation is (never 401, as /health)."""
    settings = request.app[SETTINGS]
    routes = [(method, path) for method, path, _, _ in _routes(settings)]
    public = settings.api_key is None
    return json_response(index_payload(routes, settings.root_path, public=public, docs=public))


# -- lifecycle and factory -----------------------------------------------------------------


async def _runtime_ctx(app: web.Application):
    """Start the worker and the loop-bound primitives; drain the worker at shutdown."""
    runtime, drain = app[RUNTIME], app[DRAIN]
    runtime.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=WORKER_THREAD_PREFIX)
    runtime.gate = InferenceGate(drain)
    drain.bind(runtime.gate)
    runtime.admission = asyncio.Semaphore(runtime.max_concurrent)
    app[MEMORY].start()
    settings = app[SETTINGS]
    if settings.batch_window_ms > 0:
        runtime.batcher = MicroBatcher(
            app[AGENT],
            settings.batch_window_ms / 1000.0,
            partial(on_worker, runtime),
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
    max_token_budget, max_batch_tokens, jev_strict, tournament_group, jev_profile,
    max_request_seconds, request_timeout, body_buffer, ... (see `Settings`).
    """
    config = Settings.from_env(**settings)
    app = web.Application(
        middlewares=[
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
            timing_middleware,
        ],
        handler_args={**HANDLER_ARGS, **SERVER_ARGS},
    )
    app.on_response_prepare.append(_json_only)
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
    app[RUNTIME] = runtime = Runtime(
        max_concurrent=config.max_concurrent, body_buffer=BodyBuffer(config.body_buffer)
    )
    app[DRAIN] = Drain()
    app[MEMORY] = MemoryKeeper()
    app[METRICS] = Metrics(
        served, config.max_concurrent, queue_depth=runtime.queue_depth, root_path=config.root_path
    )
    app.cleanup_ctx.append(_runtime_ctx)
    if idle is not None:
        app[IDLE] = idle
        app.cleanup_ctx.append(_idle_ctx)
    _add_routes(app.router, config)
    return app


def _routes(config: Settings) -> list[tuple[str, str, Handler, str]]:
    """(method, path, handler, name) of every route the app serves with `config`."""
    routes: list[tuple[str, str, Handler, str]] = [
        ("GET", "/", index_route, "index"),
        ("GET", "/health", health, "health"),
        ("POST", "/v1/systemone", systemone, "systemone"),
        ("POST", "/v1/systemone/batch", systemone_batch, "systemone_batch"),
        ("GET", "/v1/models", list_models, "models"),
        ("GET", "/metrics", scrape_metrics, "metrics"),
    ]
    if config.api_key is None:  # as laya-serve: no API documentation on a keyed server (404)
        routes += [("GET", "/openapi.json", openapi_route, "openapi"), ("GET", "/docs", docs_route, "docs")]
    return routes


def _add_routes(router: web.UrlDispatcher, config: Settings) -> None:
    """Every route, and again under LAYA_ROOT_PATH (`/laya/health` answers as `/health`, as
    laya-serve's root_path does; `/laya` as `/`), except where that path is a route of its own,
    which wins."""
    routes = _routes(config)
    own = {path for _, path, _, _ in routes}
    root = config.root_path
    for method, path, handler, name in routes:
        router.add_route(method, path, handler, name=name)
        prefixed = (root + path).rstrip("/")
        if root and prefixed not in own:
            router.add_route(method, prefixed, handler, name=ROOT_ROUTE + name)
