"""`laya-onnx serve`: a bundle (or a models directory) over HTTP, or on Ray Serve."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys

from laya_onnx.cli.common import (
    EXIT_OK,
    UsageError,
    add_bundle_and_providers,
    add_strict_providers,
)
from laya_onnx.core import settings
from laya_onnx.core.setting import add_arguments

NAME = "serve"
HELP = "serve a bundle over HTTP (POST /v1/systemone, /v1/systemone/batch; GET /health, /v1/models, /metrics)"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        help=HELP,
        description="Serve a bundle over TypeSafe Jev's /v1/systemone wire protocol until SIGINT/SIGTERM, "
        "then drain (%s; see serve/README.md)." % settings.SHUTDOWN_GRACE_SECONDS.env,
    )
    add_bundle_and_providers(
        p,
        optional=True,
        what="bundle directory or Hub repo id[/subfolder] holding one; or a models directory (one "
        "bundle folder per checkpoint name, as 'export --all' writes) served through the Router",
    )
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=BUNDLE",
        help="serve BUNDLE under NAME through the Router (repeatable; beside a models directory's)",
    )
    add_strict_providers(p)
    p.add_argument(
        "--ray",
        metavar="CONFIG",
        default=None,
        help="serve on Ray Serve instead, from a Ray Serve config file (serve/ray/serve-config.yaml): "
        "replicas, autoscaling, CPU/GPU per replica, micro-batching; needs the ray extra",
    )
    add_arguments(p, settings.HOST, settings.PORT, settings.THREADS, settings.LOG_FORMAT)
    return p


def run(args: argparse.Namespace) -> int:
    if args.ray is not None:
        if args.bundle is not None or args.model or args.host is not None or args.port is not None:
            raise UsageError("--ray CONFIG takes the bundle, host and port from the config file")
        return run_on_ray(args.ray)
    if args.bundle is None and not args.model:
        raise UsageError(
            "give a bundle to serve (or a models directory, or --model NAME=BUNDLE), or --ray CONFIG"
        )
    from laya_onnx.serve import run_server
    from laya_onnx.serve.served import parse_model_option

    for option in args.model:
        parse_model_option(option)  # refused before anything binds or loads
    run_server(
        args.bundle,
        host=args.host,
        port=args.port,
        providers=args.providers,
        models=args.model,
        strict_providers=args.strict_providers,
        threads=args.threads,
        log_format=args.log_format,
    )
    return EXIT_OK


#: The child `run_on_ray` starts: `ray_app.run_config` with Python's own SIGINT handler back.
SERVE_RUN = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from laya_onnx.serve.ray_app import run_config; run_config(sys.argv[1])"
)


def run_on_ray(config: str) -> int:
    """Ray's `serve run CONFIG` in a child process group of its own, until SIGINT or SIGTERM.

    Either one here is handed to the child as SIGINT, on which `serve run` shuts its
    applications and the Ray instance it started down; then what is left of its group is
    terminated, and the child's exit status returned. The handlers are set here, so a start
    that ignores SIGINT (a shell's background job) still stops on it.
    """
    child = subprocess.Popen([sys.executable, "-c", SERVE_RUN, config], preexec_fn=os.setpgrp)

    def forward(*_: object) -> None:  # (signum, frame)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGINT)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    status = child.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    return status if status >= 0 else 128 - status  # killed by a signal: 128 + its number
