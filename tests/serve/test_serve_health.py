"""`GET /health`: liveness for anyone, the full payload with the key (docs/http-api.md#health)."""

from __future__ import annotations

import pytest

from tests.serve_support import FakeAgent, aio, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]


HEALTH_KEYS = [
    "status",
    "loaded",
    "revisions",
    "device",
    "device_is_preference",
    "checkpoint_devices",
    "cpu_fallbacks",
    "providers",
    "provider_fallbacks",
]


@aio
async def test_health_liveness_only_without_the_right_bearer():
    async with served(api_key="s3cret") as c:
        for headers in ({}, {"Authorization": "Bearer nope"}):
            r = await c.get("/health", headers=headers)
            assert r.status == 200 and await r.json() == {"status": "ok"}
        r = await c.get("/health", headers={"Authorization": "Bearer s3cret"})
        assert list(await r.json()) == HEALTH_KEYS


@aio
async def test_health_full_payload():
    agent = FakeAgent()
    # a provider that never attached at startup is reported by `device`, not as a fallback
    agent.fallbacks = {"CUDAExecutionProvider": {"count": 1, "last_reason": "CUDA is not available"}}
    async with served(agent) as c:
        body = await (await c.get("/health")).json()
        assert list(body) == HEALTH_KEYS
        assert body == {
            "status": "ok",
            "loaded": ["english"],
            "revisions": {"english": "0123456789abcdef"},
            "device": "cpu",
            "device_is_preference": False,
            "checkpoint_devices": {"english": "cpu"},
            "cpu_fallbacks": {"english": {"count": 0, "last_reason": None}},
            "providers": {"english": ["CPUExecutionProvider"]},
            "provider_fallbacks": {
                "english": {"CUDAExecutionProvider": {"count": 1, "last_reason": "CUDA is not available"}}
            },
        }
        # passes retried on CPU after startup are counted, with the latest reason
        agent.fallbacks = {"CUDAExecutionProvider": {"count": 3, "last_reason": "run failed on CUDA: OOM"}}
        body = await (await c.get("/health")).json()
        assert body["cpu_fallbacks"] == {"english": {"count": 2, "last_reason": "run failed on CUDA: OOM"}}
        assert body["provider_fallbacks"]["english"]["CUDAExecutionProvider"]["count"] == 3


@aio
async def test_health_device_cuda_and_unmeasurable():
    agent = FakeAgent()
    agent.providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    agent.revision = None
    async with served(agent) as c:
        body = await (await c.get("/health")).json()
        assert body["device"] == "cuda" and body["checkpoint_devices"] == {"english": "cuda"}
        assert body["revisions"] == {"english": None}
        assert body["cpu_fallbacks"] == {"english": {"count": 0, "last_reason": None}}
        agent.providers = []
        body = await (await c.get("/health")).json()
        assert body["device"] == "cuda" and body["device_is_preference"] is True
        assert body["checkpoint_devices"] == {}


@aio
async def test_health_answers_503_once_the_device_keeps_failing():
    """A checkpoint whose device failed pass after pass (`ONNXAgent.healthy` False) makes /health
    a 503, for the liveness probe too (it sends no key), so a supervisor restarts the process."""
    agent = FakeAgent()
    async with served(agent, api_key="s3cret") as c:
        assert (await c.get("/health")).status == 200
        agent.healthy = False
        r = await c.get("/health")
        assert r.status == 503 and await r.json() == {"status": "unhealthy"}
        r = await c.get("/health", headers={"Authorization": "Bearer s3cret"})
        body = await r.json()
        assert r.status == 503 and body["status"] == "unhealthy" and body["unhealthy"] == ["english"]
        assert body["providers"] == {"english": ["CPUExecutionProvider"]}  # the full payload stays
        agent.healthy = True
        assert (await c.get("/health")).status == 200
