"""What the server needs from an agent it serves (`ServedAgent`): a change to the agent that
breaks the server is a type error here, not a `getattr` that quietly answers with a default."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from laya_onnx.core.bundle import Bundle
from laya_onnx.core.protocol import DecisionAgent
from laya_onnx.core.session import FallbackEntry


@runtime_checkable
class ServedAgent(DecisionAgent, Protocol):
    """The core's `DecisionAgent` and what the server reports about its checkpoint: `ONNXAgent`,
    the tests' fake (`isinstance` checks that every member exists). The attributes are read from
    the event loop while a pass runs on the worker, so each must be safe to read concurrently."""

    @property
    def name(self) -> str:
        """The checkpoint name requests may use (`english`, or the bundle's own name)."""
        ...

    @property
    def revision(self) -> str | None:
        """The Hub commit the bundle was exported from, when known."""
        ...

    @property
    def bundle(self) -> Bundle:
        """The loaded bundle: its manifest says where the checkpoint was published."""
        ...

    @property
    def providers(self) -> list[str]:
        """The execution providers the session actually runs on, best first."""
        ...

    @property
    def requested_providers(self) -> list[str]:
        """The providers that were asked for, best first (the device preference)."""
        ...

    @property
    def int8_kernel(self) -> str | None:
        """The integer GEMM ("u8s8" or "u8u8") an int8 bundle runs here; None for other precisions."""
        ...

    @property
    def fallbacks(self) -> dict[str, FallbackEntry]:
        """A snapshot of {provider: {"count", "last_reason"}} for every provider that fell back."""
        ...
