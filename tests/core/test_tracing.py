"""OpenTelemetry spans from ONNXAgent calls (laya_onnx/core/tracing.py), read back with the SDK's
in-memory exporter: their parent-child shape for a call of two passes, their attributes, the hook
spans, and that nothing is imported or made while the process has no tracer provider."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (opentelemetry-sdk) is not installed")

from opentelemetry import trace

from laya_onnx.core import tracing
from tests.otel_support import by_name, memory_exporter

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Should we refund?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"a": "billing", "b": "tech"}},
}


@pytest.fixture(scope="module")
def spans():
    """Every span the process ends, in memory (tests clear it before use)."""
    return memory_exporter()


def test_a_call_of_two_passes_is_one_span_with_tokenize_passes_and_decode(spans, tiny_english_agent):
    spans.clear()
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("app.request") as outer:
        results = tiny_english_agent.predict_batch(
            ["I was charged twice", "Where is my parcel? " * 6], QUESTIONS, batch_size=1
        )
    assert len(results) == 2
    finished = spans.get_finished_spans()
    named = by_name(finished)
    assert sorted(named) == ["app.request", "laya.call", "laya.decode", "laya.pass", "laya.tokenize"]
    (call,) = named["laya.call"]
    # the call continues the application's current span, in its trace
    assert call.parent.span_id == outer.get_span_context().span_id
    assert {s.context.trace_id for s in finished} == {outer.get_span_context().trace_id}
    passes = sorted(named["laya.pass"], key=lambda s: s.attributes["laya.pass.index"])
    children = [*named["laya.tokenize"], *passes, *named["laya.decode"]]
    assert all(s.parent.span_id == call.context.span_id for s in children)
    # in the order they ran: tokenize, pass 0, pass 1, decode
    assert [s.start_time for s in children] == sorted(s.start_time for s in children)
    assert call.attributes["laya.states"] == 2 and call.attributes["laya.questions"] == 2
    assert call.attributes["laya.model"] == tiny_english_agent.name
    tokenize = named["laya.tokenize"][0].attributes
    assert [p.attributes["laya.pass.index"] for p in passes] == [0, 1]
    assert sum(p.attributes["laya.pass.rows"] for p in passes) == tokenize["laya.rows"]
    assert sum(p.attributes["laya.pass.tokens"] for p in passes) == tokenize["laya.input_tokens"]
    assert sum(r["usage"]["input_tokens"] for r in results) == tokenize["laya.input_tokens"]
    short, long = (p.attributes for p in passes)
    assert short["laya.pass.length_bucket"] < long["laya.pass.length_bucket"]
    assert short["laya.pass.tokens"] <= short["laya.pass.rows"] * short["laya.pass.length_bucket"]
    assert short["laya.precision"] == "fp32" and short["laya.provider"] == "CPUExecutionProvider"


def test_hooks_run_in_spans_of_their_own_and_a_failure_marks_the_call(spans, tiny_english_agent):
    class Stamp:
        def on_predict_start(self, ctx):
            ctx.questions = dict(ctx.questions)

        def on_predict_end(self, ctx):
            pass

    spans.clear()
    tiny_english_agent.predict("I was charged twice", QUESTIONS, hooks=[Stamp()])
    named = by_name(spans.get_finished_spans())
    (call,) = named["laya.call"]
    events = [
        s.attributes["laya.hooks.event"] for s in sorted(named["laya.hooks"], key=lambda s: s.start_time)
    ]
    assert events == ["on_predict_start", "on_predict_end"]
    assert all(s.parent.span_id == call.context.span_id for s in named["laya.hooks"])

    spans.clear()
    with pytest.raises(Exception, match="type"):
        tiny_english_agent.predict("x", {"q": {"type": "nope", "instructions": "?"}})
    (failed,) = by_name(spans.get_finished_spans())["laya.call"]
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]


def test_current_ids_and_the_request_span_follow_w3c(spans):
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with tracing.request_span("GET", {"traceparent": parent}) as current:
        assert current is not None
        trace_id, span_id = tracing.current_ids()
    assert trace_id == "0af7651916cd43dd8448eb211c80319c" and len(span_id) == 16
    assert tracing.current_ids() is None  # no current span outside it


def test_without_a_tracer_provider_nothing_is_imported_or_made(tiny_english):
    """A process that never set one up: the call imports no opentelemetry, spans are the no-op."""
    code = (
        "import json, sys\n"
        "from laya_onnx import ONNXAgent\n"
        "from laya_onnx.core import tracing\n"
        "agent = ONNXAgent(sys.argv[1])\n"
        "agent.predict('I was charged twice', %r)\n"
        "print(json.dumps({'imported': sorted(m for m in sys.modules if m.startswith('opentelemetry')),"
        " 'off': tracing.span('x') is tracing._OFF and not tracing.enabled()}))\n" % (QUESTIONS,)
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tiny_english)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"imported": [], "off": True}


def test_configure_from_environment_reads_the_standard_variables(monkeypatch):
    assert tracing.configure_from_environment({}) is None
    assert tracing.configure_from_environment({"OTEL_TRACES_EXPORTER": "none"}) is None
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER=zipkin9: no such span exporter.*console"):
        tracing.configure_from_environment({"OTEL_TRACES_EXPORTER": "zipkin9"})
    assert type(tracing._exporter("console")).__name__ == "ConsoleSpanExporter"
    assert type(tracing._exporter("otlp")).__name__ == "OTLPSpanExporter"


def test_console_exporter_prints_the_spans_of_a_predict(tiny_english):
    """`OTEL_TRACES_EXPORTER=console`: a process configured from the environment prints its spans."""
    code = (
        "import sys\n"
        "from laya_onnx import ONNXAgent\n"
        "from laya_onnx.core import tracing\n"
        "assert tracing.configure_from_environment() == 'console'\n"
        "ONNXAgent(sys.argv[1]).predict('I was charged twice', %r)\n" % (QUESTIONS,)
    )
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "probe", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tiny_english)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    printed = [json.loads(chunk) for chunk in _json_objects(done.stdout)]
    names = [s["name"] for s in printed]
    assert names.count("laya.call") == 1 and "laya.pass" in names and "laya.tokenize" in names
    assert {s["resource"]["attributes"]["service.name"] for s in printed} == {"probe"}


def _json_objects(text: str) -> list[str]:
    """The console exporter's output: one indented JSON object per span, back to back."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        obj, end = decoder.raw_decode(text, i)
        out.append(json.dumps(obj))
        i = end
    return out


def test_a_recorded_wait_and_work_on_another_thread_stay_under_the_current_span(spans, tiny_english_agent):
    import time
    from concurrent.futures import ThreadPoolExecutor

    spans.clear()
    with ThreadPoolExecutor(1) as worker, tracing.span("server.request") as request:
        queued = time.perf_counter()
        time.sleep(0.01)
        tracing.record("laya.queue", queued, time.perf_counter(), {"laya.route": "/v1/systemone"})
        call = tracing.in_current_context(
            lambda: tiny_english_agent.predict("I was charged twice", QUESTIONS)
        )
        worker.submit(call).result()
        # without the context the worker's call starts a trace of its own
        worker.submit(lambda: tiny_english_agent.predict("again", QUESTIONS)).result()
    named = by_name(spans.get_finished_spans())
    (queue,) = named["laya.queue"]
    assert queue.parent.span_id == request.get_span_context().span_id
    assert 0.009 <= (queue.end_time - queue.start_time) / 1e9 < 1.0
    inside, outside = sorted(named["laya.call"], key=lambda s: s.start_time)
    assert inside.parent.span_id == request.get_span_context().span_id
    assert outside.parent is None and outside.context.trace_id != inside.context.trace_id
