"""One decision, top-down, with no web framework in it: `LocalDecider` (admission, the deadline,
the checks of `validate.py`, the pass on the inference worker), then its answer or refusal shaped
and rendered in the wire profile (docs/http-api.md#answers, docs/http-api.md#the-jev-profile)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from laya_onnx.core import settings as table
from laya_onnx.core import tournament, tracing
from laya_onnx.core.errors import LayaInputError, PassTooLarge
from laya_onnx.core.grouping import Outcome
from laya_onnx.core.hooks import aggregate_usage
from laya_onnx.core.work import CallLimits, CallStopped, CallTooLarge, call_limits
from laya_onnx.serve import schema
from laya_onnx.serve import validate as v
from laya_onnx.serve.errors import BUSY, INFERENCE_FAILED, ApiError
from laya_onnx.serve.metrics import Answered, work_done
from laya_onnx.serve.served import Served
from laya_onnx.serve.settings import Settings
from laya_onnx.serve.worker import Drain, MemoryKeeper, MicroBatcher, WorkerLock

log = logging.getLogger("laya_onnx.serve")

#: What the worker is told when the request it runs for is abandoned (the answer is not sent).
ABANDONED = "its client went away or its deadline passed"
#: The Jev contract's keys per answer type, of `usage` and of a result (docs/http-api.md#the-jev-profile).
JEV_KEYS = {
    "choice": tuple(schema.JevChoiceAnswer.model_fields),
    "score": tuple(schema.JevScoreAnswer.model_fields),
    "noul": tuple(schema.JevNoulAnswer.model_fields),
}
USAGE_KEYS = tuple(schema.Tokens.model_fields)
ROOT_KEYS = tuple(k for k in schema.JevSystemOneResponse.model_fields if not k.startswith("x_"))
#: What `LAYA_JEV_STRICT` keeps (docs/http-api.md#strict-projection): a score's `legend` last.
STRICT_KEYS = {kind: tuple(sorted(keys, key=lambda k: k == "legend")) for kind, keys in JEV_KEYS.items()}
#: The Jev profile's `error_type` by status (docs/http-api.md#the-jev-profile).
ERROR_TYPES = {
    401: "authentication_error",
    403: "authentication_error",
    404: "not_found",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "overloaded_error",
    504: "timeout_error",
}


@dataclass
class Reply:
    """What a front end writes back: an answer or a refusal, and its facts for the metrics."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    close: bool = False  # the connection closes after this answer (draining, or a body left unread)
    # of a successful decision: the pass's and the wait's ms, its (rows, input tokens), its metrics
    inference_ms: float | None = None
    queue_ms: float | None = None
    work: tuple[int, int] | None = None
    served: Answered | None = None


