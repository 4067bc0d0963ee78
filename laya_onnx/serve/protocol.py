"""What the server needs from the agent it serves: `ServedAgent`.

`ONNXAgent` implements it; so does the tests' fake agent. The server reads nothing else, so a
change to the agent that breaks the server is a type error here rather than a `getattr` that
quietly answers with a default. `isinstance(x, ServedAgent)` checks that every member exists
(not their signatures): the tests use it on their fake.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from laya_onnx.core.bundle import Bundle
from laya_onnx.core.session import FallbackEntry


@runtime_checkable
class ServedAgent(Protocol):
    """One loaded checkpoint, answering on the server's worker thread.

    `predict` / `predict_batch` raise `laya_onnx.core.errors.LayaInputError` (InvalidRequest,
    InvalidRequestType) for a caller's mistake, which the server answers with a 422 and the
    exception's text; any other exception is the server's failure (a logged 500).

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
    def fallbacks(self) -> dict[str, FallbackEntry]:
        """A snapshot of {provider: {"count", "last_reason"}} for every provider that fell back."""
        ...

    def predict(
        self,
        state: Any,
        questions: dict[Any, Any],
        *,
        lang: str | None = None,
        max_len: int | None = None,
        head_max_len: int | None = None,
        min_confidence: Any = None,
    ) -> dict[str, Any]: ...

    def tournament_group_size(self, questions: Any, head_max_len: int | None = None) -> int | None:
        """The largest group of options that keep all their tokens in one head, or None when
        every choice in `questions` already does (`laya_onnx.core.tournament.fitting_group_size`)."""
        ...

    def predict_batch(
        self,
        states: Sequence[Any],
        questions: dict[Any, Any],
        *,
        batch_size: int | None = None,
        lang: str | None = None,
        max_len: int | None = None,
        head_max_len: int | None = None,
        sort_by_length: bool = False,
        min_confidence: Any = None,
    ) -> list[dict[str, Any]]: ...
