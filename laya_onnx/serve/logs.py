"""Request ids, the log format and the access log.

Every response carries `X-Request-Id`: the caller's own when it is a plausible id (1-128
characters from a conservative set, so it is safe in a header and a log line), a fresh one
otherwise. While a request is handled its id sits in a context variable, and the server's log
format appends it to every line logged on that request's behalf (`request_id=...`).

The access log is one line per response, written once the response went out or was cut, saying
how its write ended (`whole`, `reset`, `send-timeout`; `cancelled` when the client went away
before any answer): `text` (a readable line, control characters escaped), `json` (one JSON
object per line, for a log shipper) or `off`.

The log format (LAYA_LOG_FORMAT, `--log-format`) is `text` (readable lines) or `json`: every line
one JSON object (`JsonFormatter`: time, level, logger, message, the request id and, while the
server traces, the trace and span ids; a traceback as `exception`), startup, drain, warnings and
errors alike; under it the access lines are JSON too (unless off), with their request's trace id.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import re
import uuid
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from laya_onnx.core import tracing
from laya_onnx.core.notices import log_warnings
from laya_onnx.serve.keys import TRACE_ID

REQUEST_ID_HEADER = "X-Request-Id"
ACCESS_LOGGER = "laya_onnx.serve.access"
#: What a caller-supplied id may look like: UUIDs, ULIDs, trace ids (`Root=1-...`), base64.
_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._~:/+=@-]{1,128}")

#: The id of the request the current task is handling, for log lines (None outside a request).
current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "laya_onnx_request_id", default=None
)


def new_request_id() -> str:
    return uuid.uuid4().hex


def accept_request_id(supplied: str | None) -> str:
    """The caller's id when it is acceptable, else a fresh one (never the rejected text)."""
    if supplied is not None and _VALID_REQUEST_ID.fullmatch(supplied):
        return supplied
    return new_request_id()


class RequestIdFormatter(logging.Formatter):
    """The usual line, plus ` request_id=<id>` when it was logged while handling a request."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        # formatMessage is the line before any traceback: the id stays on the line it belongs to
        line = super().formatMessage(record)
        request_id = current_request_id.get()
        return line if request_id is None else "%s request_id=%s" % (line, request_id)


def _timestamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: `ts`, `level`, `logger`, `message`, `request_id` and, while a
    span is current, `trace_id` and `span_id`; a traceback as `exception`."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": current_request_id.get(),
        }
        ids = tracing.current_ids()
        if ids is not None:
            fields["trace_id"], fields["span_id"] = ids
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        return json.dumps(fields, ensure_ascii=False, separators=(",", ":"), default=str)


#: The status an access line gives a request whose client went away before its answer.
CANCELLED = "cancelled"


#: Request key: how the answer's write ended (`WHOLE` when absent).
ENDED: Any = web.RequestKey("ended", str) if hasattr(web, "RequestKey") else "laya_onnx.ended"
WHOLE = "whole"
#: The client went away while its answer was being written.
RESET = "reset"
#: The client did not take its answer within LAYA_SEND_TIMEOUT.
SEND_TIMEOUT = "send-timeout"


def _access_fields(
    request: web.BaseRequest,
    status: int | str,
    bytes_sent: int,
    seconds: float,
    request_id: str | None,
    ended: str = WHOLE,
) -> dict[str, Any]:
    fields = {
        "remote": request.remote,
        "method": request.method,
        # the path only: a query string may carry what a log must not keep
        "path": request.path,
        "status": status,
        # what aiohttp wrote for this response, status line and headers included
        "bytes_sent": bytes_sent,
        "duration_ms": round(seconds * 1000.0, 2),
        "request_id": request_id,
        # how the answer's write ended: whole, reset, send-timeout; cancelled: before any answer
        "ended": ended,
    }
    # the request's trace, when it was traced (left by its span)
    trace_id = request.get(TRACE_ID)
    if trace_id is not None:
        fields["trace_id"] = trace_id
    return fields


class _AccessLogger(AbstractAccessLogger):
    """One line per response (`write` says how); `cancelled` for a request whose handler was
    cancelled because its client went away, for which aiohttp writes no line."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        ended = request.get(ENDED) or WHOLE
        request_id = response.headers.get(REQUEST_ID_HEADER)
        self.write(_access_fields(request, response.status, response.body_length, time, request_id, ended))

    def cut(
        self,
        request: web.BaseRequest,
        request_id: str,
        seconds: float,
        status: int | str,
        sent: int,
        ended: str,
    ) -> None:
        self.write(_access_fields(request, status, sent, seconds, request_id, ended))

    def write(self, fields: dict[str, Any]) -> None:
        raise NotImplementedError


