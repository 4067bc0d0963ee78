"""`laya-onnx bench`: bundles against the reference laya.Agent, or a running server under load."""

from __future__ import annotations

import argparse

from laya_onnx.cli.common import UsageError, emit_report


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench",
        help="time bundles against the reference laya.Agent, or load a running server (needs the dev extra)",
        description="Time the reference laya.Agent (torch, CPU) and each bundle call by call, "
        "interleaved, through the public API, on fixed workloads: medians, ratios and their range, "
        "our Python part beside the session run, peak RSS (the bench process, and each runtime "
        "alone in a child process). With --serve URL: drive a running server with 1, 8 and 32 "
        "concurrent clients instead (throughput, p50/p99).",
    )
    p.add_argument(
        "models",
        nargs="*",
        metavar="CHECKPOINT BUNDLE [BUNDLE ...]",
        help="the checkpoint, then one or more bundles exported from it",
    )
    p.add_argument("--repeats", type=int, default=10, help="timed calls per runtime and workload")
    p.add_argument(
        "--threads", type=int, default=None, help="threads for both runtimes (default: torch's count)"
    )
    p.add_argument(
        "--workloads",
        default=None,
        help="comma list of workloads (default readme-1x3,state80-1x3,short-1x1,batch-32x3; "
        "also batch-8x3, long-1x3)",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write the report here as JSON")
    p.add_argument(
        "--no-rss", action="store_true", help="skip each runtime's peak RSS alone (child processes)"
    )
    p.add_argument("--serve", default=None, metavar="URL", help="drive the server at URL instead")
    p.add_argument("--clients", default="1,8,32", help="with --serve: comma list of concurrent client counts")
    p.add_argument("--seconds", type=float, default=10.0, help="with --serve: seconds per client count")
    p.add_argument(
        "--deadline",
        type=float,
        default=10.0,
        help="with --serve: seconds a request may take before it counts as hung (a large bundle "
        "with many clients and no batch window queues for longer)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    if args.serve:
        return _run_serve(args)
    if len(args.models) < 2:
        raise UsageError("bench needs CHECKPOINT BUNDLE [BUNDLE ...] (or --serve URL)")
    from laya_onnx.bench.agent import run_bench

    report = run_bench(
        args.models[0],
        args.models[1:],
        repeats=args.repeats,
        threads=args.threads,
        workloads=args.workloads.split(",") if args.workloads else None,
        rss=not args.no_rss,
        progress=print,
    )
    return emit_report(report, args.json)


def _run_serve(args: argparse.Namespace) -> int:
    from laya_onnx.bench.http import drive_server

    clients = [int(c) for c in args.clients.split(",") if c.strip()]
    if not clients or min(clients) < 1:
        raise UsageError("--clients must be a comma list of positive integers, got %r" % (args.clients,))
    if not args.deadline > 0:
        raise UsageError("--deadline must be a positive number of seconds, got %r" % (args.deadline,))
    report = drive_server(
        args.serve, clients=clients, seconds=args.seconds, deadline_s=args.deadline, progress=print
    )
    return emit_report(report, args.json)
