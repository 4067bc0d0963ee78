"""The aiohttp front end: `create_app(agent)`, moving bytes between aiohttp and `DecisionService`;
and `laya-onnx serve` (`run_server`): the address bound before the bundle loads
(serve/README.md#exit-codes), drained on a signal (serve/README.md#stopping-a-terminating-signal-drains).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from laya_onnx.core import settings, tracing
from laya_onnx.core.errors import ConfigError
from laya_onnx.core.router import Router
from laya_onnx.serve import contract, logs
from laya_onnx.serve.connection import HANDLER_ARGS, LayaRequestHandler, handler_factory, on_loop_error
from laya_onnx.serve.contract import LocalDecider
from laya_onnx.serve.errors import BODY_UNDECODABLE, ApiError
from laya_onnx.serve.metrics import Metrics
from laya_onnx.serve.served import Served, ServedAgent, load_agent
from laya_onnx.serve.service import Call, DecisionService
from laya_onnx.serve.settings import ServerLimits, Settings, resolve_host, resolve_port
from laya_onnx.serve.worker import Drain

log = logging.getLogger("laya_onnx.serve")

WRITE_SLICE = 64 * 1024

SERVICE = web.AppKey("service", DecisionService)
DECIDER = web.AppKey("decider", LocalDecider)
METRICS = web.AppKey("metrics", Metrics)
DRAIN = web.AppKey("drain", Drain)
#: The running server's access logger (absent: no access log), for `logs.log_cut`.
ACCESS_LOG = web.AppKey("access_log", AbstractAccessLogger)


async def _chunks(request: web.Request) -> AsyncIterator[bytes]:
    """The body as it arrives; a body aiohttp cannot de-chunk is the caller's fault (400)."""
    try:
        async for chunk in request.content.iter_any():
            yield chunk
    except web.RequestPayloadError:
        raise ApiError(400, BODY_UNDECODABLE) from None


async def handle(request: web.Request) -> web.StreamResponse:
    app = request.app
    call = Call(request.method, request.path, request.headers, _chunks(request), request.query_string)
    call.health_only = getattr(request.protocol, "health_only", False)  # connection.py's cap
    began = time.perf_counter()
    response: web.StreamResponse | None = None
    try:
        if getattr(request.protocol, "unsupported_version", False):  # HTTP/0.9 or 2.0 on this port
            call.request_id = logs.new_request_id()
            reply = app[SERVICE].refusal(ApiError(505, "HTTP version not supported; send HTTP/1.1"))
            reply.headers[logs.REQUEST_ID_HEADER] = call.request_id
            reply.close = True
        else:
            reply = await app[SERVICE].handle(call)
        if call.trace_id is not None:
            request[logs.TRACE_ID] = call.trace_id
        if reply.inference_ms is not None:  # for a recorder outside the pipeline (the bench's)
            request[logs.INFERENCE_MS] = reply.inference_ms
            request[logs.QUEUE_WAIT_MS] = reply.queue_ms
        headers = {
            **reply.headers,
            "Content-Type": reply.content_type,
            "Content-Length": str(len(reply.body)),
        }
        response = web.StreamResponse(status=reply.status, headers=headers)
        if reply.close or not request.content.is_eof():  # draining, or a body left unread
            response.force_close()
        with app[DRAIN].writing():
            await _send(request, response, reply.body, app[DECIDER].settings.send_timeout)
        return response
    except asyncio.CancelledError:  # the client went away (aiohttp cancels the handler)
        logs.log_cut(app.get(ACCESS_LOG), request, call.request_id, time.perf_counter() - began, response)
        raise


async def _send(request: web.Request, response: web.StreamResponse, body: bytes, timeout: float) -> None:
    """`_write`, disconnecting a client that does not take its answer within `timeout`."""
    try:
        await asyncio.wait_for(_write(request, response, body), timeout)
    except asyncio.TimeoutError:
        request[logs.ENDED] = logs.SEND_TIMEOUT
        log.info("closed a connection whose client did not take its answer within %gs", timeout)
        if request.transport is not None:
            request.transport.abort()
    except ConnectionError:
        request[logs.ENDED] = logs.RESET


async def _write(request: web.Request, response: web.StreamResponse, body: bytes) -> None:
    """The answer in slices, each once the socket took the previous: a connection buffers no more
    than aiohttp's write-buffer limit, whatever the answer's size."""
    if hasattr(request.protocol, "answering"):  # connection.py: no interim response from now on
        request.protocol.answering = True
    await response.prepare(request)
    if request.method != "HEAD":
        for start in range(0, len(body), WRITE_SLICE):
            await response.write(body[start : start + WRITE_SLICE])
    await response.write_eof()


