"""Ray Serve deployment: the server's routes on a Ray cluster, through the same pipeline.

Two deployments, built by `build(args)` (the `import_path` of a Ray Serve config file,
`serve/ray/serve-config.yaml`):

  * `LayaIngress` — the HTTP edge: Starlette's request handed to `service.DecisionService` as a
    `Call` and its `Reply` written back, so routing, auth, the body (every cap, bounded
    decoding, Transfer-Encoding and every Content-Encoding header), the refusals and the
    metrics are the aiohttp server's, by construction. The decisions, `/health` and
    `/v1/models` are asked of a model replica (`RemoteDecider`); a replica that dies under a
    request is retried on another one, and when none answers after `RETRIES` tries the caller
    gets a 503 with Retry-After. What Ray's proxy decides before the ingress sees a request
    (header limits, its timeouts) is written down in serve/README.md, with the shipped configs
    putting a proxy with those limits in front.
  * `LayaModel` — one `ONNXAgent` per replica (or, given a models directory or `models`, the
    Router `laya-onnx serve` runs over several bundles), its passes on one worker thread.
    Single-state requests are micro-batched with `@serve.batch` and grouped as the aiohttp
    server's micro-batcher groups them (`core/grouping.py`). Replicas, autoscaling, CPUs/GPUs
    per replica and the batch size/wait (its `user_config`) come from the config file.

`laya-onnx serve --ray CONFIG` is Ray's own `serve run CONFIG`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, cast

from multidict import CIMultiDict
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request
from starlette.responses import Response

from laya_onnx.core.errors import ConfigError
from laya_onnx.core.grouping import group_key, run_group
from laya_onnx.serve import contract
from laya_onnx.serve.body import BodyBuffer
from laya_onnx.serve.contract import Reply, render
from laya_onnx.serve.errors import BUSY, ApiError
from laya_onnx.serve.metrics import RequestMetrics, work_done
from laya_onnx.serve.served import Served
from laya_onnx.serve.server import is_models_dir
from laya_onnx.serve.service import Call, DecisionService
from laya_onnx.serve.settings import Settings

log = logging.getLogger("laya_onnx.serve")

#: Tries of one request on the model replicas before a 503 (a dead replica is skipped each time).
RETRIES = 3
DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_BATCH_WAIT_S = 0.005
#: The work of a successful pass a model replica reports with its answer, for the ingress's
#: metrics: its milliseconds, question rows and input tokens.
Work = tuple[float, int, int]


def _settings(overrides: dict[str, Any] | None) -> Settings:
    return Settings.from_env(**(overrides or {}))


@serve.deployment(name="LayaModel")
class LayaModel:
    """One agent per replica; answers a route's raw body with (status, headers, body bytes)."""

    def __init__(
        self,
        bundle: str | None,
        providers: list[str] | None = None,
        threads: int | None = None,
        settings: dict[str, Any] | None = None,
        models: list[str] | None = None,
    ):
        self.settings = _settings(settings)
        agent: Any
        if models or is_models_dir(bundle):
            # several checkpoints: the Router `laya-onnx serve` runs (LAYA_* from the runtime_env)
            from laya_onnx.serve.served import build_router

            agent = build_router(bundle, models or (), providers=providers)
        else:
            from laya_onnx import ONNXAgent

            agent = ONNXAgent(bundle, providers=providers, threads=threads)
        self.served = Served.of(agent)
        self.agent, self.checkpoint = self.served.agent, self.served
        # one pass at a time per replica, off the replica's event loop (as the aiohttp app's worker)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="laya-infer")
        self.batches = {"batches": 0, "requests": 0, "largest": 0}

    def reconfigure(self, config: dict[str, Any]) -> None:
        """The config file's `user_config`: `max_batch_size`, `batch_wait_timeout_s`."""
        self.answer_one.set_max_batch_size(int(config.get("max_batch_size", DEFAULT_MAX_BATCH_SIZE)))
        self.answer_one.set_batch_wait_timeout_s(
            float(config.get("batch_wait_timeout_s", DEFAULT_BATCH_WAIT_S))
        )

    def micro_batches(self) -> dict[str, int]:
        """This replica's micro-batching so far: batches run, requests in them, the largest."""
        return dict(self.batches)

    async def health(self, full: bool) -> tuple[int, Any]:
        return self.served.health(full)

    async def models(self, full: bool) -> Any:
        """`/v1/models`: the aiohttp app's listing (the x_ keys only when `full`)."""
        return self.served.listing(full)

    def check_health(self) -> None:
        """Ray Serve's replica health check: a replica whose device keeps failing passes is
        reported unhealthy, and Serve replaces it (as the server's /health 503 asks a supervisor)."""
        sick = self.served.unhealthy()
        if sick:
            raise RuntimeError("the device failed pass after pass for %s; restart needed" % ", ".join(sick))

    async def decide(self, route: str, raw: bytes) -> tuple[int, dict[str, str], bytes, Work | None]:
        try:
            body, ms, result, headers = await self._decide(route, raw)
        except ApiError as exc:
            return exc.status, exc.headers, render(contract.api_error_body(self.settings, exc)), None
        return 200, headers, body, (ms, *work_done(result))

    async def _decide(self, route: str, raw: bytes) -> tuple[bytes, float, Any, dict[str, str]]:
        """The payload, the milliseconds of the pass that answered it, the pass's result, and the
        answer's headers besides the timing ones (`contract.answer_headers`)."""
        agent, checkpoint, settings = self.agent, self.checkpoint, self.settings
        if route == "systemone":
            decision: contract.OneDecision | contract.BatchDecision = contract.parse_systemone(
                raw, agent, checkpoint, settings
            )
            outcome = await self.answer_one(decision)
            if outcome.error is not None:
                raise contract.pass_refusal(outcome.error, decision.what, checkpoint.name)
            result, ms = outcome.result, (outcome.ended - outcome.started) * 1000.0
        else:
            decision = contract.parse_batch(raw, agent, checkpoint, settings)
            loop = asyncio.get_running_loop()
            try:
                result, ms = await loop.run_in_executor(
                    self.worker, _timed, partial(decision.run, agent, settings)
                )
            except Exception as exc:
                raise contract.pass_refusal(exc, decision.what, checkpoint.name) from None
        body = contract.render_payload(
            partial(decision.payload, result, checkpoint, settings), decision.what, checkpoint.name
        )
        return body, ms, result, contract.answer_headers(decision, result, checkpoint)

    @serve.batch(max_batch_size=DEFAULT_MAX_BATCH_SIZE, batch_wait_timeout_s=DEFAULT_BATCH_WAIT_S)
    async def answer_one(self, decisions: list[contract.OneDecision]) -> list[Any]:
        """The micro-batch: one `grouping.Outcome` per decision, in order."""
        self.batches["batches"] += 1
        self.batches["requests"] += len(decisions)
        self.batches["largest"] = max(self.batches["largest"], len(decisions))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.worker, self._answer_grouped, decisions)

    def _answer_grouped(self, decisions: list[contract.OneDecision]) -> list[Any]:
        """Decisions that share a `grouping.group_key` run as one group (`run_group`, as the
        aiohttp app's micro-batcher runs them); one without a key runs alone."""
        groups: dict[Any, list[int]] = {}
        for i, decision in enumerate(decisions):
            key = group_key(decision.questions, decision.controls)
            groups.setdefault(("alone", i) if key is None else key, []).append(i)
        outcomes: list[Any] = [None] * len(decisions)
        for positions in groups.values():
            first = decisions[positions[0]]
            states = [decisions[i].state for i in positions]
            ran = run_group(
                self.agent, states, first.questions, first.controls, self.settings.tournament_group
            )
            for i, outcome in zip(positions, ran, strict=True):
                outcomes[i] = outcome
        return outcomes


