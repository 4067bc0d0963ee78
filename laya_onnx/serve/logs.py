"""Request ids, the log formats and the access log (serve/README.md#request-ids-and-logs)."""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import re
import time
import uuid
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from laya_onnx.core import tracing
from laya_onnx.core.notices import log_warnings

REQUEST_ID_HEADER = "X-Request-Id"
ACCESS_LOGGER = "laya_onnx.serve.access"
#: What a caller-supplied id may look like: UUIDs, ULIDs, trace ids (`Root=1-...`), base64.
_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._~:/+=@-]{1,128}")
#: The id of the request the current task is handling, for log lines (None outside a request).
current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "laya_onnx_request_id", default=None
)


def request_key(name: str, kind: type) -> Any:
    """A typed `web.RequestKey`; aiohttp < 3.12 has none, and a namespaced string works there."""
    return web.RequestKey(name, kind) if hasattr(web, "RequestKey") else "laya_onnx." + name


#: What `app.handle` leaves on a request for its access line and the bench: the pass's and the wait's
#: ms (successful passes only), the trace id while tracing, how the write ended (`WHOLE` when absent).
INFERENCE_MS: Any = request_key("inference_ms", float)
QUEUE_WAIT_MS: Any = request_key("queue_wait_ms", float)
TRACE_ID: Any = request_key("trace_id", str)
ENDED: Any = request_key("ended", str)
#: How an answer's write ended (serve/README.md#request-ids-and-logs); `cancelled` is the status too.
WHOLE, RESET, SEND_TIMEOUT, CANCELLED = "whole", "reset", "send-timeout", "cancelled"
#: What a text log line never carries as is: control characters, line separators, `"` and `\`.
_UNPRINTABLE = re.compile('[\x00-\x1f\x7f-\x9f\u2028\u2029"\\\\]')


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
    """One JSON object per record, with the request and trace ids (serve/README.md#request-ids-and-logs)."""

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


def _access_fields(
    request: web.BaseRequest,
    status: int | str,
    bytes_sent: int,
    seconds: float,
    request_id: str | None,
    ended: str = WHOLE,
) -> dict[str, Any]:
    """One access line's fields: the path without its query string (it may carry secrets)."""
    fields = {
        "remote": request.remote,
        "method": request.method,
        "path": request.path,
        "status": status,
        "bytes_sent": bytes_sent,
        "duration_ms": round(seconds * 1000.0, 2),
        "request_id": request_id,
        "ended": ended,
    }
    trace_id = request.get(TRACE_ID)
    if trace_id is not None:
        fields["trace_id"] = trace_id
    return fields


class _AccessLogger(AbstractAccessLogger):
    """One line per response aiohttp logs; `write` says how."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        ended = request.get(ENDED) or WHOLE
        request_id = response.headers.get(REQUEST_ID_HEADER)
        self.write(_access_fields(request, response.status, response.body_length, time, request_id, ended))

    def write(self, fields: dict[str, Any]) -> None:
        raise NotImplementedError


def log_cut(
    logger: AbstractAccessLogger | None,
    request: web.BaseRequest,
    request_id: str,
    seconds: float,
    response: web.StreamResponse | None,
) -> None:
    """The access line aiohttp does not write: its client left before (`response` None) or mid-answer."""
    if not isinstance(logger, _AccessLogger):
        return
    if response is None:
        logger.write(_access_fields(request, CANCELLED, 0, seconds, request_id, CANCELLED))
    else:
        sent = response.body_length if response.prepared else 0
        logger.write(_access_fields(request, response.status, sent, seconds, request_id, RESET))


def printable(value: Any) -> str:
    """`value` as text with every character of `_UNPRINTABLE` written `\\xNN` (or `\\uNNNN`)."""
    return _UNPRINTABLE.sub(
        lambda m: ("\\x%02x" if ord(m.group()) < 0x100 else "\\u%04x") % ord(m.group()), str(value)
    )


class TextAccessLogger(_AccessLogger):
    """`127.0.0.1 "POST /v1/systemone" 200 512B 12.34ms request_id=... ended=whole` at INFO."""

    LINE = (
        '%(remote)s "%(method)s %(path)s" %(status)s %(bytes_sent)dB %(duration_ms).2fms '
        "request_id=%(request_id)s ended=%(ended)s"
    )

    def write(self, f: dict[str, Any]) -> None:
        numbers = ("bytes_sent", "duration_ms")
        self.logger.info(self.LINE, {k: v if k in numbers else printable(v) for k, v in f.items()})


class JsonAccessLogger(_AccessLogger):
    """One JSON object per response; the logger's handler prints the message bare."""

    def write(self, f: dict[str, Any]) -> None:
        fields = {"ts": _timestamp(time.time()), "type": "access", **f}
        self.logger.info(json.dumps(fields, ensure_ascii=False, separators=(",", ":")))


ACCESS_LOGGERS: dict[str, type[_AccessLogger]] = {"text": TextAccessLogger, "json": JsonAccessLogger}


def access_logger_class(access_log: str, log_format: str) -> type[_AccessLogger]:
    """JSON access lines when asked for, or when every line is JSON; else text."""
    return ACCESS_LOGGERS["json" if "json" in (access_log, log_format) else "text"]


def configure_logging(level: int, access_log: str, log_format: str = "text") -> logging.Logger | None:
    """The root handler in `log_format`, and the access logger (None when off; JSON lines print bare)."""
    handler = logging.StreamHandler()
    text = RequestIdFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(JsonFormatter() if log_format == "json" else text)
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("laya_onnx").setLevel(level)
    log_warnings()
    if access_log == "off":
        return None
    access = logging.getLogger(ACCESS_LOGGER)
    if access_logger_class(access_log, log_format) is JsonAccessLogger:
        json_handler = logging.StreamHandler()
        json_handler.setFormatter(logging.Formatter("%(message)s"))
        access.handlers = [json_handler]
        access.propagate = False
    return access
