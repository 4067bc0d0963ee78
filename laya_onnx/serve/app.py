"""The aiohttp front end: `create_app(agent)` -> `web.Application`, moving bytes between aiohttp
and `DecisionService` (serve/service.py), which routes and answers every request. Here: the app's
lifecycle and keys, writing an answer (serve/README.md#connections) and the access line of a
request whose client went away.
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
from laya_onnx.serve.contract import LocalDecider
from laya_onnx.serve.drain import Drain
from laya_onnx.serve.errors import BODY_UNDECODABLE, UNSUPPORTED_VERSION, ApiError
from laya_onnx.serve.keys import INFERENCE_MS, QUEUE_WAIT_MS, TRACE_ID
from laya_onnx.serve.logs import ENDED, REQUEST_ID_HEADER, RESET, SEND_TIMEOUT, log_cut, new_request_id
from laya_onnx.serve.metrics import Metrics
from laya_onnx.serve.served import Served, ServedAgent
from laya_onnx.serve.service import Call, DecisionService
from laya_onnx.serve.settings import Settings

log = logging.getLogger("laya_onnx.serve")

#: RequestHandler options, whatever runner serves the app: bodies are decoded by the pipeline
#: (within the cap), and a body a refusal left unread is not read to be thrown away.
HANDLER_ARGS: dict[str, Any] = {"auto_decompress": False, "lingering_time": 0}
#: Bytes of an answer handed to the connection at once.
WRITE_SLICE = 64 * 1024

SERVICE = web.AppKey("service", DecisionService)
DECIDER = web.AppKey("decider", LocalDecider)
SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
DRAIN = web.AppKey("drain", Drain)
#: The running server's access logger (absent: no access log), for `log_cut`.
ACCESS_LOG = web.AppKey("access_log", AbstractAccessLogger)


async def _chunks(request: web.Request) -> AsyncIterator[bytes]:
    """The body as it arrives; a body aiohttp cannot de-chunk is the caller's fault (400)."""
    try:
        async for chunk in request.content.iter_any():
            yield chunk
    except web.RequestPayloadError:
        raise ApiError(400, BODY_UNDECODABLE) from None


async def handle(request: web.Request) -> web.StreamResponse:
    """Every request: into the pipeline as a `Call`, its `Reply` written back."""
    app = request.app
    call = Call(request.method, request.path, request.headers, _chunks(request), request.query_string)
    call.health_only = getattr(request.protocol, "health_only", False)  # connection.py's cap
    began = time.perf_counter()
    response: web.StreamResponse | None = None
    try:
        if getattr(request.protocol, "unsupported_version", False):  # HTTP/0.9 or 2.0 on this port
            call.request_id = new_request_id()
            reply = app[SERVICE].refusal(ApiError(505, UNSUPPORTED_VERSION))
            reply.headers[REQUEST_ID_HEADER] = call.request_id
            reply.close = True
        else:
            reply = await app[SERVICE].handle(call)
        if call.trace_id is not None:
            request[TRACE_ID] = call.trace_id
        if reply.inference_ms is not None:  # for a recorder outside the pipeline (the bench's)
            request[INFERENCE_MS] = reply.inference_ms
            request[QUEUE_WAIT_MS] = reply.queue_ms
        headers = {
            **reply.headers,
            "Content-Type": reply.content_type,
            "Content-Length": str(len(reply.body)),
        }
        response = web.StreamResponse(status=reply.status, headers=headers)
        if reply.close or not request.content.is_eof():  # draining, or a body left unread
            response.force_close()
        with app[DRAIN].writing():
            await _send(request, response, reply.body, app[SETTINGS].send_timeout)
        return response
    except asyncio.CancelledError:  # the client went away (aiohttp cancels the handler)
        log_cut(app.get(ACCESS_LOG), request, call.request_id, time.perf_counter() - began, response)
        raise


async def _send(request: web.Request, response: web.StreamResponse, body: bytes, timeout: float) -> None:
    """`_write`, disconnecting a client that does not take its answer within `timeout`."""
    try:
        await asyncio.wait_for(_write(request, response, body), timeout)
    except asyncio.TimeoutError:
        request[ENDED] = SEND_TIMEOUT
        log.info("closed a connection whose client did not take its answer within %gs", timeout)
        if request.transport is not None:
            request.transport.abort()
    except ConnectionError:
        request[ENDED] = RESET


async def _write(request: web.Request, response: web.StreamResponse, body: bytes) -> None:
    """The answer in slices, each written once the socket took the previous: what a connection
    buffers stays near aiohttp's write-buffer limit, whatever the answer's size."""
    if hasattr(request.protocol, "answering"):  # connection.py: no interim response from now on
        request.protocol.answering = True
    await response.prepare(request)
    if request.method != "HEAD":
        for start in range(0, len(body), WRITE_SLICE):
            await response.write(body[start : start + WRITE_SLICE])
    await response.write_eof()


async def _json_only(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: an error aiohttp answers by itself (an unknown `Expect`: 417) leaves
    as the app's JSON error body with a request id (and a fixed detail, never request text)."""
    if response.status < 300 or not isinstance(response, web.Response):
        return
    if response.headers.get("Content-Type", "").startswith("application/json"):
        return
    detail = "only the Expect value 100-continue is supported" if response.status == 417 else response.reason
    response.body = contract.render(contract.error_body(request.app[SETTINGS], response.status, detail))
    response.headers["Content-Type"] = "application/json"
    response.headers["Content-Length"] = str(len(response.body))
    response.headers.setdefault(REQUEST_ID_HEADER, new_request_id())


async def _decider_ctx(app: web.Application) -> AsyncIterator[None]:
    """Start the worker on the serving loop; drain it at shutdown."""
    await app[DECIDER].start()
    try:
        yield
    finally:
        await app[DECIDER].stop()


def create_app(agent: ServedAgent | Router, **settings: Any) -> web.Application:
    """The server for one loaded agent, or a `laya_onnx.Router` over several bundles;
    `settings` (`Settings`' fields) override the environment."""
    config = Settings.from_env(**settings)
    decider = LocalDecider(Served.of(agent), config)
    metrics = Metrics(decider.served.agent, config.max_concurrent, queue_depth=decider.queue_depth)
    decider.on_wait = metrics.waited
    # a handler is cancelled when its client goes away: no further pass runs for nobody
    app = web.Application(handler_args={**HANDLER_ARGS, "handler_cancellation": True})
    app.on_response_prepare.append(_json_only)
    app[SETTINGS] = config
    app[DECIDER] = decider
    app[DRAIN] = decider.drain
    app[METRICS] = metrics
    app[SERVICE] = DecisionService(decider, config, metrics)
    app.cleanup_ctx.append(_decider_ctx)
    app.router.add_route("*", "/{path:.*}", handle)
    return app
