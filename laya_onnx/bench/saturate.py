"""`laya-onnx bench saturate BUNDLE`: the server under saturation, measured from outside and
from inside.

The server runs on this process's event loop, on 127.0.0.1; the load comes from two child
processes (`laya_onnx.bench.http`'s `load` and `probe`). Phases: `sequential` (one client: the
gateway's own cost with nothing queued), then `saturated` (N clients, with /health polled).
Inside the server a recording middleware takes, for every successful decision, the wall time of
our code, the wait for the inference worker and the pass itself; the gateway overhead is
wall − wait − pass: routing, auth, admission, body read, checks, shaping, rendering and the
hand-off to and from the worker thread.

aiohttp (the serve extra) is imported where the server runs, so `laya-onnx bench --help` reads
the defaults here without it. Figures are printed, never asserted: timing on a shared machine is
not a pass/fail test.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from laya_onnx.bench.http import DEFAULT_DEADLINE_S, run_child, summary_ms
from laya_onnx.bench.sample import README_REQUEST
from laya_onnx.core import settings as core_settings
from laya_onnx.core.machine import read_cpu

if TYPE_CHECKING:
    from aiohttp import web

#: The saturated phase: concurrent clients and its length.
DEFAULT_CLIENTS = 16
DEFAULT_SECONDS = 5.0
#: Time given to the two children to start their interpreters before their common window opens.
CHILD_START_S = 3.0


def record_decisions(app: web.Application) -> list[dict[str, float]]:
    """Add an outermost middleware that records every successful decision's timings (ms).

    Must run before the app starts (aiohttp freezes the middleware list then).
    """
    from aiohttp import web

    from laya_onnx.serve.logs import INFERENCE_MS, QUEUE_WAIT_MS

    samples: list[dict[str, float]] = []

    @web.middleware
    async def recorder(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        start = time.perf_counter()
        response = await handler(request)
        inference, queue = request.get(INFERENCE_MS), request.get(QUEUE_WAIT_MS)
        if response.status == 200 and inference is not None and queue is not None:
            wall = (time.perf_counter() - start) * 1000.0
            samples.append({"wall": wall, "queue": queue, "inference": inference})
        return response

    app.middlewares.insert(0, recorder)
    return samples


def server_figures(samples: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "wall_ms": summary_ms([s["wall"] for s in samples]),
        "queue_wait_ms": summary_ms([s["queue"] for s in samples]),
        "inference_ms": summary_ms([s["inference"] for s in samples]),
        "gateway_overhead_ms": summary_ms([s["wall"] - s["queue"] - s["inference"] for s in samples]),
    }


async def bench_app(
    app: web.Application,
    body: Any,
    clients: int = DEFAULT_CLIENTS,
    seconds: float = DEFAULT_SECONDS,
    sequential_seconds: float = 2.0,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> dict[str, Any]:
    """Serve `app` on 127.0.0.1 and run both phases against it; returns every figure."""
    from aiohttp import web

    samples = record_decisions(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    url = "http://127.0.0.1:%d" % port
    payload = json.dumps(body).encode("utf-8")
    # Generous: a child's interpreter start plus its window plus one deadline.
    limit = 30.0 + deadline_s
    out: dict[str, Any] = {"clients": clients}
    try:
        window = [url, "1", str(sequential_seconds), str(deadline_s), "0"]
        seq = await run_child("load", *window, stdin=payload, timeout=limit + sequential_seconds)
        out["sequential"] = {"client": seq, "server": server_figures(samples)}
        samples.clear()
        start_at = str(time.time() + CHILD_START_S)
        load, probe = await asyncio.gather(
            run_child(
                "load",
                url,
                str(clients),
                str(seconds),
                str(deadline_s),
                start_at,
                stdin=payload,
                timeout=limit + seconds,
            ),
            run_child("probe", url, str(seconds), str(deadline_s), start_at, timeout=limit + seconds),
        )
        out["saturated"] = {"client": load, "health": probe, "server": server_figures(samples)}
    finally:
        await runner.cleanup()
    return out


def format_summary(figures: dict[str, Any]) -> str:
    """Both phases as a few lines: answers per second, latency, statuses, /health's latency
    under load and the server's own overhead around the pass."""
    lines = [
        "%-11s %7s %10s %8s %8s %-22s %12s %13s"
        % ("phase", "clients", "answers/s", "p50 ms", "p99 ms", "statuses", "/health p99", "overhead p50"),
    ]
    for phase in ("sequential", "saturated"):
        run = figures.get(phase)
        if not run:
            continue
        client, latency = run["client"], run["client"]["latency_ms_200"]
        health = run.get("health", {}).get("latency_ms", {}).get("p99")
        lines.append(
            "%-11s %7d %10.1f %8s %8s %-22s %12s %13s"
            % (
                phase,
                client["clients"],
                client["answered_per_s"],
                latency["p50"],
                latency["p99"],
                " ".join("%s:%d" % kv for kv in client["statuses"].items()),
                "" if health is None else health,
                run["server"]["gateway_overhead_ms"]["p50"],
            )
        )
    return "\n".join(lines)


def run_saturate(
    bundle: str,
    clients: int = DEFAULT_CLIENTS,
    seconds: float = DEFAULT_SECONDS,
    max_concurrent: int | None = None,
    providers: list[str] | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """`laya-onnx bench saturate`: the README request against `bundle`, served in this process."""
    from laya_onnx import ONNXAgent
    from laya_onnx.serve.app import create_app

    options: dict[str, Any] = {"threads": threads} if threads else {}
    agent = ONNXAgent(bundle, providers=providers, **options)
    settings = {"max_concurrent": max_concurrent} if max_concurrent else {}
    app = create_app(agent, **settings)
    figures = asyncio.run(bench_app(app, README_REQUEST, clients=clients, seconds=seconds))
    figures["providers"] = agent.providers
    figures["cpu"] = read_cpu().label
    figures["max_concurrent"] = max_concurrent or core_settings.MAX_CONCURRENT.env
    return figures
