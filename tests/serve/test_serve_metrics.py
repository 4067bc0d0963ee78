"""`GET /metrics`: what the middleware counts, per app, read back through the Prometheus parser."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

from laya_onnx.serve.errors import UNAUTHORIZED
from tests.serve_support import BATCH, BODY, URL, FakeAgent, aio, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]


async def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    """Every sample as {(name, sorted labels): value}."""
    resp = await client.get("/metrics", headers=headers)
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(await resp.text()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def requests_of(samples, route, status, method="POST"):
    key = ("laya_onnx_http_requests_total", (("method", method), ("route", route), ("status", str(status))))
    return samples.get(key, 0.0)


@aio
async def test_requests_latency_inference_rows_and_tokens_are_counted():
    async with served() as c:
        assert (await post(c, URL, BODY))[0].status == 200
        assert (await post(c, BATCH, {"states": ["a", "b"], "questions": BODY["questions"]}))[0].status == 200
        assert (await post(c, URL, {"state": "x", "questions": {"q": {"type": "bogus"}}}))[0].status == 422
        assert (await c.get("/health")).status == 200
        assert (await c.get("/no/such/route")).status == 404
        m = await scrape(c)
    assert requests_of(m, "/v1/systemone", 200) == 1
    assert requests_of(m, "/v1/systemone", 422) == 1
    assert requests_of(m, "/v1/systemone/batch", 200) == 1
    assert requests_of(m, "/health", 200, "GET") == 1
    assert requests_of(m, "unmatched", 404, "GET") == 1
    assert m[("laya_onnx_http_request_duration_seconds_count", (("route", "/v1/systemone"),))] == 2
    # Successful passes only: the 422 is the agent refusing the question, not a timed pass.
    assert m[("laya_onnx_inference_duration_seconds_count", (("route", "/v1/systemone"),))] == 1
    assert m[("laya_onnx_inference_duration_seconds_count", (("route", "/v1/systemone/batch"),))] == 1
    assert m[("laya_onnx_inference_queue_wait_seconds_count", (("route", "/v1/systemone"),))] == 2
    # 3 questions on one state, then on two; the fake agent reads 10 tokens per question row.
    assert m[("laya_onnx_rows_total", ())] == 3 + 2 * 3
    assert m[("laya_onnx_input_tokens_total", ())] == 30 + 2 * 30
    assert m[("laya_onnx_admission_limit", ())] == 16
    assert m[("process_resident_memory_bytes", ())] > 0


@aio
async def test_busy_refusals_in_flight_and_queue_depth():
    agent = FakeAgent(block=True)
    async with served(agent, max_concurrent=2) as c:
        first = asyncio.ensure_future(post(c, URL, BODY))
        assert await asyncio.to_thread(agent.entered.wait, 5)
        second = asyncio.ensure_future(post(c, URL, BODY))
        for _ in range(200):  # until the second request is parked on the inference gate
            m = await scrape(c)
            if m[("laya_onnx_inference_queue_depth", ())] == 1:
                break
            await asyncio.sleep(0.01)
        assert m[("laya_onnx_inference_queue_depth", ())] == 1
        assert m[("laya_onnx_http_requests_in_flight", (("route", "/v1/systemone"),))] == 2
        r, body = await post(c, URL, BODY)
        assert r.status == 503 and r.headers["Retry-After"] == "1"
        agent.release.set()
        assert (await first)[0].status == 200 and (await second)[0].status == 200
        m = await scrape(c)
    assert m[("laya_onnx_busy_refusals_total", (("route", "/v1/systemone"),))] == 1
    assert requests_of(m, "/v1/systemone", 503) == 1
    assert requests_of(m, "/v1/systemone", 200) == 2
    assert m[("laya_onnx_inference_queue_depth", ())] == 0
    assert m[("laya_onnx_http_requests_in_flight", (("route", "/v1/systemone"),))] == 0
    assert m[("laya_onnx_admission_limit", ())] == 2


@aio
async def test_provider_fallbacks_are_read_from_the_agent_at_scrape_time():
    agent = FakeAgent()
    async with served(agent) as c:
        m = await scrape(c)
        assert not [k for k in m if k[0] == "laya_onnx_provider_fallbacks_total"]
        agent.fallbacks = {
            "CUDAExecutionProvider": {"count": 2, "last_reason": "out of memory"},
            "TensorrtExecutionProvider": {"count": 1, "last_reason": "not built"},
        }
        m = await scrape(c)
    assert m[("laya_onnx_provider_fallbacks_total", (("provider", "CUDAExecutionProvider"),))] == 2
    assert m[("laya_onnx_provider_fallbacks_total", (("provider", "TensorrtExecutionProvider"),))] == 1


@aio
async def test_two_apps_in_one_process_count_separately():
    async with served() as a, served() as b:
        for _ in range(2):
            assert (await post(a, URL, BODY))[0].status == 200
        assert (await post(b, URL, BODY))[0].status == 200
        ma, mb = await scrape(a), await scrape(b)
    assert requests_of(ma, "/v1/systemone", 200) == 2
    assert requests_of(mb, "/v1/systemone", 200) == 1


@aio
async def test_metrics_take_the_bearer_when_a_key_is_set():
    async with served(api_key="s3cret") as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = await c.get("/metrics", headers=headers)
            assert (r.status, await r.json()) == (401, {"detail": UNAUTHORIZED})
        m = await scrape(c, Authorization="Bearer s3cret")
    assert requests_of(m, "/metrics", 401, "GET") == 2


@aio
async def test_openmetrics_is_negotiated_from_accept():
    async with served() as c:
        r = await c.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        text = await r.text()
    assert r.status == 200 and r.headers["Content-Type"].startswith("application/openmetrics-text")
    assert text.rstrip().endswith("# EOF")
