"""What an operator reads off a running server: the Grafana dashboard under serve/grafana/ asks
only for metrics the server exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

from tests.serve_support import BATCH, BODY, URL, aio, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]

DASHBOARD = Path(__file__).resolve().parents[2] / "serve" / "grafana" / "laya-onnx.json"
#: The names a query may ask for: the server's own and the process collector's.
OURS = re.compile(r"\b((?:laya_onnx|process)_[a-z0-9_]+)\b")
#: What Prometheus appends to a family's name in its samples.
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def queries(dashboard: dict) -> list[str]:
    """Every PromQL text in the dashboard: the panels' targets and the template variables'."""
    found = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if isinstance(query, str) and variable.get("type") == "query":
            found.append(query)
    return found


def unknown_metrics(dashboard: dict, families: set[str]) -> list[str]:
    """The metric names the dashboard's queries ask for that none of the exported `families`
    gives (a family's samples are its name plus a suffix; a labelled one may have none yet)."""
    asked = {name for q in queries(dashboard) for name in OURS.findall(q)}
    return sorted(n for n in asked if not any(n in (f, *(f + s for s in SUFFIXES)) for f in families))


async def exported_families(client) -> set[str]:
    resp = await client.get("/metrics")
    assert resp.status == 200
    return {family.name for family in text_string_to_metric_families(await resp.text())}


@aio
async def test_every_dashboard_query_names_a_metric_the_server_exports():
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    async with served() as client:
        assert (await post(client, URL, BODY))[0].status == 200
        assert (await post(client, BATCH, {"states": ["a", "b"], "questions": BODY["questions"]}))[
            0
        ].status == 200
        exported = await exported_families(client)
    asked = {name for q in queries(dashboard) for name in OURS.findall(q)}
    assert len(asked) >= 10, asked  # the check reads the queries (not an empty set)
    assert unknown_metrics(dashboard, exported) == []
    # and it can fail: a query for a metric the server does not export is named
    broken = json.loads(json.dumps(dashboard))
    broken["panels"][0]["targets"][0]["expr"] = "rate(laya_onnx_no_such_metric_total[5m])"
    assert unknown_metrics(broken, exported) == ["laya_onnx_no_such_metric_total"]


# -- the metrics an operator asks for -------------------------------------------------------


async def samples(client) -> dict[tuple[str, tuple], float]:
    resp = await client.get("/metrics")
    out = {}
    for family in text_string_to_metric_families(await resp.text()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def labelled(m: dict, name: str, **labels) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


@aio
async def test_rows_tokens_passes_and_batch_size_per_request_under_the_served_name(tiny_english_agent):
    name = tiny_english_agent.name
    many = {"states": ["a short one", "a longer state " * 30] * 10, "questions": BODY["questions"]}
    async with served(tiny_english_agent) as client:
        assert (await post(client, URL, BODY))[0].status == 200
        assert (await post(client, BATCH, many))[0].status == 200
        # a client's `model` text never becomes a label: answered as a fallback, counted under ours
        assert (await post(client, URL, {**BODY, "model": "client-chosen-name"}))[0].status == 200
        m = await samples(client)
    rows, tokens, passes = (f"laya_onnx_request_{x}" for x in ("rows", "input_tokens", "passes"))
    assert labelled(m, rows + "_count", checkpoint=name) == 3
    assert labelled(m, rows + "_sum", checkpoint=name) == 3 + 20 * 3 + 3
    assert labelled(m, tokens + "_sum", checkpoint=name) == m[("laya_onnx_input_tokens_total", ())] > 0
    # one pass for each single decision; the 60 rows of the batch in more than one
    assert labelled(m, passes + "_bucket", checkpoint=name, le="1.0") == 2
    assert labelled(m, passes + "_sum", checkpoint=name) >= 2 + 2
    assert labelled(m, "laya_onnx_microbatch_size_count") == 3 == labelled(m, "laya_onnx_microbatch_size_sum")
    assert not [k for k in m if ("checkpoint", "client-chosen-name") in k[1]]


@aio
async def test_a_micro_batch_counts_its_size_for_each_request(tiny_english_agent):
    import asyncio

    async with served(tiny_english_agent, batch_window_ms=300) as client:
        answers = await asyncio.gather(*(post(client, URL, BODY) for _ in range(3)))
        assert [r.status for r, _ in answers] == [200, 200, 200]
        m = await samples(client)
    # three requests, each answered by the call that answered all three
    assert labelled(m, "laya_onnx_microbatch_size_count") == 3
    assert labelled(m, "laya_onnx_microbatch_size_sum") == 9
    assert labelled(m, "laya_onnx_request_passes_sum", checkpoint=tiny_english_agent.name) == 3


# -- one request followed from its trace to its log lines ------------------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@aio
async def test_a_request_continues_its_callers_trace_with_queue_and_call_spans(tiny_english_agent):
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    from tests.otel_support import by_name, memory_exporter

    spans = memory_exporter()
    async with served(tiny_english_agent) as client:
        resp, _ = await post(client, URL, BODY, headers={"traceparent": TRACEPARENT, "X-Request-Id": "rid-7"})
        assert resp.status == 200
    named = by_name(spans.get_finished_spans())
    (request,) = named["POST /v1/systemone"]
    assert format(request.context.trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert format(request.parent.span_id, "016x") == TRACEPARENT.split("-")[2]
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["laya.request_id"] == "rid-7"
    (queue,), (call,) = named["laya.queue"], named["laya.call"]
    assert queue.parent.span_id == request.context.span_id == call.parent.span_id
    assert queue.end_time <= call.start_time  # the wait, then the call on the worker
    assert all(p.parent.span_id == call.context.span_id for p in named["laya.pass"])


@aio
async def test_json_log_lines_carry_the_request_and_trace_ids():
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    import io
    import logging

    from laya_onnx.serve.logs import JsonFormatter
    from tests.otel_support import memory_exporter
    from tests.serve_support import FakeAgent

    memory_exporter()  # the process traces
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("laya_onnx")
    logger.addHandler(handler)
    try:
        # a pass failing in our code: a 500, and its traceback logged on the request's behalf
        async with served(FakeAgent(error=RuntimeError("the device fell over"))) as client:
            headers = {"traceparent": TRACEPARENT, "X-Request-Id": "rid-8"}
            assert (await post(client, URL, BODY, headers=headers))[0].status == 500
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    (line,) = [x for x in lines if "the device fell over" in x.get("exception", "")]
    assert line["level"] == "error" and line["logger"].startswith("laya_onnx.serve")
    assert line["request_id"] == "rid-8" and line["trace_id"] == TRACEPARENT.split("-")[1]
    assert len(line["span_id"]) == 16 and line["ts"].endswith("+00:00")


def test_json_lines_of_a_failure_and_an_access_line_with_its_trace():
    import logging

    from aiohttp.test_utils import make_mocked_request

    from laya_onnx.serve.logs import TRACE_ID, JsonFormatter, _access_fields, current_request_id

    token = current_request_id.set("rid-9")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord(
            "laya_onnx.serve", logging.ERROR, __file__, 1, "failed %s", ("x",), sys.exc_info()
        )
    finally:
        current_request_id.reset(token)
    token = current_request_id.set("rid-9")
    try:
        line = json.loads(JsonFormatter().format(record))
    finally:
        current_request_id.reset(token)
    assert line["message"] == "failed x" and line["request_id"] == "rid-9"
    assert "ValueError: boom" in line["exception"] and "\n" not in JsonFormatter().format(record)
    request = make_mocked_request("POST", "/v1/systemone")
    request[TRACE_ID] = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert _access_fields(request, 200, 10, 0.01, "rid-9")["trace_id"] == request[TRACE_ID]