def _timed(fn: Any) -> tuple[Any, float]:
    """fn's result and the milliseconds it ran on the worker (not its wait for the worker)."""
    t0 = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - t0) * 1000.0


# -- the HTTP edge -------------------------------------------------------------------------


class RemoteDecider:
    """The pipeline's `Decider` on the ingress: decisions, /health and /v1/models on a model
    replica; a replica that died under a call is retried on another one."""

    def __init__(self, model: Any, settings: Settings):
        self.model = model
        self.body_buffer: BodyBuffer | None = BodyBuffer(settings.body_buffer)
        # Ray Serve starts routing to the ingress once its replicas are up and healthy, and
        # stops it before they go: readiness and draining are Ray's own
        self.draining = False
        self.ready = True

    def refuse_draining(self) -> ApiError:
        raise AssertionError("a Ray ingress never drains itself")  # pragma: no cover

    async def decide(self, route: str, raw: bytes) -> Reply:
        status, headers, body, work = await self._on_model("decide", route, raw)
        if work is None:
            return Reply(status, body, headers)
        ms, rows, tokens = work
        return Reply(status, body, headers, inference_ms=ms, work=(rows, tokens))

    async def health(self, full: bool) -> tuple[int, Any]:
        return await self._on_model("health", full)

    async def models(self, full: bool) -> Any:
        return await self._on_model("models", full)

    async def _on_model(self, method: str, *args: Any) -> Any:
        for attempt in range(1, RETRIES + 1):
            try:
                return await getattr(self.model, method).remote(*args)
            except BackPressureError:
                # every model replica is at max_ongoing_requests with max_queued_requests waiting:
                # the contract's busy answer (503 + Retry-After, our error body), not Ray's own
                raise ApiError(503, BUSY, {"Retry-After": "1"}) from None
            except RayActorError as exc:
                log.warning(
                    "a LayaModel replica died under a %s call (try %d of %d): %s",
                    method,
                    attempt,
                    RETRIES,
                    exc,
                )
        raise ApiError(503, BUSY, {"Retry-After": "1"})


