"""Answering many independent requests together: grouping by question set, and one pass per group
that cannot let one bad state fail the others.

Shared by the Ray Serve deployment's micro-batching (`serve/ray_app.py`, requests from different
callers) and `laya-onnx score` (rows of a file): requests that ask the same questions with the
same controls are one `predict_batch` call; a call that fails is retried state by state, so each
state gets its own answer or its own error.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Protocol


class BatchPredictor(Protocol):
    def predict_batch(
        self, states: Sequence[Any], questions: Any, **controls: Any
    ) -> list[dict[str, Any]]: ...


def question_set_key(questions: Any, controls: dict[str, Any]) -> str:
    """A key equal for two requests exactly when one `predict_batch` call can answer both:
    the same questions (their order kept: it is the answers' order) and the same controls."""
    return json.dumps([questions, sorted(controls.items())], sort_keys=False, default=repr)


def group_indices(keys: Iterable[Hashable]) -> list[list[int]]:
    """Positions with equal keys, grouped; groups in order of first appearance, positions ascending."""
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def answer_states(
    agent: BatchPredictor, states: Sequence[Any], questions: Any, **controls: Any
) -> list[dict[str, Any] | Exception]:
    """One result or one exception per state, in order.

    `predict_batch` over all the states first; if that call raises (a state the agent refuses,
    a pass that fails), each state is asked alone, so only the states that fail by themselves
    carry an exception. A question set the agent refuses therefore fails every state, each with
    the agent's own error.
    """
    states = list(states)
    if not states:
        return []
    try:
        return list(agent.predict_batch(states, questions, **controls))
    except Exception as exc:
        if len(states) == 1:
            return [exc]
    return [_answer_one(agent, state, questions, controls) for state in states]


def _answer_one(
    agent: BatchPredictor, state: Any, questions: Any, controls: dict[str, Any]
) -> dict[str, Any] | Exception:
    try:
        return agent.predict_batch([state], questions, **controls)[0]
    except Exception as exc:
        return exc
