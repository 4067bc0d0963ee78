"""`laya-onnx bench-memory`: peak RSS and time of a long-state batch, a fresh process per runtime."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from laya_onnx.cli.common import EXIT_OK


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench-memory",
        help="peak RSS and time of a long-state batch, one fresh process per runtime configuration",
        description="Run a batch of long states (the memory report's scenario, scaled by --tokens) "
        "through the bundle, and optionally through an --attention unfused bundle (as the runtime "
        "ran before: no pass budget, arena kept) and the reference laya.Agent, each in its own "
        "process, and print idle, peak and after RSS and the median call time.",
    )
    p.add_argument("bundle", help="the bundle as exported now (fused attention)")
    p.add_argument("--unfused", default=None, help="an --attention unfused bundle of the same checkpoint")
    p.add_argument("--checkpoint", default=None, help="also run the reference laya.Agent (dev extra)")
    p.add_argument("--states", type=int, default=2, help="states in the batch (default 2)")
    p.add_argument("--words", type=int, default=7000, help='each state is "w0 w1 ... w{words-1}"')
    p.add_argument("--tokens", type=int, default=4096, help="max_len of the request")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per configuration")
    p.add_argument("--only", default=None, help="comma-separated: after,before,unfused+release,reference")
    p.add_argument("--json", action="store_true", help="also print the report as JSON")
    p.add_argument(
        "--arena", action="store_true", help="first compare CPU-arena configurations (speed and RSS)"
    )
    return p


def run(args: argparse.Namespace) -> int:
    from laya_onnx.bench.memory import (
        format_arena_table,
        format_table,
        run_arena_bench,
        run_graph_speed,
        run_memory_bench,
    )

    if args.unfused:
        speed = run_graph_speed(args.bundle, args.unfused)
        print("CPU ms per call (1 thread, median, interleaved): " + json.dumps(speed))

    if args.arena:
        arena = run_arena_bench(Path(args.bundle) / "laya.onnx")
        print(format_arena_table(arena))
        if args.json:
            print(json.dumps(arena, indent=2))
    report = run_memory_bench(
        args.bundle,
        unfused=args.unfused,
        checkpoint=args.checkpoint,
        states=args.states,
        words=args.words,
        tokens=args.tokens,
        repeats=args.repeats,
        only=args.only.split(",") if args.only else None,
    )
    print(format_table(report))
    if args.json:
        print(json.dumps(report, indent=2))
    return EXIT_OK
