"""The server saturated: `serve-bench`'s machinery against an agent with a fixed pass time.

More clients than admission slots post for a few seconds while `/health` is polled; the
figures (throughput, 503s, /health p50/p99, gateway overhead) are printed — `pytest -s` shows
them — and what is asserted is behaviour, not speed: every request is answered or refused
before its deadline, every refusal is a 503 with Retry-After, the server's own counters agree
with what the clients saw, and /health never failed while the worker was busy.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from laya_onnx.serve import create_app
from laya_onnx.serve.loadbench import bench_app
from laya_onnx.serve.metrics import METRICS

PASS_SECONDS = 0.02
SLOTS = 4
CLIENTS = 12
BODY = {
    "state": "I was charged twice this month, I want my money back",
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the user ask for a refund?"},
        "queue": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "tech"]},
    },
}


class FixedDelayAgent:
    """Sleeps a fixed time per pass (as a model would, off the interpreter lock) and answers."""

    name = "english"
    revision = None
    providers = ["CPUExecutionProvider"]

    def __init__(self, delay: float):
        self.delay = delay
        self.passes = 0
        self._lock = threading.Lock()

    def predict(self, state, questions, **controls):
        time.sleep(self.delay)
        with self._lock:
            self.passes += 1
        answers = {}
        for qid, q in questions.items():
            if q["type"] == "noul":
                answers[qid] = {"type": "noul", "noul": 0.9, "confidence": 0.9}
            else:
                labels = [str(c) for c in q["criteria"]]
                probs = dict(zip(labels, [1.0] + [0.0] * (len(labels) - 1), strict=True))
                answers[qid] = {
                    "type": "choice",
                    "choice": labels[0],
                    "probabilities": probs,
                    "confidence": 1.0,
                }
        return {"model": "fixed-delay", "answers": answers, "usage": {"input_tokens": 7, "output_tokens": 0}}


def test_saturation_refuses_the_excess_and_keeps_health_answering(monkeypatch):
    for key in ("LAYA_API_KEY", "LAYA_JEV_STRICT", "LAYA_MAX_TOKEN_BUDGET", "LAYA_MAX_BATCH_TOKENS"):
        monkeypatch.delenv(key, raising=False)
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
    assert answered == load["statuses"]["200"] + seq["client"]["statuses"]["200"] == agent.passes
    assert sat["server"]["wall_ms"]["n"] == load["statuses"]["200"]
