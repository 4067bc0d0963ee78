"""Named prediction hooks a parity suite request can ask for (`"hooks": NAME`).

A suite is JSON, so it names its hooks; both runtimes get fresh instances of the same hooks.
Each case exercises one documented hook power on a scan (`predict_long`): answering the call,
rewriting the windows, re-budgeting the scan, adding or rewriting questions.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

#: A start hook's own answer (no model involved): what a cache would return.
CACHED_RESULT = {
    "model": "cache",
    "answers": {"cached": {"type": "noul", "noul": 0.25, "confidence": 0.75}},
    "usage": {"input_tokens": 0, "output_tokens": 0},
}


def _skip(ctx) -> None:
    ctx.skip([copy.deepcopy(CACHED_RESULT)])


def _skip_per_state(ctx) -> None:
    ctx.skip([copy.deepcopy(CACHED_RESULT) for _ in ctx.states])


def _every_other_state(ctx) -> None:
    ctx.states = list(ctx.states)[::2]


def _no_states(ctx) -> None:
    ctx.states = []


def _shrink_max_len(ctx) -> None:
    ctx.max_len = 120


def _add_question(ctx) -> None:
    ctx.questions = {**ctx.questions, "added": {"type": "noul", "instructions": "Is anything urgent?"}}


def _drop_added_answer(ctx) -> None:
    for result in ctx.results or []:
        result["answers"].pop("added", None)


def _reword_in_place(ctx) -> None:
    for qdef in ctx.questions.values():
        if qdef.get("type") == "choice" and isinstance(qdef.get("criteria"), dict):
            qdef["criteria"]["zz"] = "another option the start hook added " * 6


def _drop_a_window_result(ctx) -> None:
    if ctx.results and len(ctx.results) > 1:
        ctx.results = ctx.results[1:]


#: name -> the hook keyword arguments it stands for.
HOOK_CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "skip": lambda: {"on_predict_start": [_skip]},
    "skip-per-state": lambda: {"on_predict_start": [_skip_per_state]},
    "every-other-state": lambda: {"on_predict_start": [_every_other_state]},
    "no-states": lambda: {"on_predict_start": [_no_states]},
    "shrink-max-len": lambda: {"on_predict_start": [_shrink_max_len]},
    "add-question": lambda: {"on_predict_start": [_add_question]},
    "add-then-drop-question": lambda: {
        "on_predict_start": [_add_question],
        "on_predict_end": [_drop_added_answer],
    },
    "reword-in-place": lambda: {"on_predict_start": [_reword_in_place]},
    "drop-a-window-result": lambda: {"on_predict_end": [_drop_a_window_result]},
}


def hook_case(name: str | None) -> dict[str, Any]:
    """Fresh hook keyword arguments for case `name` ({} for None)."""
    if name is None:
        return {}
    if name not in HOOK_CASES:
        raise LookupError(f"unknown hook case {name!r}; known: {sorted(HOOK_CASES)}")
    return HOOK_CASES[name]()
