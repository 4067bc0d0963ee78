"""Exception types for caller mistakes, shared by the runtime, the CLI and the server.

A request the caller got wrong (an unknown question type, a budget too small, a state that
cannot be encoded) raises `InvalidRequest` (a `ValueError`) or `InvalidRequestType` (a
`TypeError`), with the reference's own texts, so code written against `laya` that catches
ValueError/TypeError keeps working. Anything else that escapes inference (numpy, onnxruntime,
a hook's own ValueError) is *not* the caller's mistake: the server logs it and answers 500,
and only these two types become a 422 with their text.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class LayaInputError(Exception):
    """Base of every caller mistake the core reports; never raised by itself."""


class InvalidRequest(LayaInputError, ValueError):
    """A value the caller passed is not acceptable (reference type: ValueError)."""


class InvalidRequestType(LayaInputError, TypeError):
    """A value the caller passed has the wrong type (reference type: TypeError)."""


@contextmanager
def caller_value() -> Iterator[None]:
    """Where the core hands a caller's value to a library (json.dumps of a state, the tokenizer
    on a text), what the library refuses is the caller's mistake: its TypeError/ValueError is
    re-raised as InvalidRequestType/InvalidRequest with the library's text unchanged."""
    try:
        yield
    except LayaInputError:
        raise
    except TypeError as exc:
        raise InvalidRequestType(str(exc)) from exc
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc


class PassTooLarge(InvalidRequest):
    """One row alone needs more memory than a forward pass may use (`max_pass_memory`); nothing
    was run. The server answers it with 413 and this text, not 422: the request is well formed,
    only too large for this server's budget."""


def reference_kind(exc: BaseException) -> str:
    """The exception class name the reference would raise for `exc` ("ValueError", ...).

    Parity compares refusals by kind and text; our subclasses report their builtin base.
    """
    for base in (ValueError, TypeError, KeyError):
        if isinstance(exc, base):
            return base.__name__
    return type(exc).__name__


__all__ = [
    "InvalidRequest",
    "InvalidRequestType",
    "LayaInputError",
    "PassTooLarge",
    "caller_value",
    "reference_kind",
]