def log_cut(
    logger: AbstractAccessLogger | None,
    request: web.BaseRequest,
    request_id: str,
    seconds: float,
    status: int | str = CANCELLED,
    sent: int = 0,
    ended: str = CANCELLED,
) -> None:
    """The access line of a request whose handler was cancelled (its client went away): before
    its answer (status `cancelled`, 0 bytes), or while the answer was written (`ended`)."""
    if isinstance(logger, _AccessLogger):
        logger.cut(request, request_id, seconds, status, sent, ended)


#: What a text log line never carries as is: control characters (C0, DEL, C1), the Unicode line
#: separators, the quote that delimits the request and the backslash that escapes.
_UNPRINTABLE = re.compile('[\x00-\x1f\x7f-\x9f\u2028\u2029"\\\\]')


def printable(value: Any) -> str:
    """`value` as text with every character of `_UNPRINTABLE` written `\\xNN` (or `\\uNNNN`):
    a decoded path such as `/x%0A<a forged line>%1B[2J` stays on its own line, inert."""
    return _UNPRINTABLE.sub(
        lambda m: ("\\x%02x" if ord(m.group()) < 0x100 else "\\u%04x") % ord(m.group()), str(value)
    )


class TextAccessLogger(_AccessLogger):
    """`127.0.0.1 "POST /v1/systemone" 200 512B 12.34ms request_id=... ended=whole` at INFO;
    every field passes through `printable`."""

    def write(self, f: dict[str, Any]) -> None:
        self.logger.info(
            '%s "%s %s" %s %dB %.2fms request_id=%s ended=%s',
            printable(f["remote"]),
            printable(f["method"]),
            printable(f["path"]),
            printable(f["status"]),
            f["bytes_sent"],
            f["duration_ms"],
            printable(f["request_id"]),
            printable(f["ended"]),
        )


class JsonAccessLogger(_AccessLogger):
    """One JSON object per response; the logger's handler prints the message bare."""

    def write(self, f: dict[str, Any]) -> None:
        fields = {
            "ts": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "type": "access",
            **f,
        }
        self.logger.info(json.dumps(fields, ensure_ascii=False, separators=(",", ":")))


ACCESS_LOGGERS: dict[str, type[AbstractAccessLogger]] = {
    "text": TextAccessLogger,
    "json": JsonAccessLogger,
}


def configure_logging(level: int, access_log: str, log_format: str = "text") -> logging.Logger | None:
    """Root handler with request ids in `log_format`, and the access logger for `access_log`
    (None when off).

    JSON access lines (`access_log` json, or any access log under the json format) get a handler
    of their own printing the bare JSON line that does not propagate, so a shipper reading stderr
    sees one JSON object per access line.
    """
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(RequestIdFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("laya_onnx").setLevel(level)
    log_warnings()
    if access_log == "off":
        return None
    access = logging.getLogger(ACCESS_LOGGER)
    if access_json(access_log, log_format):
        json_handler = logging.StreamHandler()
        json_handler.setFormatter(logging.Formatter("%(message)s"))
        access.handlers = [json_handler]
        access.propagate = False
    return access


def access_json(access_log: str, log_format: str) -> bool:
    """Access lines are JSON: asked for, or every line is."""
    return access_log == "json" or (access_log != "off" and log_format == "json")
