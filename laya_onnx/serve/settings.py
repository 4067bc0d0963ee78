"""Server configuration: the `LAYA_*` variables of the serve layer, read once and validated.

Every variable, its default and what an unreadable value does is an entry of the settings table
(`laya_onnx.core.settings`; serve/README.md's table is generated from it). This module groups
them: what the process around the app runs with (`ServerLimits`, plus `--host/--port`, which win
over their variables) and what one app runs with (`Settings`).

Unlike laya-serve, the default bind address is 127.0.0.1: a server is reachable from other
hosts only when its operator says so (`--host 0.0.0.0`; the images and the unit do).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from laya_onnx.core import parsers
from laya_onnx.core import settings as table
from laya_onnx.core.errors import ConfigError
from laya_onnx.core.setting import Setting


def resolve_host(cli_value: str | None = None) -> str:
    """`--host` wins over its variable."""
    if cli_value is not None and cli_value.strip():
        return cli_value.strip()
    return table.HOST.read()


def resolve_port(cli_value: int | None = None) -> int:
    """`--port` wins over its variable; either one outside 1-65535 is a ConfigError."""
    if cli_value is not None:
        if isinstance(cli_value, bool) or not isinstance(cli_value, int) or not 1 <= cli_value <= 65535:
            raise ConfigError("invalid --port %r: must be an integer 1-65535" % (cli_value,))
        return cli_value
    return table.PORT.read()


@dataclass(frozen=True)
class ServerLimits:
    """What the process around the app runs with: connection timeouts, drain, access log.

    Read by `run_server` before the bundle is loaded, so a bad value exits in milliseconds.
    """

    shutdown_grace: float = table.SHUTDOWN_GRACE_SECONDS.default
    keepalive_timeout: float = table.KEEPALIVE_TIMEOUT.default
    header_read_timeout: float = table.HEADER_READ_TIMEOUT.default
    access_log: str = table.ACCESS_LOG.default
    #: Open connections served at once (LAYA_MAX_CONNECTIONS; 0: from the open-files limit).
    max_connections: int = table.MAX_CONNECTIONS.default
    #: Every log line as text or JSON (LAYA_LOG_FORMAT, `--log-format`).
    log_format: str = table.LOG_FORMAT.default

    @classmethod
    def from_env(cls, log_format: str | None = None) -> ServerLimits:
        """From the variables; `log_format` (the flag) wins over LAYA_LOG_FORMAT."""
        return cls(
            shutdown_grace=table.SHUTDOWN_GRACE_SECONDS.read(),
            keepalive_timeout=table.KEEPALIVE_TIMEOUT.read(),
            header_read_timeout=table.HEADER_READ_TIMEOUT.read(),
            access_log=table.ACCESS_LOG.read(),
            max_connections=table.MAX_CONNECTIONS.read(),
            log_format=log_format or table.LOG_FORMAT.read(),
        )


#: Each `Settings` field read from the environment, and its variable.
_VARIABLES: dict[str, Setting[Any]] = {
    "api_key": table.API_KEY,
    "max_concurrent": table.MAX_CONCURRENT,
    "body_read_timeout": table.BODY_READ_TIMEOUT,
    "root_path": table.ROOT_PATH,
    "max_token_budget": table.MAX_TOKEN_BUDGET,
    "max_batch_tokens": table.MAX_BATCH_TOKENS,
    "jev_strict": table.JEV_STRICT,
    "tournament_group": table.TOURNAMENT_GROUP,
    "jev_profile": table.JEV_PROFILE,
    "batch_window_ms": table.BATCH_WINDOW_MS,
    "batch_max_requests": table.BATCH_MAX_REQUESTS,
    "max_request_seconds": table.MAX_REQUEST_SECONDS,
    "request_timeout": table.REQUEST_TIMEOUT,
    "body_buffer": table.BODY_BUFFER,
    "send_timeout": table.SEND_TIMEOUT,
}


@dataclass(frozen=True)
class Settings:
    """What one app instance runs with, read once when the app is built (`create_app`).

    laya-serve reads its token budget, batch token budget and strict flag again on every request;
    the environment of a running process does not change from outside, so reading them once
    answers every request the same, and an unreadable value is reported once, at startup.
    """

    api_key: str | None = None
    max_concurrent: int = table.MAX_CONCURRENT.default
    body_read_timeout: float = table.BODY_READ_TIMEOUT.default
    root_path: str = ""
    max_token_budget: int = table.MAX_TOKEN_BUDGET.default
    max_batch_tokens: int = table.MAX_BATCH_TOKENS.default
    jev_strict: bool = False
    #: 0: narrow only choices over 100 options, with a group derived from the head budget.
    tournament_group: int = 0
    jev_profile: str | None = None
    #: Micro-batching of /v1/systemone (`serve.microbatch`): 0 is off.
    batch_window_ms: float = 0.0
    batch_max_requests: int = table.BATCH_MAX_REQUESTS.default
    #: Estimated inference seconds one decision request may need (LAYA_MAX_REQUEST_SECONDS).
    max_request_seconds: float = table.MAX_REQUEST_SECONDS.default
    #: Seconds from admission to answer (LAYA_REQUEST_TIMEOUT).
    request_timeout: float = table.REQUEST_TIMEOUT.default
    #: Bytes the bodies being read may hold at once (LAYA_BODY_BUFFER).
    body_buffer: int = table.BODY_BUFFER.default
    #: Seconds a client may take to receive a whole answer (LAYA_SEND_TIMEOUT).
    send_timeout: float = table.SEND_TIMEOUT.default

    def __post_init__(self) -> None:
        key = self.api_key
        if key is not None:
            fault = next((i for i, c in enumerate(key) if ord(c) < 0x20 or ord(c) == 0x7F), None)
            if fault is not None or key != key.strip():
                where = (
                    "a control character at index %d" % fault
                    if fault is not None
                    else "surrounding whitespace"
                )
                raise ConfigError(
                    "%s holds %s: no client can send that key in an Authorization header, so every "
                    "request would be refused; set it without" % (table.API_KEY.env, where)
                )
        profile = self.jev_profile
        if profile is not None:
            try:
                profile = parsers.jev_profile(profile) if profile.strip() else None
            except ValueError as exc:
                raise table.JEV_PROFILE.invalid(profile, str(exc)) from None
            object.__setattr__(self, "jev_profile", profile)
        group = self.tournament_group
        low, high = parsers.TOURNAMENT_GROUP_RANGE
        if isinstance(group, bool) or not isinstance(group, int) or not (group == 0 or low <= group <= high):
            raise ConfigError(
                "tournament_group must be 0 (derived) or an integer in %d..%d, got %r" % (low, high, group)
            )

    @classmethod
    def from_env(cls, **overrides) -> Settings:
        """The environment's settings; `overrides` win (and their variables are not read)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(
                "create_app() got unknown settings: %s (known: %s)"
                % (", ".join(unknown), ", ".join(sorted(known)))
            )
        values = {name: s.read() for name, s in _VARIABLES.items() if name not in overrides}
        values.update(overrides)
        if "root_path" in overrides:
            try:
                values["root_path"] = parsers.root_path(overrides["root_path"] or "")
            except ValueError as exc:
                raise ConfigError("invalid root_path %r: %s" % (overrides["root_path"], exc)) from None
        if values["api_key"] == "":
            values["api_key"] = None
        return cls(**values)

    @property
    def jev(self) -> bool:
        """TypeSafe's Jev profile is on (error shapes, validation, confidence, `x_` fields)."""
        return self.jev_profile is not None
