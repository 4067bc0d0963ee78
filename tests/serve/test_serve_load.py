"""The server saturated: `bench saturate`'s machinery against an agent with a fixed pass time.

More clients than admission slots post for a few seconds while `/health` is polled; the
figures (throughput, 503s, /health p50/p99, gateway overhead) are printed — `pytest -s` shows
them — and what is asserted is behaviour, not speed: every request is answered or refused
before its deadline, every refusal is a 503 with Retry-After, the server's own counters agree
with what the clients saw, and /health never failed while the worker was busy.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from laya_onnx.bench.saturate import bench_app
from laya_onnx.serve import create_app
from laya_onnx.serve.app import METRICS
from tests.serve_support import BODY, FakeAgent

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]

PASS_SECONDS = 0.02
SLOTS = 4
CLIENTS = 12


class FixedDelayAgent(FakeAgent):
    """Sleeps a fixed time per pass (as a model does, off the interpreter lock), then answers."""

    def __init__(self, delay: float):
        super().__init__()
        self.delay = delay

    def predict(self, state, questions, **kw):
        time.sleep(self.delay)
        with self._lock:
            self.calls.append(("predict", None, None, kw))
        return self._one(state, questions, kw.get("min_confidence"))


def test_saturation_refuses_the_excess_and_keeps_health_answering():
    agent = FixedDelayAgent(PASS_SECONDS)
    app = create_app(agent, max_concurrent=SLOTS)
    figures = asyncio.run(bench_app(app, BODY, clients=CLIENTS, seconds=3.0, sequential_seconds=1.0))
    print("\nserve load (fixed %.0f ms pass, %d slots, %d clients):" % (PASS_SECONDS * 1000, SLOTS, CLIENTS))
    print(json.dumps(figures, indent=1))

    seq, sat = figures["sequential"], figures["saturated"]
    # One client never meets a full house.
    assert set(seq["client"]["statuses"]) == {"200"} and seq["client"]["hung"] == 0
    load, health = sat["client"], sat["health"]
    # Nothing hangs: each request was answered or refused within its deadline, no socket errors.
    assert load["hung"] == 0 and load["client_errors"] == {}
    assert set(load["statuses"]) == {"200", "503"}, load["statuses"]
    assert load["refused_503_without_retry_after"] == 0
    assert health["hung"] == 0 and set(health["statuses"]) == {"200"} and health["latency_ms"]["n"] > 10
    # The server's counters agree with the clients, and every answer was one pass.
    registry = app[METRICS].registry
    refused = registry.get_sample_value("laya_onnx_busy_refusals_total", {"route": "/v1/systemone"})
    answered = registry.get_sample_value(
        "laya_onnx_http_requests_total", {"route": "/v1/systemone", "method": "POST", "status": "200"}
    )
    assert refused == load["statuses"]["503"]
    assert answered == load["statuses"]["200"] + seq["client"]["statuses"]["200"] == len(agent.calls)
    assert sat["server"]["wall_ms"]["n"] == load["statuses"]["200"]
