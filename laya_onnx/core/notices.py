"""Warnings as log lines, for the command line and the server.

The library reports what a caller should know (a provider that fell back, a reduced-precision
bundle, clamped temperatures, a state cut at `max_len`) as Python warnings, which an application
filters or turns into errors as it likes. A command or a server has no caller to do that: Python's
default display prints the warning's file and line and the source line that issued it (noise to an
operator), and the same warning from another call site prints again. `log_warnings()` routes them
to the `laya_onnx` logger instead, one line each, each text at most once per process.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

#: The library's own prefix on warning texts; a log line already says where it comes from.
_PREFIXES = ("laya-onnx: ", "laya: ")


def one_line(message: Warning | str) -> str:
    text = " ".join(str(message).split())
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def log_warnings(logger: str = "laya_onnx") -> None:
    """Show every warning from here on as one WARNING line of `logger`, each text once."""
    log = logging.getLogger(logger)
    seen: set[str] = set()
    lock = threading.Lock()

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        text = one_line(message)
        with lock:
            if text in seen:
                return
            seen.add(text)
        log.warning("%s", text)

    warnings.showwarning = show
    # "default" shows each (text, category, place) once; `show` folds the places together
    warnings.simplefilter("default")
