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

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from laya_onnx.core.questions import Question, normalize_questions
from laya_onnx.core.sequences import Head, build_heads
from laya_onnx.core.tokenizer import LayaTokenizer

#: Distinct (question set, head_max_len) pairs one agent keeps prepared (least recently used out).
QUESTION_CACHE_SIZE = 256
#: A question set whose texts total more characters than this is prepared afresh on every call,
#: never kept: a service repeats short question sets, and 256 kept sets of a 2 MiB request's
#: instructions would hold half a gigabyte for good.
QUESTION_CACHE_MAX_CHARS = 64 * 1024

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


def _chars_over(frozen: Any, limit: int) -> bool:
    """Whether the texts of a frozen key total more than `limit` characters (stops once over)."""
    total, stack = 0, [frozen]
    while stack:
        item = stack.pop()
        if type(item) is str:
            total += len(item)
            if total > limit:
                return True
        elif type(item) is tuple:
            stack.extend(item)
    return False


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


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    maxsize: int
    currsize: int


class QuestionCache:
    """`get(questions, head_max_len)`: prepared questions, from a bounded LRU when the key allows.

    Thread-safe. Refusals are not cached: a bad question set is validated, and refused with the
    same text, on every call. Neither is a set over QUESTION_CACHE_MAX_CHARS characters of text.
    """

    def __init__(self, tok: LayaTokenizer, maxsize: int = QUESTION_CACHE_SIZE):
        self._tok = tok
        self.maxsize = maxsize
        self._entries: OrderedDict[tuple[Hashable, int], PreparedQuestions] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = 0

    def get(self, questions: Any, head_max_len: int) -> PreparedQuestions:
        key = question_key(questions)
        if key is None:
            return prepare_questions(self._tok, questions, head_max_len)
        entry = (key, head_max_len)
        with self._lock:
            prepared = self._entries.get(entry)
            if prepared is not None:
                self._entries.move_to_end(entry)
                self._hits += 1
                return prepared
            self._misses += 1
        # prepared from the snapshot, never from the caller's objects (the module docstring)
        prepared = prepare_questions(self._tok, _thaw(key), head_max_len)
        if self.maxsize > 0 and not _chars_over(key, QUESTION_CACHE_MAX_CHARS):
            with self._lock:
                self._entries[entry] = prepared
                while len(self._entries) > self.maxsize:
                    self._entries.popitem(last=False)
        return prepared

    def info(self) -> CacheInfo:
        """Hits, misses, maxsize and the entries kept now."""
        with self._lock:
            return CacheInfo(self._hits, self._misses, self.maxsize, len(self._entries))
