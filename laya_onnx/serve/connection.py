"""The HTTP connection below the app (serve/README.md#connections). aiohttp has no hook for it
(aio-libs/aiohttp#3287): asyncio's protocol methods and aiohttp's public-named ones are
overridden, their signatures pinned by tests/serve/test_serve_connections.py."""

from __future__ import annotations

import asyncio
import logging
import re
import resource
import socket
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import Any

from aiohttp import http_exceptions, web
from aiohttp.http import HttpVersion10, HttpVersion11

from laya_onnx.core import settings
from laya_onnx.serve.contract import render
from laya_onnx.serve.errors import TOO_MANY_CONNECTIONS
from laya_onnx.serve.logs import REQUEST_ID_HEADER, new_request_id

log = logging.getLogger("laya_onnx.serve")

#: RequestHandler options, whatever runner serves the app: bodies are decoded by the pipeline
#: (within the cap), and a body a refusal left unread is not read to be thrown away.
HANDLER_ARGS: dict[str, Any] = {"auto_decompress": False, "lingering_time": 0}

_BAD_METHOD = getattr(http_exceptions, "BadHttpMethod", ())
_INVALID_URL = getattr(http_exceptions, "InvalidURLError", ())
LONG_LINE = "request line or header field too long"
#: Seconds after a client closed its side before its socket is looked at (gone or half-closed).
GONE_PROBE_SECONDS = 0.05
#: Linux's TCP state of a socket reset by its peer (`TCP_INFO`'s first byte).
TCP_CLOSE = 7
_TCP_INFO = getattr(socket, "TCP_INFO", None)
#: aiohttp's limit on a request line (its `max_line_size`), checked here first.
MAX_REQUEST_LINE = 8190
#: After refusing a request line: how long, and how many bytes, the rest is read and dropped.
LINGER_SECONDS = 2.0
LINGER_BYTES = 16 * 1024 * 1024
#: Connections past the cap kept for the health routes, and file descriptors kept free.
HEALTH_RESERVE = 32
FD_MARGIN = 64
CAP_SETTING = settings.MAX_CONNECTIONS.env
#: Seconds between two log lines about refused or failed connections.
LOG_INTERVAL = 10.0
_last_logged: dict[str, float] = {}
_suppressed: dict[str, int] = {}
#: What `framed_pieces` reads of a request's head.
_HEAD_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*([0-9]{1,18})[ \t]*(?=\r\n)", re.IGNORECASE)
_TRANSFER_ENCODING = re.compile(rb"\r\ntransfer-encoding[ \t]*:", re.IGNORECASE)


def parser_refusal(status: int, exc: BaseException | None) -> tuple[int, str]:
    """Status and a fixed detail for an error aiohttp hands to `handle_error` (never its message)."""
    if isinstance(exc, http_exceptions.LineTooLong):
        return 431, LONG_LINE
    if isinstance(exc, http_exceptions.BadHttpMessage) and "too many headers" in str(exc).lower():
        return 431, "too many request headers"
    if _BAD_METHOD and isinstance(exc, _BAD_METHOD):  # aiohttp < 3.10: a BadStatusLine
        if "HTTPS" in str(exc):
            return 400, "malformed request: TLS sent to a plain HTTP port"
        return 400, "malformed request line: invalid method"
    if isinstance(exc, http_exceptions.BadStatusLine):
        return 400, "malformed request line"
    if _INVALID_URL and isinstance(exc, _INVALID_URL):
        return 400, "malformed request target"
    if isinstance(exc, http_exceptions.InvalidHeader):
        return 400, "malformed request header"
    if isinstance(exc, http_exceptions.HttpProcessingError) or status == 400:
        return 400, "malformed request"
    status = 504 if status == 504 else 500
    return status, HTTPStatus(status).phrase