class LocalDecider:
    """Decisions in this process (docs/http-api.md#concurrency); `start()` binds it to the loop."""

    def __init__(self, served: Served, settings: Settings):
        self.served = served
        self.settings = settings
        self.drain = Drain()
        self.memory = MemoryKeeper()
        self.executor: ThreadPoolExecutor | None = None
        self.admission: asyncio.Semaphore | None = None
        self.batcher: MicroBatcher | None = None
        self._ready = False
        self._tasks: list[asyncio.Task[Any]] = []
        #: Told (route template, milliseconds) how long each decision waited for the worker.
        self.on_wait: Callable[[str, float], None] = lambda route, ms: None

    async def decide(self, route: str, raw: bytes) -> Reply:
        """One decision: 503 past LAYA_MAX_CONCURRENT (never queued), 504 past its deadline."""
        timeout = self.settings.request_timeout
        try:
            if self.admission is None or self.admission.locked():
                raise ApiError(503, BUSY, {"Retry-After": "1"})
            async with self.admission:
                return await self.drain.run(asyncio.wait_for(self._answer(route, raw), timeout))
        except asyncio.TimeoutError:
            log.info("504: not answered within %gs of admission", timeout)
            detail = "request not answered within %g s of its admission (%s); no further pass of it runs"
            raise ApiError(504, detail % (timeout, table.REQUEST_TIMEOUT.env)) from None
        finally:
            # once this request's body and parsed objects are gone (the next turn of the loop)
            asyncio.get_running_loop().call_soon(self.memory.after_request)

    async def _answer(self, route: str, raw: bytes) -> Reply:
        served, settings = self.served, self.settings
        limits = CallLimits(
            max_seconds=settings.max_request_seconds,
            max_seconds_setting=table.MAX_REQUEST_SECONDS.env,
            deadline=time.monotonic() + settings.request_timeout,
            deadline_setting=table.REQUEST_TIMEOUT.env,
        )
        served.mark()  # admitted: the idle window restarts
        batch = route != "/v1/systemone"
        what = "batch inference" if batch else "inference"
        # the checks in order (docs/http-api.md#refusals-in-order): the first failing one is raised
        body, controls, fallback, unknown = v.check(raw, served, settings, batch)
        del raw
        batcher = None if batch else self.batcher
        queued = time.perf_counter()
        try:
            if batcher is not None:
                outcome = await batcher.submit(body["state"], body["questions"], controls, limits)
            else:
                plan = tournament.predict_batch_as_planned if batch else tournament.predict_as_planned
                states = body["states"] if batch else body["state"]
                run = partial(plan, served, states, body["questions"], settings.tournament_group, **controls)
                outcome = await self.on_worker(partial(_timed, run), limits)
        except asyncio.CancelledError:
            limits.cancel(ABANDONED)
            raise
        started, result = outcome.started, outcome.result
        self.on_wait(route, (started - queued) * 1000.0)
        size = {"laya.microbatch.size": outcome.group_size} if batcher is not None else None
        tracing.record("laya.queue", queued, started, size)
        if outcome.error is not None:
            raise pass_refusal(outcome.error, what, served.name)
        rendered, names = render_result(result, served, settings, fallback, batch, what)
        return Reply(
            200,
            rendered,
            answer_headers(fallback, unknown, names, served.name),
            inference_ms=(outcome.ended - started) * 1000.0,
            queue_ms=(started - queued) * 1000.0,
            work=work_done(result),
            served=Answered(names[0] if len(names) == 1 else served.name, limits.passes, outcome.group_size),
        )

    async def on_worker(self, fn: Callable[[], Any], limits: CallLimits | None = None) -> Any:
        """`fn` on the inference worker under `limits`; cancelled, the lock is held until the worker is free."""
        lock, executor = self.drain.lock, self.executor
        if lock is None or executor is None:  # made on startup; a request cannot come earlier
            raise RuntimeError("inference requested outside the server's run (no worker)")
        await lock.acquire(limits)
        loop, release = asyncio.get_running_loop(), True
        try:
            # in this request's context: the pass's spans are its children, its log lines its id
            job: Future[Any] = executor.submit(tracing.in_current_context(partial(_run_limited, limits, fn)))
            try:
                return await asyncio.wrap_future(job)
            except asyncio.CancelledError:
                if limits is not None:
                    limits.cancel(ABANDONED)
                job.add_done_callback(lambda _: _release_from_worker(loop, lock))
                release = False
                raise
        finally:
            if release:
                lock.release()

    # -- lifecycle, and what the edge asks ---------------------------------------------------

    async def start(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="laya-infer")
        self.drain.bind(WorkerLock(self.drain))
        self.admission = asyncio.Semaphore(self.settings.max_concurrent)
        self.memory.start()
        if self.settings.batch_window_ms > 0:
            self.batcher = MicroBatcher(self.served, self.settings, self.on_worker)
        self._tasks.append(asyncio.create_task(self._warm_up()))
        if self.served.idle_seconds:
            self._tasks.append(asyncio.create_task(self._unload_when_idle(self.served.idle_seconds)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        executor, self.executor = self.executor, None
        self.admission = self.batcher = None
        if executor is not None:
            # off the loop: a pass on the worker finishes (unless the drain abandoned it), queued ones drop
            await asyncio.to_thread(executor.shutdown, wait=not self.drain.abandoned, cancel_futures=True)

    async def _warm_up(self) -> None:
        """The speed probe and one pass per length bucket, on the worker; ready afterwards."""
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, self.served.warm_up)
        except Exception:  # a failed warm-up leaves the first requests slower, nothing worse
            log.exception("warm-up failed")
        self._ready = True

    async def _unload_when_idle(self, seconds: float) -> None:
        """Look every max(0.05, min(seconds / 4, 5)) s; never while a pass runs or waits."""
        while True:
            await asyncio.sleep(max(0.05, min(seconds / 4.0, 5.0)))
            lock = self.drain.lock
            if lock is None or lock.busy or lock.waiting or time.monotonic() - self.served.last < seconds:
                continue
            try:
                await asyncio.get_running_loop().run_in_executor(self.executor, self.served.unload_if_idle)
            except Exception:  # a failed unload must not stop the next attempt
                log.exception("idle unload failed")

    @property
    def draining(self) -> bool:
        return self.drain.draining

    @property
    def ready(self) -> bool:
        return self._ready and not self.drain.draining

    def queue_depth(self) -> int:
        """Decision requests waiting for the worker now (0 before startup and after shutdown)."""
        return self.drain.lock.waiting if self.drain.lock is not None else 0

    def refuse_draining(self) -> ApiError:
        """A decision request that arrives once the server is draining: 503, Retry-After."""
        refused = self.drain.refuse("arrived after the drain began")
        log.info("503 while draining: %s", refused.reason)
        return refused

    async def health(self, full: bool) -> tuple[int, Any]:
        return self.served.health(full)

    async def models(self, full: bool) -> Any:
        return self.served.listing(full)


def _timed(fn: Callable[[], Any]) -> Outcome:
    """`fn`'s result or exception (a refusal is raised), and when it began and ended."""
    started = time.perf_counter()
    try:
        result = fn()
    except ApiError:
        raise
    except Exception as exc:
        return Outcome(error=exc, started=started, ended=time.perf_counter())
    return Outcome(result=result, started=started, ended=time.perf_counter())


def _run_limited(limits: CallLimits | None, fn: Callable[[], Any]) -> Any:
    with call_limits(limits):
        return fn()


def _release_from_worker(loop: asyncio.AbstractEventLoop, lock: WorkerLock) -> None:
    # the loop may have closed first (shutdown): then nothing is left to wait for the lock
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(lock.release)


# -- the pass and the answer -----------------------------------------------------------------


def pass_refusal(exc: Exception, what: str, model: str) -> ApiError:
    """Over its budget 413, stopped for its deadline 504, the caller's mistake 422; else a logged 500."""
    if isinstance(exc, (PassTooLarge, CallTooLarge)):
        return ApiError(413, str(exc))
    if isinstance(exc, CallStopped):
        # a deadline that cannot be met (the loop's own deadline answers a passed one first)
        return ApiError(504, "request not answered: %s; no pass of it ran after that" % exc.reason)
    if isinstance(exc, LayaInputError):
        return ApiError(422, str(exc))
    log.error("%s failed for model=%s", what, model, exc_info=exc)
    return ApiError(500, INFERENCE_FAILED)


def jev_confidence(answer: dict[str, Any]) -> float | None:
    """TypeSafe Jev's `confidence` of a choice or score answer (docs/http-api.md#answers), or None."""
    kind, probs = answer.get("type"), answer.get("probabilities")
    if kind not in ("choice", "score") or not isinstance(probs, dict) or not probs:
        return None
    if any(isinstance(v, bool) for v in probs.values()):
        return None
    try:
        keys = sorted(probs, key=int) if kind == "score" else list(probs)
        p = [float(probs[k]) for k in keys]
    except (TypeError, ValueError, OverflowError):
        return None
    if not all(math.isfinite(v) and v >= 0.0 for v in p):
        return None
    n = len(p)
    if n == 1:
        return 1.0
    total = sum(p)
    p = [v / total for v in p] if total else [1.0 / n] * n
    if kind == "choice":
        return (max(p) - 1.0 / n) / (1.0 - 1.0 / n)
    mode = max(range(n), key=p.__getitem__)
    spread = sum(v * abs(i - mode) for i, v in enumerate(p))
    center = (n - 1) / 2
    uniform = sum(abs(i - center) for i in range(n)) / n
    return max(0.0, 1.0 - spread / uniform)


def with_jev_confidence(result: dict[str, Any]) -> dict[str, Any]:
    """A copy of `result` whose choice/score answers carry `x_jev_confidence`."""
    answers = result.get("answers")
    if not isinstance(answers, dict):
        return result
    out = {}
    for qid, answer in answers.items():
        conf = jev_confidence(answer) if isinstance(answer, dict) else None
        out[qid] = answer if conf is None else {**answer, "x_jev_confidence": round(conf, 4)}
    return {**result, "answers": out}


def strict_projection(result: dict[str, Any]) -> dict[str, Any]:
    """`LAYA_JEV_STRICT` (docs/http-api.md#strict-projection); a typed answer missing a key is a 500."""
    answers = {}
    for qid, a in (result.get("answers") or {}).items():
        keys = STRICT_KEYS.get(str(a.get("type"))) if isinstance(a, dict) else None
        answers[qid] = a if keys is None else {k: a[k] for k in keys}
    usage = result.get("usage") or {}
    return {"model": result["model"], "answers": answers, "usage": {k: usage.get(k, 0) for k in USAGE_KEYS}}


def _extra(key: str) -> str:
    return key if key.startswith("x_") else "x_" + key


def _jev_answer(answer: Any) -> Any:
    kind = answer.get("type") if isinstance(answer, dict) else None
    if kind not in JEV_KEYS:
        return answer
    values = dict(answer)
    if "confidence" in values:
        values["x_laya_confidence"] = values.pop("confidence")
    if kind != "noul":
        conf = jev_confidence(answer)
        values["confidence"] = round(conf, 4) if conf is not None else values.get("x_laya_confidence")
    out = {k: values.pop(k) for k in JEV_KEYS[kind] if k in values}
    out.update({_extra(k): v for k, v in values.items()})
    return out


def jev_result(result: dict[str, Any]) -> dict[str, Any]:
    """One result in the Jev profile (docs/http-api.md#the-jev-profile)."""
    answers = result.get("answers")
    out: dict[str, Any] = {k: result[k] for k in ROOT_KEYS if k in result}
    if isinstance(answers, dict):
        out["answers"] = {qid: _jev_answer(a) for qid, a in answers.items()}
    usage = result.get("usage")
    if isinstance(usage, dict):
        out["usage"] = {k: usage[k] for k in USAGE_KEYS if k in usage}
        out["usage"].update({_extra(k): v for k, v in usage.items() if k not in USAGE_KEYS})
    out.update({_extra(k): v for k, v in result.items() if k not in ROOT_KEYS})
    return out


def shape(settings: Settings, result: dict[str, Any], fallback: str | None) -> dict[str, Any]:
    """One routed result in the wire profile; the Jev profile names a model fallback in the body too."""
    if settings.jev:
        if fallback is not None:
            answered = {"requested": fallback, "answered_by": answered_by(result)}
            result = {**result, "x_model_fallback": answered}
        result = jev_result(result)
    elif not settings.jev_strict:
        return with_jev_confidence(result)
    return strict_projection(result) if settings.jev_strict else result


class NonFiniteNumber(ValueError):
    """A payload holds a NaN or an infinity, which JSON cannot carry."""


def render(payload: Any) -> bytes:
    """Compact UTF-8 JSON; NonFiniteNumber for a NaN or an infinity (json's ValueError, else a cycle)."""
    try:
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        try:
            json.dumps(payload, allow_nan=True)
        except ValueError:
            raise exc from None
        raise NonFiniteNumber(str(exc)) from None
    return text.encode("utf-8")


def render_result(
    result: Any, checkpoint: Served, settings: Settings, fallback: str | None, batch: bool, what: str
) -> tuple[bytes, list[str]]:
    """A decision's answer in the wire profile (docs/http-api.md#batch), and the served checkpoints that
    answered, in order; a non-finite float is a 422, any other failure a logged 500."""
    try:
        routed = [checkpoint.with_routing(r) for r in (result if batch else [result])]
        results = [shape(settings, r, fallback) for r in routed]
        body = render({"results": results, "total_usage": aggregate_usage(routed)} if batch else results[0])
    except NonFiniteNumber:
        raise ApiError(422, "Out of range float values are not JSON compliant") from None
    except Exception:
        log.exception("%s failed for model=%s", what, checkpoint.name)
        raise ApiError(500, INFERENCE_FAILED) from None
    return body, [n for n in dict.fromkeys(map(answered_by, routed)) if n]


def answered_by(routed: dict[str, Any]) -> str:
    """The checkpoint a result's `routing` block names."""
    routing = routed.get("routing")
    return str(routing.get("model")) if isinstance(routing, dict) else ""


def answer_headers(fallback: str | None, unknown: str | None, names: list[str], name: str) -> dict[str, str]:
    """`X-Model-Fallback` and `X-Unknown-Fields` (docs/http-api.md#request-fields, #the-model-field)."""
    headers = {}
    if fallback is not None:
        answered = ", ".join(names) or name
        log.info("model %.200r names no checkpoint served here; answered by %s", fallback, answered)
        headers["X-Model-Fallback"] = "".join(c if " " <= c <= "~" else "?" for c in answered)
    if unknown is not None:
        headers["X-Unknown-Fields"] = unknown
    return headers


def error_body(settings: Settings, status: int, detail: str, errors: Any = None) -> Any:
    """A refusal's body in the wire profile (docs/http-api.md#the-jev-profile)."""
    if not settings.jev:
        return {"detail": detail}
    if status == 422:
        default = [{"loc": ["body"], "msg": detail, "type": "value_error"}]
        return {"detail": errors if errors is not None else default}
    error_type = ERROR_TYPES.get(status, "internal_error" if status >= 500 else "api_usage_error")
    return {"detail": {"error_type": error_type, "message": detail}}
