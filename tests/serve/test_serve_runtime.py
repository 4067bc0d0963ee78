"""Admission and the inference runtime: one worker thread, one pass at a time, the excess
refused with 503, /health answering meanwhile, and the worker drained at shutdown."""

from __future__ import annotations

import asyncio
import threading

import pytest

from laya_onnx.serve.app import DECIDER
from tests.serve_support import BATCH, BODY, URL, FakeAgent, Q, aio, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]


@aio
async def test_inference_runs_off_the_loop_and_health_answers_meanwhile():
    agent = FakeAgent(block=True)
    async with served(agent) as c:
        pending = asyncio.ensure_future(post(c, URL, BODY))
        assert await asyncio.to_thread(agent.entered.wait, 5)
        r = await c.get("/health")
        assert r.status == 200 and (await r.json())["status"] == "ok"
        assert not pending.done()
        agent.release.set()
        r, _ = await pending
        assert r.status == 200
    assert agent.threads and all(t.startswith("laya-infer") for t in agent.threads)
    assert threading.main_thread().name not in agent.threads


@aio
async def test_one_pass_at_a_time_on_one_worker():
    async with served() as c:
        results = await asyncio.gather(
            *(
                post(c, path, body)
                for _ in range(4)
                for path, body in ((URL, BODY), (BATCH, {"states": ["a", "b"], "questions": Q}))
            )
        )
        assert [r.status for r, _ in results] == [200] * 8
        assert len(set(c.agent.threads)) == 1 and c.agent.max_active == 1


@aio
async def test_admission_refuses_the_excess_with_retry_after():
    agent = FakeAgent(block=True)
    async with served(agent, max_concurrent=1) as c:
        first = asyncio.ensure_future(post(c, URL, BODY))
        assert await asyncio.to_thread(agent.entered.wait, 5)
        for path, body in ((URL, BODY), (BATCH, {"states": ["x"], "questions": Q}), (URL, b"junk")):
            r, out = await post(c, path, body)
            assert (r.status, out) == (503, {"detail": "server busy, try again later"})
            assert r.headers["Retry-After"] == "1"
        assert (await c.get("/health")).status == 200
        agent.release.set()
        assert (await first)[0].status == 200
        for _ in range(3):  # the slot is reused sequentially
            r, _ = await post(c, URL, BODY)
            assert r.status == 200


@aio
async def test_health_answers_during_a_batch_and_shutdown_waits_for_the_pass():
    agent = FakeAgent(block=True)
    async with served(agent) as c:
        pending = asyncio.ensure_future(post(c, BATCH, {"states": ["a"] * 3, "questions": Q}))
        assert await asyncio.to_thread(agent.entered.wait, 5)
        assert (await c.get("/health")).status == 200
        agent.release.set()
        r, body = await pending
        assert r.status == 200 and len(body["results"]) == 3
        runtime = c.server.app[DECIDER]
        assert runtime.executor is not None
    assert agent.active == 0 and runtime.executor is None  # cleanup_ctx drained the worker