async def _json_only(request: web.Request, response: web.StreamResponse) -> None:
    """An error aiohttp answers by itself (an unknown `Expect`: 417) as the app's JSON error body,
    with a request id and a fixed detail (never request text)."""
    if response.status < 300 or not isinstance(response, web.Response):
        return
    if response.headers.get("Content-Type", "").startswith("application/json"):
        return
    detail = "only the Expect value 100-continue is supported" if response.status == 417 else response.reason
    response.body = request.app[SERVICE].refusal(ApiError(response.status, detail)).body
    response.headers["Content-Type"] = "application/json"
    response.headers["Content-Length"] = str(len(response.body))
    response.headers.setdefault(logs.REQUEST_ID_HEADER, logs.new_request_id())


async def _decider_ctx(app: web.Application) -> AsyncIterator[None]:
    await app[DECIDER].start()
    try:
        yield
    finally:
        await app[DECIDER].stop()


def create_app(agent: ServedAgent | Router, **settings: Any) -> web.Application:
    """The server for one loaded agent or a `laya_onnx.Router`; `settings` (`Settings`' fields)
    override the environment."""
    config = Settings.from_env(**settings)
    decider = LocalDecider(Served.of(agent), config)
    metrics = Metrics(decider.served, config.max_concurrent, queue_depth=decider.queue_depth)
    decider.on_wait = metrics.waited
    # a handler is cancelled when its client goes away: no further pass runs for nobody
    app = web.Application(handler_args={**HANDLER_ARGS, "handler_cancellation": True})
    app.on_response_prepare.append(_json_only)
    app[DECIDER] = decider
    app[DRAIN] = decider.drain
    app[METRICS] = metrics
    app[SERVICE] = DecisionService(decider, config, metrics)
    app.cleanup_ctx.append(_decider_ctx)
    app.router.add_route("*", "/{path:.*}", handle)
    return app


#: Every signal whose default action ends the process (SIGPIPE is ignored by Python already).
DRAIN_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)


def _where(address: Any) -> str:
    return ("[%s]:%d" if ":" in address[0] else "%s:%d") % tuple(address[:2])


