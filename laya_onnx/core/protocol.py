"""What the front ends need from the agent they answer with: `DecisionAgent`.

`ONNXAgent` implements it, and so does the Router behind the server (`serve.served.Served`);
the request grouping (`core.grouping`), the elimination plan (`core.tournament.plan_group`), the
server and `laya-onnx score` read nothing else, so a change to the agent that breaks them is a
type error rather than a `getattr` that quietly answers with a default. The server's own
protocol (`serve.served.ServedAgent`) adds what it reports about the checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class DecisionAgent(Protocol):
    """One loaded checkpoint that answers question sets.

    `predict` / `predict_batch` raise `laya_onnx.core.errors.LayaInputError` (InvalidRequest,
    InvalidRequestType) for a caller's mistake; any other exception is the agent's failure.
    """

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
