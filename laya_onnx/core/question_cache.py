"""Validated questions and their heads, kept across calls that ask the same questions.

A service asks the same few question sets over and over; validating them, tokenizing their
instructions and options and building their heads is most of a short call's Python time. The
cache key is a deep, type-exact snapshot of the caller's definitions (`question_key`): 1, 1.0,
True and "1" stay four different values, -0.0 is not 0.0, and dict order counts, because each of
these changes the rows or the answer keys. Definitions holding anything but plain JSON-like
values (a str or dict subclass, an object rendered with str()) are not cached: their text is not
fully captured by the key. A miss prepares the questions from the snapshot, never from the
caller's objects, so a caller mutating its dicts later cannot change a cached entry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from laya_onnx.core.questions import Question, normalize_questions
from laya_onnx.core.sequences import Head, build_heads
from laya_onnx.core.tokenizer import LayaTokenizer

#: Distinct (question set, head_max_len) pairs one agent keeps prepared (least recently used out).
QUESTION_CACHE_SIZE = 256

# Tags of the frozen forms other than str, int and None, which stand for themselves: unique
# objects, so no caller's value can equal a tagged tuple (and 1, True and 1.0 stay apart).
_FLOAT, _BOOL, _LIST, _TUPLE, _DICT = (object() for _ in range(5))


class _Uncacheable(Exception):
    pass


def _freeze(value: Any) -> Hashable:
    kind = type(value)
    if kind is str or kind is int or value is None:
        return value
    if kind is dict:
        return (
            _DICT,
            tuple(
                [
                    (k if type(k) is str else _freeze(k), v if type(v) is str else _freeze(v))
                    for k, v in value.items()
                ]
            ),
        )
    if kind is list or kind is tuple:
        return (
            _LIST if kind is list else _TUPLE,
            tuple([v if type(v) is str else _freeze(v) for v in value]),
        )
    if kind is float:
        return (_FLOAT, repr(value))  # repr: keeps -0.0 apart from 0.0, nan comparable
    if kind is bool:
        return (_BOOL, value)
    raise _Uncacheable


def _thaw(frozen: Any) -> Any:
    if type(frozen) is not tuple:
        return frozen
    tag, payload = frozen
    if tag is _DICT:
        return {_thaw(k): _thaw(v) for k, v in payload}
    if tag is _LIST:
        return [_thaw(v) for v in payload]
    if tag is _TUPLE:
        return tuple(_thaw(v) for v in payload)
    if tag is _FLOAT:
        return float(payload)
    return payload


def question_key(questions: Any) -> Hashable | None:
    """A hashable, type-exact snapshot of `questions`, or None when it cannot be cached."""
    if type(questions) is not dict:
        return None
    try:
        return _freeze(questions)
    except (_Uncacheable, RecursionError):
        return None


@dataclass(frozen=True)
class PreparedQuestions:
    """Validated questions in call order and each one's head for one `head_max_len`."""

    questions: dict[Any, Question]
    heads: dict[Any, Head]


def prepare_questions(
    tok: LayaTokenizer, questions: Mapping[Any, Any], head_max_len: int
) -> PreparedQuestions:
    qs = normalize_questions(questions)
    return PreparedQuestions(questions=qs, heads=build_heads(tok, qs, head_max_len))


class QuestionCache:
    """`get(questions, head_max_len)`: prepared questions, from a bounded LRU when the key allows.

    Thread-safe (functools.lru_cache). Refusals are not cached: a bad question set is validated,
    and refused with the same text, on every call.
    """

    def __init__(self, tok: LayaTokenizer, maxsize: int = QUESTION_CACHE_SIZE):
        self._tok = tok
        self._cached: Callable[[Hashable, int], PreparedQuestions] = functools.lru_cache(maxsize=maxsize)(
            self._prepare_frozen
        )

    def _prepare_frozen(self, key: Hashable, head_max_len: int) -> PreparedQuestions:
        return prepare_questions(self._tok, _thaw(key), head_max_len)

    def get(self, questions: Any, head_max_len: int) -> PreparedQuestions:
        key = question_key(questions)
        if key is None:
            return prepare_questions(self._tok, questions, head_max_len)
        return self._cached(key, head_max_len)

    def info(self):
        """functools' hits / misses / maxsize / currsize."""
        return self._cached.cache_info()  # type: ignore[attr-defined]
