"""What the server needs from the agent it serves: `ServedAgent`.

`ONNXAgent` implements it; so does the tests' fake agent. It is the core's `DecisionAgent` (the
answering calls) plus what the server reports about the checkpoint. The server reads nothing
else, so a change to the agent that breaks the server is a type error here rather than a
`getattr` that quietly answers with a default. `isinstance(x, ServedAgent)` checks that every
member exists (not their signatures): the tests use it on their fake.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from laya_onnx.core.bundle import Bundle
from laya_onnx.core.protocol import DecisionAgent
from laya_onnx.core.session import FallbackEntry


@runtime_checkable
class ServedAgent(DecisionAgent, Protocol):
    """One loaded checkpoint, answering on the server's worker thread.

    A caller's mistake (`LayaInputError` from `predict` / `predict_batch`) is answered with a
    422 and the exception's text; any other exception is the server's failure (a logged 500).

    The attributes are read from the event loop while a pass may be running on the worker, so
    each must be safe to read concurrently; `fallbacks` in particular returns a copy.
    """

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
