"""Micro-batching (LAYA_BATCH_WINDOW_MS): concurrent single decisions that share their questions
and pass controls run as one predict_batch; each caller gets its own answer or refusal."""

from __future__ import annotations

import asyncio

import pytest

from laya_onnx import ONNXAgent
from laya_onnx.bench.http import drive_server
from laya_onnx.core.errors import ConfigError
from laya_onnx.core.grouping import group_key
from laya_onnx.serve.settings import Settings
from tests.serve_support import URL, FakeAgent, Q, aio, listening, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]

OTHER_Q = {"refund": {"type": "noul", "instructions": "Does the user ask for a refund?"}}


async def _concurrently(client, bodies):
    return await asyncio.gather(*(post(client, URL, b) for b in bodies))


def test_group_keys_split_on_questions_and_pass_controls():
    base = group_key(Q, {})
    assert base is not None and group_key(dict(Q), {}) == base
    assert group_key(OTHER_Q, {}) != base
    assert group_key(Q, {"max_len": 256}) != base
    assert group_key(Q, {"min_confidence": 0.5}) != group_key(Q, {"min_confidence": 0.6})
    assert group_key(Q, {"lang": "de"}) != base
    assert group_key(Q, {"model": "english"}) != group_key(Q, {"model": "multilingual"}) != base
    assert group_key(Q, {"batch_size": 2}) is None  # not a single decision's control: alone


@aio
async def test_requests_in_one_window_run_as_one_pass_per_group():
    agent = FakeAgent()
    async with served(agent, batch_window_ms=200) as c:
        bodies = [
            {"state": "a", "questions": Q},
            {"state": "b", "questions": Q},
            {"state": "c", "questions": OTHER_Q},
            {"state": "d", "questions": Q, "max_len": 256},
            {"state": "e", "questions": Q},
        ]
        answers = await _concurrently(c, bodies)
        assert [r.status for r, _ in answers] == [200] * 5
        calls = sorted(
            (name, tuple(states) if name == "predict_batch" else states) for name, states, _, _ in agent.calls
        )
        assert calls == [("predict", "c"), ("predict", "d"), ("predict_batch", ("a", "b", "e"))]
        for (r, body), sent in zip(answers, bodies, strict=True):
            assert set(body["answers"]) == set(sent["questions"])
            assert r.headers["X-Inference-Time-Ms"]


@aio
async def test_a_group_that_fails_is_answered_member_by_member():
    class FailsTogether(FakeAgent):
        def predict_batch(self, states, questions, **kw):
            raise ValueError("a batch refusal no single caller caused")

        def predict(self, state, questions, **kw):
            if state == "bad":
                from laya_onnx.core.errors import InvalidRequest

                raise InvalidRequest("state 'bad' refused alone")
            return super().predict(state, questions, **kw)

    async with served(FailsTogether(), batch_window_ms=200) as c:
        answers = await _concurrently(c, [{"state": s, "questions": Q} for s in ("ok1", "bad", "ok2")])
        assert [r.status for r, _ in answers] == [200, 422, 200]
        assert answers[1][1] == {"detail": "state 'bad' refused alone"}


def test_the_window_setting(monkeypatch):
    assert Settings.from_env().batch_window_ms == 0.0
    monkeypatch.setenv("LAYA_BATCH_WINDOW_MS", "2.5")
    assert Settings.from_env().batch_window_ms == 2.5
    monkeypatch.setenv("LAYA_BATCH_WINDOW_MS", "soon")
    with pytest.raises(
        ConfigError, match="invalid LAYA_BATCH_WINDOW_MS 'soon': must be a number of milliseconds"
    ):
        Settings.from_env()


async def _alone_and_grouped(agent, bodies):
    """Each body posted alone, then all posted at once inside one batch window (one group)."""
    async with served(agent) as c:
        alone = [await post(c, URL, b) for b in bodies]
    batches = []
    predict_batch = agent.predict_batch

    def counted(states, questions, **controls):
        batches.append(len(states))
        return predict_batch(states, questions, **controls)

    agent.predict_batch = counted
    try:
        async with served(agent, batch_window_ms=300) as c:
            grouped = await _concurrently(c, bodies)
    finally:
        del agent.predict_batch
    # one pass was asked for the whole group; anything after it is a member alone
    # (`ONNXAgent.predict` is a batch of one)
    assert batches[0] == len(bodies) and set(batches[1:]) <= {1}, batches
    return alone, grouped


