"""Server configuration: environment variables, parsed once and validated.

Everything is an environment variable (plus `--host/--port` on the command line), so one
image serves a laptop run and a systemd unit alike. laya-serve's variables follow laya-serve
0.4.15 (http.md §4): blank means unset; a number that cannot be read falls back to its default,
except the bind port and the log level, which are refused with a `ConfigError` instead — a server
bound somewhere its operator did not ask for is unreachable, not degraded. The variables that are
ours alone (timeouts, the shutdown grace, the access log, the root path) are refused the same way
when they cannot be read: there is no compatibility to keep, and a typo in a limit should not
silently become another limit.

Unlike laya-serve, the default bind address is 127.0.0.1: a server is reachable from other
hosts only when its operator says so (`--host 0.0.0.0`; the images and the unit do).
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, fields
from typing import Any

log = logging.getLogger("laya_onnx.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_LOG_LEVEL = "info"
DEFAULT_MAX_CONCURRENT = 16
DEFAULT_BODY_READ_TIMEOUT = 10.0
DEFAULT_MAX_TOKEN_BUDGET = 8192
DEFAULT_MAX_BATCH_TOKENS = 131072
#: LAYA_BATCH_MAX_REQUESTS: the most single decisions one micro-batch holds.
DEFAULT_BATCH_MAX_REQUESTS = 32
#: Seconds a SIGTERM/SIGINT drain may take, signal to exit; the unit's TimeoutStopSec is above it.
DEFAULT_SHUTDOWN_GRACE = 30.0
#: Seconds an idle connection (no request started) is kept open. Above the idle timeouts of the
#: usual proxies in front (nginx upstream keepalive 60 s, AWS ALB 60 s), so the proxy closes
#: first and never reuses a connection this server is closing.
DEFAULT_KEEPALIVE_TIMEOUT = 75.0
#: Seconds from a request's first byte to the end of its headers before a 408 (slowloris).
DEFAULT_HEADER_READ_TIMEOUT = 10.0
ACCESS_LOG_MODES = ("text", "json", "off")
DEFAULT_ACCESS_LOG = "text"

#: The level names uvicorn (and so laya-serve) accepts for LAYA_LOG_LEVEL; `trace` is below DEBUG.
TRACE = 5
LOG_LEVELS = {
    "critical": logging.CRITICAL,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": TRACE,
}


class ConfigError(ValueError):
    """A setting the server cannot start with; the message names the variable or flag at fault.

    A ValueError, so `laya-onnx serve` reports it as one line and exits 2 like every other
    usage mistake, and a library caller of `run_server`/`create_app` gets an exception, not an exit.
    """


def env_text(name: str) -> str | None:
    """The variable as set, or None when it is unset or blank: one reading of LAYA_* for all."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value


