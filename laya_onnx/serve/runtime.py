"""The decision path of the aiohttp app, from the body to the pass: reading, admission, the
request's limits and the single inference worker.

A decision request (past auth) goes through, in order:

  1. **its body**, read before it takes an admission slot, so a client that uploads slowly holds
     a socket and a few bytes of `BodyBuffer` but never a slot the model's callers need. The
     `Transfer-Encoding` and `Content-Encoding` are checked first (501/415), the 2 MiB cap
     applies to the raw and to the decoded bytes (413), the whole read has LAYA_BODY_READ_TIMEOUT
     (408), and a compressed body is inflated off the loop, in bounded steps, only up to the cap;
  2. **admission**: at most LAYA_MAX_CONCURRENT requests from here on; the excess gets 503 +
     Retry-After at once (`Drain.run` then answers or refuses it on shutdown);
  3. **its limits** (`laya_onnx.core.work.CallLimits`): the pass plan's estimated seconds may not
     exceed LAYA_MAX_REQUEST_SECONDS (413 before any pass) and the answer is due within
     LAYA_REQUEST_TIMEOUT of admission (504 otherwise). When the client goes away (aiohttp
     cancels the handler) or the deadline passes, no further pass of the request starts, the
     pass running is cut short (onnxruntime's terminate flag, obeyed between two operators),
     its slot is freed at once, and the worker stays booked (the gate held) only until that
     pass has stopped;
  4. **the worker**: one thread, one pass at a time, first come first served (`InferenceGate`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from laya_onnx.core import settings as table
from laya_onnx.core.work import CallLimits, call_limits
from laya_onnx.serve import contract
from laya_onnx.serve.body import BodyBuffer, content_decoder, transfer_codings_refusal
from laya_onnx.serve.drain import InferenceGate
from laya_onnx.serve.errors import BODY_TIMEOUT, BODY_TOO_LARGE, BODY_UNDECODABLE, BUSY, ApiError
from laya_onnx.serve.keys import INFERENCE_MS, PASS_RESULT, QUEUE_WAIT_MS
from laya_onnx.serve.microbatch import MicroBatcher
from laya_onnx.serve.settings import Settings
from laya_onnx.serve.validate import MAX_BODY_BYTES

log = logging.getLogger("laya_onnx.serve")

WORKER_THREAD_PREFIX = "laya-infer"
DEADLINE_PASSED = "request not answered within %%g s of its admission (%s); no further pass of it runs" % (
    table.REQUEST_TIMEOUT.env
)
#: What the worker is told when the request it runs for is abandoned (the answer is not sent).
ABANDONED = "its client went away or its deadline passed"


@dataclass
class Runtime:
    """Per-run inference machinery; the loop-bound parts are built by the app's startup."""

    max_concurrent: int
    body_buffer: BodyBuffer
    executor: ThreadPoolExecutor | None = None
    gate: InferenceGate | None = None
    admission: asyncio.Semaphore | None = None
    #: Micro-batching of single decisions (LAYA_BATCH_WINDOW_MS); None when off.
    batcher: MicroBatcher | None = None

    def queue_depth(self) -> int:
        """Decision requests waiting for the worker now (0 before startup and after shutdown)."""
        return self.gate.waiting if self.gate is not None else 0


# -- 1. the body ---------------------------------------------------------------------------


async def read_body(request: web.Request, settings: Settings, buffer: BodyBuffer) -> bytes:
    """The decoded body, at most MAX_BODY_BYTES, delivered within the read timeout.

    Content-Length is a hint a client chooses and chunked uploads do not send it, so the stream
    itself is counted, raw and decoded, and abandoned as soon as either passes the cap.
    """
    refusal = transfer_codings_refusal(request.headers.getall("Transfer-Encoding", []))
    if refusal is not None:
        raise refusal
    if contract.declared_too_large(request.headers.get("Content-Length")):
        raise ApiError(413, BODY_TOO_LARGE)
    decoder = content_decoder(request.headers.getall("Content-Encoding", []))
    held = 0

    def hold(n: int) -> None:
        nonlocal held
        buffer.take(n)
        held += n

    async def collect() -> bytes:
        nonlocal held
        chunks: list[bytes] = []
        raw = decoded = 0
        while True:
            chunk = await request.content.readany()
            if not chunk:
                break
            raw += len(chunk)
            contract.check_body_size(raw)
            hold(len(chunk))
            if decoder is not None:
                out = await asyncio.to_thread(decoder.feed, chunk, MAX_BODY_BYTES - decoded)
                buffer.give_back(len(chunk))  # the raw bytes are dropped once decoded
                held -= len(chunk)
                decoded += len(out)
                contract.check_body_size(decoded)
                hold(len(out))
                chunk = out
            chunks.append(chunk)
        if decoder is not None and raw and not decoder.finished():
            raise ApiError(400, BODY_UNDECODABLE)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(collect(), settings.body_read_timeout)
    except asyncio.TimeoutError:
        raise ApiError(408, BODY_TIMEOUT) from None
    except ConnectionResetError:
        # the client went away mid-upload: nobody is left to answer (aiohttp cancels the handler)
        raise asyncio.CancelledError() from None
    finally:
        buffer.give_back(held)


