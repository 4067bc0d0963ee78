"""Warnings as log lines, for the command line and the server, in bounded memory.

The library reports what a caller should know (a provider that fell back, a reduced-precision
bundle, clamped temperatures, a state cut at `max_len`) as Python warnings, which an application
filters or turns into errors as it likes. A command or a server has no caller to do that: Python's
default display prints the warning's file and line and the source line that issued it (noise to an
operator), and the same warning from another call site prints again. `log_warnings()` routes them
to the `laya_onnx` logger instead, one line each, each text at most once while it is among the
`SEEN_TEXTS` most recent distinct texts.

A long-running server sees texts without end (a warning may name a question id a client chose), so
nothing here grows with them: the texts already shown are remembered as fixed-size digests in an
LRU, Python's own per-module registry of shown warnings is bypassed (the "always" action adds
nothing to it), a line is cut at `MAX_LINE` characters, and the library cuts every string a user
chose (`brief`) before it goes into a warning.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import warnings
from collections import OrderedDict
from typing import Any

#: The library's own prefix on warning texts; a log line already says where it comes from.
_PREFIXES = ("laya-onnx: ", "laya: ")
#: Distinct warning texts remembered as shown (16-byte digests, so about 1.5 KiB per 10).
SEEN_TEXTS = 4096
#: The longest warning line logged, in characters.
MAX_LINE = 2000
#: The longest user-chosen string (an id, a label, a path) quoted whole in a warning.
MAX_QUOTED = 80


def brief(value: Any, limit: int = MAX_QUOTED) -> str:
    """`repr(value)` for a warning or a log line, cut to about `limit` characters with the full
    length said, so a client's 1 MB question id costs a line, not a megabyte."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(value) if isinstance(value, str) else text
    return "%r... (%d characters)" % (text[:limit], len(text))


def cut(text: str, limit: int) -> str:
    """`text` whole up to `limit` characters, else its start and its full length."""
    return text if len(text) <= limit else "%s... (%d characters)" % (text[:limit], len(text))


def one_line(message: Warning | str) -> str:
    text = " ".join(str(message).split())
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    return cut(text, MAX_LINE)


class SeenTexts:
    """The most recent `size` distinct texts, as digests: `first(text)` is True when `text` is
    not among them (and remembers it, forgetting the oldest past `size`)."""

    def __init__(self, size: int = SEEN_TEXTS) -> None:
        self.size = size
        self._digests: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._digests)

    def first(self, text: str) -> bool:
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        with self._lock:
            if digest in self._digests:
                self._digests.move_to_end(digest)
                return False
            self._digests[digest] = None
            if len(self._digests) > self.size:
                self._digests.popitem(last=False)
            return True


def log_warnings(logger: str = "laya_onnx", seen: SeenTexts | None = None) -> SeenTexts:
    """Show every warning from here on as one WARNING line of `logger`, each text once while it
    is among the recent distinct ones; returns the bounded set of texts shown."""
    log = logging.getLogger(logger)
    shown = seen if seen is not None else SeenTexts()

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        text = one_line(message)
        if shown.first(text):
            log.warning("%s", text)

    warnings.showwarning = show
    # "always" hands every warning to `show` and, unlike "default" or "once", records nothing in
    # the issuing module's `__warningregistry__` or in `warnings.onceregistry`: `shown` alone
    # decides what repeats, in bounded memory.
    warnings.simplefilter("always")
    return shown
