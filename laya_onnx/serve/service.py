"""One request, with no web framework in it: `DecisionService.handle(call) -> Reply`.

A front end (the aiohttp app, the Ray ingress) hands over a `Call` and writes the `Reply` back;
in between, for both: the request id, the route, the bearer, the body, the decision (a `Decider`),
the refusal, the timing headers and the metrics (docs/http-api.md#refusals-in-order).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from multidict import MultiMapping
from prometheus_client.exposition import choose_encoder

from laya_onnx.core import tracing
from laya_onnx.serve import contract
from laya_onnx.serve.body import BodyBuffer, check_page, read_body
from laya_onnx.serve.contract import Reply, render
from laya_onnx.serve.errors import BUSY, TOO_MANY_CONNECTIONS, UNAUTHORIZED, ApiError
from laya_onnx.serve.logs import REQUEST_ID_HEADER, accept_request_id, current_request_id
from laya_onnx.serve.metrics import CLIENT_GONE, UNMATCHED, Metrics
from laya_onnx.serve.openapi import docs_html, index_payload, openapi_json
from laya_onnx.serve.settings import Settings

log = logging.getLogger("laya_onnx.serve")


@dataclass
class Call:
    """One request as a front end hands it over."""

    method: str
    #: The path as the client sent it, percent-decoded, without the query.
    path: str
    #: Every header instance, as aiohttp reads them (UTF-8 with surrogateescape).
    headers: MultiMapping[str]
    #: The body, chunk by chunk; read only by a route that needs it, after auth.
    body: AsyncIterator[bytes]
    query: str = ""
    #: A prefix the front end already took off `path` (Ray's route_prefix), kept in redirects.
    mounted_at: str = ""
    #: Set by `handle`: the request's id (for a front end's own log line about it).
    request_id: str = ""
    #: Set by `handle` while the server traces: the request's trace id (for its access line).
    trace_id: str | None = None
    #: The connection was opened past the server's connection cap: only the health routes answer.
    health_only: bool = False


class Decider(Protocol):
    """Where the decisions are made: in-process (`contract.LocalDecider`) or on a Ray replica."""

    @property
    def draining(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    def refuse_draining(self) -> ApiError: ...

    async def decide(self, route: str, raw: bytes) -> Reply: ...

    async def health(self, full: bool) -> tuple[int, Any]: ...

    async def models(self, full: bool) -> Any: ...


class DecisionService:
    """Routing, auth, body, decision, answer: the pipeline both front ends run (module docstring)."""

    def __init__(self, decider: Decider, settings: Settings, metrics: Metrics, docs: bool = True):
        self.decider = decider
        self.settings = settings
        self.metrics = metrics
        self.body_buffer = BodyBuffer(settings.body_buffer)
        #: Every route's handler by (method, path); `/openapi.json` and `/docs` only without an API key.
        self.routes: dict[tuple[str, str], Callable[[Call], Awaitable[Reply]]] = {
            ("GET", "/"): self._index,
            ("GET", "/health"): self._health,
            ("GET", "/health/live"): self._live,
            ("GET", "/health/ready"): self._ready,
            ("POST", "/v1/systemone"): self._decide,
            ("POST", "/v1/systemone/batch"): self._decide,
            ("GET", "/v1/models"): self._models,
            ("GET", "/metrics"): self._metrics,
        }
        if settings.api_key is None and docs:
            self.routes.update({("GET", "/openapi.json"): self._openapi, ("GET", "/docs"): self._docs})
        self.paths = {p for _, p in self.routes}

    async def handle(self, call: Call) -> Reply:
        request_id = call.request_id = accept_request_id(call.headers.get(REQUEST_ID_HEADER))
        # while the server traces: a span per request, continuing its caller's `traceparent`
        with tracing.request_span(call.method, call.headers, {"laya.request_id": request_id}) as span:
            if span is not None:
                call.trace_id = format(span.get_span_context().trace_id, "032x")
            token = current_request_id.set(request_id)
            began = time.perf_counter()
            label, status, busy = UNMATCHED, 500, False
            try:
                try:
                    handler, label = self.match(call)
                    if call.health_only and not label.startswith("/health"):
                        raise ApiError(503, TOO_MANY_CONNECTIONS, {"Retry-After": "1"})
                    with self.metrics.in_flight.labels(label).track_inprogress():
                        reply = await handler(call)
                except ApiError as exc:
                    busy = exc.status == 503 and exc.detail == BUSY
                    reply = self.refusal(exc)
                except asyncio.CancelledError:
                    status = CLIENT_GONE
                    raise
                except Exception:
                    log.exception("unhandled error on %s %s", call.method, call.path)
                    reply = self.refusal(ApiError(500, "Internal Server Error"))
                status = reply.status
            finally:
                self.metrics.answered(label, call.method, status, time.perf_counter() - began, busy)
                current_request_id.reset(token)
            reply.headers[REQUEST_ID_HEADER] = request_id
            if reply.inference_ms is not None and reply.status == 200:
                self.metrics.inference.labels(label).observe(reply.inference_ms / 1000.0)
                self.metrics.worked(*(reply.work or (0, 0)))
                reply.headers["Server-Timing"] = "inference;dur=%.2f" % reply.inference_ms
                reply.headers["X-Inference-Time-Ms"] = "%.2f" % reply.inference_ms
                if reply.served is not None:
                    self.metrics.per_request(reply.served, *(reply.work or (0, 0)))
            if self.decider.draining or call.health_only:
                reply.close = True
            tracing.answered(span, call.method, label, reply.status)
            return reply

    def match(self, call: Call) -> tuple[Callable[[Call], Awaitable[Reply]], str]:
        """(handler, route template) of `call`, or the 404/405/307 refusal."""
        method = "GET" if call.method == "HEAD" else call.method
        path = self._unprefixed(call.path)
        handler = self.routes.get((method, path))
        if handler is not None:
            return handler, path
        allowed = sorted(m for (m, p) in self.routes if p == path)
        if allowed:
            raise ApiError(405, "Method Not Allowed", {"Allow": ", ".join(allowed)})
        stripped = call.path.rstrip("/")
        if stripped != call.path and stripped and self._unprefixed(stripped) in self.paths:
            location = call.mounted_at + stripped + ("?" + call.query if call.query else "")
            raise ApiError(307, "Temporary Redirect", {"Location": location})
        raise ApiError(404, "Not Found")

    def _unprefixed(self, path: str) -> str:
        """`path` under LAYA_ROOT_PATH as the route it answers as (`/laya/health` -> `/health`,
        `/laya` -> `/`); a path that is a route of its own stays itself."""
        root = self.settings.root_path
        if root and path not in self.paths and (path == root or path.startswith(root + "/")):
            rest = path[len(root) :]
            return path if rest == "/" else rest or "/"
        return path

    def authorized(self, call: Call) -> bool:
        """Exactly one `Authorization: Bearer <key>`, or no key set; compared in constant time as
        the wire's bytes, so an undecodable header is a 401, not an exception."""
        key = self.settings.api_key
        if key is None:
            return True
        sent = call.headers.getall("Authorization", [])
        if len(sent) != 1:
            return False
        supplied = sent[0].encode("utf-8", "surrogateescape")
        return hmac.compare_digest(supplied, ("Bearer " + key).encode("utf-8", "surrogateescape"))

    async def _decide(self, call: Call) -> Reply:
        """`POST /v1/systemone` and `/v1/systemone/batch`: the bearer, a page's body type, the body,
        then the decider's decision (refused once the server is draining)."""
        if not self.authorized(call):
            raise ApiError(401, UNAUTHORIZED)
        check_page(call.headers)
        decider = self.decider
        if decider.draining:
            raise decider.refuse_draining()
        raw = await read_body(call.headers, call.body, self.settings.body_read_timeout, self.body_buffer)
        if decider.draining:
            raise decider.refuse_draining()
        return await decider.decide(self._unprefixed(call.path), raw)

    def refusal(self, exc: ApiError) -> Reply:
        """A refusal in the wire profile (laya-serve's `{"detail": ...}` or Jev's shapes)."""
        body = contract.error_body(self.settings, exc.status, exc.detail, getattr(exc, "errors", None))
        return Reply(exc.status, render(body), dict(exc.headers))

    async def _index(self, call: Call) -> Reply:
        """`GET /`: the routes this server answers (never 401)."""
        public = self.settings.api_key is None
        docs = public and ("GET", "/docs") in self.routes
        root = call.mounted_at or self.settings.root_path
        return Reply(200, render(index_payload(list(self.routes), root, public=public, docs=docs)))

    async def _health(self, call: Call) -> Reply:
        """laya-serve's `/health`: liveness for anyone, the full payload with the bearer (or no key)."""
        status, payload = await self.decider.health(self.authorized(call))
        return Reply(status, render(payload))

    async def _live(self, call: Call, ok: str = "ok") -> Reply:
        """Alive unless a restart is the remedy: a checkpoint whose device keeps failing passes
        (503 `unhealthy`). Draining or warming up is not a reason to restart."""
        status, payload = await self.decider.health(False)
        return Reply(status, render({"status": ok if status == 200 else payload["status"]}))

    async def _ready(self, call: Call) -> Reply:
        """Ready for decisions: warmed up, healthy, and not draining; 503 otherwise."""
        if self.decider.draining:
            return Reply(503, render({"status": "draining"}))
        if not self.decider.ready:
            return Reply(503, render({"status": "warming up"}))
        return await self._live(call, "ready")

    async def _models(self, call: Call) -> Reply:
        return Reply(200, render(await self.decider.models(self.authorized(call))))

    async def _metrics(self, call: Call) -> Reply:
        if not self.authorized(call):
            raise ApiError(401, UNAUTHORIZED)
        encoder, content_type = choose_encoder(call.headers.get("Accept") or "")  # negotiated by Accept
        return Reply(200, encoder(self.metrics.registry), content_type=content_type)

    async def _openapi(self, call: Call) -> Reply:
        s = self.settings
        return Reply(200, openapi_json(s.root_path, s.jev, s.max_token_budget))

    async def _docs(self, call: Call) -> Reply:
        html = docs_html(self.settings.jev).encode("utf-8")
        return Reply(200, html, content_type="text/html; charset=utf-8")
