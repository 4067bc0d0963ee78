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
from laya_onnx.serve.catalog import ModelCard
from laya_onnx.serve.protocol import ServedAgent
from laya_onnx.serve.routed import IdleUnload, RoutedCatalog, served_router
from laya_onnx.serve.wire import Checkpoint, fallback_baseline

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
        return contract.health_payload(self.agent, self.checkpoint, self.baseline, full)

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
