"""`laya-onnx bench http URL`: a running server under load, and the HTTP clients every server
measurement runs.

The clients run in child processes (this module run with `python -m`), so client-side work never
competes with a server in the parent for the interpreter lock:

  * `load`: N clients post the same decision body as fast as they are answered, each request
    with a deadline; a 503 is counted (with or without `Retry-After`) and retried after a
    short pause, as a well-behaved client would, but sooner than the header says so the
    server stays saturated;
  * `probe`: one client polls `/health` at a fixed interval and times every answer.

aiohttp (the serve extra) is imported where a client runs, so `laya-onnx bench --help` reads the
defaults here without it. Figures are printed, never asserted: timing on a shared machine is not
a pass/fail test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from laya_onnx.bench.child import python_module
from laya_onnx.bench.sample import README_REQUEST

DECISION_PATH = "/v1/systemone"
HEALTH_PATH = "/health"
#: Every request gets this long to be answered or refused; one that takes longer "hung".
DEFAULT_DEADLINE_S = 10.0
#: How long a client waits after a 503 before it tries again (the server says 1 s; the bench
#: retries sooner so the admission bound is what it measures, not the clients' patience).
DEFAULT_RETRY_PAUSE_S = 0.05
DEFAULT_PROBE_INTERVAL_S = 0.02
#: `drive_server`: the concurrent client counts, one run each, and each run's length.
DEFAULT_CLIENT_COUNTS = (1, 8, 32)
DEFAULT_SECONDS = 10.0


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def summary_ms(values: list[float]) -> dict[str, Any]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 2)

    return {
        "n": len(values),
        "p50": r(percentile(values, 50)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values) if values else None),
    }


async def _wait_until(epoch: float | None) -> None:
    """Both children start their windows at the same wall-clock instant, whichever of them
    finished starting its interpreter first."""
    if epoch is not None:
        await asyncio.sleep(max(0.0, epoch - time.time()))


async def generate_load(
    url: str,
    body: bytes,
    clients: int,
    seconds: float,
    deadline_s: float = DEFAULT_DEADLINE_S,
    retry_pause_s: float = DEFAULT_RETRY_PAUSE_S,
    start_at: float | None = None,
) -> dict[str, Any]:
    """`clients` concurrent posters for `seconds`; every request answered, refused or timed out."""
    from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector

    await _wait_until(start_at)
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    no_retry_after = hung = 0
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    headers = {"Content-Type": "application/json"}

    async def client(session: Any) -> None:
        nonlocal no_retry_after, hung
        while loop.time() < stop_at:
            start = time.perf_counter()
            status = None
            try:
                async with session.post(url + DECISION_PATH, data=body, headers=headers) as resp:
                    await resp.read()
                    status = resp.status
                    if status == 503 and "Retry-After" not in resp.headers:
                        no_retry_after += 1
            except asyncio.TimeoutError:
                hung += 1
            except ClientError as exc:
                errors[type(exc).__name__] += 1
            if status is None:
                continue
            statuses[status] += 1
            if status == 200:
                latencies.append((time.perf_counter() - start) * 1000.0)
            elif status == 503:
                await asyncio.sleep(retry_pause_s)

    started = time.perf_counter()
    connector = TCPConnector(limit=clients)
    async with ClientSession(connector=connector, timeout=ClientTimeout(total=deadline_s)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    window = time.perf_counter() - started
    return {
        "clients": clients,
        "window_s": round(window, 3),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "answered_per_s": round(statuses[200] / window, 1),
        "refused_503_without_retry_after": no_retry_after,
        "hung": hung,
        "client_errors": dict(errors),
        "latency_ms_200": summary_ms(latencies),
    }


async def probe_health(
    url: str,
    seconds: float,
    interval_s: float = DEFAULT_PROBE_INTERVAL_S,
    deadline_s: float = DEFAULT_DEADLINE_S,
    start_at: float | None = None,
) -> dict[str, Any]:
    """Time `GET /health` every `interval_s` for `seconds`."""
    from aiohttp import ClientSession, ClientTimeout

    await _wait_until(start_at)
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    hung = 0
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    async with ClientSession(timeout=ClientTimeout(total=deadline_s)) as session:
        while loop.time() < stop_at:
            start = time.perf_counter()
            try:
                async with session.get(url + HEALTH_PATH) as resp:
                    await resp.read()
                    statuses[resp.status] += 1
                    latencies.append((time.perf_counter() - start) * 1000.0)
            except asyncio.TimeoutError:
                hung += 1
            await asyncio.sleep(interval_s)
    return {
        "statuses": {str(k): v for k, v in statuses.items()},
        "hung": hung,
        "latency_ms": summary_ms(latencies),
    }


async def run_child(*args: str, stdin: bytes | None = None, timeout: float) -> dict[str, Any]:
    """Run this module as a child process (`load` or `probe`, see `_main`) and read its JSON."""
    proc = await asyncio.create_subprocess_exec(
        *python_module("laya_onnx.bench.http", *args),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError("load generator %s did not finish within %.0f s" % (args[0], timeout)) from None
    if proc.returncode != 0:
        raise RuntimeError("load generator %s failed: %s" % (args[0], err.decode(errors="replace")[-2000:]))
    return json.loads(out)


def drive_server(
    url: str,
    clients: Sequence[int] = DEFAULT_CLIENT_COUNTS,
    seconds: float = DEFAULT_SECONDS,
    body: Any = None,
    deadline_s: float = DEFAULT_DEADLINE_S,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """`laya-onnx bench http URL`: load a server that is already running (another process,
    started with the settings under test) with each client count in turn, posting `body`
    (default the README request) for `seconds` each; throughput and latency per count."""

    payload = json.dumps(README_REQUEST if body is None else body).encode("utf-8")
    out: dict[str, Any] = {"url": url, "seconds": seconds, "runs": {}}
    for n in clients:
        figures = asyncio.run(generate_load(url.rstrip("/"), payload, n, seconds, deadline_s))
        out["runs"][str(n)] = figures
        if progress:
            lat = figures["latency_ms_200"]
            progress(
                "%3d clients: %7.1f answers/s  p50 %s ms  p99 %s ms  statuses %s"
                % (n, figures["answered_per_s"], lat["p50"], lat["p99"], figures["statuses"])
            )
    return out


# -- child entry point ----------------------------------------------------------------------


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m laya_onnx.bench.http")
    sub = p.add_subparsers(dest="mode", required=True)
    ld = sub.add_parser("load", help="post the JSON body read from stdin")
    ld.add_argument("url")
    ld.add_argument("clients", type=int)
    ld.add_argument("seconds", type=float)
    ld.add_argument("deadline", type=float)
    ld.add_argument("start_at", type=float, help="epoch seconds the window opens at; 0 = now")
    pb = sub.add_parser("probe", help="poll /health")
    pb.add_argument("url")
    pb.add_argument("seconds", type=float)
    pb.add_argument("deadline", type=float)
    pb.add_argument("start_at", type=float, help="epoch seconds the window opens at; 0 = now")
    args = p.parse_args(argv)
    if args.mode == "load":
        body = sys.stdin.buffer.read()
        result = asyncio.run(
            generate_load(
                args.url, body, args.clients, args.seconds, args.deadline, start_at=args.start_at or None
            )
        )
    else:
        result = asyncio.run(
            probe_health(args.url, args.seconds, deadline_s=args.deadline, start_at=args.start_at or None)
        )
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
