"""`laya-onnx bench MEASUREMENT`: every measurement, one subcommand each.

  agent     bundles against the reference laya.Agent, interleaved (`laya_onnx.bench.agent`)
  http      a server already running, under 1..N concurrent clients (`laya_onnx.bench.http`)
  saturate  a bundle served in this process and saturated (`laya_onnx.bench.saturate`)
  memory    peak RSS and time of a long-state batch (`laya_onnx.bench.memory`)
  soak      honest and hostile traffic for minutes against a served bundle (`laya_onnx.bench.soak`)
  coldstart process start to first answer, fresh processes, beside the reference (`laya_onnx.bench.coldstart`)

The defaults the options show are those modules' own constants; the modules import torch,
onnxruntime and aiohttp only where a measurement runs, so `--help` loads none of them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from laya_onnx.cli.common import EXIT_OK, UsageError, add_bundle_and_providers, emit_report
from laya_onnx.core import settings
from laya_onnx.core.setting import add_arguments

NAME = "bench"
HELP = "measure: a bundle against the reference, a server under load or saturated, memory"


class Measurement(NamedTuple):
    add_parser: Callable[[Any], argparse.ArgumentParser]
    run: Callable[[argparse.Namespace], int]


def _comma_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def add_plot_option(parser: argparse.ArgumentParser, what: str) -> None:
    """`--plot FILE`: the figure as a PNG (the plot extra)."""
    parser.add_argument(
        "--plot",
        default=None,
        metavar="FILE",
        help="also draw %s into this PNG file (needs the plot extra: matplotlib)" % what,
    )


def plot_ready(args: argparse.Namespace) -> None:
    """Before a measurement runs: the plot extra is there when --plot asks for a figure (an
    ImportError naming matplotlib, which the CLI turns into the install line)."""
    if args.plot:
        from laya_onnx.bench.plot import require

        require()


def drew(path: Path) -> None:
    print(f"figure written: {path}")


# -- agent ----------------------------------------------------------------------------------
def _add_agent(group) -> argparse.ArgumentParser:
    from laya_onnx.bench.agent import DEFAULT_REPEATS, DEFAULT_RSS_CALLS, DEFAULT_WORKLOADS, WORKLOADS
    from laya_onnx.core.int8_kernel import AUTO, CHOICES

    p = group.add_parser(
        "agent",
        help="time bundles against the reference laya.Agent, call by call (needs the dev extra)",
        description="Time the reference laya.Agent (torch, CPU) and each bundle call by call, "
        "interleaved, through the public API, on fixed workloads: medians, ratios and their range, "
        "our Python part beside the session run, peak RSS (the bench process, and each runtime "
        "alone in a child process).",
    )
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="the checkpoint the bundles were exported from")
    p.add_argument("bundles", nargs="+", metavar="BUNDLE", help="one or more bundles exported from it")
    p.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        help="timed calls per runtime and workload (default %(default)s)",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="threads for both runtimes (default: torch's count)"
    )
    others = [name for name in WORKLOADS if name not in DEFAULT_WORKLOADS]
    p.add_argument(
        "--workloads",
        type=_comma_list,
        default=None,
        help="comma list of workloads (default %s; also %s)"
        % (",".join(DEFAULT_WORKLOADS), ", ".join(others)),
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write the report here as JSON")
    p.add_argument(
        "--no-rss", action="store_true", help="skip each runtime's peak RSS alone (child processes)"
    )
    p.add_argument(
        "--rss-calls",
        type=int,
        default=DEFAULT_RSS_CALLS,
        help="calls per runtime in each peak-RSS child process (default %(default)s)",
    )
    p.add_argument(
        "--int8-kernels",
        type=_comma_list,
        default=[AUTO],
        help="run each int8 bundle with each of these kernels (%s; default %s, the one this CPU takes)"
        % (", ".join(CHOICES), AUTO),
    )
    p.add_argument(
        "--no-reference-bf16",
        action="store_true",
        help="skip the reference's bf16 mode (%s=bf16), timed by default where the CPU has "
        "AVX512-BF16 or AMX" % settings.REFERENCE_CPU_AMP.env,
    )
    add_plot_option(p, "each runtime's speed-up against its largest |Δp| from laya torch f32")
    return p


def _run_agent(args: argparse.Namespace) -> int:
    from laya_onnx.bench.agent import WORKLOADS, format_summary, run_bench
    from laya_onnx.core.int8_kernel import CHOICES

    unknown = [name for name in args.workloads or () if name not in WORKLOADS]
    if unknown:
        raise UsageError(
            "--workloads: unknown %s; choose from %s" % (", ".join(unknown), ", ".join(WORKLOADS))
        )
    if args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    if args.rss_calls < 1:
        raise UsageError("--rss-calls must be at least 1")
    bad = [k for k in args.int8_kernels if k not in CHOICES]
    if bad or not args.int8_kernels:
        raise UsageError(
            "--int8-kernels: choose from %s, got %s" % (", ".join(CHOICES), ", ".join(bad) or "none")
        )
    plot_ready(args)
    report = run_bench(
        args.checkpoint,
        args.bundles,
        repeats=args.repeats,
        threads=args.threads,
        workloads=args.workloads,
        rss=not args.no_rss,
        progress=print,
        int8_kernels=args.int8_kernels,
        reference_bf16=False if args.no_reference_bf16 else None,
        rss_calls=args.rss_calls,
    )
    if args.plot:
        from laya_onnx.bench.plot import plot_agent

        drew(plot_agent(report, args.plot))
    return emit_report(report, args.json, format_summary(report))


# -- http -----------------------------------------------------------------------------------
def _add_http(group) -> argparse.ArgumentParser:
    from laya_onnx.bench.http import DEFAULT_CLIENT_COUNTS, DEFAULT_DEADLINE_S, DEFAULT_SECONDS

    p = group.add_parser(
        "http",
        help="load a server that is already running: throughput and p50/p99 per client count",
        description="Drive the server at URL (started elsewhere, with the settings under test) with "
        "each count of concurrent clients in turn, posting the README request: answers per second, "
        "latency p50/p99, statuses.",
    )
    p.add_argument("url", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--clients",
        default=",".join(str(n) for n in DEFAULT_CLIENT_COUNTS),
        help="comma list of concurrent client counts, one run each (default %(default)s)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_SECONDS,
        help="seconds per client count (default %(default)s)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=DEFAULT_DEADLINE_S,
        help="seconds a request may take before it counts as hung (default %(default)s; a large "
        "bundle with many clients and no batch window queues for longer)",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write the report here as JSON")
    add_plot_option(p, "answers per second and p50/p99 latency against clients")
    return p


def _run_http(args: argparse.Namespace) -> int:
    try:
        clients = [int(c) for c in _comma_list(args.clients)]
    except ValueError:
        clients = []
    if not clients or min(clients) < 1:
        raise UsageError("--clients must be a comma list of positive integers, got %r" % (args.clients,))
    if not args.seconds > 0:
        raise UsageError("--seconds must be a positive number, got %r" % (args.seconds,))
    if not args.deadline > 0:
        raise UsageError("--deadline must be a positive number of seconds, got %r" % (args.deadline,))
    from laya_onnx.bench.http import drive_server

    plot_ready(args)
    report = drive_server(
        args.url, clients=clients, seconds=args.seconds, deadline_s=args.deadline, progress=print
    )
    if args.plot:
        from laya_onnx.bench.plot import load_runs_of_http, plot_load

        title = "%s: the README request, %g s per client count" % (args.url, args.seconds)
        drew(plot_load(load_runs_of_http(report), args.plot, title))
    return emit_report(report, args.json)  # the progress lines, one per client count, are the table


# -- saturate -------------------------------------------------------------------------------
def _add_saturate(group) -> argparse.ArgumentParser:
    from laya_onnx.bench.saturate import DEFAULT_CLIENTS, DEFAULT_SECONDS

    p = group.add_parser(
        "saturate",
        help="serve a bundle on 127.0.0.1 and saturate it: throughput, 503s, /health latency, gateway overhead",
        description="Serve the bundle in-process on 127.0.0.1 and load it from child processes: one "
        "client, then --clients posting the README request while /health is polled; print a table "
        "of the figures (--json PATH writes them all).",
    )
    add_bundle_and_providers(p)
    p.add_argument(
        "--clients",
        type=int,
        default=DEFAULT_CLIENTS,
        help="concurrent clients in the saturated phase (default %(default)s)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_SECONDS,
        help="length of the saturated phase in seconds (default %(default)s)",
    )
    add_arguments(p, settings.MAX_CONCURRENT, settings.THREADS)
    p.add_argument("--json", default=None, metavar="PATH", help="write the report here as JSON")
    add_plot_option(p, "answers per second and p50/p99 latency against clients")
    return p


def _run_saturate(args: argparse.Namespace) -> int:
    if args.clients < 1:
        raise UsageError("--clients must be at least 1, got %r" % (args.clients,))
    if not args.seconds > 0:
        raise UsageError("--seconds must be a positive number, got %r" % (args.seconds,))
    from laya_onnx.bench.saturate import format_summary, run_saturate

    plot_ready(args)
    figures = run_saturate(
        args.bundle,
        clients=args.clients,
        seconds=args.seconds,
        max_concurrent=args.max_concurrent,
        providers=args.providers,
        threads=args.threads,
    )
    if args.plot:
        from laya_onnx.bench.plot import load_runs_of_saturate, plot_load

        title = "%s served in-process (%s): the README request, one client then %d for %g s" % (
            Path(args.bundle).name,
            figures.get("cpu", "CPU unknown"),
            args.clients,
            args.seconds,
        )
        drew(plot_load(load_runs_of_saturate(figures), args.plot, title))
    return emit_report(figures, args.json, format_summary(figures))


# -- memory ---------------------------------------------------------------------------------
def _add_memory(group) -> argparse.ArgumentParser:
    from laya_onnx.bench import memory

    p = group.add_parser(
        "memory",
        help="peak RSS and time of a long-state batch, one fresh process per runtime configuration",
        description="Run a batch of long states (the memory report's scenario, scaled by --tokens) "
        "through the bundle, and optionally through an --attention unfused bundle (as the runtime "
        "ran before: no pass budget, arena kept) and the reference laya.Agent, each in its own "
        "process, and print idle, peak and after RSS and the median call time.",
    )
    p.add_argument("bundle", help="the bundle as exported now (fused attention)")
    p.add_argument("--unfused", default=None, help="an --attention unfused bundle of the same checkpoint")
    p.add_argument("--checkpoint", default=None, help="also run the reference laya.Agent (dev extra)")
    p.add_argument(
        "--states", type=int, default=memory.DEFAULT_STATES, help="states in the batch (default %(default)s)"
    )
    p.add_argument(
        "--words",
        type=int,
        default=memory.DEFAULT_WORDS,
        help='each state is "w0 w1 ... w{words-1}" (default %(default)s)',
    )
    p.add_argument(
        "--tokens",
        type=int,
        default=memory.DEFAULT_TOKENS,
        help="max_len of the request (default %(default)s)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=memory.DEFAULT_REPEATS,
        help="timed calls per configuration (default %(default)s)",
    )
    p.add_argument(
        "--only", type=_comma_list, default=None, help="comma list of: " + ",".join(memory.CONFIGS)
    )
    p.add_argument("--json", action="store_true", help="also print the report as JSON")
    p.add_argument(
        "--arena", action="store_true", help="first compare CPU-arena configurations (speed and RSS)"
    )
    add_plot_option(p, "the bundle's per-pass memory model against the passes measured")
    return p


def _run_memory(args: argparse.Namespace) -> int:
    from laya_onnx.bench import memory

    unknown = [name for name in args.only or () if name not in memory.CONFIGS]
    if unknown:
        raise UsageError(
            "--only: unknown %s; choose from %s" % (", ".join(unknown), ", ".join(memory.CONFIGS))
        )
    for option in ("states", "words", "tokens", "repeats"):
        if getattr(args, option) < 1:
            raise UsageError("--%s must be at least 1" % option)
    plot_ready(args)
    if args.unfused:
        speed = memory.run_graph_speed(args.bundle, args.unfused)
        print("CPU ms per call (1 thread, median, interleaved): " + json.dumps(speed))
    if args.arena:
        from laya_onnx.core.bundle import GRAPH_FILE

        arena = memory.run_arena_bench(Path(args.bundle) / GRAPH_FILE)
        print(memory.format_arena_table(arena))
        if args.json:
            print(json.dumps(arena, indent=2))
    report = memory.run_memory_bench(
        args.bundle,
        unfused=args.unfused,
        checkpoint=args.checkpoint,
        states=args.states,
        words=args.words,
        tokens=args.tokens,
        repeats=args.repeats,
        only=args.only,
    )
    print(memory.format_table(report))
    if args.json:
        print(json.dumps(report, indent=2))
    if args.plot:
        from laya_onnx.bench.plot import plot_memory

        drew(plot_memory(report, args.plot))
    return EXIT_OK


# -- soak -----------------------------------------------------------------------------------
def _add_soak(group) -> argparse.ArgumentParser:
    from laya_onnx.bench.soak import DEFAULT_MINUTES

    p = group.add_parser(
        "soak",
        help="honest and hostile traffic for minutes against a served bundle: answered/refused, "
        "/health latency, RSS and fds over time",
        description="Serve the bundle in a child process on 127.0.0.1 and, for --minutes, post the "
        "README request from 4 clients and poll /health every 50 ms while hostile clients take turns "
        "(decompression bombs, a work bomb whose client hangs up, slow uploads and headers, ...); "
        "print a summary (--json PATH writes every figure).",
    )
    p.add_argument("bundle", help="the bundle to serve")
    p.add_argument(
        "--minutes", type=float, default=DEFAULT_MINUTES, help="how long to soak (default %(default)s)"
    )
    p.add_argument(
        "--proofs",
        action="store_true",
        help="instead of the timed soak, three attacks one at a time, each with the figure that shows "
        "the server held: work bombs whose clients hang up after 3 s then the README request; three "
        "1 GiB gzip bombs under /health every 50 ms; 16 uploaders at 1 byte/s then the README request "
        "(about a minute)",
    )
    p.add_argument("--log", default=None, help="write the server's log to this file")
    p.add_argument("--json", default=None, metavar="PATH", help="write the report here as JSON")
    add_plot_option(p, "the server's RSS, open fds and /health latency over time (not with --proofs)")
    return p


def _run_soak(args: argparse.Namespace) -> int:
    if args.proofs and args.plot:
        raise UsageError("--plot draws the timed soak; --proofs has no figure")
    plot_ready(args)
    if args.proofs:
        from laya_onnx.bench import proofs

        report = proofs.run_proofs(args.bundle, log_path=args.log)
        return emit_report(report, args.json, proofs.format_summary(report))
    if not args.minutes > 0:
        raise UsageError("--minutes must be a positive number, got %r" % (args.minutes,))
    from laya_onnx.bench.soak import format_summary, run_soak

    report = run_soak(args.bundle, minutes=args.minutes, log_path=args.log)
    if args.plot:
        from laya_onnx.bench.plot import plot_soak

        drew(plot_soak(report, args.plot))
    return emit_report(report, args.json, format_summary(report))


# -- coldstart ------------------------------------------------------------------------------
def _add_coldstart(group) -> argparse.ArgumentParser:
    from laya_onnx.bench.coldstart import DEFAULT_REPEATS, DEFAULT_THREADS

    p = group.add_parser(
        "coldstart",
        help="process start to first answer, fresh processes, beside the reference (torch)",
        description="Time fresh processes from spawn to the first 3-question answer: import, "
        "load, first answer, and peak RSS at the first answer; with --checkpoint the reference "
        "laya.Agent (torch, needs the dev extra) runs beside each bundle, interleaved.",
    )
    p.add_argument("bundles", nargs="+", metavar="BUNDLE", help="one or more bundles")
    p.add_argument("--checkpoint", help="the checkpoint they were exported from: time the reference too")
    p.add_argument(
        "--repeats", type=int, default=DEFAULT_REPEATS, help="runs per runtime (default %(default)s)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="intra-op threads of every runtime (default %(default)s)",
    )
    p.add_argument(
        "--session-cache",
        metavar="DIR",
        help="also run each bundle from its graph prepared for this machine in DIR (the session cache setting)",
    )
    p.add_argument("--json", metavar="FILE", help="write the report as JSON")
    return p


def _run_coldstart(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.threads < 1:
        raise UsageError("--repeats and --threads must be at least 1")
    from laya_onnx.bench.coldstart import format_report, run_coldstart

    report = run_coldstart(
        args.bundles,
        args.checkpoint,
        repeats=args.repeats,
        threads=args.threads,
        session_cache=args.session_cache,
    )
    return emit_report(report, args.json, format_report(report))


MEASUREMENTS = {
    "agent": Measurement(_add_agent, _run_agent),
    "http": Measurement(_add_http, _run_http),
    "saturate": Measurement(_add_saturate, _run_saturate),
    "memory": Measurement(_add_memory, _run_memory),
    "soak": Measurement(_add_soak, _run_soak),
    "coldstart": Measurement(_add_coldstart, _run_coldstart),
}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description="Every measurement, one subcommand each; 'laya-onnx bench MEASUREMENT --help' "
        "describes its options. Figures are printed (or written as JSON), never asserted.",
    )
    group = p.add_subparsers(dest="measurement", required=True, metavar="MEASUREMENT", help="what to measure")
    for measurement in MEASUREMENTS.values():
        leaf = measurement.add_parser(group)
        leaf.set_defaults(prog=leaf.prog)  # errors name the measurement: "laya-onnx bench http: ..."
    return p


def run(args: argparse.Namespace) -> int:
    return MEASUREMENTS[args.measurement].run(args)
