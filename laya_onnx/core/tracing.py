"""OpenTelemetry spans of a call: one per `ONNXAgent` call, with its tokenization, each forward
pass, its decoding and its hooks as children (the `otel` extra).

Spans are made only when the process has a tracer provider of its own: an application that set
one up (`opentelemetry.trace.set_tracer_provider`) gets them under its current span; the server
sets one up from the standard `OTEL_*` variables (`configure_from_environment`). Otherwise
tracing is off and costs a dictionary lookup per span: this module never imports opentelemetry
itself unless it is asked to configure it, and `span` hands back one shared no-op context.

The names and attributes (one meaning each):

| span | attributes |
|---|---|
| `METHOD /route` (the server's, per request; continues an incoming `traceparent`) | `http.request.method`, `http.route`, `http.response.status_code`, `laya.request_id` |
| `laya.queue` (the request's wait for the inference worker) | `laya.microbatch.size` (micro-batched requests) |
| `laya.call` | `laya.model`, `laya.states`, `laya.questions` |
| `laya.tokenize` | `laya.rows`, `laya.input_tokens` |
| `laya.pass` | `laya.pass.index`, `laya.pass.rows`, `laya.pass.tokens` (real, unpadded), `laya.pass.length_bucket` (the padded length), `laya.precision`, `laya.provider` |
| `laya.decode` | |
| `laya.hooks` | `laya.hooks.event` (`on_predict_start`, `on_predict_end`, `on_error`) |
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from laya_onnx.core.errors import ConfigError

#: The instrumentation scope the spans are made under.
SCOPE = "laya_onnx"
#: The standard variable that turns the exporter on (`console`, `otlp`, or any installed
#: exporter's entry-point name; `none` or unset: off).
EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"
DEFAULT_SERVICE_NAME = "laya-onnx"
#: The entry-point group the SDK's exporters register under, and what `otlp` means here (the
#: otel extra brings OTLP over HTTP; the gRPC exporter is taken where it is the one installed).
EXPORTER_GROUP = "opentelemetry_traces_exporter"
OTLP_EXPORTERS = ("otlp_proto_http", "otlp_proto_grpc")

_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()
_cached: tuple[Any, Any] = (None, None)  # (provider, its tracer)


def tracer() -> Any:
    """The tracer spans are made with, or None when the process has no tracer provider of its
    own (opentelemetry not imported, or only its default no-op/proxy provider)."""
    global _cached
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    if _cached[0] is not provider:
        from laya_onnx import __version__

        _cached = (provider, provider.get_tracer(SCOPE, __version__))
    return _cached[1]


def enabled() -> bool:
    return tracer() is not None


def span(name: str, attributes: Mapping[str, Any] | None = None, **options: Any) -> Any:
    """A context manager: a span named `name`, current inside it (its value: the span, to add
    attributes to), or a shared no-op whose value is None when tracing is off. `options` go to
    the tracer (`context=`, `kind=`, `links=`)."""
    active = tracer()
    if active is None:
        return _OFF
    return active.start_as_current_span(name, attributes=attributes, **options)


def set_attributes(current: Any, attributes: Callable[..., Mapping[str, Any]], *args: Any) -> None:
    """Add `attributes(*args)` to a span `span` handed back (nothing made when tracing is off)."""
    if current is not None:
        current.set_attributes(attributes(*args))


def call_attributes(model: str, states: Any, questions: Any) -> dict[str, Any] | None:
    """A `laya.call` span's attributes (None, nothing counted, when tracing is off)."""
    if tracer() is None:
        return None
    return {
        "laya.model": model,
        "laya.states": len(states) if isinstance(states, (list, tuple)) else 1,
        "laya.questions": len(questions) if isinstance(questions, dict) else 0,
    }


