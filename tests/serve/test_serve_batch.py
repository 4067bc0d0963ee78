"""`POST /v1/systemone/batch`: results and total usage, shape errors, the chunk plan and the
batch-only controls."""

from __future__ import annotations

import pytest

from tests.serve_support import BATCH, BODY, URL, Q, aio, kwargs_of, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]


@aio
async def test_batch_results_total_usage_and_routing():
    async with served() as c:
        r, body = await post(c, BATCH, {"states": ["a", {"b": 1}, ["c"]], "questions": Q})
        assert r.status == 200 and list(body) == ["results", "total_usage"]
        assert body["total_usage"] == {"input_tokens": 90, "output_tokens": 0}
        assert all(item["routing"]["model"] == "english" for item in body["results"])
        assert all("x_jev_confidence" in item["answers"]["queue"] for item in body["results"])
        name, states, questions, kw = c.agent.calls[-1]
        assert name == "predict_batch" and states == ["a", {"b": 1}, ["c"]] and kw == {}
        assert r.headers["X-Inference-Time-Ms"]


@aio
async def test_batch_shape_errors():
    async with served() as c:
        for body, status, detail in [
            ({"questions": Q}, 400, "request body must be an object with 'states' and 'questions' fields"),
            ({"states": ["x"]}, 400, "request body must be an object with 'states' and 'questions' fields"),
            ([1], 400, "request body must be an object with 'states' and 'questions' fields"),
            ({"states": [], "questions": Q}, 400, "'states' must be a non-empty list"),
            ({"states": "x", "questions": Q}, 400, "'states' must be a non-empty list"),
            ({"states": ["x"] * 65, "questions": Q}, 413, "too many states in batch (65 > 64)"),
            ({"states": ["x", "y" * 50001], "questions": Q}, 413, "state too large (50001 > 50000 chars)"),
        ]:
            r, out = await post(c, BATCH, body)
            assert (r.status, out) == (status, {"detail": detail})
        r, _ = await post(c, BATCH, {"states": ["x"], "questions": {}})
        assert r.status == 200 and "batch_size" not in kwargs_of(c.agent)
        assert len(c.agent.calls) == 1


def _noul_questions(n):
    return {"q%d" % i: {"type": "noul", "instructions": "x"} for i in range(n)}


@pytest.mark.parametrize(
    "n_states,n_q,extra,env,expect",
    [
        (64, 4, {}, None, None),
        (8, 32, {}, None, None),
        (9, 32, {}, None, 8),
        (64, 64, {}, None, 4),
        (64, 64, {"max_len": 8192}, None, 1),
        (20, 1, {"max_len": 8192}, None, 16),
        (64, 64, {"batch_size": 7}, None, 4),
        (64, 64, {"batch_size": 2}, None, 2),
        (4, 4, {"batch_size": 100}, None, 100),
        (64, 64, {}, "2097152", None),
        (8, 2, {}, "2048", 2),
        (64, 64, {}, "3.5", 4),
    ],
)
@aio
async def test_batch_chunk_plan(monkeypatch, n_states, n_q, extra, env, expect):
    if env is not None:
        monkeypatch.setenv("LAYA_MAX_BATCH_TOKENS", env)
    async with served() as c:
        r, _ = await post(c, BATCH, {"states": ["s"] * n_states, "questions": _noul_questions(n_q), **extra})
        assert r.status == 200
        assert kwargs_of(c.agent).get("batch_size") == expect


@aio
async def test_batch_controls_split_and_validation():
    async with served() as c:
        body = {
            "states": ["a", "b"],
            "questions": Q,
            "min_confidence": 0.8,
            "batch_size": 2,
            "sort_by_length": True,
            "max_len": 256,
            "lang": "en",
            "lang_guess": "en",
        }
        r, out = await post(c, BATCH, body)
        assert r.status == 200
        # the Router in front of the bundle applies the gate and keeps `lang` for an agent with
        # per-language temperatures (the fake has none): both answer as the agent would
        assert kwargs_of(c.agent) == {"max_len": 256, "batch_size": 2, "sort_by_length": True}
        answers = [a for item in out["results"] for a in item["answers"].values()]
        assert {a["abstention_threshold"] for a in answers} == {0.8}
        r, _ = await post(c, BATCH, {"states": ["a"], "questions": Q, "sort_by_length": False})
        assert kwargs_of(c.agent) == {}
        for value, detail in [
            (True, "batch_size must be an integer"),
            (2.0, "batch_size must be an integer"),
            ("2", "batch_size must be an integer"),
            (0, "batch_size must be a positive integer, got 0"),
            (-5, "batch_size must be a positive integer, got -5"),
        ]:
            r, out = await post(c, BATCH, {"states": ["a"], "questions": Q, "batch_size": value})
            assert (r.status, out) == (422, {"detail": detail})
        for value in ("yes", 1, 0):
            r, out = await post(c, BATCH, {"states": ["a"], "questions": Q, "sort_by_length": value})
            assert (r.status, out) == (422, {"detail": "sort_by_length must be a boolean"})
        # the single route ignores the batch-only controls
        r, _ = await post(c, URL, {**BODY, "batch_size": "x", "sort_by_length": "x"})
        assert r.status == 200