def connection_cap() -> int:
    """The open-files limit less a margin and the health reserve (at least 16)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        soft = 1024
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, soft - FD_MARGIN - HEALTH_RESERVE)


def _throttled_log(message: str, *args: Any) -> None:
    """`message` at WARNING at most once per LOG_INTERVAL, with how many were left out since."""
    now = time.monotonic()
    if now - _last_logged.get(message, -LOG_INTERVAL) < LOG_INTERVAL:
        _suppressed[message] = _suppressed.get(message, 0) + 1
        return
    _last_logged[message] = now
    left_out = _suppressed.pop(message, 0)
    log.warning(message + ("" if not left_out else " (and %d more like it not logged)" % left_out), *args)


def on_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The serving loop's exception handler: a failed accept is `_throttled_log`ged, no traceback."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and "accept" in str(context.get("message", "")):
        _throttled_log("cannot accept connections: %s (raise LimitNOFILE, or lower %s)", exc, CAP_SETTING)
        return
    loop.default_exception_handler(context)


def framed_pieces(data: bytes) -> Iterator[bytes]:
    """`data` (from a request's first byte) cut after each request it holds whole, framed by one
    plain Content-Length; anything else goes to the parser as it is. Joined, the pieces are `data`."""
    start = 0
    while True:
        head_end = data.find(_HEAD_END, start)
        if head_end < 0:
            break
        head = data[start : head_end + 2]  # through the last header's CRLF
        lengths = _CONTENT_LENGTH.findall(head)
        if _TRANSFER_ENCODING.search(head) or len(lengths) > 1:
            break
        end = head_end + len(_HEAD_END) + (int(lengths[0]) if lengths else 0)
        if end >= len(data):
            break
        yield data[start:end]
        start = end
    yield data[start:]


class LayaRequestHandler(web.RequestHandler):
    """aiohttp's connection protocol with the cap, the timeouts, the parser's refusals and the drain."""

    def __init__(
        self,
        manager: web.Server,
        *,
        idle_timeout: float,
        header_read_timeout: float,
        error_payload: Callable[[int, str], Any],
        max_connections: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self.manager = manager
        self.max_connections = max_connections or connection_cap()
        self.error_payload = error_payload  # the app's wire profile (laya-serve's or Jev's)
        self.idle_timeout = idle_timeout
        self.header_read_timeout = header_read_timeout
        self.health_only = False  # opened past the cap: only the health routes answer
        self.unsupported_version = False  # the request names HTTP/0.9 or 2.0 (505)
        self.request_http11 = False  # an interim response may be sent on the request
        self.answering = False  # its answer has started (set by app.py): no interim response
        self._half_closed = False  # the client closed its side after sending
        self._line_bytes: int | None = None  # of the request line so far (None: complete)
        self._discarded: int | None = None  # dropped after a refused request line
        self._begun = 0  # requests aiohttp built (`request_began`), parser refusals included
        self._finished = 0  # responses written
        self._head_started = False  # bytes of a request whose headers are not complete yet
        self._unread_body: Any = None  # an answered request's body still arriving (discarded)
        self._draining = False
        self._timer: asyncio.TimerHandle | None = None

    def _between_requests(self) -> bool:
        """Every request parsed is answered and its body in: the next bytes start a new request."""
        if self._unread_body is not None:
            if not self._unread_body.is_eof():
                return False
            self._unread_body = None
        return self._begun <= self._finished

    @property
    def idle(self) -> bool:
        """Between requests with no byte of the next one received."""
        return self._between_requests() and not self._head_started

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _write_refusal(self, status: int, detail: str, why: str = "") -> None:
        """A whole `Connection: close` refusal straight to the socket, between requests; `why` logs it."""
        request_id = new_request_id()
        if why:
            peer = self.transport.get_extra_info("peername") if self.transport is not None else None
            log.info("%d to %s: %s request_id=%s", status, peer, why, request_id)
        if isinstance(self.transport, asyncio.WriteTransport):
            body = render(self.error_payload(status, detail))
            head = (
                "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                "%s: %s\r\nConnection: close\r\n\r\n"
                % (status, HTTPStatus(status).phrase, len(body), REQUEST_ID_HEADER, request_id)
            )
            self.transport.write(head.encode("ascii") + body)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm(self.idle_timeout, self._idle_expired)
        connections = self.manager.connections
        over = len(connections) - self.max_connections
        if over <= 0:
            return
        # idle keep-alive connections make room first, oldest first
        idle = [c for c in connections if c is not self and isinstance(c, LayaRequestHandler) and c.idle]
        for conn in [c for c in idle if c.transport][:over]:
            conn.force_close()
            over -= 1
        if over <= 0:
            return
        if over > HEALTH_RESERVE:
            _throttled_log(
                "%d connections open (%s): refused a new one with 503", len(connections), CAP_SETTING
            )
            self._write_refusal(503, TOO_MANY_CONNECTIONS)
            self.force_close()
        else:
            self.health_only = True

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio reads the bool
        """The client closed its side with an HTTP/1.1 request unanswered: the socket stays open, and an
        interim `100 Continue` tells whether the client is gone (a reset: the request is cancelled)."""
        transport = self.transport
        if self._between_requests() or self._discarded is not None or transport is None:
            return False
        if not self.request_http11 or self.answering or not isinstance(transport, asyncio.WriteTransport):
            return False
        transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        asyncio.get_running_loop().call_later(GONE_PROBE_SECONDS, self._gone_or_half_closed)
        self._half_closed = True
        return True

    def _gone_or_half_closed(self) -> None:
        transport = self.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None:
            return
        try:
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            state = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)[0] if _TCP_INFO is not None else 0
        except OSError:
            error, state = 1, 0
        if error or state == TCP_CLOSE:
            log.debug("a client that closed its side is gone: its request is cancelled")
            self.force_close()

    def data_received(self, data: bytes) -> None:
        if self._discarded is not None:  # after a refused request line: swallowed, then closed
            self._discarded += len(data)
            if self._discarded > LINGER_BYTES:
                self.force_close()
            return
        starts = bool(data) and self.idle  # the first bytes of a request
        if starts:
            self._head_started = True
            self._line_bytes = 0
            self._arm(self.header_read_timeout, self._head_expired)
        if self._head_started and self._line_bytes is not None:
            if b"\n" in data:
                self._line_bytes = None  # the request line is complete: the parser judges the rest
            else:
                self._line_bytes += len(data)
                if self._line_bytes > MAX_REQUEST_LINE:
                    self._refuse_long_line()
                    return
        for piece in framed_pieces(data) if starts else (data,):
            super().data_received(piece)

    def _refuse_long_line(self) -> None:
        """431 for a request line over MAX_REQUEST_LINE, then a lingering close (no reset under an upload)."""
        transport = self.transport
        if transport is None:
            return
        self._disarm()
        self._write_refusal(431, LONG_LINE, "request line over %d bytes" % MAX_REQUEST_LINE)
        if transport.can_write_eof():
            transport.write_eof()
        self._discarded = 0
        self._arm(LINGER_SECONDS, self.force_close)

    def request_began(self, version: Any) -> None:
        """aiohttp built the request object of a head (or of a parser refusal) naming `version`."""
        self._begun += 1
        self._head_started = False
        self._disarm()
        self.request_http11 = version == HttpVersion11
        self.answering = False
        self.unsupported_version = version not in (HttpVersion10, HttpVersion11)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: Any
    ) -> Any:
        if self._draining:
            resp.force_close()
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._finished += 1
            if not request.content.is_eof():
                self._unread_body = request.content
            if self.transport is not None and self.idle:
                if self._draining or self._half_closed:
                    self.force_close()
                else:
                    self._arm(self.idle_timeout, self._idle_expired)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The parser's refusals (and any error that escaped the app) in the wire profile."""
        status, detail = parser_refusal(status, exc)
        request_id = new_request_id()
        peer = request.remote
        if isinstance(exc, http_exceptions.HttpProcessingError):
            refusal = "%d %s (%s)" % (status, detail, type(exc).__name__)
            log.info("refused a malformed request from %s: %s request_id=%s", peer, refusal, request_id)
        else:
            log.error("error handling a request from %s request_id=%s", peer, request_id, exc_info=exc)
        if request.writer.output_size > 0:
            # the status line is already out; all that can be done is to close (as aiohttp does)
            raise ConnectionError("response already started; cannot send the error response")
        response = web.Response(
            body=render(self.error_payload(status, detail)),
            status=status,
            headers={REQUEST_ID_HEADER: request_id},
            content_type="application/json",
        )
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """A body aiohttp could not decode, met again while discarding it after its 400: one line."""
        exc = kwargs.get("exc_info")
        if isinstance(exc, web.RequestPayloadError):
            log.info("closed a connection whose request body could not be decoded (%s)", type(exc).__name__)
            return
        super().log_exception(*args, **kwargs)

    def _idle_expired(self) -> None:
        self._timer = None
        if self.idle and self.transport is not None:
            log.debug("closing a connection idle for %gs", self.idle_timeout)
            self.force_close()

    def _head_expired(self) -> None:
        self._timer = None
        if not (self._head_started and self._between_requests()) or self.transport is None:
            return
        why = "request headers not complete within %gs" % self.header_read_timeout
        self._write_refusal(408, "request headers were not received in time", why)
        self.force_close()

    def begin_drain(self) -> bool:
        """Close now if idle, else after the response in progress; True when closed now."""
        self._draining = True
        if self.idle and self.transport is not None:
            self.force_close()
            return True
        return False


def handler_factory(runner: web.AppRunner, **kwargs: Any) -> Any:
    """`loop.create_server`'s protocol factory in place of `runner.server`, where connections register."""
    server = runner.server
    if server is None:
        raise RuntimeError("call runner.setup() before serving")
    loop = asyncio.get_running_loop()
    build_request = server.request_factory

    def begun(message: Any, payload: Any, protocol: Any, *args: Any) -> Any:
        if isinstance(protocol, LayaRequestHandler):
            protocol.request_began(getattr(message, "version", HttpVersion11))
            if protocol.unsupported_version:
                # answered 505 in HTTP/1.1 (`app.handle`), never in the version the client named
                message = message._replace(version=HttpVersion11)
        return build_request(message, payload, protocol, *args)

    server.request_factory = begun

    def make() -> LayaRequestHandler:
        return LayaRequestHandler(server, loop=loop, **HANDLER_ARGS, **kwargs)

    return make
