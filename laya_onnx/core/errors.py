"""Exception types for caller mistakes and unusable settings, shared by the runtime, the CLI and the server.

A request the caller got wrong (an unknown question type, a budget too small, a state that
cannot be encoded) raises `InvalidRequest` (a `ValueError`) or `InvalidRequestType` (a
`TypeError`), with the reference's own texts, so code written against `laya` that catches
ValueError/TypeError keeps working. Anything else that escapes inference (numpy, onnxruntime,
a hook's own ValueError) is *not* the caller's mistake: the server logs it and answers 500,
and only these two types become a 422 with their text.
"""

from __future__ import annotations

from typing import Any


class UserError(Exception):
    """Base of every error a user can cause and fix: a request, an argument, a setting, a path, a
    bundle, a checkpoint, a file to read. The command line reports any of them as one line and
    exits 2 (`laya_onnx.cli.errors`); never raised by itself."""


class LayaInputError(UserError):
    """Base of every mistake in what a caller passes to a call (a request, a question, a path to
    load): the server answers it with a 4xx and its text. Never raised by itself."""


class InvalidRequest(LayaInputError, ValueError):
    """A value the caller passed is not acceptable (reference type: ValueError)."""


class InvalidRequestType(LayaInputError, TypeError):
    """A value the caller passed has the wrong type (reference type: TypeError)."""


class _CallerValue:
    # A class, not @contextmanager: this wraps every tokenizer call, and a generator-based
    # manager creates a generator and a wrapper object on each use.
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, _tb: Any) -> None:
        if exc is None or isinstance(exc, LayaInputError):
            return
        if isinstance(exc, TypeError):
            raise InvalidRequestType(str(exc)) from exc
        if isinstance(exc, ValueError):
            raise InvalidRequest(str(exc)) from exc


_CALLER_VALUE = _CallerValue()


def caller_value() -> _CallerValue:
    """Where the core hands a caller's value to a library (json.dumps of a state, the tokenizer
    on a text), what the library refuses is the caller's mistake: its TypeError/ValueError is
    re-raised as InvalidRequestType/InvalidRequest with the library's text unchanged."""
    return _CALLER_VALUE


class PassTooLarge(InvalidRequest):
    """One row alone needs more memory than a forward pass may use (`max_pass_memory`); nothing
    was run. The server answers it with 413 and this text, not 422: the request is well formed,
    only too large for this server's budget."""


class SourceNotFound(LayaInputError, FileNotFoundError):
    """A path or name the caller gave (a checkpoint, a bundle, a models directory, a calibration
    file) that is not there, locally or on the Hub; the message says where it was looked for, and
    the nearest local names where there are some."""


class SourceNotADirectory(LayaInputError, NotADirectoryError):
    """A checkpoint or bundle argument that names a file where a directory is expected."""


class StateTruncatedWarning(UserWarning):
    """A state was cut to fit `max_len`; `predict_long` reads it whole."""


class UnknownFieldWarning(UserWarning):
    """A request or question carries a field nothing reads (often a misspelling, `critera`): it is
    accepted and ignored, as laya does, and named with the nearest known field
    (`laya_onnx.core.questions.unknown_fields`)."""


class ConfigError(UserError, ValueError):
    """A setting that cannot be used (a `LAYA_*` variable, a flag, a `create_app` setting); the
    message names the variable or flag at fault.

    A ValueError, so `laya-onnx` reports it as one line and exits 2 like every other usage
    mistake, and a library caller of `run_server`/`create_app` gets an exception, not an exit.
    """


def reference_kind(exc: BaseException) -> str:
    """The exception class name the reference would raise for `exc` ("ValueError", ...).

    Parity compares refusals by kind and text; our subclasses report their builtin base.
    """
    for base in (ValueError, TypeError, KeyError):
        if isinstance(exc, base):
            return base.__name__
    return type(exc).__name__


__all__ = [
    "ConfigError",
    "InvalidRequest",
    "InvalidRequestType",
    "LayaInputError",
    "PassTooLarge",
    "SourceNotADirectory",
    "SourceNotFound",
    "StateTruncatedWarning",
    "UnknownFieldWarning",
    "UserError",
    "caller_value",
    "reference_kind",
]
