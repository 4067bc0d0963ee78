"""The serve layer's `LAYA_*` variables, read once at startup and validated: each field names its
entry of the settings table (`laya_onnx.core.settings`), where all about a setting is said.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from laya_onnx.core import settings as table
from laya_onnx.core.errors import ConfigError
from laya_onnx.core.parsers import TOURNAMENT_GROUP_RANGE
from laya_onnx.core.setting import Setting

T = TypeVar("T", bound="_FromEnv")


def _entry(setting: Setting[Any]) -> Any:
    """A field read from `setting`'s variable, with its default."""
    return field(default=setting.default, metadata={"setting": setting})


class _FromEnv:
    @classmethod
    def from_env(cls: type[T], **overrides: Any) -> T:
        """From the environment; `overrides` win (their variables are not read), those of text
        settings read by their variable's rules."""
        own = fields(cls)  # type: ignore[arg-type]  # each subclass is a dataclass
        unknown = sorted(set(overrides) - {f.name for f in own})
        if unknown:
            known = ", ".join(sorted(f.name for f in own))
            raise TypeError("create_app() got unknown settings: %s (known: %s)" % (", ".join(unknown), known))
        values = {}
        for f in own:
            setting, value = f.metadata["setting"], overrides.get(f.name)
            if f.name not in overrides:
                value = setting.read()
            elif isinstance(value, str) and not isinstance(setting.default, (int, float)):
                value = setting.read({setting.env: value})
            values[f.name] = value
        return cls(**values)


def resolve_host(cli_value: str | None = None) -> str:
    """`--host` wins over its variable."""
    return (cli_value or "").strip() or table.HOST.read()


def resolve_port(cli_value: int | None = None) -> int:
    """`--port` wins over its variable; either one outside 1-65535 is a ConfigError."""
    if cli_value is None:
        return table.PORT.read()
    if isinstance(cli_value, bool) or not isinstance(cli_value, int) or not 1 <= cli_value <= 65535:
        raise ConfigError("invalid --port %r: must be an integer 1-65535" % (cli_value,))
    return cli_value


@dataclass(frozen=True)
class ServerLimits(_FromEnv):
    """What the process around the app runs with; read before the bundle is loaded."""

    shutdown_grace: float = _entry(table.SHUTDOWN_GRACE_SECONDS)
    keepalive_timeout: float = _entry(table.KEEPALIVE_TIMEOUT)
    header_read_timeout: float = _entry(table.HEADER_READ_TIMEOUT)
    access_log: str = _entry(table.ACCESS_LOG)
    max_connections: int = _entry(table.MAX_CONNECTIONS)
    log_format: str = _entry(table.LOG_FORMAT)


@dataclass(frozen=True)
class Settings(_FromEnv):
    """What one app runs with, read once when it is built (`create_app`)
    (docs/http-api.md#where-this-server-differs-from-laya-serve)."""

    api_key: str | None = _entry(table.API_KEY)
    max_concurrent: int = _entry(table.MAX_CONCURRENT)
    body_read_timeout: float = _entry(table.BODY_READ_TIMEOUT)
    root_path: str = _entry(table.ROOT_PATH)
    max_token_budget: int = _entry(table.MAX_TOKEN_BUDGET)
    max_batch_tokens: int = _entry(table.MAX_BATCH_TOKENS)
    jev_strict: bool = _entry(table.JEV_STRICT)
    tournament_group: int = _entry(table.TOURNAMENT_GROUP)
    jev_profile: str | None = _entry(table.JEV_PROFILE)
    batch_window_ms: float = _entry(table.BATCH_WINDOW_MS)
    batch_max_requests: int = _entry(table.BATCH_MAX_REQUESTS)
    max_request_seconds: float = _entry(table.MAX_REQUEST_SECONDS)
    request_timeout: float = _entry(table.REQUEST_TIMEOUT)
    body_buffer: int = _entry(table.BODY_BUFFER)
    send_timeout: float = _entry(table.SEND_TIMEOUT)

    def __post_init__(self) -> None:
        key = self.api_key
        fault = next((i for i, c in enumerate(key or "") if ord(c) < 0x20 or ord(c) == 0x7F), None)
        if fault is not None or (key is not None and key != key.strip()):
            where = "surrounding whitespace" if fault is None else "a control character at index %d" % fault
            raise ConfigError(
                "%s holds %s: no client can send that key in an Authorization header, so every "
                "request would be refused; set it without" % (table.API_KEY.env, where)
            )
        group = self.tournament_group
        low, high = TOURNAMENT_GROUP_RANGE
        if isinstance(group, bool) or not isinstance(group, int) or not (group == 0 or low <= group <= high):
            raise ConfigError(
                "tournament_group must be 0 (derived) or an integer in %d..%d, got %r" % (low, high, group)
            )

    @property
    def jev(self) -> bool:
        """TypeSafe's Jev profile is on (error shapes, validation, confidence, `x_` fields)."""
        return self.jev_profile is not None