def tokenized_attributes(encoded: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """A `laya.tokenize` span's attributes: the rows of every state and their tokens."""
    rows = [row for state_rows in encoded for row in state_rows]
    return {"laya.rows": len(rows), "laya.input_tokens": sum(len(row.ids) for row in rows)}


def pass_attributes(agent: Any, index: int, rows: Sequence[Any], length: int) -> dict[str, Any] | None:
    """A `laya.pass` span's attributes for `agent`'s pass `index` over `rows` padded to `length`
    (None when tracing is off)."""
    if tracer() is None:
        return None
    return {
        "laya.pass.index": index,
        "laya.pass.rows": len(rows),
        "laya.pass.tokens": sum(len(row.ids) for row in rows),
        "laya.pass.length_bucket": length,
        "laya.precision": agent.precision,
        "laya.provider": agent.providers[0],
    }


def record(name: str, started: float, ended: float, attributes: Mapping[str, Any] | None = None) -> None:
    """A span that already happened, under the current one: from `started` to `ended`, two
    `time.perf_counter()` readings (a wait measured where no span could be held open)."""
    active = tracer()
    if active is None:
        return
    now_ns, now = time.time_ns(), time.perf_counter()
    begin = active.start_span(name, attributes=attributes, start_time=now_ns - int((now - started) * 1e9))
    begin.end(end_time=now_ns - int((now - ended) * 1e9))


def in_current_context(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn`, to run on another thread (an executor's) inside this one's context: its spans are
    children of the current span, its log lines carry the current request's id."""
    return functools.partial(contextvars.copy_context().run, fn)


def request_span(method: str, headers: Mapping[str, str], attributes: Mapping[str, Any] | None = None) -> Any:
    """`span` for a request a server received: named by its method (name it `METHOD /route` once
    the route is known), continuing the trace its W3C `traceparent` carries."""
    active = tracer()
    if active is None:
        return _OFF
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    return active.start_as_current_span(
        method, context=extract(headers), kind=SpanKind.SERVER, attributes=attributes
    )


def answered(current: Any, method: str, route: str, status: int) -> None:
    """Name a request span (`request_span`) `METHOD /route` once answered, with OpenTelemetry's
    HTTP attributes (nothing when tracing is off)."""
    if current is None:
        return
    current.update_name("%s %s" % (method, route))
    current.set_attributes(
        {"http.request.method": method, "http.route": route, "http.response.status_code": status}
    )


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span as W3C hex, or None (off, or no span)."""
    if tracer() is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)


def configure_from_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """Set up the SDK's tracer provider from the standard variables, once per process: its
    exporter from `OTEL_TRACES_EXPORTER` (comma list), the service name from `OTEL_SERVICE_NAME`
    (default `laya-onnx`), the exporter's own `OTEL_EXPORTER_*` settings read by the exporter.
    Returns the exporters' names, or None when off (unset or `none`). Without the otel extra a
    warning says so and tracing stays off; an unknown exporter name is a ConfigError."""
    env = os.environ if environ is None else environ
    names = [n.strip().lower() for n in env.get(EXPORTER_ENV, "").split(",") if n.strip()]
    if not names or names == ["none"]:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        warnings.warn(
            "laya-onnx: %s is set but OpenTelemetry's SDK is not installed: tracing stays off; "
            "install it with: pip install 'laya-onnx[otel]'" % EXPORTER_ENV,
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    exporters = [_exporter(name) for name in names]
    resource = Resource.create({} if env.get(SERVICE_NAME_ENV) else {"service.name": DEFAULT_SERVICE_NAME})
    provider = TracerProvider(resource=resource)
    for name, exporter in zip(names, exporters, strict=True):
        # the console prints each span as it ends; a network exporter sends them in batches
        processor = SimpleSpanProcessor if name == "console" else BatchSpanProcessor
        provider.add_span_processor(processor(exporter))
    trace.set_tracer_provider(provider)
    return ",".join(names)


def _exporter(name: str) -> Any:
    from importlib.metadata import entry_points

    installed = {ep.name: ep for ep in entry_points(group=EXPORTER_GROUP)}
    candidates = OTLP_EXPORTERS if name == "otlp" else (name,)
    for candidate in candidates:
        if candidate in installed:
            return installed[candidate].load()()
    raise ConfigError(
        "%s=%s: no such span exporter installed; choose from %s"
        % (EXPORTER_ENV, name, ", ".join(sorted({*installed, "otlp", "none"})))
    )
