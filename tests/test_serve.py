"""The serve layer against http.md (laya-serve 0.4.15 wire contract), with a fake agent.

No pytest plugin: each async test is wrapped by `aio`, which runs it on a fresh loop, and
`served()` starts the app on aiohttp's in-process TestServer (a real loopback socket).
The fake agent is deterministic, records every call and the thread it ran on, and can be made
to block on an Event so tests can prove that /health answers during inference and that the
admission bound refuses the excess.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("aiohttp")
from aiohttp.test_utils import TestClient, TestServer

from laya_onnx.gate import apply_confidence_gate
from laya_onnx.serve import create_app
from laya_onnx.serve import settings as serve_settings
from laya_onnx.serve.app import RUNTIME
from laya_onnx.serve.wire import jev_confidence

URL = "/v1/systemone"
BATCH = "/v1/systemone/batch"
Q = {
    "queue": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "billing and refunds", "tech": "login", "other": "else"},
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent?",
        "criteria": ["calm", "firm", "angry", "furious"],
    },
    "refund": {"type": "noul", "instructions": "Wants a refund?"},
}
BODY = {"state": "I was charged twice this month, I want my money back", "questions": Q}


# -- the fake agent ------------------------------------------------------------------------


def _answer(qid, q):
    kind = q.get("type") if isinstance(q, dict) else None
    if kind not in ("choice", "score", "noul"):
        raise ValueError("question %r: unknown type %r; use one of ['choice', 'noul', 'score']" % (qid, kind))
    if kind == "noul":
        return {
            "type": "noul",
            "noul": 0.8,
            "confidence": 0.8,
            "answer_confidence": 0.8,
            "action": {"act_probability": 1.0},
        }
    crit = q["criteria"]
    labels = [str(c) for c in crit] if kind == "choice" else [str(i) for i in range(len(crit))]
    n = len(labels)
    probs = [1.0] if n == 1 else [0.6] + [round(0.4 / (n - 1), 4)] * (n - 1)
    if kind == "score" and n > 1:
        probs = probs[1:2] + probs[:1] + probs[2:]  # peak on level 1
    p = dict(zip(labels, probs, strict=False))
    ans = {"type": kind}
    if kind == "choice":
        ans["choice"] = labels[probs.index(max(probs))]
    else:
        ans["score"] = round(sum(i * v for i, v in enumerate(probs)), 4)
        ans["legend"] = {str(i): c for i, c in enumerate(crit)}
    ans.update(
        {
            "probabilities": p,
            "confidence": 0.5,
            "answer_confidence": max(probs),
            "action": {"act_probability": 1.0},
        }
    )
    return ans


class FakeAgent:
    name = "english"
    revision = "0123456789abcdef"

    def __init__(self, *, block=False, error=None, result_hook=None):
        self.calls = []
        self.threads = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not block:
            self.release.set()
        self.error = error
        self.result_hook = result_hook
        self._lock = threading.Lock()
        self.active = self.max_active = 0
        self.providers = ["CPUExecutionProvider"]
        self.requested_providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        self.fallbacks = {}
        self.bundle = SimpleNamespace(
            manifest={"source": {"repo": "convaiinnovations/laya"}},
            config={},
            root=Path("/srv/bundles/english"),
        )

    def _one(self, state, questions, min_confidence=None):
        result = {
            "model": "laya-rl-agent-onnx",
            "answers": {qid: _answer(qid, q) for qid, q in questions.items()},
            "usage": {
                "input_tokens": 10 * len(questions),
                "output_tokens": 0,
                "state_tokens": 5,
                "state_tokens_dropped": 0,
                "truncated": False,
                "truncated_questions": [],
            },
        }
        apply_confidence_gate([result], min_confidence)
        return self.result_hook(result) if self.result_hook else result

    def _enter(self, call):
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            self.calls.append(call)
            self.threads.append(threading.current_thread().name)
            self.entered.set()
            assert self.release.wait(10), "test never released the fake agent"
            time.sleep(0.01)  # long enough for an overlapping pass to show up in max_active
            if self.error is not None:
                raise self.error
        finally:
            with self._lock:
                self.active -= 1

    def predict(self, state, questions, **kw):
        self._enter(("predict", state, questions, kw))
        return self._one(state, questions, kw.get("min_confidence"))

    def predict_batch(self, states, questions, **kw):
        self._enter(("predict_batch", states, questions, kw))
        return [self._one(s, questions, kw.get("min_confidence")) for s in states]


class PlainAgent(FakeAgent):
    """An agent without predict_batch: the batch route falls back to one predict per state."""

    predict_batch = None

    def __getattribute__(self, name):
        if name == "predict_batch":
            raise AttributeError(name)
        return super().__getattribute__(name)


# -- harness -------------------------------------------------------------------------------


def aio(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 60))

    return wrapper


@contextlib.asynccontextmanager
async def served(agent=None, **settings):
    agent = agent if agent is not None else FakeAgent()
    async with TestClient(TestServer(create_app(agent, **settings))) as client:
        client.agent = agent
        yield client


async def post(client, path, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    resp = await client.post(path, data=data, **kw)
    return resp, await resp.json(content_type=None)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("LAYA_"):
            monkeypatch.delenv(key)


def kwargs_of(agent, i=-1):
    return agent.calls[i][3]


# -- the happy path ------------------------------------------------------------------------


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
async def test_content_type_is_never_checked_and_bom_is_accepted():
    async with served() as c:
        r, _ = await post(c, URL, json.dumps(BODY), headers={"Content-Type": "text/plain"})
        assert r.status == 200
        r, _ = await post(c, URL, b"\xef\xbb\xbf" + json.dumps(BODY).encode())
        assert r.status == 200
        r, _ = await post(c, URL, json.dumps(BODY).encode("utf-16"))
        assert r.status == 200
        # duplicate keys: last wins
        raw = '{"state": null, "questions": {}, "state": "second"}'
        r, _ = await post(c, URL, raw)
        assert r.status == 200 and c.agent.calls[-1][1] == "second"


# -- 400s: JSON and shape ------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"",
        b"\xff\xfe\xfa",
        b'{"state": "x", "questions": {',
        b"[" * 100000,
        b'{"state": ' + b"1" * 4301 + b', "questions": {}}',
    ],
)
@aio
async def test_malformed_json_is_400(raw):
    async with served() as c:
        r, body = await post(c, URL, raw)
        assert (r.status, body) == (400, {"detail": "request body must be valid JSON"})
        r, body = await post(c, BATCH, raw)
        assert (r.status, body) == (400, {"detail": "request body must be valid JSON"})
        assert c.agent.calls == []
        assert "Server-Timing" not in r.headers


@pytest.mark.parametrize("body", [[1, 2, 3], "hello", None, {"state": "x"}])
@aio
async def test_non_object_or_missing_questions_is_400(body):
    async with served() as c:
        r, out = await post(c, URL, json.dumps(body))
    assert r.status == 400 and "questions" in out["detail"]
    assert out == {"detail": "request body must be an object with a 'questions' field"}


@pytest.mark.parametrize("body", [{"questions": Q}, {"state": None, "questions": Q}])
@aio
async def test_state_absent_or_null_is_400(body):
    async with served() as c:
        r, out = await post(c, URL, body)
        assert (r.status, out) == (400, {"detail": "'state' is required"})
        r, out = await post(c, BATCH, {"states": ["a", None], "questions": Q})
        assert (r.status, out) == (400, {"detail": "'state' is required"})
        assert c.agent.calls == []


@pytest.mark.parametrize("state", ["null", "", "0", 0, False, [], {}])
@aio
async def test_falsy_but_present_states_are_answered(state):
    async with served() as c:
        r, _ = await post(c, URL, {"state": state, "questions": Q})
    assert r.status == 200


@aio
async def test_questions_must_be_an_object():
    async with served() as c:
        r, out = await post(c, URL, {"state": "x", "questions": ["a"]})
        assert (r.status, out) == (400, {"detail": "'questions' must be an object"})
        r, out = await post(c, BATCH, {"states": ["x"], "questions": ["a"]})
        assert (r.status, out) == (400, {"detail": "'questions' must be an object"})


# -- 413s: body and limits -----------------------------------------------------------------


@aio
async def test_body_over_2mib_is_413_with_and_without_content_length():
    big = json.dumps({"state": "x" * (2 * 1024 * 1024), "questions": Q}).encode()

    async def chunks(data, size=65536):
        for i in range(0, len(data), size):
            yield data[i : i + size]

    async with served() as c:
        r, out = await post(c, URL, big)
        assert (r.status, out) == (413, {"detail": "request body too large"})
        r = await c.post(URL, data=chunks(big))  # chunked transfer: no Content-Length
        assert r.status == 413 and await r.json() == {"detail": "request body too large"}
        ok = json.dumps(BODY).encode()
        r = await c.post(URL, data=chunks(ok, 7))
        assert r.status == 200
        assert len(c.agent.calls) == 1


@aio
async def test_declared_content_length_over_cap_refused_before_reading():
    async with served() as c:
        host, port = c.server.host, c.server.port
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n\r\n{")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 413")
        writer.close()


@aio
async def test_slow_body_is_408_and_releases_the_slot():
    async with served(max_concurrent=1, body_read_timeout=0.3) as c:
        reader, writer = await asyncio.open_connection(c.server.host, c.server.port)
        writer.write(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        head = await asyncio.wait_for(reader.read(4096), 5)
        assert head.startswith(b"HTTP/1.1 408")
        assert b'{"detail":"request body was not received in time"}' in head
        writer.close()
        r, _ = await post(c, URL, BODY)
        assert r.status == 200


@aio
async def test_question_and_option_limits():
    many = {"q%d" % i: {"type": "noul", "instructions": "x"} for i in range(65)}
    choice101 = {"c": {"type": "choice", "instructions": "x", "criteria": [str(i) for i in range(101)]}}
    score33 = {"s": {"type": "score", "instructions": "x", "criteria": [str(i) for i in range(33)]}}
    null_level = {"s": {"type": "score", "instructions": "x", "criteria": ["a", None, "c"]}}
    total = {
        "c%d" % i: {"type": "choice", "instructions": "x", "criteria": [str(j) for j in range(100)]}
        for i in range(6)
    }
    cases = [
        (many, 413, "too many questions (65 > 64)"),
        (choice101, 413, "too many choice options for 'c' (101 > 100)"),
        (score33, 413, "too many score levels for 's' (33 > 32)"),
        (null_level, 422, "score question 's' has a null level at index 1; give every level a description"),
        (total, 413, "too many answer options across questions (600 > 512)"),
    ]
    async with served() as c:
        for questions, status, detail in cases:
            for path, body in (
                (URL, {"state": "x", "questions": questions}),
                (BATCH, {"states": ["x"], "questions": questions}),
            ):
                r, out = await post(c, path, body)
                assert (r.status, out) == (status, {"detail": detail}), (path, detail)
        assert c.agent.calls == []


@aio
async def test_state_size_is_measured_on_serialized_json():
    async with served() as c:
        r, out = await post(c, URL, {"state": {"body": '"' * 49988}, "questions": Q})
        assert (r.status, out) == (413, {"detail": "state too large (99988 > 50000 chars)"})
        r, _ = await post(c, URL, {"state": "\u200b" * 8344, "questions": Q})
        assert r.status == 200
        r, _ = await post(c, URL, {"state": "x" * 50000, "questions": Q})
        assert r.status == 200
        r, out = await post(c, URL, {"state": "x" * 50001, "questions": Q})
        assert (r.status, out) == (413, {"detail": "state too large (50001 > 50000 chars)"})
        pad = 50000 - len(json.dumps({"k": ""}))
        r, _ = await post(c, URL, {"state": {"k": "x" * pad}, "questions": Q})
        assert r.status == 200
        r, out = await post(c, URL, {"state": {"k": "x" * (pad + 1)}, "questions": Q})
        assert (r.status, out) == (413, {"detail": "state too large (50001 > 50000 chars)"})
        # a huge state is refused on a measured lower bound, never an overstated count
        r, out = await post(c, URL, {"state": ["y" * 600000], "questions": Q})
        n = int(out["detail"].split("(")[1].split(" ")[0])
        assert r.status == 413 and 50000 < n <= len(json.dumps(["y" * 600000]))


# -- refusals and surrogates ---------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["hooks", "on_predict_start", "on_predict_end", "hooks_raise", "hooks_timeout"]
)
@aio
async def test_hook_keys_are_refused(key):
    async with served() as c:
        for path, base in ((URL, BODY), (BATCH, {"states": ["x"], "questions": Q})):
            r, out = await post(c, path, {**base, key: "anything"})
            assert r.status == 422
            assert out["detail"] == (
                "%s run inside the server process and cannot be sent to this "
                "endpoint; install them where laya-serve runs, or drop them" % key
            )
            r, _ = await post(c, path, {**base, key: None})
            assert r.status == 200


@aio
async def test_several_hooks_named_together_and_diagnostics_on_batch():
    async with served() as c:
        r, out = await post(c, URL, {**BODY, "hooks_timeout": 1, "hooks": [1]})
        assert out["detail"].startswith("hooks, hooks_timeout run inside")
        r, out = await post(c, URL, {**BODY, "diagnostics": {}})
        assert r.status == 200  # ignored on the single route
        r, out = await post(c, BATCH, {"states": ["x"], "questions": Q, "diagnostics": {}})
        assert r.status == 422 and out["detail"].startswith("diagnostics is filled in place")
        r, _ = await post(c, BATCH, {"states": ["x"], "questions": Q, "diagnostics": None})
        assert r.status == 200


@pytest.mark.parametrize("where", ["state", "instructions", "label"])
@aio
async def test_lone_surrogate_is_400_on_both_routes(where):
    q = json.loads(json.dumps(Q))
    state = "fine"
    if where == "state":
        state = "bad \ud800 here"
    elif where == "instructions":
        q["queue"]["instructions"] = "\udfff"
    else:
        q["queue"]["criteria"] = {"ok": "x", "\ud83d": "y"}
    detail = "request body contains an unpaired surrogate escape; those cannot be encoded as UTF-8"
    async with served() as c:
        r, out = await post(c, URL, json.dumps({"state": state, "questions": q}))
        assert (r.status, out) == (400, {"detail": detail})
        r, out = await post(c, BATCH, json.dumps({"states": [state], "questions": q}))
        assert (r.status, out) == (400, {"detail": detail})
        assert c.agent.calls == []


@aio
async def test_raw_cesu_bytes_and_emoji():
    async with served() as c:
        raw = b'{"state": "a\xed\xa0\x80b", "questions": {}}'
        r, out = await post(c, URL, raw)
        assert r.status == 400 and "surrogate" in out["detail"]
        r, _ = await post(c, URL, json.dumps({"state": "\U0001f600 ok", "questions": Q}))
        assert r.status == 200
        r, _ = await post(c, BATCH, json.dumps({"states": ["\U0001f600"], "questions": Q}))
        assert r.status == 200


@aio
async def test_deep_nesting_does_not_500():
    async with served() as c:
        deep = "[" * 400 + '"x"' + "]" * 400
        r, _ = await post(c, URL, '{"state": %s, "questions": {}}' % deep)
        assert r.status == 200
        deeper = "[" * 5000 + "]" * 5000
        r, out = await post(c, URL, '{"state": %s, "questions": {}}' % deeper)
        assert (r.status, out) == (400, {"detail": "request body must be valid JSON"})


@aio
async def test_check_order_first_failure_wins():
    async with served() as c:
        # size beats hooks, hooks beat surrogates, surrogates beat model, model beats budgets
        r, _ = await post(c, URL, {"state": "x" * 50001, "questions": Q, "hooks": 1})
        assert r.status == 413
        r, out = await post(c, URL, json.dumps({**BODY, "hooks": 1, "state": "\ud800"}))
        assert out["detail"].startswith("hooks run inside")
        r, out = await post(c, URL, json.dumps({**BODY, "model": "/x", "state": "\ud800"}))
        assert "surrogate" in out["detail"]
        r, out = await post(c, URL, {**BODY, "model": "/x", "max_len": "a"})
        assert "unknown model" in out["detail"]
        r, out = await post(c, URL, {**BODY, "max_len": 0, "lang": 5})
        assert out["detail"] == "max_len must be a positive integer"
        r, out = await post(c, URL, {**BODY, "lang": 5, "min_confidence": 2})
        assert out["detail"].startswith("lang must be")
        r, out = await post(c, URL, {**BODY, "task": "multilingual", "min_confidence": 2})
        assert out["detail"].startswith("min_confidence must be")


# -- model / task --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        "jev-1",
        "jev-latest",
        "not-a-checkpoint",
        "convaiinnovations/laya",
        "CONVAIINNOVATIONS/LAYA",
        "",
        None,
        0,
        False,
        True,
        5,
        "gpt-5",
        "english",
        " English ",
        "en",
        "laya",
        "default",
    ],
)
@aio
async def test_model_names_this_checkpoint_or_auto_routes(model):
    async with served() as c:
        r, body = await post(c, URL, {**BODY, "model": model})
        assert r.status == 200 and body["routing"]["model"] == "english"
        assert "model" not in kwargs_of(c.agent)
        r, body = await post(c, BATCH, {"states": ["a"], "questions": Q, "model": model})
        assert r.status == 200


@pytest.mark.parametrize(
    "model",
    [
        "/path/to/checkpoint",
        "org/repo",
        "~/models/ckpt",
        "./checkpoint",
        ".\\checkpoint",
        "C:\\models\\ckpt",
        ["a/b"],
        "multilingual",
        "ml",
        "convaiinnovations/laya-typed-decisions",
    ],
)
@aio
async def test_path_like_or_unserved_model_is_422_on_both_routes(model):
    async with served() as c:
        for path, base in ((URL, BODY), (BATCH, {"states": ["x"], "questions": Q})):
            r, out = await post(c, path, {**base, "model": model})
            assert r.status == 422
            d = out["detail"]
            assert "unknown model" in d and "choose one of ['english']" in d
            assert d.endswith(", or omit model to let the router choose") and repr(model) in d
        assert c.agent.calls == []


@aio
async def test_task_must_name_the_served_checkpoint():
    async with served() as c:
        r, _ = await post(c, URL, {**BODY, "task": "en"})
        assert r.status == 200 and "task" not in kwargs_of(c.agent)
        r, out = await post(c, URL, {**BODY, "task": "invoice"})
        assert r.status == 422
        assert out["detail"] == (
            "unknown model 'invoice'; choose one of ['english'] (or an alias: ['default', 'en', 'laya'])"
        )
        r, out = await post(c, BATCH, {"states": ["x"], "questions": Q, "task": "typed"})
        assert r.status == 422 and "unknown model 'typed'" in out["detail"]


# -- controls ------------------------------------------------------------------------------


@aio
async def test_budgets_forwarded_only_when_sent():
    async with served() as c:
        await post(c, URL, {**BODY, "max_len": 256, "head_max_len": 256})
        assert kwargs_of(c.agent) == {"max_len": 256, "head_max_len": 256}
        await post(
            c,
            URL,
            {
                **BODY,
                "max_len": None,
                "head_max_len": None,
                "lang": None,
                "min_confidence": None,
                "task": None,
                "lang_guess": None,
            },
        )
        assert kwargs_of(c.agent) == {}


@pytest.mark.parametrize(
    "value,detail",
    [
        ("fast", "max_len must be an integer"),
        (True, "max_len must be an integer"),
        (3.14, "max_len must be an integer"),
        (1.0, "max_len must be an integer"),
        (0, "max_len must be a positive integer"),
        (-10, "max_len must be a positive integer"),
        (9000, "max_len exceeds server limit (9000 > 8192)"),
    ],
)
@aio
async def test_budget_validation(value, detail):
    async with served() as c:
        for key in ("max_len", "head_max_len"):
            for path, base in ((URL, BODY), (BATCH, {"states": ["x"], "questions": Q})):
                r, out = await post(c, path, {**base, key: value})
                assert (r.status, out) == (422, {"detail": detail.replace("max_len", key, 1)})
        assert c.agent.calls == []


@aio
async def test_token_budget_env_caps_and_bad_values_fall_back(monkeypatch, caplog):
    async with served() as c:
        monkeypatch.setenv("LAYA_MAX_TOKEN_BUDGET", "2048")
        r, out = await post(c, URL, {**BODY, "max_len": 4096})
        assert out == {"detail": "max_len exceeds server limit (4096 > 2048)"}
        monkeypatch.setenv("LAYA_MAX_TOKEN_BUDGET", "lots")
        with caplog.at_level(logging.WARNING, "laya_onnx.serve"):
            r, _ = await post(c, URL, {**BODY, "max_len": 8192})
        assert r.status == 200 and "invalid LAYA_MAX_TOKEN_BUDGET" in caplog.text


@aio
async def test_lang_controls_and_min_confidence():
    async with served() as c:
        r, _ = await post(c, URL, {**BODY, "lang": "de", "lang_guess": "pt"})
        assert r.status == 200 and kwargs_of(c.agent) == {"lang": "de"}
        r, _ = await post(c, URL, {**BODY, "lang": ""})
        assert kwargs_of(c.agent) == {"lang": ""}
        for key in ("lang", "lang_guess"):
            r, out = await post(c, URL, {**BODY, key: True})
            assert (r.status, out["detail"]) == (
                422,
                '%s must be a language code string such as "de", or null' % key,
            )
        r, body = await post(c, URL, {**BODY, "min_confidence": 0.0})
        assert kwargs_of(c.agent) == {"min_confidence": 0.0}
        assert {a["abstention"] for a in body["answers"].values()} == {"passed"}
        r, body = await post(c, URL, {**BODY, "min_confidence": 0.7})
        assert body["answers"]["queue"]["low_confidence"] is True
        assert body["answers"]["refund"]["abstention"] == "passed"
        r, body = await post(c, URL, {**BODY, "min_confidence": {"default": 0.5, "noul:2": 0.9}})
        assert body["answers"]["refund"]["abstention_threshold"] == 0.9


@pytest.mark.parametrize(
    "value,detail",
    [
        (1.5, "min_confidence must be a float in [0.0, 1.0], got 1.5"),
        (-0.1, "min_confidence must be a float in [0.0, 1.0], got -0.1"),
        (True, "min_confidence must be a float in [0.0, 1.0], got True"),
        ("0.9", "min_confidence must be a float in [0.0, 1.0], got '0.9'"),
        ({}, "a min_confidence map must be a non-empty dict of bucket -> float, got {}"),
        ({"x": 0.5}, "min_confidence map keys must be a bucket like 'choice:3-5' or 'default', got 'x'"),
    ],
)
@aio
async def test_min_confidence_validation_uses_core_text(value, detail):
    async with served() as c:
        r, out = await post(c, URL, {**BODY, "min_confidence": value})
        assert (r.status, out) == (422, {"detail": detail})
        r, out = await post(c, URL, '{"state": "x", "questions": {}, "min_confidence": 1e999}')
        assert (r.status, out) == (422, {"detail": "min_confidence must be a float in [0.0, 1.0], got inf"})


# -- inference errors and the worker -------------------------------------------------------


@aio
async def test_question_value_error_is_422_not_logged(caplog):
    bad = {"refund": {"type": "X", "instructions": "x"}}
    async with served() as c:
        with caplog.at_level(logging.ERROR):
            r, out = await post(c, URL, {"state": "x", "questions": bad})
        assert r.status == 422
        assert out == {
            "detail": "question 'refund': unknown type 'X'; use one of ['choice', 'noul', 'score']"
        }
        assert "Server-Timing" not in r.headers
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


@pytest.mark.parametrize("path,body", [(URL, BODY), (BATCH, {"states": ["x"], "questions": Q})])
@aio
async def test_unexpected_error_is_500_without_leak(caplog, path, body):
    agent = FakeAgent(error=RuntimeError("CUDA OOM at /secret/path"))
    async with served(agent) as c:
        with caplog.at_level(logging.ERROR):
            r, out = await post(c, path, body)
    assert (r.status, out) == (500, {"detail": "inference failed"})
    errors = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
    assert errors and errors[0].exc_info and "secret" not in json.dumps(out)
    assert "Server-Timing" not in r.headers


@aio
async def test_non_finite_result_is_422():
    def poison(result):
        result["answers"]["queue"]["confidence"] = float("nan")
        return result

    async with served(FakeAgent(result_hook=poison)) as c:
        r, out = await post(c, URL, BODY)
        assert (r.status, out) == (422, {"detail": "Out of range float values are not JSON compliant"})
        assert "Server-Timing" not in r.headers


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


@pytest.mark.parametrize("raw,expect", [(None, 16), ("", 16), ("abc", 16), ("0", 16), ("-3", 16), ("4", 4)])
def test_max_concurrent_env(monkeypatch, raw, expect):
    if raw is not None:
        monkeypatch.setenv("LAYA_MAX_CONCURRENT", raw)
    assert serve_settings.Settings.from_env().max_concurrent == expect


# -- auth ----------------------------------------------------------------------------------


async def _raw_request(client, head: bytes, body: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(head + body)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)  # Connection: close -> read to EOF
    writer.close()
    return data


@aio
async def test_bearer_auth_on_decision_routes():
    async with served(api_key="s3cret") as c:
        for path, body in ((URL, BODY), (BATCH, {"states": ["x"], "questions": Q})):
            for header in (
                None,
                "Bearer wrong",
                "bearer s3cret",
                "Bearer  s3cret",
                "s3cret",
                "Bearer s3cret\tx",
            ):
                headers = {"Authorization": header} if header else {}
                r, out = await post(c, path, body, headers=headers)
                assert (r.status, out) == (401, {"detail": "invalid or missing bearer token"})
                assert "WWW-Authenticate" not in r.headers
            r, _ = await post(c, path, body, headers={"Authorization": "Bearer s3cret"})
            assert r.status == 200
        # auth is checked before the body: even an oversized or malformed one is a 401
        r, out = await post(c, URL, b"junk")
        assert r.status == 401
        payload = json.dumps(BODY).encode()
        for value in (b"Bearer s\xe9cret", b"Bearer s\xc3\xa9cret", b"Bearer \xff\xfe"):
            head = (
                b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: "
                + value
                + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(payload)
            )
            data = await _raw_request(c, head, payload)
            assert data.startswith(b"HTTP/1.1 401 Unauthorized"), data[:200]
            assert data.endswith(b'{"detail":"invalid or missing bearer token"}')
        assert len(c.agent.calls) == 2


@aio
async def test_non_ascii_key_matches_its_utf8_bearer_only():
    # aiohttp hands header bytes over as UTF-8/surrogateescape, so the key's UTF-8 bytes match
    # (laya-serve's latin-1 decoding can never match a non-ASCII key); latin-1 bytes do not.
    async with served(api_key="s\u00e9cret") as c:
        payload = json.dumps(BODY).encode()
        for value, status in ((b"s\xc3\xa9cret", b"200"), (b"s\xe9cret", b"401")):
            head = (
                b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + value
                + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(payload)
            )
            data = await _raw_request(c, head, payload)
            assert data.startswith(b"HTTP/1.1 " + status), data[:200]


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
async def test_health_reads_laya_style_counters():
    agent = FakeAgent()
    agent.cpu_fallback_count, agent.last_fallback_reason = 4, "out of memory"
    async with served(agent) as c:
        body = await (await c.get("/health")).json()
    assert body["cpu_fallbacks"] == {"english": {"count": 4, "last_reason": "out of memory"}}


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


# -- routing surface -----------------------------------------------------------------------


@aio
async def test_not_found_method_not_allowed_and_slash_redirect():
    async with served() as c:
        for path in ("/v1/models", "/metrics", "/ready", "/v1/chat/completions", "/docs"):
            r = await c.get(path)
            assert (r.status, await r.json()) == (404, {"detail": "Not Found"})
        r = await c.get(URL)
        assert (r.status, await r.json()) == (405, {"detail": "Method Not Allowed"})
        assert r.headers["Allow"] == "POST"
        r = await c.post("/health")
        assert r.status == 405 and r.headers["Allow"] == "GET"
        r = await c.head("/health")
        assert r.status == 405
        r = await c.post(URL + "/", data=json.dumps(BODY), allow_redirects=False)
        assert r.status == 307 and r.headers["Location"].endswith(URL)


# -- strict Jev projection -----------------------------------------------------------------


@aio
async def test_strict_projection(monkeypatch):
    async with served() as c:
        for off in (None, "0", "no", ""):
            if off is None:
                monkeypatch.delenv("LAYA_JEV_STRICT", raising=False)
            else:
                monkeypatch.setenv("LAYA_JEV_STRICT", off)
            _, body = await post(c, URL, BODY)
            assert "routing" in body
        monkeypatch.setenv("LAYA_JEV_STRICT", "1")
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


# -- batch ---------------------------------------------------------------------------------


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
        r, _ = await post(c, BATCH, body)
        assert r.status == 200
        assert kwargs_of(c.agent) == {
            "max_len": 256,
            "lang": "en",
            "min_confidence": 0.8,
            "batch_size": 2,
            "sort_by_length": True,
        }
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


@aio
async def test_batch_without_predict_batch_falls_back_per_state():
    async with served(PlainAgent()) as c:
        r, body = await post(
            c,
            BATCH,
            {
                "states": ["a", "b"],
                "questions": Q,
                "max_len": 300,
                "min_confidence": 0.1,
                "sort_by_length": True,
            },
        )
        assert r.status == 200 and len(body["results"]) == 2
        assert [call[0] for call in c.agent.calls] == ["predict", "predict"]
        assert kwargs_of(c.agent) == {"max_len": 300, "min_confidence": 0.1}


# -- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize("raw,expect", [(None, 8000), ("", 8000), ("  ", 8000), (" 9000 ", 9000)])
def test_port_env(monkeypatch, raw, expect):
    if raw is not None:
        monkeypatch.setenv("LAYA_PORT", raw)
    assert serve_settings.resolve_port(None) == expect


@pytest.mark.parametrize("raw", ["abc", "0", "70000", "-1", "80.5"])
def test_bad_port_env_exits_with_a_message(monkeypatch, raw):
    monkeypatch.setenv("LAYA_PORT", raw)
    with pytest.raises(SystemExit, match="invalid LAYA_PORT"):
        serve_settings.resolve_port(None)


def test_cli_port_wins_and_is_checked(monkeypatch):
    monkeypatch.setenv("LAYA_PORT", "nonsense")
    assert serve_settings.resolve_port(8123) == 8123
    with pytest.raises(SystemExit, match="invalid --port 70000"):
        serve_settings.resolve_port(70000)
    monkeypatch.setenv("LAYA_HOST", " 127.0.0.1 ")
    assert serve_settings.resolve_host(None) == "127.0.0.1"
    assert serve_settings.resolve_host("::1") == "::1"
    monkeypatch.delenv("LAYA_HOST")
    assert serve_settings.resolve_host(None) == "0.0.0.0"


def test_log_level_env(monkeypatch):
    assert serve_settings.resolve_log_level() == logging.INFO
    monkeypatch.setenv("LAYA_LOG_LEVEL", " DEBUG ")
    assert serve_settings.resolve_log_level() == logging.DEBUG
    monkeypatch.setenv("LAYA_LOG_LEVEL", "loud")
    with pytest.raises(SystemExit, match="invalid LAYA_LOG_LEVEL 'loud'"):
        serve_settings.resolve_log_level()


def test_env_bool_and_settings(monkeypatch):
    for raw, want in (
        ("1", True),
        ("TRUE", True),
        (" on ", True),
        ("yes", True),
        ("0", False),
        ("off", False),
        ("2", False),
        ("", False),
    ):
        monkeypatch.setenv("LAYA_JEV_STRICT", raw)
        assert serve_settings.env_bool("LAYA_JEV_STRICT") is want
    monkeypatch.setenv("LAYA_API_KEY", "")
    assert serve_settings.Settings.from_env().api_key is None
    monkeypatch.setenv("LAYA_API_KEY", " k ")
    assert serve_settings.Settings.from_env().api_key == " k "
    for raw, want in (("abc", 10.0), ("0", 10.0), ("inf", 10.0), ("nan", 10.0), ("2.5", 2.5)):
        monkeypatch.setenv("LAYA_BODY_READ_TIMEOUT", raw)
        assert serve_settings.Settings.from_env().body_read_timeout == want
    with pytest.raises(TypeError, match="unknown settings: nope"):
        serve_settings.Settings.from_env(nope=1)


def test_cli_serve_bad_port_exits_before_loading(tmp_path):
    from laya_onnx.cli import main

    with pytest.raises(SystemExit, match="invalid --port"):
        main(["serve", str(tmp_path / "missing"), "--port", "70000"])


@aio
async def test_strict_projection_of_a_broken_answer_is_500(monkeypatch, caplog):
    def broken(result):
        del result["answers"]["queue"]["choice"]
        return result

    monkeypatch.setenv("LAYA_JEV_STRICT", "1")
    async with served(FakeAgent(result_hook=broken)) as c:
        with caplog.at_level(logging.ERROR):
            r, out = await post(c, URL, BODY)
    assert (r.status, out) == (500, {"detail": "inference failed"})
    assert "Server-Timing" not in r.headers and caplog.records


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
        runtime = c.server.app[RUNTIME]
        assert runtime.executor is not None
    assert agent.active == 0 and runtime.executor is None  # cleanup_ctx drained the worker
