"""Typed request-scoped keys, and the facts `app.infer` leaves on a decision request.

The timing headers (`timing_middleware`), the metrics (`metrics_middleware`) and the bench's
recorder (`laya_onnx.bench.saturate`) read them after the handler returned, so handlers never
call any of those.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web


def request_key(name: str, kind: type) -> Any:
    """A typed `web.RequestKey`; aiohttp < 3.12 has none, and a namespaced string works there."""
    return web.RequestKey(name, kind) if hasattr(web, "RequestKey") else "laya_onnx." + name


#: Milliseconds of the worker's pass (successful passes only).
INFERENCE_MS: Any = request_key("inference_ms", float)
#: Milliseconds the request waited for the inference worker.
QUEUE_WAIT_MS: Any = request_key("queue_wait_ms", float)
#: What the worker returned: one result dict or a list of them.
PASS_RESULT: Any = request_key("pass_result", object)
#: The request's trace id (W3C hex) while the server traces, for its access line.
TRACE_ID: Any = request_key("trace_id", str)