def env_int(name: str) -> int | None:
    """The variable as an int, or None when it is unset, blank or not an int (each caller then
    applies laya-serve's own fallback for that variable)."""
    value = env_text(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def env_bool(name: str, default: bool = False) -> bool:
    """Unset or blank gives `default`; only 1/true/yes/on (any case) are true."""
    value = env_text(name)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def _positive_int(name: str, default: int, warn: bool) -> int:
    value = env_text(name)
    if value is None:
        return default
    try:
        n = int(value.strip())
    except ValueError:
        if warn:
            log.warning("invalid %s %r; falling back to %d", name, value, default)
        return default
    if n <= 0:
        if warn:
            log.warning("%s must be positive (got %d); falling back to %d", name, n, default)
        return default
    return n


def max_concurrent_from_env() -> int:
    return _positive_int("LAYA_MAX_CONCURRENT", DEFAULT_MAX_CONCURRENT, warn=False)


def max_token_budget_from_env() -> int:
    return _positive_int("LAYA_MAX_TOKEN_BUDGET", DEFAULT_MAX_TOKEN_BUDGET, warn=True)


def max_batch_tokens_from_env() -> int:
    return _positive_int("LAYA_MAX_BATCH_TOKENS", DEFAULT_MAX_BATCH_TOKENS, warn=True)


def body_read_timeout_from_env() -> float:
    value = env_text("LAYA_BODY_READ_TIMEOUT")
    if value is None:
        return DEFAULT_BODY_READ_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        return DEFAULT_BODY_READ_TIMEOUT
    return seconds if 0.0 < seconds < math.inf else DEFAULT_BODY_READ_TIMEOUT


def seconds_from_env(name: str, default: float, *, allow_zero: bool = False, unit: str = "seconds") -> float:
    """A finite, positive number of seconds (0 too when `allow_zero`); blank gives `default`.
    `unit` only names what the number counts in the refusal."""
    value = env_text(name)
    if value is None:
        return default
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = math.nan
    low_ok = seconds >= 0.0 if allow_zero else seconds > 0.0
    if not (low_ok and seconds < math.inf):
        raise ConfigError(
            "invalid %s %r: must be a number of %s %s" % (name, value, unit, ">= 0" if allow_zero else "> 0")
        )
    return seconds


def batch_window_ms_from_env() -> float:
    """LAYA_BATCH_WINDOW_MS: how long a single decision waits for others to share its pass
    (`serve.microbatch`); unset, blank or 0: off. A bad value refuses to start (ConfigError)."""
    return seconds_from_env("LAYA_BATCH_WINDOW_MS", 0.0, allow_zero=True, unit="milliseconds")


def batch_max_requests_from_env() -> int:
    """LAYA_BATCH_MAX_REQUESTS: a micro-batch runs as soon as it holds this many requests."""
    return _positive_int("LAYA_BATCH_MAX_REQUESTS", DEFAULT_BATCH_MAX_REQUESTS, warn=True)


def access_log_from_env() -> str:
    """LAYA_ACCESS_LOG: `text` (one line per request), `json` (one JSON object per line) or `off`."""
    value = env_text("LAYA_ACCESS_LOG")
    if value is None:
        return DEFAULT_ACCESS_LOG
    mode = value.strip().lower()
    if mode not in ACCESS_LOG_MODES:
        raise ConfigError(
            "invalid LAYA_ACCESS_LOG %r: must be one of %s" % (value, ", ".join(ACCESS_LOG_MODES))
        )
    return mode


#: One or more path segments of URL-safe characters (RFC 3986 pchar); no query, no spaces.
_ROOT_PATH = re.compile(r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)+")


def normalize_root_path(value: str | None, what: str = "LAYA_ROOT_PATH") -> str:
    """The public URL prefix behind a proxy ("" = none), as laya-serve's LAYA_ROOT_PATH.

    The routes answer both with and without it (Starlette's root_path behaviour, http.md §1).
    A trailing slash is dropped ("/laya/" is "/laya"); anything that is not an absolute path is
    refused, where laya-serve would take it and silently never match.
    """
    path = (value or "").strip().rstrip("/")
    if not path:
        return ""
    if not _ROOT_PATH.fullmatch(path):
        raise ConfigError("invalid %s %r: must be an absolute URL path such as /laya" % (what, value))
    return path


def root_path_from_env() -> str:
    return normalize_root_path(env_text("LAYA_ROOT_PATH"))


#: LAYA_TOURNAMENT_GROUP's accepted range (laya-serve 0.4.15): above the one-pass choice cap a
#: choice admitted by the raised cap could land in one group and be read in one pass after all.
TOURNAMENT_GROUP_RANGE = (2, 100)
#: LAYA_JEV_PROFILE values: "typesafe" follows TypeSafe's Jev spec where it asks more than laya-serve.
JEV_PROFILES = ("typesafe",)


def tournament_group_from_env() -> int:
    """LAYA_TOURNAMENT_GROUP as laya-serve reads it: an int in 2..100, anything else 0 (unset)."""
    n = env_int("LAYA_TOURNAMENT_GROUP")
    low, high = TOURNAMENT_GROUP_RANGE
    return n if n is not None and low <= n <= high else 0


def check_jev_profile(value: str | None) -> str | None:
    """None (laya-serve's wire format) or a known profile; anything else is refused by name."""
    if value is None or not value.strip():
        return None
    name = value.strip().lower()
    if name not in JEV_PROFILES:
        raise ConfigError(
            "invalid LAYA_JEV_PROFILE %r: use %s, or leave it unset for laya-serve's wire format"
            % (value, " or ".join(repr(p) for p in JEV_PROFILES))
        )
    return name


def api_key_from_env() -> str | None:
    # Not stripped: the key is compared byte for byte, and an empty value means "no auth".
    return os.environ.get("LAYA_API_KEY") or None


def resolve_host(cli_value: str | None = None) -> str:
    if cli_value is not None and cli_value.strip():
        return cli_value.strip()
    value = env_text("LAYA_HOST")
    return value.strip() if value is not None else DEFAULT_HOST


def resolve_port(cli_value: int | None = None) -> int:
    """`--port` wins over LAYA_PORT; either one outside 1-65535 is a ConfigError."""
    if cli_value is not None:
        if isinstance(cli_value, bool) or not isinstance(cli_value, int) or not 1 <= cli_value <= 65535:
            raise ConfigError("invalid --port %r: must be an integer 1-65535" % (cli_value,))
        return cli_value
    value = env_text("LAYA_PORT")
    if value is None:
        return DEFAULT_PORT
    try:
        port = int(value.strip())
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise ConfigError("invalid LAYA_PORT %r: must be an integer 1-65535" % (value,))
    return port


def resolve_log_level() -> int:
    raw = os.environ.get("LAYA_LOG_LEVEL", DEFAULT_LOG_LEVEL)
    name = raw.strip().lower() or DEFAULT_LOG_LEVEL
    if name not in LOG_LEVELS:
        raise ConfigError(
            "invalid LAYA_LOG_LEVEL %r: must be one of %s" % (raw.strip(), ", ".join(sorted(LOG_LEVELS)))
        )
    return LOG_LEVELS[name]


@dataclass(frozen=True)
class ServerLimits:
    """What the process around the app runs with: connection timeouts, drain, access log.

    Read by `run_server` before the bundle is loaded, so a bad value exits in milliseconds.
    """

    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT
    header_read_timeout: float = DEFAULT_HEADER_READ_TIMEOUT
    access_log: str = DEFAULT_ACCESS_LOG

    @classmethod
    def from_env(cls) -> ServerLimits:
        return cls(
            shutdown_grace=seconds_from_env(
                "LAYA_SHUTDOWN_GRACE_SECONDS", DEFAULT_SHUTDOWN_GRACE, allow_zero=True
            ),
            keepalive_timeout=seconds_from_env("LAYA_KEEPALIVE_TIMEOUT", DEFAULT_KEEPALIVE_TIMEOUT),
            header_read_timeout=seconds_from_env("LAYA_HEADER_READ_TIMEOUT", DEFAULT_HEADER_READ_TIMEOUT),
            access_log=access_log_from_env(),
        )


@dataclass(frozen=True)
class Settings:
    """What one app instance runs with.

    `api_key`, `max_concurrent`, `body_read_timeout`, `root_path`, `tournament_group` and
    `jev_profile` are fixed when the app is built. `max_token_budget`, `max_batch_tokens` and
    `jev_strict` are read from the environment on every request unless given here, as laya-serve
    reads them (http.md §4, "per request").
    """

    api_key: str | None = None
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    body_read_timeout: float = DEFAULT_BODY_READ_TIMEOUT
    root_path: str = ""
    max_token_budget: int | None = None
    max_batch_tokens: int | None = None
    jev_strict: bool | None = None
    #: 0: narrow only choices over 100 options, with a group derived from the head budget.
    tournament_group: int = 0
    jev_profile: str | None = None
    #: Micro-batching of /v1/systemone (`serve.microbatch`): 0 is off.
    batch_window_ms: float = 0.0
    batch_max_requests: int = DEFAULT_BATCH_MAX_REQUESTS

    def __post_init__(self) -> None:
        object.__setattr__(self, "jev_profile", check_jev_profile(self.jev_profile))
        group = self.tournament_group
        low, high = TOURNAMENT_GROUP_RANGE
        if isinstance(group, bool) or not isinstance(group, int) or not (group == 0 or low <= group <= high):
            raise ConfigError(
                "tournament_group must be 0 (derived) or an integer in %d..%d, got %r" % (low, high, group)
            )

    @classmethod
    def from_env(cls, **overrides) -> Settings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(
                "create_app() got unknown settings: %s (known: %s)"
                % (", ".join(unknown), ", ".join(sorted(known)))
            )
        values: dict[str, Any] = {
            "api_key": api_key_from_env(),
            "max_concurrent": max_concurrent_from_env(),
            "body_read_timeout": body_read_timeout_from_env(),
            "tournament_group": tournament_group_from_env(),
            "jev_profile": os.environ.get("LAYA_JEV_PROFILE"),
            "batch_window_ms": batch_window_ms_from_env(),
            "batch_max_requests": batch_max_requests_from_env(),
        }
        values.update(overrides)
        values["root_path"] = (
            normalize_root_path(overrides["root_path"], "root_path")
            if "root_path" in overrides
            else root_path_from_env()
        )
        if values["api_key"] == "":
            values["api_key"] = None
        return cls(**values)

    def token_budget(self) -> int:
        return self.max_token_budget if self.max_token_budget is not None else max_token_budget_from_env()

    def batch_tokens(self) -> int:
        return self.max_batch_tokens if self.max_batch_tokens is not None else max_batch_tokens_from_env()

    @property
    def jev(self) -> bool:
        """TypeSafe's Jev profile is on (error shapes, validation, confidence, `x_` fields)."""
        return self.jev_profile is not None

    def strict(self) -> bool:
        return self.jev_strict if self.jev_strict is not None else env_bool("LAYA_JEV_STRICT", False)
