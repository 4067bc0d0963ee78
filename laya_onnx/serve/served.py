"""What a server serves: one loaded agent, or a `laya_onnx.Router` over several bundles.

`Served.of(agent_or_router)` gives the decision path one object either way: the agent the worker
calls, the checkpoint role (`model`/`task` resolution, the `routing` block), `/health`'s and
`/v1/models`' payloads, the idle-unload window, and the warm-up a server runs before it reports
itself ready.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from laya_onnx.core.router import Router
from laya_onnx.serve import contract
from laya_onnx.serve.catalog import ModelCard, int8_kernels_block, random_weights_block
from laya_onnx.serve.protocol import ServedAgent
from laya_onnx.serve.routed import IdleUnload, RoutedCatalog, RoutedCheckpoints, served_router
from laya_onnx.serve.wire import (
    Checkpoint,
    cpu_fallbacks,
    fallback_baseline,
    preferred_device,
    provider_device,
)

log = logging.getLogger("laya_onnx.serve")

#: Row lengths the warm-up runs one pass at (each at most the bundle's own max_len): the shapes
#: onnxruntime meets first in real traffic, so the first requests do not pay for them.
WARM_LENGTHS = (32, 64, 128, 256, 512)


@dataclass
class Served:
    agent: ServedAgent
    checkpoint: contract.ServedCheckpoints
    catalog: ModelCard | RoutedCatalog
    baseline: dict[str, int]
    idle: IdleUnload | None = None
    router: Router | None = None

    @classmethod
    def of(cls, agent: ServedAgent | Router) -> Served:
        if isinstance(agent, Router):
            routed, checkpoints, catalog, idle = served_router(agent)
            # every member the decision path and the metrics read (`bundle` is never read here)
            return cls(routed, checkpoints, catalog, {}, idle, agent)  # type: ignore[arg-type]
        checkpoint = Checkpoint.of(agent)
        return cls(agent, checkpoint, ModelCard.of(agent, checkpoint), fallback_baseline(agent.fallbacks))

    def mark(self) -> None:
        """A decision request was admitted: the idle window restarts."""
        if self.idle is not None:
            self.idle.mark()

    def health(self, full: bool) -> dict[str, Any]:
        """`/health`: liveness for anyone; the full payload only when `full` (no key, or its
        bearer). Reads attributes and the agents' fallback snapshots, never a pass, so it answers
        while a pass is running."""
        sick = self.unhealthy()
        if not full:
            return {"status": contract.UNHEALTHY if sick else "ok"}
        checkpoint = self.checkpoint
        payload = checkpoint.health() if isinstance(checkpoint, RoutedCheckpoints) else self._one_health()
        if sick:
            payload["status"] = contract.UNHEALTHY
            payload["unhealthy"] = sick
        return payload

    def unhealthy(self) -> list[str]:
        """The loaded checkpoints whose device failed pass after pass (`ONNXAgent.healthy`): the
        process needs a restart, which /health and /health/live ask for with a 503."""
        if self.router is not None:
            return [
                name for name, each in self.router.resident().items() if not getattr(each, "healthy", True)
            ]
        return [] if getattr(self.agent, "healthy", True) else [self.checkpoint.name]

    def _one_health(self) -> dict[str, Any]:
        agent, name = self.agent, self.checkpoint.name
        providers = list(agent.providers)
        fallbacks = agent.fallbacks  # one snapshot for both fields
        measured = provider_device(providers[0]) if providers else None
        return {
            "status": "ok",
            "loaded": [name],
            "revisions": {name: agent.revision},
            "device": measured or preferred_device(agent.requested_providers),
            "device_is_preference": measured is None,
            "checkpoint_devices": {name: measured} if measured else {},
            "cpu_fallbacks": {name: cpu_fallbacks(fallbacks, self.baseline)},
            "providers": {name: providers},
            "provider_fallbacks": {name: fallbacks},
            **random_weights_block({name: agent}),
            **int8_kernels_block({name: agent}),
        }

    def listing(self, full: bool) -> dict[str, Any]:
        return self.catalog.listing(self.agent, full=full)

    def residents(self) -> list[Any]:
        return list(self.router.resident().values()) if self.router is not None else [self.agent]

    def warm_up(self) -> None:
        """On the worker: each loaded bundle's speed probe and one pass per warm length (an agent
        without an onnxruntime session, such as a test's fake, has nothing to warm)."""
        from laya_onnx.core.memory import probe_feeds
        from laya_onnx.core.work import PROBE_LENGTH

        for agent in self.residents():
            clock, session = getattr(agent, "pass_clock", None), getattr(agent, "session", None)
            if clock is None or session is None:
                continue
            clock.seconds(1, PROBE_LENGTH)
            longest = int(getattr(agent, "max_len", 512) or 512)
            for length in WARM_LENGTHS:
                if length <= longest:
                    session.run(probe_feeds(1, length))
            log.info("warmed up %s", getattr(agent, "name", "the checkpoint"))
