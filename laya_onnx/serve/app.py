"""The aiohttp front end: `create_app(agent)` -> `web.Application`, bytes in and out of the pipeline.

Every request, whatever its path, goes to one handler that hands it to `DecisionService.handle`
(serve/service.py: routing, auth, body, decision, answer) as a `Call` and writes its `Reply`
back. What stays here is aiohttp's own: the app's lifecycle (`cleanup_ctx` starts and stops the
in-process decider on the serving loop), typed `AppKey`s, how aiohttp runs the connections
(`handler_args`: bodies are not decoded by aiohttp, a handler is cancelled when its client goes
away), the JSON body of what aiohttp answers by itself (an unknown `Expect`), and the access-log
line of a request whose client went away. The connection-level limits are `connection.py`'s;
the process, its signals and its drain are `server.py`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from laya_onnx.core.router import Router
from laya_onnx.serve import contract
from laya_onnx.serve.contract import render
from laya_onnx.serve.drain import Drain
from laya_onnx.serve.errors import BODY_UNDECODABLE, UNSUPPORTED_VERSION, ApiError
from laya_onnx.serve.keys import INFERENCE_MS, PASS_RESULT, QUEUE_WAIT_MS, TRACE_ID
from laya_onnx.serve.logs import (
    ENDED,
    REQUEST_ID_HEADER,
    RESET,
    SEND_TIMEOUT,
    accept_request_id,
    log_cut,
    new_request_id,
)
from laya_onnx.serve.metrics import Metrics
from laya_onnx.serve.protocol import ServedAgent
from laya_onnx.serve.served import Served
from laya_onnx.serve.service import Call, DecisionService, LocalDecider
from laya_onnx.serve.settings import Settings

log = logging.getLogger("laya_onnx.serve")

#: How aiohttp runs this app's connections, whatever runner serves it (`handler_args`): bodies
#: are decoded by the pipeline (off the loop, only up to the cap); a body left unread by a
#: refusal (401, 413) is not read to be thrown away, the connection is closed instead; and a
#: handler is cancelled when its client goes away, so no further pass runs for nobody.
HANDLER_ARGS: dict[str, Any] = {"auto_decompress": False, "lingering_time": 0}
SERVER_ARGS: dict[str, Any] = {"handler_cancellation": True}
#: Bytes of an answer handed to the connection at once.
WRITE_SLICE = 64 * 1024
#: Fixed details for statuses aiohttp produces itself (no request text is ever echoed).
AIOHTTP_DETAILS = {417: "only the Expect value 100-continue is supported"}

SERVICE = web.AppKey("service", DecisionService)
DECIDER = web.AppKey("decider", LocalDecider)
SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
#: Shutdown state: the server's signal handler starts the drain, admission and the worker obey it.
DRAIN = web.AppKey("drain", Drain)
#: The access logger of the server running the app (None: no access log), for the requests
#: whose handler is cancelled: aiohttp writes no access line for those.
ACCESS_LOG = web.AppKey("access_log", AbstractAccessLogger)


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=render(payload), status=status, headers=headers, content_type="application/json")


def error_body(app: web.Application, status: int, detail: str, errors: Any = None) -> Any:
    """The error body in `app`'s wire profile; also for the parser's refusals (connection.py)."""
    return contract.error_body(app[SETTINGS], status, detail, errors)


async def _chunks(request: web.Request) -> AsyncIterator[bytes]:
    """The body as it arrives; a body aiohttp cannot de-chunk is the caller's fault (400)."""
    try:
        async for chunk in request.content.iter_any():
            yield chunk
    except web.RequestPayloadError:
        raise ApiError(400, BODY_UNDECODABLE) from None


