"""Server configuration: environment variables, parsed once and validated.

Everything is an environment variable (plus `--host/--port` on the command line), so one
image serves a laptop run and a systemd unit alike. The readers follow laya-serve 0.4.15
(http.md §4): blank means unset; a number that cannot be read falls back to its default,
except the bind port and the log level, which exit with a message instead — a server bound
somewhere its operator did not ask for is unreachable, not degraded.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, fields

log = logging.getLogger("laya_onnx.serve")

DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 8000
DEFAULT_LOG_LEVEL = "info"
DEFAULT_MAX_CONCURRENT = 16
DEFAULT_BODY_READ_TIMEOUT = 10.0
DEFAULT_MAX_TOKEN_BUDGET = 8192
DEFAULT_MAX_BATCH_TOKENS = 131072

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


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value


def env_bool(name: str, default: bool = False) -> bool:
    """Unset or blank gives `default`; only 1/true/yes/on (any case) are true."""
    value = _raw(name)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def _positive_int(name: str, default: int, warn: bool) -> int:
    value = _raw(name)
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
    value = _raw("LAYA_BODY_READ_TIMEOUT")
    if value is None:
        return DEFAULT_BODY_READ_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        return DEFAULT_BODY_READ_TIMEOUT
    return seconds if 0.0 < seconds < math.inf else DEFAULT_BODY_READ_TIMEOUT


def threads_from_env() -> int | None:
    """LAYA_THREADS: ONNX Runtime intra-op threads; anything but a positive int leaves ORT's default."""
    value = _raw("LAYA_THREADS")
    if value is None:
        return None
    try:
        n = int(value.strip())
    except ValueError:
        log.warning("invalid LAYA_THREADS %r; using onnxruntime's default", value)
        return None
    return n if n > 0 else None


def api_key_from_env() -> str | None:
    # Not stripped: the key is compared byte for byte, and an empty value means "no auth".
    return os.environ.get("LAYA_API_KEY") or None


def resolve_host(cli_value: str | None = None) -> str:
    if cli_value is not None and cli_value.strip():
        return cli_value.strip()
    value = _raw("LAYA_HOST")
    return value.strip() if value is not None else DEFAULT_HOST


def resolve_port(cli_value: int | None = None) -> int:
    """`--port` wins over LAYA_PORT; either one outside 1-65535 exits with a message."""
    if cli_value is not None:
        if isinstance(cli_value, bool) or not isinstance(cli_value, int) or not 1 <= cli_value <= 65535:
            raise SystemExit("laya-onnx: invalid --port %r: must be an integer 1-65535" % (cli_value,))
        return cli_value
    value = _raw("LAYA_PORT")
    if value is None:
        return DEFAULT_PORT
    try:
        port = int(value.strip())
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise SystemExit("laya-onnx: invalid LAYA_PORT %r: must be an integer 1-65535" % (value,))
    return port


def resolve_log_level() -> int:
    raw = os.environ.get("LAYA_LOG_LEVEL", DEFAULT_LOG_LEVEL)
    name = raw.strip().lower() or DEFAULT_LOG_LEVEL
    if name not in LOG_LEVELS:
        raise SystemExit(
            "laya-onnx: invalid LAYA_LOG_LEVEL %r: must be one of %s"
            % (raw.strip(), ", ".join(sorted(LOG_LEVELS)))
        )
    return LOG_LEVELS[name]


@dataclass(frozen=True)
class Settings:
    """What one app instance runs with.

    `api_key`, `max_concurrent` and `body_read_timeout` are fixed when the app is built.
    `max_token_budget`, `max_batch_tokens` and `jev_strict` are read from the environment on
    every request unless given here, as laya-serve reads them (http.md §4, "per request").
    """

    api_key: str | None = None
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    body_read_timeout: float = DEFAULT_BODY_READ_TIMEOUT
    max_token_budget: int | None = None
    max_batch_tokens: int | None = None
    jev_strict: bool | None = None

    @classmethod
    def from_env(cls, **overrides) -> Settings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(
                "create_app() got unknown settings: %s (known: %s)"
                % (", ".join(unknown), ", ".join(sorted(known)))
            )
        values = {
            "api_key": api_key_from_env(),
            "max_concurrent": max_concurrent_from_env(),
            "body_read_timeout": body_read_timeout_from_env(),
        }
        values.update(overrides)
        if values["api_key"] == "":
            values["api_key"] = None
        return cls(**values)

    def token_budget(self) -> int:
        return self.max_token_budget if self.max_token_budget is not None else max_token_budget_from_env()

    def batch_tokens(self) -> int:
        return self.max_batch_tokens if self.max_batch_tokens is not None else max_batch_tokens_from_env()

    def strict(self) -> bool:
        return self.jev_strict if self.jev_strict is not None else env_bool("LAYA_JEV_STRICT", False)
