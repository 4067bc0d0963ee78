"""TypeSafe's official Python SDK (`typesafe-sdk` on PyPI, dev extra) against our server in the Jev
profile: every question type parses into the SDK's answer models, and refusals surface as the
SDK's own error types.

The server runs on aiohttp's TestServer (a real loopback socket) on the test's own loop, and the
SDK's async client talks HTTP to it; the model is the tiny exported bundle, or the fake agent
where a refusal has to be provoked (a blocked pass for the 503).
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("typesafe_sdk")

from aiohttp.test_utils import TestServer
from typesafe_sdk import (
    AsyncTypeSafeClient,
    Choice,
    ChoiceAnswer,
    Noul,
    NoulAnswer,
    RetryPolicy,
    Score,
    ScoreAnswer,
    TypeSafeAPIError,
    TypeSafeAuthenticationError,
    TypeSafeInternalServerError,
    TypeSafeUnprocessableEntityError,
)
from typesafe_sdk._core.compression import COMPRESSORS

from laya_onnx.serve import create_app
from tests.serve_support import FakeAgent, aio

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env", "no_typesafe_env")]

KEY = "s3cret"
NO_RETRY = RetryPolicy(max_retries=0)
OPTIONS = {"opción %d — %s" % (i, team): None for i, team in enumerate(["billing", "tech", "refund"] * 85)}


@pytest.fixture
def no_typesafe_env(monkeypatch):
    """The SDK reads TYPESAFE_* (default model, base URL, key) when an argument is left out."""
    import os

    for key in list(os.environ):
        if key.startswith("TYPESAFE_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def tiny_agent(bundle_factory):
    from laya_onnx import ONNXAgent

    return ONNXAgent(bundle_factory("tiny-english"))


@contextlib.asynccontextmanager
async def sdk_client(agent, key=KEY, **settings):
    """The SDK's async client (sending `key`) pointed at a Jev-profile server for `agent`."""
    server = TestServer(create_app(agent, jev_profile="typesafe", **settings), host="127.0.0.1")
    await server.start_server()
    try:
        base = "http://127.0.0.1:%d" % server.port
        async with AsyncTypeSafeClient(api_key=key, base_url=base, retry=NO_RETRY, timeout=60.0) as client:
            yield client
    finally:
        await server.close()


QUESTIONS = {
    "billing": Noul(instructions="Is this about billing?"),
    "refund": Noul(criteria={"true": "the customer wants money back"}),  # no instructions
    "tone": Choice(instructions="What is the tone?", criteria={"calm": None, "angry": "shouting, threats"}),
    "queue": Choice(instructions={"task": "route the ticket"}, criteria=OPTIONS),  # 255 options
    "urgency": Score(instructions="How urgent?", criteria=["can wait", "this week", "today"]),
    "raw": {"type": "score", "instructions": ["rate", "it"], "criteria": ["low", {"level": "high"}]},
}


def _check_answers(result):
    assert set(result.answers) == set(QUESTIONS)
    assert set(result.nouls) == {"billing", "refund"}
    assert set(result.choices) == {"tone", "queue"}
    assert set(result.scores) == {"urgency", "raw"}
    for answer in result.nouls.values():
        assert isinstance(answer, NoulAnswer) and 0 <= answer.noul <= 1
    for qid, answer in result.choices.items():
        assert isinstance(answer, ChoiceAnswer)
        criteria = QUESTIONS[qid].criteria
        assert list(answer.probabilities) == list(criteria)  # non-ASCII names round-trip
        assert answer.choice == max(answer.probabilities, key=answer.probabilities.get)
        assert abs(sum(answer.probabilities.values()) - 1) < 1e-3 and 0 <= answer.confidence <= 1
    for answer in result.scores.values():
        assert isinstance(answer, ScoreAnswer)
        assert sorted(answer.probabilities) == sorted(answer.legend) == list(range(len(answer.legend)))
        assert answer.score == pytest.approx(sum(i * p for i, p in answer.probabilities.items()), abs=1e-3)
        assert 0 <= answer.confidence <= 1
    assert result.scores["raw"].legend == {0: "low", 1: '{"level": "high"}'}
    assert result.usage.input_tokens > 0 and result.usage.output_tokens == 0


@pytest.mark.parametrize("strict", ["0", "1"])
@aio
async def test_every_answer_type_parses(tiny_agent, monkeypatch, strict):
    monkeypatch.setenv("LAYA_JEV_STRICT", strict)
    async with sdk_client(tiny_agent) as client:  # no auth configured: the SDK's bearer is ignored
        result = await client.system_one(state={"ticket": "I was charged twice"}, questions=QUESTIONS)
    _check_answers(result)
    raw = result.raw_http_response.json()
    # the 255-option body is over the SDK's 1 KiB threshold: zstd when the SDK can (serve extra)
    sent = result.raw_http_response.request.headers.get("content-encoding")
    assert sent == ("zstd" if "zstd" in COMPRESSORS else None)
    assert list(raw) == (
        ["model", "answers", "usage"] if strict == "1" else ["model", "answers", "usage", "x_routing"]
    )
    assert "x_tournament" in raw["answers"]["queue"] or strict == "1"


@aio
async def test_with_auth_configured_the_sdk_key_is_checked(tiny_agent):
    async with sdk_client(tiny_agent, api_key=KEY) as client:
        result = await client.system_one(state="charged twice", questions={"b": QUESTIONS["billing"]})
    assert 0 <= result.nouls["b"].noul <= 1
    async with sdk_client(tiny_agent, key="wrong", api_key=KEY) as client:
        with pytest.raises(TypeSafeAuthenticationError) as err:
            await client.system_one(state="x", questions={"b": QUESTIONS["billing"]})
    assert err.value.status == 401 and "invalid or missing bearer token" in str(err.value)
    assert err.value.body["detail"]["error_type"] == "authentication_error"


@aio
async def test_refusals_raise_the_sdks_error_types():
    async with sdk_client(FakeAgent()) as client:
        # 422: validation, the SDK joins the list's loc/msg into its message
        bad = {"s": {"type": "score", "instructions": "x", "criteria": {"0": "a", "1": "b"}}}
        with pytest.raises(TypeSafeUnprocessableEntityError) as err:
            await client.system_one(state="x", questions=bad)
        assert err.value.status == 422
        assert str(err.value).endswith(
            '422 questions.s.score.criteria: score criteria must be a list of level descriptions, index 0 first; the map form {"0": ..., "1": ...} is not accepted'
        )
        # 413: no dedicated SDK class, so the base API error with the status and our message
        many = {"q%d" % i: Noul(instructions="x") for i in range(65)}
        with pytest.raises(TypeSafeAPIError) as err:
            await client.system_one(state="x", questions=many)
        assert err.value.status == 413 and "too many questions (65 > 64)" in str(err.value)
        assert err.value.body["detail"]["error_type"] == "api_usage_error"


@aio
async def test_busy_is_the_sdks_server_error():
    agent = FakeAgent(block=True)
    async with sdk_client(agent, max_concurrent=1) as client:
        first = asyncio.ensure_future(client.system_one(state="x", questions={"b": QUESTIONS["billing"]}))
        assert await asyncio.to_thread(agent.entered.wait, 5)
        with pytest.raises(TypeSafeInternalServerError) as err:
            await client.system_one(state="y", questions={"b": QUESTIONS["billing"]})
        assert err.value.status == 503 and err.value.headers["retry-after"] == "1"
        assert err.value.body["detail"]["error_type"] == "overloaded_error"
        agent.release.set()
        assert 0 <= (await first).nouls["b"].noul <= 1
