"""Choice questions with more options than one pass reads well, answered by elimination.

One pass gives every option of a question a share of one `head_max_len` window; past a few dozen
options the shares shrink to a few tokens and the options stop being told apart. A tournament
reads them in groups instead (laya 0.4.15's `shortlist.predict_tournament`, restated here):

  * a choice with more than `group_size` labels is cut, in criteria order, into
    ceil(n / group_size) contiguous groups of near-equal size;
  * one predict call answers every group of every such choice (the groups go in as separate
    questions named "0", "1", ... so they share one forward pass), and each group's `choice`
    goes through to the next round;
  * rounds repeat until no choice has more than `group_size` labels left; a final call then
    answers every question of the request, each narrowed choice cut to its finalists.

The answer keeps the shape of a one-pass answer (laya-serve's `_predict_with_tournament`):
`probabilities` names every option in criteria order, the finalists carry the final call's
probabilities and an eliminated option carries 0.0, so the values still sum to 1 and `choice` is
still their argmax; `x_tournament` = {finalists, rounds[, option_order_dropped]} says which
options the final call scored. `confidence`, `answer_confidence` and the gate keys are the final
call's; `usage.input_tokens` is summed over every call, the other usage keys are the final call's.

A narrowed choice loses its `option_order` (one RuntimeWarning per question): the order has one
slot per option and no longer fits the kept labels, and remapping it would move options between
slots.

`predict` is any callable with `ONNXAgent.predict`'s shape, so the server runs the same code
over whatever agent it fronts. Nothing here imports torch.

Which requests the front ends (the server, its micro-batches, `laya-onnx score`) answer by
elimination, and with what group (`plan_group`, run on the worker: deriving a group tokenizes
option texts):

  * a configured group `g` (2..100; the server's LAYA_TOURNAMENT_GROUP) is laya-serve 0.4.15's
    `_tournament_plan`, restated: every choice over `g` options is narrowed, except that while
    no choice is over 100 options (what one pass was ever asked to read) a choice with an
    `option_order` or a non-string label keeps the whole request on one pass; once one is over
    100, orders are dropped and a non-string label is refused, since a narrowed label must map
    back onto the JSON answer.
  * none (0, our default; laya-serve refuses such requests with a 413): a request is narrowed
    only when a choice has more than 100 options, so every request laya-serve answers is
    answered exactly as it does. The group is the largest one whose options keep all their
    tokens in the request's `head_max_len` (`DecisionAgent.tournament_group_size`), at most 100.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from laya_onnx.core.errors import InvalidRequest, InvalidRequestType
from laya_onnx.core.notices import brief
from laya_onnx.core.protocol import DecisionAgent
from laya_onnx.core.questions import check_question, normalize_questions
from laya_onnx.core.sequences import OPTION_SHRINK_BELOW, option_spans
from laya_onnx.core.tokenizer import LayaTokenizer

#: laya.shortlist.DEFAULT_TOURNAMENT_GROUP: the group size when nothing better is known.
DEFAULT_GROUP_SIZE = 16
MIN_GROUP_SIZE = 2
#: laya-serve's choice cap without LAYA_TOURNAMENT_GROUP: what one pass is ever asked to read.
MAX_ONE_PASS_CHOICE_OPTIONS = 100

Predict = Callable[..., dict[str, Any]]


def check_group_size(group_size: Any) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < MIN_GROUP_SIZE:
        raise InvalidRequest("group_size must be an integer of at least 2, got %r" % (group_size,))
    return group_size


def requested_group(
    agent: DecisionAgent, tournament: Any, questions: Any, head_max_len: int | None = None
) -> int | None:
    """The group size a call's `tournament` argument asks for (`ONNXAgent.predict`), or None for
    one plain pass: True derives it (`DecisionAgent.tournament_group_size`), an int is checked."""
    if tournament is None or tournament is False:
        return None
    if tournament is True:
        return agent.tournament_group_size(questions, head_max_len)
    try:
        return check_group_size(tournament)
    except ValueError:
        raise InvalidRequest(
            "tournament must be True, False/None, or a group size of at least 2, got %r" % (tournament,)
        ) from None


def choice_labels(qid: Any, criteria: Any) -> list[Any]:
    """A choice's labels in criteria order (dict keys, or the list itself)."""
    if isinstance(criteria, dict):
        labels = list(criteria)
    elif isinstance(criteria, list):
        labels = list(criteria)
    else:
        raise InvalidRequestType(
            "question %r: choice criteria must be a dict or list, got %s" % (qid, type(criteria).__name__)
        )
    return labels