# -- 2. admission and 3. the request's limits ----------------------------------------------


def check_admission(runtime: Runtime) -> None:
    """Refuse (503 + Retry-After: 1) when LAYA_MAX_CONCURRENT requests are already admitted;
    not queued: slots turn over at inference speed and the client can retry elsewhere."""
    if runtime.admission is None or runtime.admission.locked():
        raise ApiError(503, BUSY, {"Retry-After": "1"})


def request_limits(settings: Settings) -> CallLimits:
    """The limits of one admitted request, its deadline counted from now."""
    return CallLimits(
        max_seconds=settings.max_request_seconds,
        max_seconds_setting=table.MAX_REQUEST_SECONDS.env,
        deadline=time.monotonic() + settings.request_timeout,
        deadline_setting=table.REQUEST_TIMEOUT.env,
    )


async def within_deadline(answer: Any, settings: Settings) -> Any:
    """Await `answer` until LAYA_REQUEST_TIMEOUT; then it is cancelled (its limits with it) and
    the client gets a 504 at once."""
    try:
        return await asyncio.wait_for(answer, settings.request_timeout)
    except asyncio.TimeoutError:
        log.info("504: not answered within %gs of admission", settings.request_timeout)
        raise ApiError(504, DEADLINE_PASSED % settings.request_timeout) from None


# -- 4. the worker -------------------------------------------------------------------------


def _run_limited(limits: CallLimits | None, fn: Callable[[], Any]) -> Any:
    with call_limits(limits):
        return fn()


async def on_worker(runtime: Runtime, fn: Callable[[], Any], limits: CallLimits | None = None) -> Any:
    """Run `fn` on the inference worker under `limits` once the gate is free.

    Cancelled while `fn` runs (its client went away, its deadline passed, the drain gave up on
    it): `limits` is cancelled so no further pass of it starts, the caller gets the
    CancelledError at once, and the gate stays held until the worker is really free.
    """
    gate, executor = runtime.gate, runtime.executor
    if gate is None or executor is None:  # made on startup; a request cannot come earlier
        raise RuntimeError("inference requested outside the app's run (no inference gate)")
    await gate.acquire(limits)
    loop = asyncio.get_running_loop()
    try:
        job: Future[Any] = executor.submit(_run_limited, limits, fn)
    except BaseException:
        gate.release()
        raise
    try:
        result = await asyncio.wrap_future(job)
    except asyncio.CancelledError:
        if limits is not None:
            limits.cancel(ABANDONED)
        job.add_done_callback(lambda _: _release_from_worker(loop, gate))
        raise
    except BaseException:
        gate.release()
        raise
    gate.release()
    return result


def _release_from_worker(loop: asyncio.AbstractEventLoop, gate: InferenceGate) -> None:
    try:
        loop.call_soon_threadsafe(gate.release)
    except RuntimeError:  # the loop closed first (shutdown): nothing is left to wait for the gate
        pass


async def infer(request: web.Request, fn: Callable[[], Any], what: str, limits: CallLimits) -> Any:
    """`on_worker` for one request, timed (its wait, its pass), its failures mapped to the
    contract's refusals (`contract.pass_refusal`) here on the loop, where the log line carries
    the request id."""
    runtime = request.app[RUNTIME]
    queued = time.perf_counter()
    started: float | None = None

    def timed() -> Any:
        nonlocal started
        started = time.perf_counter()
        return fn()

    try:
        result = await on_worker(runtime, timed, limits)
    except ApiError:  # the gate's own refusal (a drain), not the pass's
        raise
    except Exception as exc:
        if started is not None:
            request[QUEUE_WAIT_MS] = (started - queued) * 1000.0
        raise contract.pass_refusal(exc, what, request.app[CHECKPOINT].name) from None
    assert started is not None  # the worker ran `timed`
    request[QUEUE_WAIT_MS] = (started - queued) * 1000.0
    request[INFERENCE_MS] = (time.perf_counter() - started) * 1000.0
    request[PASS_RESULT] = result
    return result


async def infer_grouped(
    request: web.Request, batcher: MicroBatcher, decision: contract.OneDecision, limits: CallLimits
) -> Any:
    """`infer` for a single decision through the micro-batcher: the same facts left on the
    request (its wait, its group's pass time, its own result) and the same refusals."""
    queued = time.perf_counter()
    try:
        outcome = await batcher.submit(decision.state, decision.questions, decision.controls, limits)
    except asyncio.CancelledError:
        limits.cancel(ABANDONED)
        raise
    if outcome.error is not None:
        raise contract.pass_refusal(outcome.error, decision.what, request.app[CHECKPOINT].name)
    request[QUEUE_WAIT_MS] = (outcome.started - queued) * 1000.0
    request[INFERENCE_MS] = (outcome.ended - outcome.started) * 1000.0
    request[PASS_RESULT] = outcome.result
    return outcome.result


RUNTIME = web.AppKey("runtime", Runtime)
CHECKPOINT = web.AppKey[contract.ServedCheckpoints]("checkpoint")