def _bind(host: str, port: int) -> list[socket.socket]:
    """Bind, without listening, every address `host` resolves to: the port is held while the
    model loads, and a client is refused outright rather than queued."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError("invalid --host/%s %r: %s" % (settings.HOST.env, host, exc.strerror)) from None
    sockets: list[socket.socket] = []
    seen = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            if os.name == "posix":
                # a restart must not wait out the old process's TIME_WAIT connections
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise _cannot_listen(address, exc) from None
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _cannot_listen(address: Any, exc: OSError) -> OSError:
    """The bind/listen failure, saying where."""
    return OSError(exc.errno, "cannot listen on %s: %s" % (_where(address), exc.strerror or exc))


def run_server(
    bundle: os.PathLike | str | None,
    host: str | None = None,
    port: int | None = None,
    providers: Sequence[Any] | None = None,
    models: Sequence[str] = (),
    strict_providers: bool = False,
    threads: int | None = None,
    log_format: str | None = None,
) -> None:
    """`laya-onnx serve` (`--help`: each flag an argument here, winning over its variable). Raises
    `ConfigError` or OSError before the bundle is loaded, SystemExit when it cannot be loaded."""
    options = {"providers": list(providers) if providers else None, "threads": threads}

    def load() -> Any:
        try:
            return load_agent(bundle, models, strict_providers=strict_providers, **options)
        except ConfigError:
            raise
        except (OSError, ValueError) as exc:
            raise SystemExit(f"laya-onnx: cannot serve {str(bundle or ', '.join(models))!r}: {exc}") from None

    _run(host, port, load, str(bundle), log_format=log_format)


def serve_agent(agent: Any, host: str | None = None, port: int | None = None, **settings: Any) -> None:
    """Serve an agent already built as `run_server` serves a bundle; `settings` go to `create_app`."""
    _run(host, port, lambda: agent, None, settings)


def _run(
    host: str | None,
    port: int | None,
    load: Callable[[], Any],
    source: str | None,
    overrides: dict[str, Any] | None = None,
    log_format: str | None = None,
) -> None:
    """Settings checked and the address bound before `load`; served until a signal, then drained."""
    host, port, level = resolve_host(host), resolve_port(port), settings.LOG_LEVEL.read()
    limits = ServerLimits.from_env(**({"log_format": log_format} if log_format else {}))
    app_settings = Settings.from_env(**(overrides or {}))
    access_log = logs.configure_logging(level, limits.access_log, limits.log_format)
    tracing.configure_from_environment()  # spans exported where OTEL_TRACES_EXPORTER says
    sockets = _bind(host, port)
    try:
        app = create_app(load(), **dataclasses.asdict(app_settings))
        asyncio.run(_serve(app, sockets, limits, access_log, source))
    finally:
        for sock in sockets:
            sock.close()
    if abandoned := app[DRAIN].abandoned:
        # ThreadPoolExecutor threads are joined at interpreter exit: waiting for a pass the
        # drain already answered for would break the grace the operator configured.
        log.warning("exiting with %d abandoned pass(es) still on the worker thread", abandoned)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@dataclasses.dataclass
class RunningServer:
    """The app listening on bound sockets through `LayaRequestHandler`: `start`, `drain`, `close`."""

    app: web.Application
    runner: web.AppRunner
    limits: ServerLimits
    listeners: list[asyncio.AbstractServer] = dataclasses.field(default_factory=list)

    @classmethod
    async def start(
        cls,
        app: web.Application,
        sockets: Sequence[socket.socket],
        limits: ServerLimits,
        access_log: logging.Logger | None = None,
    ) -> RunningServer:
        access_class = logs.access_logger_class(limits.access_log, limits.log_format)
        handler_options: dict[str, Any] = {
            # only a backstop: LayaRequestHandler closes idle connections and slow heads sooner
            "keepalive_timeout": limits.keepalive_timeout + limits.header_read_timeout,
            "access_log_class": access_class,
            "access_log": access_log,
        }
        if access_log is not None:  # for the lines aiohttp does not write (`log_cut`)
            app[ACCESS_LOG] = access_class(access_log, "")
        runner = web.AppRunner(
            app, handle_signals=False, shutdown_timeout=_closing_margin(limits), **handler_options
        )
        await runner.setup()
        server = cls(app, runner, limits)
        try:
            factory = handler_factory(
                runner,
                idle_timeout=limits.keepalive_timeout,
                header_read_timeout=limits.header_read_timeout,
                max_connections=limits.max_connections,
                error_payload=partial(contract.error_body, app[DECIDER].settings),
                **handler_options,
            )
            loop = asyncio.get_running_loop()
            loop.set_exception_handler(on_loop_error)  # a failed accept: one line a while
            for sock in sockets:
                try:
                    server.listeners.append(await loop.create_server(factory, sock=sock, backlog=128))
                except OSError as exc:
                    raise _cannot_listen(sock.getsockname(), exc) from None
        except BaseException:
            await server.close()
            raise
        return server

    async def drain(self, reason: str) -> None:
        """Stop accepting, close idle connections, answer or refuse every admitted request, each
        step logged; returns when all are answered, at the latest at the end of the grace."""
        loop = asyncio.get_running_loop()
        grace = self.limits.shutdown_grace
        drain = self.app[DRAIN]
        gate = drain.lock
        began = loop.time()
        running = int(gate is not None and gate.busy)
        waiting = gate.waiting if gate is not None else 0
        log.info(
            "%s: draining for up to %gs; %d decision request(s) in flight "
            "(%d running, %d waiting for the worker, %d being checked)",
            reason,
            grace,
            drain.in_flight,
            running,
            waiting,
            max(0, drain.in_flight - running - waiting),
        )
        for listener in self.listeners:
            listener.close()
        connections = self.runner.server.connections if self.runner.server is not None else []
        closed = sum(1 for conn in connections if isinstance(conn, LayaRequestHandler) and conn.begin_drain())
        log.info("stopped accepting connections; closed %d idle connection(s)", closed)
        drain.begin(began + grace - _closing_margin(self.limits))
        if drain.refused:
            log.info(
                "refused %d queued request(s) that could not finish within the grace (503, Retry-After)",
                drain.refused,
            )
        finished = await drain.wait_idle(began + grace - loop.time())
        log.info(
            "drained in %.1fs: %d answered, %d refused%s",
            loop.time() - began,
            drain.answered,
            drain.refused,
            "" if finished else "; %d still unanswered at the deadline" % drain.in_flight,
        )

    async def close(self) -> None:
        """Close every connection and run the app's cleanup (which stops the worker)."""
        for listener in self.listeners:
            listener.close()
        await self.runner.cleanup()


def _closing_margin(limits: ServerLimits) -> float:
    """Seconds kept at the end of the grace to write the last answers and close down."""
    return min(1.0, limits.shutdown_grace / 4)


async def _serve(
    app: web.Application,
    sockets: list[socket.socket],
    limits: ServerLimits,
    access_log: logging.Logger | None,
    source: str | None,
) -> None:
    loop = asyncio.get_running_loop()
    first: asyncio.Future[int] = loop.create_future()  # the signal that starts the drain

    def on_signal(signum: int) -> None:
        if not first.done():
            first.set_result(signum)
        else:
            log.warning(
                "received %s again: refusing everything still unanswered now", signal.Signals(signum).name
            )
            app[DRAIN].begin(loop.time())

    server = await RunningServer.start(app, sockets, limits, access_log)
    try:
        for signum in DRAIN_SIGNALS:
            loop.add_signal_handler(signum, on_signal, signum)
        served = app[DECIDER].served
        providers = dict.fromkeys(p for agent in served.resident().values() for p in agent.providers)
        log.info(
            "serving %s%s on %s with %s; shutdown grace %gs",
            served.describe(),
            " from %s" % source if source else "",
            ", ".join("http://" + _where(sock.getsockname()) for sock in sockets),
            ", ".join(providers) or "default providers",
            limits.shutdown_grace,
        )
        await server.drain("received %s" % signal.Signals(await first).name)
    finally:
        for signum in DRAIN_SIGNALS:
            loop.remove_signal_handler(signum)
        await server.close()
    log.info("stopped")
