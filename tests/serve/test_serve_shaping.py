"""Successful answers: payload, routing block, timing headers, `x_jev_confidence` and the
strict Jev projection (docs/http-api.md, "Answers" and "Strict projection")."""

from __future__ import annotations

import pytest

from laya_onnx.serve.contract import jev_confidence
from tests.serve_support import BATCH, BODY, URL, FakeAgent, Q, aio, kwargs_of, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]


@aio
async def test_single_decision_payload_routing_and_timing():
    async with served() as c:
        r, body = await post(c, URL, BODY)
        assert r.status == 200
        assert r.content_type == "application/json"
        assert list(body) == ["model", "answers", "usage", "routing"]
        assert body["model"] == "laya-rl-agent-onnx"
        assert body["routing"] == {
            "model": "english",
            "repo": "convaiinnovations/laya",
            "reason": "served bundle",
            "detection": None,
            "workflow": None,
        }
        assert body["answers"]["queue"]["choice"] == "billing"
        assert body["usage"]["input_tokens"] == 30
        st, xt = r.headers["Server-Timing"], r.headers["X-Inference-Time-Ms"]
        assert st == "inference;dur=%s" % xt and float(xt) >= 0 and len(xt.split(".")[1]) == 2
        assert c.agent.calls[0][0] == "predict" and kwargs_of(c.agent) == {}


@aio
async def test_x_jev_confidence_on_choice_and_score_only():
    async with served() as c:
        _, body = await post(c, URL, BODY)
    a = body["answers"]
    # choice: (0.6 - 1/3) / (1 - 1/3) = 0.4
    assert a["queue"]["x_jev_confidence"] == 0.4
    # score [0.1333, 0.6, 0.1333, 0.1333]: mode 1, spread 0.1333*(1+1+2)/sum, D=1.0
    p = [0.1333, 0.6, 0.1333, 0.1333]
    p = [v / sum(p) for v in p]
    want = round(max(0.0, 1 - (p[0] + p[2] + 2 * p[3]) / 1.0), 4)
    assert a["urgency"]["x_jev_confidence"] == want
    assert "x_jev_confidence" not in a["refund"]
    assert list(a["queue"])[-1] == "x_jev_confidence"


def test_jev_confidence_edge_cases():
    assert jev_confidence({"type": "choice", "probabilities": {"a": 1.0}}) == 1.0
    assert jev_confidence({"type": "choice", "probabilities": {"a": 0, "b": 0}}) == 0.0
    assert jev_confidence({"type": "choice", "probabilities": {"a": True, "b": 0}}) is None
    assert jev_confidence({"type": "choice", "probabilities": {"a": -0.1, "b": 1.1}}) is None
    assert jev_confidence({"type": "choice", "probabilities": {"a": float("nan"), "b": 1}}) is None
    assert jev_confidence({"type": "score", "probabilities": {"0": 0.5, "x": 0.5}}) is None
    assert jev_confidence({"type": "noul", "probabilities": {"0": 1}}) is None
    assert jev_confidence({"type": "score", "probabilities": {"0": 0.5, "1": 0.5}}) == 0.0


@aio
async def test_empty_questions_answer_empty():
    async with served() as c:
        r, body = await post(c, URL, {"state": "x", "questions": {}})
    assert r.status == 200 and body["answers"] == {}


@aio
async def test_strict_projection(monkeypatch):
    for off in (None, "0", "no", ""):
        if off is None:
            monkeypatch.delenv("LAYA_JEV_STRICT", raising=False)
        else:
            monkeypatch.setenv("LAYA_JEV_STRICT", off)
        async with served() as c:
            _, body = await post(c, URL, BODY)
            assert "routing" in body
    monkeypatch.setenv("LAYA_JEV_STRICT", "1")
    async with served() as c:
        r, body = await post(c, URL, {**BODY, "min_confidence": 0.9})
        assert list(body) == ["model", "answers", "usage"]
        a = body["answers"]
        assert set(a["queue"]) == {"type", "choice", "confidence", "probabilities"}
        assert set(a["urgency"]) == {"type", "score", "confidence", "probabilities", "legend"}
        assert a["refund"] == {"type": "noul", "noul": 0.8}
        assert body["usage"] == {"input_tokens": 30, "output_tokens": 0}
        assert "Server-Timing" in r.headers
        r, body = await post(c, BATCH, {"states": ["a", "b"], "questions": Q})
        assert body["total_usage"] == {"input_tokens": 60, "output_tokens": 0}
        assert all(list(item) == ["model", "answers", "usage"] for item in body["results"])


@aio
async def test_strict_unknown_answer_type_passes_through(monkeypatch):
    def odd(result):
        result["answers"]["extra"] = {"type": "ranking", "order": [1, 2]}
        result["answers"]["weird"] = 3
        return result

    monkeypatch.setenv("LAYA_JEV_STRICT", "true")
    async with served(FakeAgent(result_hook=odd)) as c:
        _, body = await post(c, URL, BODY)
    assert body["answers"]["extra"] == {"type": "ranking", "order": [1, 2]}
    assert body["answers"]["weird"] == 3