@aio
async def test_each_caller_gets_its_alone_answer_from_a_real_agent(bundle_factory):
    agent = ONNXAgent(bundle_factory("tiny-english"), max_pass_memory="40M")
    states = ["I was charged twice", "my login fails on the app", "word " * 2000, "refund me please"]
    bodies = [{"state": s, "questions": Q, "max_len": 4096} for s in states]
    alone, grouped = await _alone_and_grouped(agent, bodies)
    assert [r.status for r, _ in alone] == [200, 200, 413, 200]
    assert [r.status for r, _ in grouped] == [200, 200, 413, 200]
    assert grouped[2][1] == alone[2][1]  # the refusal, verbatim
    for (_, want), (_, got) in zip(alone, grouped, strict=True):
        if "answers" not in want:
            continue
        assert got["usage"] == want["usage"]
        for qid, a in want["answers"].items():
            b = got["answers"][qid]
            assert a.keys() == b.keys() and a.get("choice") == b.get("choice")
            for key in ("confidence", "answer_confidence", "noul", "score"):
                if key in a:
                    assert abs(a[key] - b[key]) <= 1e-4 + 1e-12


STATES_OF_MIXED_LENGTH = ["I was charged twice", "my login fails on the app " * 6, "refund me please", "hi"]


async def _answers_alone_and_grouped(agent):
    bodies = [{"state": s, "questions": Q} for s in STATES_OF_MIXED_LENGTH]
    alone, grouped = await _alone_and_grouped(agent, bodies)
    assert [r.status for r, _ in grouped] == [r.status for r, _ in alone] == [200] * 4
    return [body["answers"] for _, body in alone], [body["answers"] for _, body in grouped]


@pytest.mark.torch
def test_int8_callers_get_exactly_their_alone_answer(lowered, bundle_factory, tmp_path):
    # int8 activations are scaled per row, so grouping (other rows, more padding) moves nothing:
    # grouped answers equal the alone ones exactly. The control, onnxruntime's per-tensor dynamic
    # quantization (one scale for the whole pass), shows the same comparison does catch a graph
    # whose answers depend on their neighbours. The bundles are made before the served part, so
    # the lowering's time (tens of seconds on a busy machine) is not in the served part's bound.
    import shutil
    import warnings

    from onnxruntime.quantization import QuantType, quantize_dynamic

    from laya_onnx.core.bundle import ReducedPrecisionWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReducedPrecisionWarning)
        int8 = ONNXAgent(lowered("tiny-english", "int8"))
        alone, grouped = aio(_answers_alone_and_grouped)(int8)
    assert grouped == alone

    per_tensor = tmp_path / "per-tensor"
    shutil.copytree(bundle_factory("tiny-english"), per_tensor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(per_tensor / "laya.onnx", per_tensor / "laya.onnx", weight_type=QuantType.QInt8)
        alone, grouped = aio(_answers_alone_and_grouped)(ONNXAgent(per_tensor, verify=False))
    assert grouped != alone


@aio
async def test_bench_http_drives_a_running_server_at_each_client_count():
    agent = FakeAgent()
    async with listening(agent, batch_window_ms=20, max_concurrent=8) as live:
        url = "http://127.0.0.1:%d" % live.port
        report = await asyncio.to_thread(drive_server, url, [1, 4], 0.5)
    assert list(report["runs"]) == ["1", "4"]
    for run in report["runs"].values():
        assert run["statuses"].get("200", 0) > 0 and run["latency_ms_200"]["p50"] is not None
    # with four clients in a 20 ms window, some requests shared a pass
    assert any(name == "predict_batch" for name, *_ in agent.calls)


@aio
async def test_a_router_groups_requests_by_the_model_they_name():
    from tests.serve.test_serve_router import DE, EN, router, serving

    r = router()
    async with serving(r, batch_window_ms=200) as c:
        bodies = [
            {"state": "en1", "questions": Q, "model": "english"},
            {"state": "ml1", "questions": Q, "model": "multilingual"},
            {"state": "en2", "questions": Q, "model": "english"},
            {"state": "ml2", "questions": Q, "model": "ml"},
            {"state": EN, "questions": Q},
            {"state": DE, "questions": Q},
        ]
        answers = await _concurrently(c, bodies)
        assert [r.status for r, _ in answers] == [200] * 6
        routed = [body["routing"]["model"] for _, body in answers]
        assert routed == ["english", "multilingual", "english", "multilingual", "english", "multilingual"]
        seen = {name: agent.calls for name, agent in r.resident().items()}
    # every pass ran on the checkpoint each of its requests named or was routed to, and the
    # requests that named the same checkpoint shared one pass
    for name, calls in seen.items():
        for _, states, _, _ in calls:
            for state in [states] if isinstance(states, str) else states:
                assert routed[[b["state"] for b in bodies].index(state)] == name
    batched = sorted(
        tuple(states) for name, states, _, _ in sum(seen.values(), []) if name == "predict_batch"
    )
    assert ("en1", "en2") in batched and ("ml1", "ml2") in batched
