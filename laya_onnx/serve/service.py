"""One request, with no web framework in it: `DecisionService.handle(call) -> Reply`.

A front end (the aiohttp app, the Ray Serve ingress) turns its framework's request into a `Call`
(method, path, headers, a stream of body chunks) and writes the `Reply` back (status, headers,
body bytes, whether the connection must close). Everything in between happens here, in this
order, for both front ends:

  1. **the request id** (`X-Request-Id`: the caller's when plausible, else a new one), set for
     every log line written on the request's behalf;
  2. **routing**: the route table, under LAYA_ROOT_PATH too; a trailing slash is a 307 to the
     route, a known path with another method a 405 with `Allow`, anything else a 404;
  3. **auth**: the decision routes and `/metrics` need `Authorization: Bearer <key>` when a key
     is set, checked before a byte of the body is read;
  4. **the body** (`body.read_body`): Transfer-Encoding (501), Content-Encoding (415), the 2 MiB
     cap on the raw and the decoded bytes (413), decoding in bounded steps off the loop, the
     read timeout (408), the bytes all bodies being read may hold at once (503);
  5. **the decision** (`Decider.decide`): admission, the request's deadline and estimated
     seconds, the checks of the contract in their order, the pass on the inference worker, the
     answer shaped for the wire profile. The aiohttp app decides in-process (`LocalDecider`);
     the Ray ingress hands the body to a model replica, which runs the same `LocalDecider`;
  6. **the answer**: a refusal rendered in the wire profile (`{"detail": ...}` or Jev's shapes),
     the timing headers on a successful decision, the metrics counted, and the connection
     marked for closing while the server drains or when the body was left unread.

docs/http-api.md describes the contract, route by route.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from multidict import MultiMapping

from laya_onnx.core import settings as table
from laya_onnx.core import tracing
from laya_onnx.core.work import CallLimits, call_limits
from laya_onnx.serve import contract
from laya_onnx.serve.body import BodyBuffer, page_refusal, read_body
from laya_onnx.serve.contract import render
from laya_onnx.serve.drain import Drain, WorkerLock
from laya_onnx.serve.errors import BUSY, TOO_MANY_CONNECTIONS, UNAUTHORIZED, ApiError
from laya_onnx.serve.logs import REQUEST_ID_HEADER, accept_request_id, current_request_id
from laya_onnx.serve.metrics import CLIENT_GONE, UNMATCHED, Answered, RequestMetrics, work_done
from laya_onnx.serve.microbatch import MicroBatcher
from laya_onnx.serve.openapi import docs_html, index_payload, openapi_json
from laya_onnx.serve.rss import MemoryKeeper
from laya_onnx.serve.served import Served
from laya_onnx.serve.settings import Settings

log = logging.getLogger("laya_onnx.serve")

#: (method, path, name) of every route; `/openapi.json` and `/docs` only without an API key.
ROUTES: tuple[tuple[str, str, str], ...] = (
    ("GET", "/", "index"),
    ("GET", "/health", "health"),
    ("GET", "/health/live", "live"),
    ("GET", "/health/ready", "ready"),
    ("POST", "/v1/systemone", "systemone"),
    ("POST", "/v1/systemone/batch", "systemone_batch"),
    ("GET", "/v1/models", "models"),
    ("GET", "/metrics", "metrics"),
)
DOC_ROUTES: tuple[tuple[str, str, str], ...] = (
    ("GET", "/openapi.json", "openapi"),
    ("GET", "/docs", "docs"),
)
DECISION_ROUTES = frozenset({"systemone", "systemone_batch"})
HEALTH_ROUTES = frozenset({"health", "live", "ready"})
#: A decision route's template by its name (the metrics' label).
ROUTE_PATHS = {"systemone": "/v1/systemone", "systemone_batch": "/v1/systemone/batch"}
JSON = "application/json"


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


@dataclass
class Reply:
    """What the front end writes back."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = JSON
    #: The route's template for the metrics (`UNMATCHED` for no route).
    route: str = UNMATCHED
    #: The connection must close after this answer (draining, or the body was left unread).
    close: bool = False
    #: Of a successful decision: the pass's milliseconds, the wait for the worker, its result.
    inference_ms: float | None = None
    queue_ms: float | None = None
    result: Any = None
    work: tuple[int, int] | None = None
    #: Of a successful decision: what the per-request metrics count it under.
    served: Answered | None = None


