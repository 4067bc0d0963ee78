"""What `app.handle` leaves on an aiohttp request for the access line and the bench's recorder."""

from __future__ import annotations

from typing import Any

from aiohttp import web


def request_key(name: str, kind: type) -> Any:
    """A typed `web.RequestKey`; aiohttp < 3.12 has none, and a namespaced string works there."""
    return web.RequestKey(name, kind) if hasattr(web, "RequestKey") else "laya_onnx." + name


#: Milliseconds of the worker's pass, and of the wait for it (successful passes only).
INFERENCE_MS: Any = request_key("inference_ms", float)
QUEUE_WAIT_MS: Any = request_key("queue_wait_ms", float)
#: The request's trace id (W3C hex) while the server traces, for its access line.
TRACE_ID: Any = request_key("trace_id", str)
#: How the answer's write ended (`logs.WHOLE` when absent).
ENDED: Any = request_key("ended", str)
