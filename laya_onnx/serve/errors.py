"""The one error shape the server answers with: `{"detail": "<string>"}`."""

from __future__ import annotations

from collections.abc import Mapping


class ApiError(Exception):
    """A refusal with an HTTP status and a client-safe `detail` text.

    Raised by validators and handlers; the error middleware renders it. Nothing else is ever
    shown to a client, so a detail must never carry a path, a traceback or a library message
    that was not written to be read by a caller.
    """

    def __init__(self, status: int, detail: str, headers: Mapping[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = dict(headers or {})
        #: The index of the batch item at fault, when one is (`BATCH_ITEM_HEADER`).
        self.item: int | None = None

    def at_item(self, index: int) -> ApiError:
        """This refusal, naming the batch item at fault (a header; the detail stays the same)."""
        self.item = index
        self.headers[BATCH_ITEM_HEADER] = str(index)
        return self


#: The response header naming the index (in `states`) of the batch item a refusal is about. The
#: detail keeps laya-serve's text, which names no item.
BATCH_ITEM_HEADER = "X-Batch-Item"


#: Details shared by both decision routes, written once so the routes cannot drift apart.
BODY_TOO_LARGE = "request body too large"
BODY_TIMEOUT = "request body was not received in time"
BODY_UNDECODABLE = "request body could not be decoded (transfer or content encoding)"
INVALID_JSON = "request body must be valid JSON"
LONE_SURROGATE = "request body contains an unpaired surrogate escape; those cannot be encoded as UTF-8"
BUSY = "server busy, try again later"
UNAUTHORIZED = "invalid or missing bearer token"
INFERENCE_FAILED = "inference failed"
NON_FINITE = "Out of range float values are not JSON compliant"
SHUTTING_DOWN = "server is shutting down, try again later"
HEADERS_TIMEOUT = "request headers were not received in time"
NOT_JSON_FROM_A_PAGE = "a request from a web page must send its body as application/json"
UNSUPPORTED_VERSION = "HTTP version not supported; send HTTP/1.1"
TOO_MANY_CONNECTIONS = "too many open connections, try again later"
