"""`laya-onnx serve-bench`: a bundle served on 127.0.0.1 and saturated from child processes."""

from __future__ import annotations

import argparse
import json

from laya_onnx.cli.common import EXIT_OK, add_bundle_and_providers
from laya_onnx.core import settings


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve-bench",
        help="saturate a served bundle on 127.0.0.1: throughput, 503s, /health latency, gateway overhead",
        description="Serve the bundle in-process on 127.0.0.1 and load it from child processes: one "
        "client, then --clients posting the README request while /health is polled; print JSON figures.",
    )
    add_bundle_and_providers(p)
    p.add_argument("--clients", type=int, default=16, help="concurrent clients in the saturated phase")
    p.add_argument("--seconds", type=float, default=5.0, help="length of the saturated phase")
    settings.add_arguments(p, settings.MAX_CONCURRENT, settings.THREADS)
    return p


def run(args: argparse.Namespace) -> int:
    from laya_onnx.bench.http import run_serve_bench

    figures = run_serve_bench(
        args.bundle,
        clients=args.clients,
        seconds=args.seconds,
        max_concurrent=args.max_concurrent,
        providers=args.providers,
        threads=args.threads,
    )
    print(json.dumps(figures, indent=2))
    return EXIT_OK
