"""Every `LAYA_*` environment variable, in one table: the only module that names them.

Each entry (`Setting`) says what the variable is called, how its text is read, its default, what a
value that cannot be read does, what it is for, and which layer reads it (core, serve, bench).
Everything else reads a variable through its entry (`settings.THREADS.read()`), names it in a
message with `entry.env`, and builds `--flags` with `add_arguments`; the server's settings, the
CLI's flags and help, and the documentation table (`python -m laya_onnx.core.settings --markdown`,
in serve/README.md) are all derived from here.

How an entry's text is read and what a value that cannot be read does (refused for every
variable of our own, laya-serve's own fallback for laya-serve's): `laya_onnx.core.setting`.

A new setting is one entry below (refused when unreadable, unless laya-serve reads it too), then
the README table regenerated; tests/core/test_settings.py asks for an unreadable example of every
entry whose reader can refuse one.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

from laya_onnx.core import parsers
from laya_onnx.core.setting import Setting, markdown

T = TypeVar("T")

#: What every variable of this table starts with (for code that passes a whole environment on).
PREFIX = "LAYA_"


TABLE: dict[str, Setting[Any]] = {}


def _entry(setting: Setting[T]) -> Setting[T]:
    if not setting.env.startswith(PREFIX) or setting.env in TABLE:
        raise AssertionError("settings table: bad or repeated name %s" % setting.env)
    if not setting.compat and setting.on_bad != "refuse":
        raise AssertionError("settings table: %s is ours, so a bad value is refused" % setting.env)
    TABLE[setting.env] = setting
    return setting


def parse_bytes(value: Any, what: str | None = None) -> int:
    """A positive byte count: an int, or text such as `2G`, `512M`, `1.5GiB`, `300000000`.

    Suffixes K, M, G, T are powers of 1024 (an optional trailing `B` or `iB` is accepted).
    Anything else raises ValueError naming `what` (default: the pass memory variable).
    """
    try:
        return parsers.byte_count(value)
    except ValueError as exc:
        raise ValueError(f"{what or MAX_PASS_MEMORY.env} {exc}, got {value!r}") from None


# -- the table: core ---------------------------------------------------------------------------

#: LAYA_INT8_KERNEL's values (`laya_onnx.core.int8_kernel`).
INT8_KERNELS = ("auto", "u8s8", "u8u8")

THREADS = _entry(
    Setting[int | None](
        "LAYA_THREADS",
        parsers.positive_int,
        None,
        "warn",
        "ONNX Runtime intra-op threads of every session (`ONNXAgent(threads=)` and the flag win)",
        "core",
        compat=True,
        shown_default="one per core",
        fallback="using onnxruntime's default",
        flag="--threads",
        flag_help="onnxruntime intra-op threads",
        flag_type=int,
    )
)
MODELS_DIR = _entry(
    Setting[str | None](
        "LAYA_MODELS_DIR",
        parsers.text,
        None,
        "refuse",
        "the models directory `load(NAME)` finds a checkpoint's bundle in (one folder per "
        "checkpoint name, as `laya-onnx export --all` writes)",
        "core",
        verbatim=True,
    )
)
REVISION = _entry(
    Setting[str | None](
        "LAYA_REVISION",
        parsers.stripped,
        None,
        "refuse",
        "the Hub revision of checkpoints and bundles fetched by id; `reviewed` is the commit pinned "
        "for that repo (refused for a repo without one)",
        "core",
        compat=True,
        shown_default="Hub default",
    )
)
SESSION_CACHE = _entry(
    Setting[str | None](
        "LAYA_SESSION_CACHE",
        parsers.stripped,
        None,
        "refuse",
        "a folder where each bundle graph loaded on the CPU provider is saved optimized, its weights "
        "prepacked, for this CPU and onnxruntime (made on first load, kept only if it answers bit for "
        "bit as the bundle's graph); later loads map it instead of preparing the graph again, and "
        "hash no bundle file that is unchanged since a load verified it",
        "core",
        shown_default="unset: every load prepares the graph",
    )
)
#: 2 GiB: on the 2-core / 24 GiB machine this project targets, a pass that size already takes
#: seconds on tiny-english and tens of seconds on the full-size encoder (attention work grows with
#: the same length**2 as its memory), and five such servers (weights + a full pass each) still
#: leave room; the default lets every built-in request and a 4096-token tiny-english row through.
DEFAULT_MAX_PASS_MEMORY = 2 * parsers.GiB
MAX_PASS_MEMORY = _entry(
    Setting[int](
        "LAYA_MAX_PASS_MEMORY",
        parsers.byte_count,
        DEFAULT_MAX_PASS_MEMORY,
        "refuse",
        "bytes one forward pass may use above idle, priced by the bundle's memory model; bytes or "
        "`K`/`M`/`G`/`T` (1024-based). Bigger passes are split, a row that cannot fit alone is a 413 "
        "(read when the bundle is loaded)",
        "core",
        shown_default="2G",
    )
)

# -- the table: serve, as laya-serve 0.4.15 reads them ------------------------------------------

INT8_KERNEL = _entry(
    Setting[str](
        "LAYA_INT8_KERNEL",
        parsers.choice(INT8_KERNELS),
        "auto",
        "refuse",
        "int8 bundles: `auto` runs u8 x s8 where the CPU has VNNI (AVX512-VNNI, AVX-VNNI, AMX) and "
        "u8 x u8 elsewhere; `u8s8` / `u8u8` force one. The answers are bit-identical; u8s8 on a CPU "
        "without VNNI is refused, it would answer wrongly (`ONNXAgent(int8_kernel=)` wins; read when "
        "the bundle is loaded)",
        "core",
    )
)
HOST = _entry(
    Setting[str](
        "LAYA_HOST",
        parsers.stripped,
        "127.0.0.1",
        "refuse",
        "bind address (the flag wins); `0.0.0.0` serves other hosts (the images set it). "
        "laya-serve binds `0.0.0.0`",
        "serve",
        compat=True,
        flag="--host",
        flag_help="bind address; 0.0.0.0 to serve other hosts",
    )
)
PORT = _entry(
    Setting[int](
        "LAYA_PORT",
        parsers.int_range(1, 65535),
        8000,
        "refuse",
        "bind port, 1-65535 (the flag wins)",
        "serve",
        compat=True,
        flag="--port",
        flag_help="port",
        flag_type=int,
    )
)
LOG_LEVEL = _entry(
    Setting[int](
        "LAYA_LOG_LEVEL",
        parsers.log_level,
        logging.INFO,
        "refuse",
        "the log level: %s" % ", ".join(parsers.LOG_LEVELS),
        "serve",
        compat=True,
        shown_default="info",
    )
)
API_KEY = _entry(
    Setting[str | None](
        "LAYA_API_KEY",
        parsers.text,
        None,
        "refuse",
        "require `Authorization: Bearer <key>` on the decision routes (compared byte for byte)",
        "serve",
        compat=True,
        verbatim=True,
    )
)
MAX_CONCURRENT = _entry(
    Setting[int](
        "LAYA_MAX_CONCURRENT",
        parsers.positive_int,
        16,
        "ignore",
        "decision requests admitted at once (their bodies read); the excess gets 503",
        "serve",
        compat=True,
        flag="--max-concurrent",
        flag_help="admission slots",
        flag_type=int,
    )
)
BODY_READ_TIMEOUT = _entry(
    Setting[float](
        "LAYA_BODY_READ_TIMEOUT",
        parsers.seconds(),
        10.0,
        "ignore",
        "seconds (> 0) to deliver a body before 408",
        "serve",
        compat=True,
    )
)
MAX_TOKEN_BUDGET = _entry(
    Setting[int](
        "LAYA_MAX_TOKEN_BUDGET",
        parsers.positive_int,
        8192,
        "warn",
        "cap on a request's `max_len` / `head_max_len` (a positive integer)",
        "serve",
        compat=True,
        fallback="falling back to 8192",
    )
)
MAX_BATCH_TOKENS = _entry(
    Setting[int](
        "LAYA_MAX_BATCH_TOKENS",
        parsers.positive_int,
        131072,
        "warn",
        "tokens one batch pass may collate; bigger batches are split into `batch_size` chunks",
        "serve",
        compat=True,
        fallback="falling back to 131072",
    )
)
JEV_STRICT = _entry(
    Setting[bool](
        "LAYA_JEV_STRICT",
        parsers.flag,
        False,
        "ignore",
        "`1` answers the strict Jev contract: no `routing`, no `x_jev_confidence`/`answer_confidence`/"
        "`action`, usage = two counts",
        "serve",
        compat=True,
        shown_default="0",
    )
)
TOURNAMENT_GROUP = _entry(
    Setting[int](
        "LAYA_TOURNAMENT_GROUP",
        parsers.tournament_group,
        0,
        "ignore",
        "an int 2-100: every choice over that many options is answered by elimination in groups "
        "of it, as laya-serve does; see [Large choices](#large-choices-2-to-255-options)",
        "serve",
        compat=True,
        shown_default="unset",
    )
)
ROOT_PATH = _entry(
    Setting[str](
        "LAYA_ROOT_PATH",
        parsers.root_path,
        "",
        "refuse",
        "public URL prefix behind a proxy: `/laya/health` answers as `/health`, which keeps "
        "answering (laya-serve's root_path). A trailing `/` is dropped; refused where laya-serve "
        "takes any text and never matches it",
        "serve",
        compat=True,
        shown_default="unset",
    )
)
MAX_LOADED = _entry(
    Setting[int | None](
        "LAYA_MAX_LOADED",
        parsers.positive_int,
        None,
        "ignore",
        "several checkpoints: how many are resident at once (a positive integer)",
        "serve",
        compat=True,
        shown_default="2",
    )
)
EXTRA_MODELS = _entry(
    Setting[Mapping[str, Any]](
        "LAYA_EXTRA_MODELS",
        parsers.extra_models,
        MappingProxyType({}),
        "refuse",
        'several checkpoints: more of them, `{"name": "bundle folder or Hub id"}` (or `[repo, subfolder]`)',
        "serve",
        compat=True,
        shown_default="none",
        show_value=False,
    )
)
DEFAULT_MODEL = _entry(
    Setting[str | None](
        "LAYA_DEFAULT_MODEL",
        parsers.text,
        None,
        "refuse",
        "several checkpoints: the one a request without `model` gets (a name it can resolve)",
        "serve",
        compat=True,
        shown_default="multilingual",
    )
)
AUTO_TASK = _entry(
    Setting[bool](
        "LAYA_AUTO_TASK",
        parsers.flag,
        False,
        "ignore",
        "several checkpoints: workflow routing by the questions asked",
        "serve",
        compat=True,
        shown_default="0",
    )
)
PRELOAD = _entry(
    Setting[bool](
        "LAYA_PRELOAD",
        parsers.flag,
        True,
        "ignore",
        "several checkpoints: load them at startup, not at their first request",
        "serve",
        compat=True,
        shown_default="1",
    )
)
MODELS = _entry(
    Setting[list[str] | None](
        "LAYA_MODELS",
        parsers.name_list,
        None,
        "refuse",
        "several checkpoints: the comma-separated names preloaded (an unknown one is refused)",
        "serve",
        compat=True,
        shown_default="all",
    )
)
IDLE_UNLOAD_SECONDS = _entry(
    Setting[float](
        "LAYA_IDLE_UNLOAD_SECONDS",
        parsers.idle_seconds,
        0.0,
        "warn",
        "several checkpoints: after this many seconds without a decision request every resident one is "
        "unloaded; the next request reloads its own",
        "serve",
        compat=True,
        shown_default="0 (off)",
        fallback="idle unload disabled",
    )
)

# -- the table: serve, ours alone (a value that cannot be read is refused) ---------------------

JEV_PROFILE = _entry(
    Setting[str | None](
        "LAYA_JEV_PROFILE",
        parsers.jev_profile,
        None,
        "refuse",
        "`typesafe`: the [Jev profile](#the-jev-profile-laya_jev_profiletypesafe)",
        "serve",
    )
)
BATCH_WINDOW_MS = _entry(
    Setting[float](
        "LAYA_BATCH_WINDOW_MS",
        parsers.seconds(allow_zero=True, unit="milliseconds"),
        0.0,
        "refuse",
        "micro-batching, milliseconds >= 0: a `/v1/systemone` request waits up to this long for others with the same "
        "questions and the same `max_len`/`head_max_len`/`lang`/`min_confidence`; the group runs as "
        "one `predict_batch` (`laya_onnx/serve/worker.py`). Each caller gets its own answer (the "
        "one it would get alone, within fp32 rounding of the padding) or its own refusal: a group "
        "whose pass fails is re-run member by member. Admission and the pass memory budget apply as "
        "without it",
        "serve",
        shown_default="0 (off)",
    )
)
BATCH_MAX_REQUESTS = _entry(
    Setting[int](
        "LAYA_BATCH_MAX_REQUESTS",
        parsers.positive_int,
        32,
        "refuse",
        "a micro-batch runs as soon as it holds this many requests (a positive integer)",
        "serve",
    )
)
SHUTDOWN_GRACE_SECONDS = _entry(
    Setting[float](
        "LAYA_SHUTDOWN_GRACE_SECONDS",
        parsers.seconds(allow_zero=True),
        30.0,
        "refuse",
        "seconds (>= 0) from SIGTERM/SIGINT to exit at most (the images set 8); see "
        "[Stopping](#stopping-a-terminating-signal-drains)",
        "serve",
    )
)
#: Above the idle timeouts of the usual proxies in front (nginx upstream keepalive 60 s, AWS ALB
#: 60 s), so the proxy closes first and never reuses a connection this server is closing.
KEEPALIVE_TIMEOUT = _entry(
    Setting[float](
        "LAYA_KEEPALIVE_TIMEOUT",
        parsers.seconds(),
        75.0,
        "refuse",
        "seconds (> 0) an idle connection (no request started) is kept open",
        "serve",
    )
)
SEND_TIMEOUT = _entry(
    Setting[float](
        "LAYA_SEND_TIMEOUT",
        parsers.seconds(),
        30.0,
        "refuse",
        "seconds (> 0) a client may take to receive a whole answer; past it the connection is "
        "closed and the access log says so",
        "serve",
    )
)
MAX_CONNECTIONS = _entry(
    Setting[int](
        "LAYA_MAX_CONNECTIONS",
        parsers.int_range(0),
        0,
        "refuse",
        "open connections served at once; past it a request gets 503 and its connection is closed "
        "(the health routes still answer, in a reserve of their own); 0: the open-files limit less "
        "a margin",
        "serve",
    )
)
HEADER_READ_TIMEOUT = _entry(
    Setting[float](
        "LAYA_HEADER_READ_TIMEOUT",
        parsers.seconds(),
        10.0,
        "refuse",
        "seconds (> 0) from a request's first byte to the end of its headers before a 408",
        "serve",
    )
)
#: A minute of the single worker is what one caller may take from all the others; an interactive
#: decision takes milliseconds to a few seconds.
MAX_REQUEST_SECONDS = _entry(
    Setting[float](
        "LAYA_MAX_REQUEST_SECONDS",
        parsers.seconds(),
        60.0,
        "refuse",
        "estimated inference seconds one decision request may need, by the bundle's time model; "
        "more is a 413 before any pass (see [Limits on one request](#limits-on-one-request))",
        "serve",
    )
)
#: Room for one maximal request after another one queued ahead of it.
REQUEST_TIMEOUT = _entry(
    Setting[float](
        "LAYA_REQUEST_TIMEOUT",
        parsers.seconds(),
        120.0,
        "refuse",
        "seconds from a decision request's admission (its body read) to its answer; then 504, and "
        "no further pass of it runs",
        "serve",
    )
)
#: 16 maximal bodies (2 MiB raw plus 2 MiB decoded each).
BODY_BUFFER = _entry(
    Setting[int](
        "LAYA_BODY_BUFFER",
        parsers.byte_count,
        64 * parsers.MiB,
        "refuse",
        "bytes (raw and decoded) all decision request bodies being read may hold at once; beyond it "
        "503. Bodies are read before admission, so this is what bounds them",
        "serve",
        shown_default="64M",
    )
)
ACCESS_LOG = _entry(
    Setting[str](
        "LAYA_ACCESS_LOG",
        parsers.choice(parsers.ACCESS_LOG_MODES),
        "text",
        "refuse",
        "the access log, one line per response at INFO: `text`, `json` (one object per line) or `off`",
        "serve",
    )
)
LOG_FORMAT = _entry(
    Setting[str](
        "LAYA_LOG_FORMAT",
        parsers.choice(parsers.LOG_FORMATS),
        "text",
        "refuse",
        "every log line as `text` or `json` (one object per line: time, level, logger, message, "
        "request id, trace id; access lines too, unless LAYA_ACCESS_LOG is off)",
        "serve",
        flag="--log-format",
        flag_help="text or json: every log line as one JSON object",
    )
)

# -- the table: bench --------------------------------------------------------------------------

REFERENCE_CPU_AMP = _entry(
    Setting[str | None](
        "LAYA_CPU_AMP",
        parsers.choice(("bf16", "bfloat16")),
        None,
        "ignore",
        "the reference's own (laya.Agent's): `bf16` runs its forward under torch's bf16 autocast on "
        "CPU. `laya-onnx bench agent` sets it to time the reference's bf16 mode on CPUs with "
        "AVX512-BF16 or AMX; laya-onnx's runtime does not read it",
        "bench",
        compat=True,
        shown_default="unset (fp32)",
    )
)


# -- what is derived from the table -------------------------------------------------------------


def without_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less every variable of this table's family (a child process started clean)."""
    return {k: v for k, v in environ.items() if not k.startswith(PREFIX)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m laya_onnx.core.settings", description="The LAYA_* environment variables."
    )
    parser.add_argument("--markdown", action="store_true", help="print the documentation table")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown(TABLE.values()))
    else:
        for s in TABLE.values():
            sys.stdout.write("%s=%s\n" % (s.env, s.default_text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
