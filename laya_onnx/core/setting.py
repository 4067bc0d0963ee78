"""`Setting`: one environment variable of the settings table (`laya_onnx.core.settings`), the
rules its text is read by, and what is derived from entries: their `--flags` and their
documentation table.

Reading rules, for every variable: unset and blank are the same (the default), except for the
`verbatim` ones, where only the empty string is unset and the text is used as set (an API key is
compared byte for byte). What a value that cannot be read does (`on_bad`):

* `refuse`: a `ConfigError` naming the variable, the value and what it must be. Every variable of
  our own is refused: there is no compatibility to keep, and a typo in a limit should not quietly
  become another limit.
* `warn` / `ignore`: the default, with or without a logged warning. Only laya-serve 0.4.15's own
  variables (`compat`) do this, exactly where laya-serve does, so a configuration that starts
  laya-serve starts this server with the same limits.

Why a dataclass and not pydantic-settings: the core reads four of these variables and must stay
light (stdlib + numpy + onnxruntime; pydantic is a serve-only dependency), and what the table has
to express is mostly outside what pydantic-settings models: laya-serve's per-variable fallbacks
(silent for some, warned for others, refused for the port), blank meaning unset, one variable kept
verbatim, and the CLI flags and the documentation generated from the same entries. Each of those
would be a custom validator or a wrapper around the library, so the library would add a
dependency without removing code, and a serve-only wrapper would be a second source of truth.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from laya_onnx.core import parsers
from laya_onnx.core.errors import ConfigError

T = TypeVar("T")
Layer = Literal["core", "serve", "bench"]
OnBad = Literal["refuse", "warn", "ignore"]


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: its name, how it is read, and what it is for."""

    env: str
    #: Text as set -> value; a ValueError's text says what the value must be.
    parse: Callable[[str], T]
    default: T
    on_bad: OnBad
    help: str
    layer: Layer
    #: laya-serve 0.4.15 reads it too, with the same meaning.
    compat: bool = False
    #: The default as the documentation and `--help` show it (else `default` itself).
    shown_default: str | None = None
    #: Only "" is unset; the text is used as set, spaces included.
    verbatim: bool = False
    #: The refusal shows the value (not for long JSON values).
    show_value: bool = True
    #: What a `warn` fallback means, for the log line.
    fallback: str = ""
    #: The command-line flag that wins over the variable, with its `--help` text.
    flag: str | None = None
    flag_help: str = ""
    flag_type: Callable[[str], Any] | None = None

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The text as set, or None when unset (or blank, unless `verbatim`)."""
        value = (os.environ if environ is None else environ).get(self.env)
        if value is None or value == "" or (not self.verbatim and not value.strip()):
            return None
        return value

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        """The value from the environment, by this entry's rules (module docstring)."""
        raw = self.raw(environ)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            if self.on_bad == "refuse":
                raise self.invalid(raw, str(exc)) from None
            if self.on_bad == "warn":
                logging.getLogger("laya_onnx." + self.layer).warning(
                    "invalid %s %r: %s; %s", self.env, raw, exc, self.fallback
                )
            return self.default

    def invalid(self, value: Any, reason: str) -> ConfigError:
        """The refusal of `value` for this variable, naming it."""
        if not self.show_value:
            return ConfigError("invalid %s: %s" % (self.env, reason))
        return ConfigError("invalid %s %r: %s" % (self.env, value, reason))

    @property
    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if isinstance(self.default, float):
            return "%g" % self.default
        return "unset" if self.default is None else str(self.default)


def add_arguments(parser: argparse.ArgumentParser, *settings: Setting[Any]) -> None:
    """`--flag` for each of `settings` (each must have one), default None (then the variable),
    with its help naming the variable and its default."""
    for setting in settings:
        if setting.flag is None:
            raise AssertionError("%s has no command-line flag" % setting.env)
        options: dict[str, Any] = {"default": None}
        if setting.flag_type is not None:
            options["type"] = setting.flag_type
        elif setting.on_bad == "refuse":
            options["type"] = _checked_by(setting)
        parser.add_argument(
            setting.flag,
            help="%s (default $%s, else %s)" % (setting.flag_help, setting.env, setting.default_text),
            **options,
        )


def _checked_by(setting: Setting[Any]) -> Callable[[str], str]:
    """An argparse `type` that refuses what the variable would refuse, naming the flag, and
    passes the text on as given (it is read by the variable's rules where it is used)."""

    def check(value: str) -> str:
        try:
            setting.parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return check


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(settings: Iterable[Setting[Any]]) -> str:
    """The documentation table of `settings`, as serve/README.md carries it (of the whole table)."""
    on_bad = {
        "refuse": "refused",
        "warn": "default, with a warning",
        "ignore": "default",
    }
    taken: dict[Callable[[str], Any], str] = {
        parsers.text: "any text is taken",
        parsers.stripped: "any text is taken",
        parsers.flag: "anything else than 1/true/yes/on is off",
    }
    lines = [
        "| variable | default | layer | unreadable value | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in settings:
        name = "`%s`" % s.env + (" / `%s`" % s.flag if s.flag else "")
        origin = "laya-serve's" if s.compat else "ours"
        lines.append(
            "| %s | `%s` | %s (%s) | %s | %s |"
            % (name, s.default_text, s.layer, origin, taken.get(s.parse, on_bad[s.on_bad]), _cell(s.help))
        )
    return "\n".join(lines) + "\n"
