"""Readers of setting values: each takes the text of an environment variable (or a flag) and
returns its value, or raises a ValueError whose text says what the value must be; the settings
table (`laya_onnx.core.settings`) adds the variable's name and applies its failure policy."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

_TRUE = ("1", "true", "yes", "on")


def text(value: str) -> str:
    return value


def stripped(value: str) -> str:
    return value.strip()


def flag(value: str) -> bool:
    # laya-serve's _env_bool: anything but these is false, never an error.
    return value.strip().lower() in _TRUE


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value.strip())
        except ValueError:
            n = low - 1
        if n < low or (high is not None and n > high):
            if high is not None:
                raise ValueError("must be an integer %d-%d" % (low, high))
            raise ValueError("must be a positive integer" if low == 1 else "must be an integer >= %d" % low)
        return n

    return parse


positive_int = int_range(1)


def seconds(allow_zero: bool = False, unit: str = "seconds") -> Callable[[str], float]:
    """A finite number of `unit`, > 0 (>= 0 when `allow_zero`)."""

    def parse(value: str) -> float:
        try:
            seconds = float(value.strip())
        except ValueError:
            seconds = math.nan
        low_ok = seconds >= 0.0 if allow_zero else seconds > 0.0
        if not (low_ok and seconds < math.inf):
            raise ValueError("must be a number of %s %s" % (unit, ">= 0" if allow_zero else "> 0"))
        return seconds

    return parse


def choice(options: Sequence[str], reason: str | None = None) -> Callable[[str], str]:
    def parse(value: str) -> str:
        name = value.strip().lower()
        if name not in options:
            raise ValueError(reason or "must be one of %s" % ", ".join(options))
        return name

    return parse


def idle_seconds(value: str) -> float:
    # laya-serve: unreadable or not finite is off with a warning; <= 0 is off quietly.
    seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError("must be a finite number of seconds")
    return max(seconds, 0.0)


def name_list(value: str) -> list[str]:
    return [n.strip() for n in value.split(",") if n.strip()]


def extra_models(value: str) -> dict[str, Any]:
    """{name: bundle folder or Hub id, or [repo, subfolder]} as JSON."""
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise ValueError("not a JSON object (%s)" % exc) from None
    if not isinstance(data, dict):
        raise ValueError("a JSON object {name: source}, got %s" % type(data).__name__)
    out: dict[str, Any] = {}
    for name, source in data.items():
        if isinstance(source, list):
            out[name] = tuple(source)
        elif isinstance(source, str):
            out[name] = source
        else:
            raise ValueError(
                "source for %r must be a bundle folder, a Hub id, or a [repo, subfolder] pair; got %s"
                % (name, type(source).__name__)
            )
    return out


#: One or more path segments of URL-safe characters (RFC 3986 pchar); no query, no spaces.
_ROOT_PATH = re.compile(r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)+")


def root_path(value: str) -> str:
    """The public URL prefix behind a proxy ("" = none). A trailing slash is dropped ("/laya/" is
    "/laya"); anything that is not an absolute path is refused, where laya-serve would take it and
    silently never match."""
    path = value.strip().rstrip("/")
    if path and not _ROOT_PATH.fullmatch(path):
        raise ValueError("must be an absolute URL path such as /laya")
    return path


KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
_SUFFIXES = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1 << 40}
_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def byte_count(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("must be a byte count such as 2G or 512M")
    if isinstance(value, int):
        n = value
    else:
        match = _BYTES.match(str(value)) if isinstance(value, (str, float)) else None
        if match is None:
            raise ValueError("must be a byte count such as 2G, 512M or 300000000 (K/M/G/T = 1024-based)")
        n = int(float(match.group(1)) * _SUFFIXES[match.group(2).upper()])
    if n <= 0:
        raise ValueError("must be positive")
    return n


#: The level names uvicorn (and so laya-serve) accepts for the log level; `trace` is below DEBUG.
TRACE = 5
LOG_LEVELS = {
    "critical": logging.CRITICAL,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": TRACE,
}


def log_level(value: str) -> int:
    return LOG_LEVELS[choice(sorted(LOG_LEVELS))(value)]


ACCESS_LOG_MODES = ("text", "json", "off")
LOG_FORMATS = ("text", "json")
#: The Jev profiles: "typesafe" follows TypeSafe's Jev spec where it asks more than laya-serve.
JEV_PROFILES = ("typesafe",)
#: The tournament group's accepted range (laya-serve 0.4.15): above the one-pass choice cap a
#: choice admitted by the raised cap could land in one group and be read in one pass after all.
TOURNAMENT_GROUP_RANGE = (2, 100)


def tournament_group(value: str) -> int:
    return int_range(*TOURNAMENT_GROUP_RANGE)(value)


def jev_profile(value: str) -> str:
    return choice(
        JEV_PROFILES,
        "use %s, or leave it unset for laya-serve's wire format" % " or ".join(repr(p) for p in JEV_PROFILES),
    )(value)
