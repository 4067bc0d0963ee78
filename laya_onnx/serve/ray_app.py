"""Ray Serve deployment (serve/README.md#ray-serves-http-edge): `build(args)`, a config file's
`import_path`, binds `LayaIngress` (Starlette's request through `service.DecisionService`) to
`LayaModel`, one `contract.LocalDecider` per replica.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from multidict import CIMultiDict
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request
from starlette.responses import Response

from laya_onnx.core.errors import ConfigError
from laya_onnx.serve.contract import LocalDecider, Reply
from laya_onnx.serve.errors import BUSY, ApiError
from laya_onnx.serve.metrics import Metrics
from laya_onnx.serve.served import Served, load_agent
from laya_onnx.serve.service import Call, DecisionService
from laya_onnx.serve.settings import Settings

log = logging.getLogger("laya_onnx.serve")

RETRIES = 3  #: tries of a call on the model replicas (a dead one is skipped) before a 503


@serve.deployment(name="LayaModel")
class LayaModel:
    """The decisions, `/health` and `/v1/models` of one bundle or Router, on a `LocalDecider`."""

    async def __init__(self, args: dict[str, Any]):  # type: ignore[misc]  # Ray awaits it
        options = {"providers": args.get("providers"), "threads": args.get("threads")}
        agent = load_agent(args.get("bundle"), args.get("models") or (), **options)
        self.decider = LocalDecider(Served.of(agent), Settings.from_env(**(args.get("settings") or {})))
        await self.decider.start()

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose device keeps failing passes is replaced."""
        sick = self.decider.served.unhealthy()
        if sick:
            raise RuntimeError("the device failed pass after pass for %s; restart needed" % ", ".join(sick))

    async def __call__(self, method: str, *args: Any) -> Any:
        """The decider's `decide`, `health` or `models`."""
        try:
            return await getattr(self.decider, method)(*args)
        except ApiError as exc:  # its pickle would lose the status: its fields cross instead
            return exc.status, exc.detail, exc.headers  # X-Batch-Item among them


class RemoteDecider:
    """The pipeline's `Decider` on the ingress: each call on a model replica, retried if it died."""

    draining = False  # readiness and draining are Ray Serve's own
    ready = True

    def __init__(self, model: Any):
        self.model = model

    def refuse_draining(self) -> ApiError:
        raise AssertionError("a Ray ingress never drains itself")  # pragma: no cover

    async def decide(self, route: str, raw: bytes) -> Reply:
        answer = await self._on_model("decide", route, raw)
        if isinstance(answer, Reply):
            return answer
        raise ApiError(*answer)

    async def health(self, full: bool) -> tuple[int, Any]:
        return await self._on_model("health", full)

    async def models(self, full: bool) -> Any:
        return await self._on_model("models", full)

    async def _on_model(self, method: str, *args: Any) -> Any:
        for attempt in range(1, RETRIES + 1):
            try:
                return await self.model.remote(method, *args)
            except BackPressureError:  # every replica and its queue full: our 503, not Ray's
                break
            except RayActorError as exc:
                log.warning("LayaModel replica died under %s (try %d/%d): %s", method, attempt, RETRIES, exc)
        raise ApiError(503, BUSY, {"Retry-After": "1"})


@serve.deployment(name="LayaIngress")
class LayaIngress:
    """Starlette's request as the pipeline's `Call`, and its `Reply` as Starlette's response."""

    def __init__(self, model: Any, settings: dict[str, Any] | None = None):
        config = Settings.from_env(**(settings or {}))
        self.service = DecisionService(RemoteDecider(model), config, Metrics(), docs=False)

    async def __call__(self, request: Request) -> Response:
        path, root = request.scope.get("path", "/"), request.scope.get("root_path", "")
        if root and (path == root or path.startswith(root + "/")):
            path = path[len(root) :] or "/"  # the application's route_prefix
        # every header instance as aiohttp reads them: the bearer compares the wire's bytes
        headers = CIMultiDict(
            (k.decode("latin-1"), v.decode("utf-8", "surrogateescape"))
            for k, v in request.scope.get("headers", [])
        )
        call = Call(request.method.upper(), path, headers, request.stream(), request.url.query, root)
        reply = await self.service.handle(call)
        # never `reply.close`: Ray Serve drains the ingress itself (`RemoteDecider.draining`)
        return Response(reply.body, reply.status, {**reply.headers, "Content-Type": reply.content_type})


def build(args: dict[str, Any]) -> Any:
    """The application of a config file's `args` (serve/README.md#ray-serves-http-edge)."""
    if not isinstance(args, dict) or not (args.get("bundle") or args.get("models")):
        raise ConfigError("the Ray Serve config's args must name a bundle: PATH or models: [NAME=PATH]")
    unknown = sorted(set(args) - {"bundle", "models", "providers", "threads", "settings"})
    if unknown:
        raise ConfigError("unknown args in the Ray Serve config: %s" % ", ".join(unknown))
    settings = args.get("settings") or {}
    Settings.from_env(**settings)  # a bad setting is refused here, before any replica starts
    return cast(Any, LayaIngress).bind(cast(Any, LayaModel).bind(args), settings)  # Deployments


def run_config(config: str, blocking: bool = True) -> None:
    """Ray's `serve run CONFIG` on the Ray instance joined (RAY_ADDRESS or a local one): until
    interrupted, or, not blocking, until submitted."""
    from ray.serve.scripts import cli

    argv = ["run", config] + ([] if blocking else ["--non-blocking"])
    cli.main(argv, prog_name="laya-onnx serve --ray", standalone_mode=blocking)
