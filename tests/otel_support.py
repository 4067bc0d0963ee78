"""The SDK's in-memory exporter on the process's tracer provider (OpenTelemetry takes one provider
per process: the first test module that needs spans sets it, the others add their exporter)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def memory_exporter() -> InMemorySpanExporter:
    """A new in-memory exporter receiving every span the process ends from now on."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[union-attr]
    return exporter


def by_name(finished) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in finished:
        out.setdefault(s.name, []).append(s)
    return out