async def handle(request: web.Request) -> web.StreamResponse:
    """Every request: into the pipeline as a `Call`, its `Reply` written back (`_write`)."""
    app = request.app
    call = Call(request.method, request.path, request.headers, _chunks(request), request.query_string)
    call.health_only = getattr(request.protocol, "health_only", False)  # connection.py's cap
    began = time.perf_counter()
    try:
        if getattr(request.protocol, "unsupported_version", False):  # HTTP/0.9 or 2.0 on this port
            call.request_id = new_request_id()
            reply = app[SERVICE].refusal(ApiError(505, UNSUPPORTED_VERSION))
            reply.headers[REQUEST_ID_HEADER], reply.close = call.request_id, True
        else:
            reply = await app[SERVICE].handle(call)
    except asyncio.CancelledError:
        log_cut(app.get(ACCESS_LOG), request, call.request_id, time.perf_counter() - began)
        raise
    if call.trace_id is not None:  # the access line names the request's trace
        request[TRACE_ID] = call.trace_id
    if reply.inference_ms is not None:  # for a recorder outside the pipeline (the bench's)
        request[INFERENCE_MS] = reply.inference_ms
        request[QUEUE_WAIT_MS] = reply.queue_ms
        request[PASS_RESULT] = reply.result
    headers = dict(reply.headers)
    headers["Content-Type"] = reply.content_type
    response = web.StreamResponse(status=reply.status, headers=headers)
    response.content_length = len(reply.body)
    if reply.close or not request.content.is_eof():
        # draining, or a body left unread (a refusal before it): nothing more on this connection
        response.force_close()
    drain = app[DRAIN]
    drain.writing += 1  # a drain waits for the answers still being written, within its grace
    try:
        await asyncio.wait_for(_write(request, response, reply.body), app[SETTINGS].send_timeout)
    except asyncio.TimeoutError:
        request[ENDED] = SEND_TIMEOUT
        log.info(
            "closed a connection whose client did not take its answer within %gs", app[SETTINGS].send_timeout
        )
        if request.transport is not None:
            request.transport.abort()
    except ConnectionError:
        request[ENDED] = RESET
    except asyncio.CancelledError:  # the client went away mid-answer (aiohttp cancels the handler)
        sent = response.body_length if response.prepared else 0
        log_cut(
            app.get(ACCESS_LOG),
            request,
            call.request_id,
            time.perf_counter() - began,
            reply.status,
            sent,
            RESET,
        )
        raise
    finally:
        drain.written()
    return response


async def _write(request: web.Request, response: web.StreamResponse, body: bytes) -> None:
    """The answer in slices: what the connection buffers stays near aiohttp's write-buffer limit,
    whatever the answer's size, since each write waits for the socket to take the previous."""
    if hasattr(request.protocol, "answering"):  # connection.py: no interim response from now on
        request.protocol.answering = True
    await response.prepare(request)
    if request.method != "HEAD":
        for start in range(0, len(body), WRITE_SLICE):
            await response.write(body[start : start + WRITE_SLICE])
    await response.write_eof()


async def _json_only(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: an error aiohttp built itself (an unknown `Expect`: 417, answered
    before any handler runs) leaves as the app's JSON error body with a request id."""
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
        response.headers[REQUEST_ID_HEADER] = accept_request_id(None)


async def _decider_ctx(app: web.Application) -> AsyncIterator[None]:
    """Start the worker on the serving loop; drain it at shutdown."""
    decider = app[DECIDER]
    await decider.start()
    try:
        yield
    finally:
        await decider.stop()


def create_app(agent: ServedAgent | Router, **settings: Any) -> web.Application:
    """Build the server for one loaded agent, or for a `laya_onnx.Router` over several bundles.

    `settings` override the environment: api_key, max_concurrent, body_read_timeout, root_path,
    max_token_budget, max_batch_tokens, jev_strict, tournament_group, jev_profile,
    max_request_seconds, request_timeout, body_buffer, ... (see `Settings`).
    """
    config = Settings.from_env(**settings)
    served = Served.of(agent)
    decider = LocalDecider(served, config)
    metrics = Metrics(served.agent, config.max_concurrent, queue_depth=decider.queue_depth)
    app = web.Application(handler_args={**HANDLER_ARGS, **SERVER_ARGS})
    app.on_response_prepare.append(_json_only)
    app[SETTINGS] = config
    app[DECIDER] = decider
    app[DRAIN] = decider.drain
    app[METRICS] = metrics
    app[SERVICE] = DecisionService(decider, config, metrics)
    decider.on_wait = metrics.waited
    app.cleanup_ctx.append(_decider_ctx)
    app.router.add_route("*", "/{path:.*}", handle)
    return app
