"""Request grouping: decisions that ask the same thing of the model, answered in one forward.

Decisions group when they share the questions and the controls that change the pass, its
decoding or, behind a Router, the checkpoint that answers (`group_key`: max_len, head_max_len,
lang, min_confidence, model, task, lang_guess). A group runs as one
`predict_batch` (`run_group`) and each member gets its own result, in order: the answer its
request alone would get (the rows are the same; only the padding of the pass differs, which
moves the last float bits, within the parity rule). Whatever goes wrong stays per member: when
the group's call raises, every member is run alone, so each gets its own answer or its own
refusal with the text it would have had alone. A group is also run member by member when its
questions are answered by elimination (`core.tournament.plan_group`).

The front ends bring the grouping window: the server's micro-batcher (`serve.worker`, on
Ray Serve's model replicas too) and `laya-onnx score`'s row batches.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from laya_onnx.core import tournament
from laya_onnx.core.protocol import DecisionAgent
from laya_onnx.core.question_cache import question_key
from laya_onnx.core.work import CallLimits, call_limits

#: Controls that change the pass, the decoding or the routing: requests group only when they
#: agree on all (a Router's `predict_batch` routes each member as it would route it alone).
GROUPED_CONTROLS = ("max_len", "head_max_len", "lang", "min_confidence", "model", "task", "lang_guess")


def group_key(questions: Any, controls: dict[str, Any]) -> Hashable | None:
    """What requests must share to run in one pass, or None when this one must run alone
    (questions or controls that have no type-exact snapshot, or a control we do not group on)."""
    if set(controls) - set(GROUPED_CONTROLS):
        return None
    qkey = question_key(questions)
    ckey = question_key({k: controls.get(k) for k in GROUPED_CONTROLS})
    if qkey is None or ckey is None:
        return None
    return (qkey, ckey)


@dataclass
class Outcome:
    """One member's result or exception, and the times its pass began and ended (perf_counter)."""

    result: Any = None
    error: Exception | None = None
    started: float = 0.0
    ended: float = 0.0
    #: The requests the call that answered this one answered in all (its group's size).
    group_size: int = 1


def run_group(
    agent: DecisionAgent,
    states: list[Any],
    questions: Any,
    controls: dict[str, Any],
    configured_group: int,
    limits: Sequence[CallLimits | None] | None = None,
) -> list[Outcome]:
    """The blocking pass of a group, one `Outcome` per state in order: one `predict_batch` (under
    the limits the caller put around this call: `core.work.GroupLimits`), or each member alone,
    under its own `limits`, when that raised or the questions go through a tournament
    (`configured_group`: `core.tournament.plan_group`'s, 0 for none)."""
    started = time.perf_counter()
    try:
        together = (
            tournament.plan_group(agent, questions, configured_group, controls.get("head_max_len")) is None
        )
    except Exception:  # refused while planning: each member is refused alone, as it would be
        together = False
    if together and len(states) > 1:
        try:
            results = agent.predict_batch(states, questions, **controls)
        except Exception:
            pass
        else:
            ended = time.perf_counter()
            return [Outcome(result=r, started=started, ended=ended, group_size=len(states)) for r in results]
    outcomes = []
    for i, state in enumerate(states):
        t0 = time.perf_counter()
        try:
            with call_limits(limits[i] if limits is not None else None):
                result = tournament.predict_as_planned(agent, state, questions, configured_group, **controls)
            outcomes.append(Outcome(result=result, started=t0, ended=time.perf_counter()))
        except Exception as exc:
            outcomes.append(Outcome(error=exc, started=t0, ended=time.perf_counter()))
    return outcomes