def split_groups(labels: list[Any], group_size: int) -> list[list[Any]]:
    """`labels` cut into ceil(n / group_size) contiguous groups whose sizes differ by at most one."""
    n = len(labels)
    parts = -(-n // group_size)
    return [labels[i * n // parts : (i + 1) * n // parts] for i in range(parts)]


def large_choices(questions: Mapping[Any, Any], group_size: int) -> dict[Any, list[Any]]:
    """{qid: labels} for every choice with more than `group_size` options, in question order."""
    large = {}
    for qid, q in questions.items():
        if isinstance(q, dict) and q.get("type") == "choice":
            criteria = q.get("criteria")
            if isinstance(criteria, (dict, list)) and len(criteria) > group_size:
                large[qid] = choice_labels(qid, criteria)
    return large


def fitting_group_size(span_lengths: Iterable[list[int]], head_max_len: int) -> int | None:
    """The largest group size at which every choice's options keep all their tokens, or None.

    `span_lengths` holds one list per choice question: each option's span length (its [MASK]
    plus its text tokens) as one pass would build it. A choice whose options all fit one head
    puts no bound on the group; for the others, any `g` of their longest options must fit, so
    every group of every round (finalists are a subset) is read without shrinking. None means
    every choice fits and one pass is enough. The floor is 2: a tournament needs pairs.
    """
    bound = None
    for lengths in span_lengths:
        ordered = sorted(lengths, reverse=True)
        if head_max_len - sum(ordered) >= OPTION_SHRINK_BELOW:
            continue
        g, used = 0, 0
        for length in ordered:
            if head_max_len - (used + length) < OPTION_SHRINK_BELOW:
                break
            used += length
            g += 1
        g = max(MIN_GROUP_SIZE, g)
        bound = g if bound is None else min(bound, g)
    return bound


def questions_group_size(tok: LayaTokenizer, questions: Any, head_max_len: int) -> int | None:
    """`fitting_group_size` for the choices of `questions`, their options' spans as `tok` and one
    pass of `head_max_len` tokens build them."""
    spans = [option_spans(tok, q) for q in normalize_questions(questions).values() if q.type == "choice"]
    return fitting_group_size([[len(span) for span in q_spans] for q_spans in spans], head_max_len)


def _narrowed(qid: Any, question: dict[str, Any], labels: list[Any], warned: set) -> dict[str, Any]:
    criteria = question["criteria"]
    kept = {label: criteria[label] for label in labels} if isinstance(criteria, dict) else list(labels)
    narrowed = {k: v for k, v in question.items() if k != "option_order"}
    narrowed["criteria"] = kept
    if "option_order" in question and qid not in warned:
        warned.add(qid)
        warnings.warn(
            "question %s: 'option_order' was dropped because the tournament narrowed its %d "
            "options to %d; the order has one slot per option and remapping it would move "
            "options between slots" % (brief(qid), len(criteria), len(labels)),
            RuntimeWarning,
            stacklevel=3,
        )
    return narrowed


def _answers(result: Any) -> dict[Any, Any]:
    if not isinstance(result, dict):
        raise TypeError("predict must return a dict, got %s" % type(result).__name__)
    answers = result.get("answers")
    if not isinstance(answers, dict):
        raise TypeError("predict must return an answers dict, got %s" % type(answers).__name__)
    return answers


def run_tournament(
    predict: Predict, state: Any, questions: dict[Any, Any], group_size: int, **predict_kwargs: Any
) -> dict[str, Any]:
    """Answer `questions`, narrowing every choice over `group_size` options by elimination.

    `predict_kwargs` go to every call (budgets, lang, min_confidence, ...). With no choice over
    `group_size` this is exactly one `predict` call. The caller's questions are not mutated.
    """
    group_size = check_group_size(group_size)
    if not isinstance(questions, dict):
        raise InvalidRequestType(
            "questions must be a dict of question id -> definition, got %s" % type(questions).__name__
        )
    large = large_choices(questions, group_size)
    if not large:
        return predict(state, questions, **predict_kwargs)
    # Checked up front so a bad question is refused under its own id, not as a round's "0", "1".
    for qid, q in questions.items():
        check_question(qid, q)

    field = {qid: list(labels) for qid, labels in large.items()}
    rounds = dict.fromkeys(large, 0)
    warned: set = set()
    input_tokens = 0
    while True:
        groups = [
            (qid, part)
            for qid, labels in field.items()
            if len(labels) > group_size
            for part in split_groups(labels, group_size)
        ]
        if not groups:
            break
        round_questions = {
            str(i): _narrowed(qid, questions[qid], part, warned) for i, (qid, part) in enumerate(groups)
        }
        result = predict(state, round_questions, **predict_kwargs)
        answers = _answers(result)
        input_tokens += (result.get("usage") or {}).get("input_tokens", 0)
        winners: dict[Any, list[Any]] = {}
        for i, (qid, _part) in enumerate(groups):
            winners.setdefault(qid, []).append(answers[str(i)]["choice"])
        for qid, kept in winners.items():
            field[qid] = kept
            rounds[qid] += 1

    final_questions = dict(questions)
    for qid, labels in field.items():
        final_questions[qid] = _narrowed(qid, questions[qid], labels, warned)
    final = predict(state, final_questions, **predict_kwargs)
    answers = dict(_answers(final))
    input_tokens += (final.get("usage") or {}).get("input_tokens", 0)
    for qid, labels in large.items():
        answer = answers.get(qid)
        if not isinstance(answer, dict):
            continue
        scored = answer.get("probabilities") or {}
        report: dict[str, Any] = {"finalists": list(field[qid]), "rounds": rounds[qid]}
        if questions[qid].get("option_order") is not None:
            report["option_order_dropped"] = True
        answers[qid] = {
            **answer,
            "probabilities": {label: scored.get(label, 0.0) for label in labels},
            "x_tournament": report,
        }
    usage = dict(final.get("usage") or {})
    usage["input_tokens"] = input_tokens
    return {**final, "answers": answers, "usage": usage}


# -- which requests are answered by elimination ----------------------------------------------


def _over_one_pass(large: dict[Any, list[Any]]) -> bool:
    return any(len(labels) > MAX_ONE_PASS_CHOICE_OPTIONS for labels in large.values())


def _refuse_unmappable(large: dict[Any, list[Any]]) -> None:
    for qid, labels in large.items():
        if not all(isinstance(label, str) for label in labels):
            raise InvalidRequest(
                "question %r: a choice is narrowed by elimination once a request has one over %d "
                "options, and that needs every label to be a string" % (qid, MAX_ONE_PASS_CHOICE_OPTIONS)
            )


def _derived_group(agent: DecisionAgent, questions: dict[Any, Any], head_max_len: int | None) -> int | None:
    group = agent.tournament_group_size(questions, head_max_len)
    return None if group is None else min(group, MAX_ONE_PASS_CHOICE_OPTIONS)


def plan_group(
    agent: DecisionAgent, questions: Any, configured_group: int, head_max_len: int | None = None
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


def predict_as_planned(
    agent: DecisionAgent, state: Any, questions: Any, configured_group: int, **controls: Any
) -> dict[str, Any]:
    """`agent.predict`, through a tournament when `plan_group` says so."""
    group = plan_group(agent, questions, configured_group, controls.get("head_max_len"))
    if group is None:
        return agent.predict(state, questions, **controls)
    return run_tournament(agent.predict, state, questions, group, **controls)


def predict_batch_as_planned(
    agent: DecisionAgent, states: list[Any], questions: Any, configured_group: int, **controls: Any
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


__all__ = [
    "DEFAULT_GROUP_SIZE",
    "MAX_ONE_PASS_CHOICE_OPTIONS",
    "check_group_size",
    "choice_labels",
    "fitting_group_size",
    "large_choices",
    "plan_group",
    "predict_as_planned",
    "predict_batch_as_planned",
    "run_tournament",
    "split_groups",
]