def _headers(request: Request) -> CIMultiDict[str]:
    """The request's headers as aiohttp reads them (UTF-8, surrogateescape), every instance kept,
    so the bearer compares the wire's bytes and a repeated header is seen as repeated."""
    return CIMultiDict(
        (k.decode("latin-1"), v.decode("utf-8", "surrogateescape"))
        for k, v in request.scope.get("headers", [])
    )


@serve.deployment(name="LayaIngress")
class LayaIngress:
    """Bytes between Starlette and the pipeline (`service.DecisionService`); decisions on a replica."""

    def __init__(self, model: Any, settings: dict[str, Any] | None = None):
        config = _settings(settings)
        self.metrics = RequestMetrics()
        self.service = DecisionService(RemoteDecider(model, config), config, self.metrics, docs=False)

    async def __call__(self, request: Request) -> Response:
        path, root = request.scope.get("path", "/"), request.scope.get("root_path", "")
        if root and (path == root or path.startswith(root + "/")):
            path = path[len(root) :] or "/"  # the application's route_prefix
        call = Call(
            request.method.upper(), path, _headers(request), request.stream(), request.url.query, root
        )
        reply = await self.service.handle(call)
        headers = {**reply.headers, "Content-Type": reply.content_type}
        if reply.close:
            headers["Connection"] = "close"
        return Response(content=reply.body, status_code=reply.status, headers=headers)


def build(args: dict[str, Any]) -> Any:
    """The Ray Serve application of a config file's `args`:

    bundle (a bundle, or a models directory: a folder of bundles served through the Router, as
    `laya-onnx serve DIR`), models (a list of NAME=BUNDLE, as `--model`; with or without bundle),
    providers (list), threads (onnxruntime intra-op threads per replica; LAYA_THREADS behind a
    Router), settings (the aiohttp app's `Settings` overrides: api_key, max_token_budget,
    jev_profile, ...; unset ones come from the replica's LAYA_* environment, e.g. the config's
    runtime_env, which also carries the Router's LAYA_MAX_LOADED, LAYA_DEFAULT_MODEL, ...).
    """
    if not isinstance(args, dict) or not (args.get("bundle") or args.get("models")):
        raise ConfigError(
            "the Ray Serve config's args must name a bundle or models: args: {bundle: PATH} or "
            "{models: [NAME=BUNDLE, ...]}"
        )
    unknown = sorted(set(args) - {"bundle", "models", "providers", "threads", "settings"})
    if unknown:
        raise ConfigError("unknown args in the Ray Serve config: %s" % ", ".join(unknown))
    settings = args.get("settings") or {}
    _settings(settings)  # a bad setting is refused here, before any replica starts
    models = [str(m) for m in args.get("models") or ()]
    bundle = str(args["bundle"]) if args.get("bundle") else None
    # the decorated classes are Deployments (mypy sees the plain classes)
    model = cast(Any, LayaModel).bind(bundle, args.get("providers"), args.get("threads"), settings, models)
    return cast(Any, LayaIngress).bind(model, settings)


def run_config(config: str, blocking: bool = True) -> None:
    """`laya-onnx serve --ray CONFIG`: Ray's `serve run CONFIG` (joins the Ray instance this
    process is connected to, or RAY_ADDRESS, or starts a local one; deploys the config).

    Blocking, it runs until interrupted and then shuts the applications down; not blocking, it
    returns once the config is submitted (the tests, on their own `ray.init`).
    """
    from ray.serve.scripts import cli

    argv = ["run", config] + ([] if blocking else ["--non-blocking"])
    cli.main(argv, prog_name="laya-onnx serve --ray", standalone_mode=blocking)