@dataclass
class Decided:
    """A decision's answer as a `Decider` gives it: the rendered payload and its facts."""

    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    inference_ms: float | None = None
    queue_ms: float | None = None
    result: Any = None
    status: int = 200
    #: (question rows, input tokens) the pass answered, for the metrics.
    work: tuple[int, int] | None = None
    served: Answered | None = None


class Decider(Protocol):
    """Where the decisions are made: in-process (`LocalDecider`) or on a Ray model replica."""

    @property
    def draining(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    body_buffer: BodyBuffer | None

    def refuse_draining(self) -> ApiError: ...

    async def decide(self, route: str, raw: bytes) -> Decided: ...

    async def health(self, full: bool) -> tuple[int, Any]: ...

    async def models(self, full: bool) -> Any: ...


class DecisionService:
    """Routing, auth, body, decision, answer: the pipeline both front ends run (module docstring)."""

    def __init__(self, decider: Decider, settings: Settings, metrics: RequestMetrics, docs: bool = True):
        self.decider = decider
        self.settings = settings
        self.metrics = metrics
        routes = ROUTES + (DOC_ROUTES if settings.api_key is None and docs else ())
        self.routes: dict[tuple[str, str], str] = {(m, p): n for m, p, n in routes}
        self.paths = {p for _, p, _ in routes}
        #: The route handlers by name; a decision route reads the body.
        self._handlers: dict[str, Callable[[Call], Awaitable[Reply]]] = {
            "index": self._index,
            "health": self._health,
            "live": self._live,
            "ready": self._ready,
            "models": self._models,
            "metrics": self._metrics,
            "openapi": self._openapi,
            "docs": self._docs,
        }

    # -- the pipeline ----------------------------------------------------------------------

    async def handle(self, call: Call) -> Reply:
        request_id = call.request_id = accept_request_id(call.headers.get(REQUEST_ID_HEADER))
        # while the server traces: a span per request, continuing its caller's `traceparent`
        with tracing.request_span(call.method, call.headers, {"laya.request_id": request_id}) as span:
            if span is not None:
                call.trace_id = format(span.get_span_context().trace_id, "032x")
            reply = await self._handle(call, request_id)
            tracing.answered(span, call.method, reply.route, reply.status)
        return reply

    async def _handle(self, call: Call, request_id: str) -> Reply:
        token = current_request_id.set(request_id)
        began = time.perf_counter()
        label, status, busy = UNMATCHED, 500, False
        try:
            try:
                name, path = self.match(call)
                label = path
                with self.metrics.in_flight.labels(label).track_inprogress():
                    reply = await self._route(name, call)
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
        reply.route = label
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
        return reply

    def match(self, call: Call) -> tuple[str, str]:
        """(route name, route template) of `call`, or the 404/405/307 refusal."""
        method = "GET" if call.method == "HEAD" else call.method
        path = self._unprefixed(call.path)
        name = self.routes.get((method, path))
        if name is not None:
            return name, path
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
        """Exactly one `Authorization: Bearer <key>` (`contract.authorized`); True without a key."""
        return contract.authorized(self.settings, call.headers.getall("Authorization", []))

    async def _route(self, name: str, call: Call) -> Reply:
        if call.health_only and name not in HEALTH_ROUTES:
            raise ApiError(503, TOO_MANY_CONNECTIONS, {"Retry-After": "1"})
        if name not in DECISION_ROUTES:
            return await self._handlers[name](call)
        if not self.authorized(call):
            raise ApiError(401, UNAUTHORIZED)
        refusal = page_refusal(call.headers)
        if refusal is not None:
            raise refusal
        decider = self.decider
        if decider.draining:
            raise decider.refuse_draining()
        raw = await read_body(call.headers, call.body, self.settings.body_read_timeout, decider.body_buffer)
        if decider.draining:
            raise decider.refuse_draining()
        decided = await decider.decide(name, raw)
        return Reply(
            decided.status,
            decided.body,
            dict(decided.headers),
            inference_ms=decided.inference_ms,
            queue_ms=decided.queue_ms,
            result=decided.result,
            work=decided.work,
            served=decided.served,
        )

    def refusal(self, exc: ApiError) -> Reply:
        """A refusal in the wire profile (laya-serve's `{"detail": ...}` or Jev's shapes)."""
        return Reply(exc.status, render(contract.api_error_body(self.settings, exc)), dict(exc.headers))

    # -- the other routes ------------------------------------------------------------------

    async def _index(self, call: Call) -> Reply:
        """`GET /`: the routes this server answers (never 401)."""
        settings = self.settings
        routes = [(m, p) for (m, p) in self.routes]
        public = settings.api_key is None
        docs = public and ("GET", "/docs") in self.routes
        root = call.mounted_at or settings.root_path
        return Reply(200, render(index_payload(routes, root, public=public, docs=docs)))

    async def _health(self, call: Call) -> Reply:
        """laya-serve's `/health`: liveness for anyone, the full payload with the bearer (or no key)."""
        status, payload = await self.decider.health(self.authorized(call))
        return Reply(status, render(payload))

    async def _live(self, call: Call) -> Reply:
        """Alive unless a restart is the remedy: a checkpoint whose device keeps failing passes
        (503 `unhealthy`). Draining or warming up is not a reason to restart."""
        status, payload = await self.decider.health(False)
        return Reply(status, render({"status": "ok" if status == 200 else payload["status"]}))

    async def _ready(self, call: Call) -> Reply:
        """Ready for decisions: warmed up, healthy, and not draining; 503 otherwise."""
        decider = self.decider
        if decider.draining:
            return Reply(503, render({"status": "draining"}))
        if not decider.ready:
            return Reply(503, render({"status": "warming up"}))
        status, payload = await decider.health(False)
        return Reply(status, render({"status": "ready" if status == 200 else payload["status"]}))

    async def _models(self, call: Call) -> Reply:
        return Reply(200, render(await self.decider.models(self.authorized(call))))

    async def _metrics(self, call: Call) -> Reply:
        if not self.authorized(call):
            raise ApiError(401, UNAUTHORIZED)
        body, content_type = self.metrics.exposition(call.headers.get("Accept"))
        return Reply(200, body, content_type=content_type)

    async def _openapi(self, call: Call) -> Reply:
        s = self.settings
        return Reply(200, openapi_json(s.root_path, s.jev, s.max_token_budget))

    async def _docs(self, call: Call) -> Reply:
        return Reply(
            200, docs_html(self.settings.jev).encode("utf-8"), content_type="text/html; charset=utf-8"
        )


# -- the in-process decider ------------------------------------------------------------------

WORKER_THREAD_PREFIX = "laya-infer"
DEADLINE_PASSED = "request not answered within %%g s of its admission (%s); no further pass of it runs" % (
    table.REQUEST_TIMEOUT.env
)
#: What the worker is told when the request it runs for is abandoned (the answer is not sent).
ABANDONED = "its client went away or its deadline passed"


class LocalDecider:
    """Decisions in this process: admission, the request's limits, one inference worker.

    After its body, a decision request goes through, in order:

      1. **admission**: at most LAYA_MAX_CONCURRENT requests from here on; the excess gets 503 +
         Retry-After at once (a drain answers or refuses the admitted ones);
      2. **its limits** (`laya_onnx.core.work.CallLimits`): the pass plan's estimated seconds may
         not exceed LAYA_MAX_REQUEST_SECONDS (413 before any pass) and the answer is due within
         LAYA_REQUEST_TIMEOUT of admission (504). When the client goes away or the deadline
         passes, no further pass starts, the running one is cut short between two operators,
         the slot is freed at once and the worker stays booked only until that pass stopped;
      3. **the contract's checks** (`contract.parse_systemone` / `parse_batch`), in order;
      4. **the worker**: one thread, one pass at a time, first come first served (`WorkerLock`),
         or a micro-batch of single decisions (LAYA_BATCH_WINDOW_MS);
      5. **the answer**, shaped for the wire profile and rendered.

    `start()` and `stop()` bind it to the serving loop (the front end's lifecycle calls them).
    """

    def __init__(self, served: Served, settings: Settings):
        self.served = served
        self.settings = settings
        self.body_buffer: BodyBuffer | None = BodyBuffer(settings.body_buffer)
        self.drain = Drain()
        self.memory = MemoryKeeper()
        self.executor: ThreadPoolExecutor | None = None
        self.lock: WorkerLock | None = None
        self.admission: asyncio.Semaphore | None = None
        self.batcher: MicroBatcher | None = None
        self._ready = False
        self._tasks: list[asyncio.Task[Any]] = []
        #: Told (route template, milliseconds) how long each decision waited for the worker.
        self.on_wait: Callable[[str, float], None] = lambda route, ms: None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=WORKER_THREAD_PREFIX)
        self.lock = WorkerLock(self.drain)
        self.drain.bind(self.lock)
        self.admission = asyncio.Semaphore(self.settings.max_concurrent)
        self.memory.start()
        settings = self.settings
        if settings.batch_window_ms > 0:
            self.batcher = MicroBatcher(
                self.served.agent,
                settings.batch_window_ms / 1000.0,
                self.on_worker,
                configured_group=settings.tournament_group,
                max_group=settings.batch_max_requests,
            )
        self._tasks.append(asyncio.create_task(self._warm_up()))
        idle = self.served.idle
        if idle is not None:
            self._tasks.append(asyncio.create_task(idle.reap(self._busy, self._run_on_worker)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        executor, self.executor = self.executor, None
        self.admission = None
        self.batcher = None
        if executor is not None:
            # A pass already on the worker finishes; queued ones are dropped. Off the loop so it
            # keeps turning meanwhile. A pass the drain gave up on is not waited for.
            await asyncio.to_thread(executor.shutdown, wait=not self.drain.abandoned, cancel_futures=True)

    async def _warm_up(self) -> None:
        """The speed probe and one pass per length bucket, on the worker; ready afterwards."""
        try:
            await self._run_on_worker(self.served.warm_up)
        except Exception:  # a failed warm-up leaves the first requests slower, nothing worse
            log.exception("warm-up failed")
        self._ready = True

    def _busy(self) -> bool:
        return self.lock is not None and (self.lock.busy or self.lock.waiting > 0)

    def _run_on_worker(self, fn: Callable[[], Any]) -> Any:
        return asyncio.get_running_loop().run_in_executor(self.executor, fn)

    # -- what the edge asks --------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self.drain.draining

    @property
    def ready(self) -> bool:
        return self._ready and not self.drain.draining

    def queue_depth(self) -> int:
        """Decision requests waiting for the worker now (0 before startup and after shutdown)."""
        return self.lock.waiting if self.lock is not None else 0

    def refuse_draining(self) -> ApiError:
        """A decision request that arrives once the server is draining: 503, Retry-After."""
        refused = self.drain.refuse("arrived after the drain began")
        log.info("503 while draining: %s", refused.reason)
        return refused

    async def health(self, full: bool) -> tuple[int, Any]:
        return self.served.health(full)

    async def models(self, full: bool) -> Any:
        return self.served.listing(full)

    async def decide(self, route: str, raw: bytes) -> Decided:
        try:
            if self.admission is None or self.admission.locked():
                # not queued: slots turn over at inference speed and the client can retry elsewhere
                raise ApiError(503, BUSY, {"Retry-After": "1"})
            async with self.admission:
                return await self.drain.run(self._within_deadline(self._answer(route, raw)))
        finally:
            # once this request's body and parsed objects are gone (the next turn of the loop)
            asyncio.get_running_loop().call_soon(self.memory.after_request)

    async def _within_deadline(self, answer: Awaitable[Decided]) -> Decided:
        timeout = self.settings.request_timeout
        try:
            return await asyncio.wait_for(answer, timeout)
        except asyncio.TimeoutError:
            log.info("504: not answered within %gs of admission", timeout)
            raise ApiError(504, DEADLINE_PASSED % timeout) from None

    async def _answer(self, route: str, raw: bytes) -> Decided:
        served, settings = self.served, self.settings
        limits = CallLimits(
            max_seconds=settings.max_request_seconds,
            max_seconds_setting=table.MAX_REQUEST_SECONDS.env,
            deadline=time.monotonic() + settings.request_timeout,
            deadline_setting=table.REQUEST_TIMEOUT.env,
        )
        served.mark()  # admitted: the idle window restarts
        parse = contract.parse_systemone if route == "systemone" else contract.parse_batch
        decision = parse(raw, served.agent, served, settings)
        del raw
        queued = time.perf_counter()
        if self.batcher is not None and isinstance(decision, contract.OneDecision):
            try:
                outcome = await self.batcher.submit(
                    decision.state, decision.questions, decision.controls, limits
                )
            except asyncio.CancelledError:
                limits.cancel(ABANDONED)
                raise
            if outcome.error is not None:
                raise contract.pass_refusal(outcome.error, decision.what, served.name)
            self.on_wait(ROUTE_PATHS[route], (outcome.started - queued) * 1000.0)
            result, started, ended = outcome.result, outcome.started, outcome.ended
            group = outcome.group_size
            tracing.record("laya.queue", queued, started, {"laya.microbatch.size": group})
        else:
            result, started, ended = await self._infer(
                partial(decision.run, served.agent, settings), decision, limits, route
            )
            group = 1
        body = contract.render_payload(
            partial(decision.payload, result, served, settings),
            decision.what,
            served.name,
        )
        return Decided(
            body,
            contract.answer_headers(decision, result, served),
            inference_ms=(ended - started) * 1000.0,
            queue_ms=(started - queued) * 1000.0,
            result=result,
            work=work_done(result),
            served=Answered(contract.metrics_checkpoint(result, served), limits.passes, group),
        )

    async def _infer(
        self, fn: Callable[[], Any], decision: Any, limits: CallLimits, route: str
    ) -> tuple[Any, float, float]:
        """`fn` on the worker, timed; its failures as the contract's refusals, here on the loop
        (where the log line carries the request id)."""
        queued, started = time.perf_counter(), None

        def timed() -> Any:
            nonlocal started
            started = time.perf_counter()
            return fn()

        try:
            result = await self.on_worker(timed, limits)
        except ApiError:  # the worker lock's own refusal (a drain), not the pass's
            raise
        except Exception as exc:
            if started is not None:
                self.on_wait(ROUTE_PATHS[route], (started - queued) * 1000.0)
                tracing.record("laya.queue", queued, started)
            raise contract.pass_refusal(exc, decision.what, self.served.name) from None
        assert started is not None  # the worker ran `timed`
        self.on_wait(ROUTE_PATHS[route], (started - queued) * 1000.0)
        tracing.record("laya.queue", queued, started)
        return result, started, time.perf_counter()

    async def on_worker(self, fn: Callable[[], Any], limits: CallLimits | None = None) -> Any:
        """Run `fn` on the inference worker under `limits` once the worker is free.

        Cancelled while `fn` runs (its client went away, its deadline passed, the drain gave up
        on it): `limits` is cancelled so no further pass of it starts, the caller gets the
        CancelledError at once, and the lock stays held until the worker is really free.
        """
        lock, executor = self.lock, self.executor
        if lock is None or executor is None:  # made on startup; a request cannot come earlier
            raise RuntimeError("inference requested outside the server's run (no worker)")
        await lock.acquire(limits)
        loop = asyncio.get_running_loop()
        try:
            # in this request's context: the pass's spans are its children, its log lines its id
            job: Future[Any] = executor.submit(tracing.in_current_context(partial(_run_limited, limits, fn)))
        except BaseException:
            lock.release()
            raise
        try:
            result = await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            if limits is not None:
                limits.cancel(ABANDONED)
            job.add_done_callback(lambda _: _release_from_worker(loop, lock))
            raise
        except BaseException:
            lock.release()
            raise
        lock.release()
        return result


def _run_limited(limits: CallLimits | None, fn: Callable[[], Any]) -> Any:
    with call_limits(limits):
        return fn()


def _release_from_worker(loop: asyncio.AbstractEventLoop, lock: WorkerLock) -> None:
    try:
        loop.call_soon_threadsafe(lock.release)
    except RuntimeError:  # the loop closed first (shutdown): nothing is left to wait for the lock
        pass
