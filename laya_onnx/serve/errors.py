"""A refusal (`ApiError`) and the texts more than one module refuses with (`contract.error_body`)."""

from __future__ import annotations

from collections.abc import Mapping

#: Details shared by both decision routes, written once so the routes cannot drift apart.
BODY_TOO_LARGE = "request body too large"
BODY_TIMEOUT = "request body was not received in time"
BODY_UNDECODABLE = "request body could not be decoded (transfer or content encoding)"
INVALID_JSON = "request body must be valid JSON"
LONE_SURROGATE = "request body contains an unpaired surrogate escape; those cannot be encoded as UTF-8"
BUSY = "server busy, try again later"
UNAUTHORIZED = "invalid or missing bearer token"
INFERENCE_FAILED = "inference failed"
SHUTTING_DOWN = "server is shutting down, try again later"
NOT_JSON_FROM_A_PAGE = "a request from a web page must send its body as application/json"
TOO_MANY_CONNECTIONS = "too many open connections, try again later"


class ApiError(Exception):
    """A refusal: an HTTP status, headers, and a `detail` written for the caller. Nothing else
    reaches a client, so a detail never carries a path, a traceback or a library's message."""

    def __init__(self, status: int, detail: str, headers: Mapping[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = dict(headers or {})
        #: The index of the batch item at fault, when one is.
        self.item: int | None = None

    def at_item(self, index: int) -> ApiError:
        """This refusal, naming the batch item at fault in `X-Batch-Item` (the detail stays)."""
        self.item = index
        self.headers["X-Batch-Item"] = str(index)
        return self
