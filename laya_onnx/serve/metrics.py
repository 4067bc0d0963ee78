"""Prometheus metrics for one server: what `/metrics` exposes (serve/README.md#metrics)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from laya_onnx.core import settings
from laya_onnx.serve.served import Served

PREFIX = "laya_onnx"
M = TypeVar("M", Counter, Gauge, Histogram)
#: Each metric's help text, by its name after PREFIX.
HELP = {
    "_http_requests": "HTTP requests answered, by route template, method and status code.",
    "_http_request_duration_seconds": (
        "Time from the request reaching the application to its response being ready."
    ),
    "_http_requests_in_flight": "Requests being handled now, by route template.",
    "_inference_duration_seconds": (
        "Time of successful forward passes on the worker (what X-Inference-Time-Ms reports)."
    ),
    "_rows": "Question rows answered (one per question per state).",
    "_input_tokens": "Input tokens read by successful passes (non-pad tokens over all rows).",
    "_busy_refusals": (
        f"Decision requests refused with 503 because {settings.MAX_CONCURRENT.env} were already in flight."
    ),
    "_request_rows": "Question rows (one per question per state) of a successful decision request.",
    "_request_input_tokens": "Input tokens (non-pad, over all rows) a successful decision request read.",
    "_request_passes": (
        "Forward passes of the call that answered a successful decision request (a "
        "micro-batch's passes count for each of its requests)."
    ),
    "_microbatch_size": (
        "Per successful decision request: how many requests the call on the worker that "
        "answered it answered in all (its micro-batch; 1 without a batch window)."
    ),
    "_inference_queue_wait_seconds": "Time a decision request waited for the single inference worker.",
    "_inference_queue_depth": (
        "Decision requests waiting for the inference worker now (the running one excluded)."
    ),
    "_admission_limit": f"{settings.MAX_CONCURRENT.env}: decision requests admitted at once.",
}
#: Seconds. Covers a loopback health probe (~1 ms) up to a long batch on a CPU (tens of s).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Per-request work: question rows, input tokens, passes; and requests per call on the worker.
ROWS_BUCKETS = (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)
TOKENS_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536, 262144)
PASSES_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128)
GROUP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: The route label of every request that matched no route (scanners cannot grow the label set).
UNMATCHED = "unmatched"
#: The status label of a request whose client went away before its answer (nginx's 499).
CLIENT_GONE = 499


def work_done(result: Any) -> tuple[int, int]:
    """(question rows answered, input tokens read) of a pass's result, one dict or a list."""
    rows = tokens = 0
    for item in result if isinstance(result, list) else [result]:
        if not isinstance(item, dict):
            continue
        answers = item.get("answers")
        rows += len(answers) if isinstance(answers, dict) else 0
        usage = item.get("usage")
        n = usage.get("input_tokens") if isinstance(usage, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            tokens += n
    return rows, tokens


@dataclass(frozen=True)
class Answered:
    """A successful decision's checkpoint, its call's passes and the requests that call answered."""

    checkpoint: str
    passes: int
    group_size: int = 1


class Metrics(Collector):
    """A front end's HTTP edge on a registry of its own; given the agent its worker runs, also that
    worker's queue, the admission limit and provider fallbacks."""

    def __init__(
        self, agent: Served | None = None, max_concurrent: int = 0, queue_depth: Callable[[], int] = int
    ) -> None:
        self.registry = CollectorRegistry()
        self.requests = self.add(Counter, "_http_requests", ["route", "method", "status"])
        self.latency = self.add(Histogram, "_http_request_duration_seconds", ["route"], LATENCY_BUCKETS)
        self.in_flight = self.add(Gauge, "_http_requests_in_flight", ["route"])
        self.inference = self.add(Histogram, "_inference_duration_seconds", ["route"], LATENCY_BUCKETS)
        self.rows = self.add(Counter, "_rows")
        self.tokens = self.add(Counter, "_input_tokens")
        self.busy = self.add(Counter, "_busy_refusals", ["route"])
        self.request_rows = self.add(Histogram, "_request_rows", ["checkpoint"], ROWS_BUCKETS)
        self.request_tokens = self.add(Histogram, "_request_input_tokens", ["checkpoint"], TOKENS_BUCKETS)
        self.request_passes = self.add(Histogram, "_request_passes", ["checkpoint"], PASSES_BUCKETS)
        self.group_size = self.add(Histogram, "_microbatch_size", [], GROUP_BUCKETS)
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, cpu seconds, fds
        if agent is not None:
            self.agent = agent
            self.queue_wait = self.add(Histogram, "_inference_queue_wait_seconds", ["route"], LATENCY_BUCKETS)
            # read at scrape time: the worker lock's queue, and the fallbacks (`collect`)
            self.add(Gauge, "_inference_queue_depth").set_function(queue_depth)
            self.add(Gauge, "_admission_limit").set(max_concurrent)
            self.registry.register(self)

    def add(self, kind: type[M], name: str, labels: Sequence[str] = (), buckets: Sequence[float] = ()) -> M:
        """The metric `PREFIX + name` with its help text, on this app's registry."""
        extra: dict[str, Any] = {"buckets": buckets} if buckets else {}
        return kind(PREFIX + name, HELP[name], labels, registry=self.registry, **extra)

    def answered(self, route: str, method: str, status: int, seconds: float, busy: bool) -> None:
        """One request answered (or its client gone: `CLIENT_GONE`)."""
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route).observe(seconds)
        if busy:
            self.busy.labels(route).inc()

    def per_request(self, answered: Answered, rows: int, tokens: int) -> None:
        """One successful decision request's work, under the served checkpoint that answered it."""
        self.request_rows.labels(answered.checkpoint).observe(rows)
        self.request_tokens.labels(answered.checkpoint).observe(tokens)
        self.request_passes.labels(answered.checkpoint).observe(answered.passes)
        self.group_size.observe(answered.group_size)

    def worked(self, rows: int, tokens: int) -> None:
        self.rows.inc(rows)
        self.tokens.inc(tokens)

    def waited(self, route: str, ms: float) -> None:
        self.queue_wait.labels(route).observe(ms / 1000.0)

    def collect(self) -> Iterable[Metric]:
        """`laya_onnx_provider_fallbacks_total{provider}`: /health's `provider_fallbacks` table."""
        family = CounterMetricFamily(
            PREFIX + "_provider_fallbacks",
            "Passes (or session builds) an execution provider failed and handed to the next one.",
            labels=["provider"],
        )
        for provider, entry in sorted(self.agent.fallbacks.items()):  # a snapshot
            family.add_metric([provider], entry["count"])
        yield family
