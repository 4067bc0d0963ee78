"""Which requests the server answers by elimination (`laya_onnx.core.tournament`), and with what group.

Two policies, both run on the inference worker (deriving a group tokenizes option texts):

  * `LAYA_TOURNAMENT_GROUP=g` (2..100) is laya-serve 0.4.15's `_tournament_plan`, restated: every
    choice over `g` options is narrowed, except that while no choice is over 100 options (what
    one pass was ever asked to read) a choice with an `option_order` or a non-string label keeps
    the whole request on one pass; once one is over 100, orders are dropped and a non-string
    label is refused, since a narrowed label must map back onto the JSON answer.
  * unset (our default; laya-serve refuses such requests with a 413): a request is narrowed only
    when a choice has more than 100 options, so every request laya-serve answers is answered
    exactly as it does. The group is the largest one whose options keep all their tokens in the
    request's `head_max_len` (`ServedAgent.tournament_group_size`), at most 100.
"""

from __future__ import annotations

from typing import Any

from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.tournament import large_choices, run_tournament
from laya_onnx.serve.protocol import ServedAgent
from laya_onnx.serve.validate import MAX_ONE_PASS_CHOICE_OPTIONS


def _over_one_pass(large: dict[Any, list[Any]]) -> bool:
    return any(len(labels) > MAX_ONE_PASS_CHOICE_OPTIONS for labels in large.values())


def _refuse_unmappable(large: dict[Any, list[Any]]) -> None:
    for qid, labels in large.items():
        if not all(isinstance(label, str) for label in labels):
            raise InvalidRequest(
                "question %r: a choice is narrowed by elimination once a request has one over %d "
                "options, and that needs every label to be a string" % (qid, MAX_ONE_PASS_CHOICE_OPTIONS)
            )


def _derived_group(agent: ServedAgent, questions: dict[Any, Any], head_max_len: int | None) -> int | None:
    group = agent.tournament_group_size(questions, head_max_len)
    return None if group is None else min(group, MAX_ONE_PASS_CHOICE_OPTIONS)


def plan_group(
    agent: ServedAgent, questions: Any, configured_group: int, head_max_len: int | None = None
) -> int | None:
    """The group size to narrow this request with, or None to answer it in one pass."""
    if not isinstance(questions, dict):
        return None
    if configured_group:
        large = large_choices(questions, configured_group)
        if not large:
            return None
        if _over_one_pass(large):
            _refuse_unmappable(large)
            return configured_group
        keeps_one_pass = any(
            not all(isinstance(label, str) for label in labels)
            or questions[qid].get("option_order") is not None
            for qid, labels in large.items()
        )
        return None if keeps_one_pass else configured_group
    if not _over_one_pass(large_choices(questions, MAX_ONE_PASS_CHOICE_OPTIONS)):
        return None
    group = _derived_group(agent, questions, head_max_len)
    if group is None:
        return None
    _refuse_unmappable(large_choices(questions, group))
    return group


def predict(
    agent: ServedAgent, state: Any, questions: Any, configured_group: int, **controls: Any
) -> dict[str, Any]:
    """`agent.predict`, through a tournament when `plan_group` says so."""
    group = plan_group(agent, questions, configured_group, controls.get("head_max_len"))
    if group is None:
        return agent.predict(state, questions, **controls)
    return run_tournament(agent.predict, state, questions, group, **controls)


def predict_batch(
    agent: ServedAgent, states: list[Any], questions: Any, configured_group: int, **controls: Any
) -> list[dict[str, Any]]:
    """`agent.predict_batch`, or state by state through a tournament when `plan_group` says so.

    One question set for every state, so whether it is narrowed is decided once; the rounds run
    per state, so a batch's chunking (`batch_size`, `sort_by_length`) has nothing to apply to.
    """
    group = plan_group(agent, questions, configured_group, controls.get("head_max_len"))
    if group is None:
        return agent.predict_batch(states, questions, **controls)
    per_state = {k: v for k, v in controls.items() if k not in ("batch_size", "sort_by_length")}
    return [run_tournament(agent.predict, s, questions, group, **per_state) for s in states]
