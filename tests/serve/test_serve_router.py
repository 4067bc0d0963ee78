"""`laya-onnx serve MODELS_DIR`: the server in front of a Router (serve/served.py), over the serve
tests' fake agents (one per checkpoint, built by the Router's agent_factory): the `model` field
as laya-serve resolves it, the routing controls, batches, /health, /v1/models, the environment
(LAYA_MAX_LOADED, LAYA_EXTRA_MODELS, LAYA_DEFAULT_MODEL, LAYA_PRELOAD, LAYA_MODELS) and idle
unload. The same against laya.serve with real models is tests/serve/test_serve_router_reference.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

import pytest

from laya_onnx.core import settings
from laya_onnx.core.errors import ConfigError
from laya_onnx.core.hooks import BaseHook
from laya_onnx.core.router import Router
from laya_onnx.serve import create_app
from laya_onnx.serve.served import build_router, parse_model_option
from tests.serve.test_serve_health import HEALTH_KEYS
from tests.serve_support import BATCH, URL, FakeAgent, Q, aio, post

pytestmark = [pytest.mark.serve, pytest.mark.runtime, pytest.mark.usefixtures("no_laya_env")]

EN, DE, JA = (
    "I was charged twice this month, I want my money back",
    "Mein Konto wurde zweimal belastet",
    "二重請求です",
)
ROUTER_HEALTH_KEYS = [*HEALTH_KEYS, "memory"]  # one bundle's keys, then the process memory


def fake(source, name, **kwargs):
    agent = FakeAgent()
    agent.name, agent.source = name, source
    return agent


def router(**kw):
    models = {"english": "b/en", "multilingual": "b/ml", "typed-decisions": "b/td", "papers": "b/papers"}
    return Router(models, agent_factory=fake, **kw)


@contextlib.asynccontextmanager
async def serving(r, **settings):
    from aiohttp.test_utils import TestClient, TestServer

    async with TestClient(TestServer(create_app(r, **settings))) as client:
        yield client


@aio
async def test_the_model_field_as_laya_serve_resolves_it():
    r = router()
    async with serving(r) as c:
        for model, routed, reason in [
            # the server resolves the name first, so the reason names the checkpoint (laya-serve)
            ("ml", "multilingual", "explicit model='multilingual'"),
            (" Typed ", "typed-decisions", "explicit model='typed-decisions'"),
            ("convaiinnovations/laya-multilingual", "multilingual", "explicit model='multilingual'"),
            ("PAPERS", "papers", "explicit model='papers'"),
            ("convaiinnovations/laya", "english", "English Latin text"),  # the bundle repo: auto
            ("jev-latest", "english", "English Latin text"),  # any other name: auto
            ("", "english", "English Latin text"),
        ]:
            resp, body = await post(c, URL, {"state": EN, "questions": Q, "model": model})
            assert resp.status == 200, (model, body)
            assert (body["routing"]["model"], body["routing"]["reason"]) == (routed, reason)
            assert list(body)[-1] == "routing" and body["model"] == "laya-rl-agent-onnx"
        for model in ("./ckpt", "org/repo", "~/m", "C:\\m", ["a/b"]):
            resp, body = await post(c, URL, {"state": EN, "questions": Q, "model": model})
            assert resp.status == 422
            assert body["detail"].startswith(
                "unknown model %r; choose one of ['english', 'multilingual', 'papers', " % (model,)
            )
            assert body["detail"].endswith(", or omit model to let the router choose")


@aio
async def test_a_model_naming_no_checkpoint_is_auto_routed_and_says_so():
    """laya-serve auto-routes a miss silently; here X-Model-Fallback names the checkpoints the
    router chose (state by state in a batch), and a named or generic model carries none."""
    r = router()
    async with serving(r) as c:
        resp, body = await post(c, URL, {"state": DE, "questions": Q, "model": "englsh"})
        assert resp.status == 200 and body["routing"]["model"] == "multilingual"
        assert resp.headers["X-Model-Fallback"] == "multilingual" and "x_model_fallback" not in body
        resp, body = await post(c, BATCH, {"states": [EN, DE, EN], "questions": Q, "model": "gpt-5"})
        assert resp.status == 200 and resp.headers["X-Model-Fallback"] == "english, multilingual"
        for model in ("english", "ml", "jev-latest", "convaiinnovations/laya", None):
            resp, _ = await post(c, URL, {"state": EN, "questions": Q, "model": model})
            assert resp.status == 200 and "X-Model-Fallback" not in resp.headers, model
    async with serving(router(), jev_profile="typesafe") as c:
        resp, body = await post(c, URL, {"state": JA, "questions": Q, "model": "multilingal"})
        assert body["x_model_fallback"] == {"requested": "multilingal", "answered_by": "multilingual"}


@aio
async def test_task_lang_and_lang_guess_reach_the_router():
    r = router()
    async with serving(r) as c:
        cases = [
            ({"task": "typed_decisions"}, "typed-decisions", "explicit task='typed_decisions'"),
            ({"lang": "de"}, "multilingual", "explicit lang='de'"),
            (
                {"lang_guess": "pt"},
                "multilingual",
                "lang_guess: the caller identified this as non-English text",
            ),
            ({"lang": "C"}, "english", "English Latin text"),
        ]
        for controls, routed, reason in cases:
            resp, body = await post(c, URL, {"state": EN, "questions": Q, **controls})
            assert (
                resp.status == 200
                and body["routing"]["reason"] == reason
                and body["routing"]["model"] == routed
            )
        assert r.resident()["english"].calls[-1][3] == {"lang": "C"}  # the agent still gets the code
        resp, body = await post(c, URL, {"state": EN, "questions": Q, "task": "invoice"})
        assert resp.status == 422 and body["detail"].startswith("unknown model 'invoice'; choose one of")
        resp, body = await post(c, URL, {"state": EN, "questions": Q, "lang_guess": 5})
        assert resp.status == 422 and "lang_guess must be a language code string" in body["detail"]


@aio
async def test_a_batch_is_routed_state_by_state():
    r = router()
    async with serving(r) as c:
        resp, body = await post(c, BATCH, {"states": [EN, DE, JA, EN], "questions": Q, "min_confidence": 0.7})
        assert resp.status == 200
        assert [x["routing"]["model"] for x in body["results"]] == [
            "english",
            "multilingual",
            "multilingual",
            "english",
        ]
        assert body["total_usage"] == {"input_tokens": 4 * 30, "output_tokens": 0}
        assert all(
            a["abstention"] == "abstained"
            for x in body["results"]
            for a in x["answers"].values()
            if a["type"] == "choice"
        )
        # one predict_batch per checkpoint, the states in input order
        assert [c[1] for c in r.resident()["english"].calls] == [[EN, EN]]
        resp, body = await post(c, BATCH, {"states": [EN, DE], "questions": Q, "model": "typed"})
        assert {x["routing"]["model"] for x in body["results"]} == {"typed-decisions"}


@aio
async def test_health_reports_every_resident_checkpoint_and_the_process_memory():
    r = router(max_loaded=3)
    r.load("english")
    async with serving(r, api_key="k") as c:
        # after the start: passes that fell back (one present at the start never attached)
        r.resident()["english"].fallbacks = {"CUDAExecutionProvider": {"count": 2, "last_reason": "no GPU"}}
        assert await (await c.get("/health")).json() == {"status": "ok"}
        await post(c, URL, {"state": DE, "questions": Q}, headers={"Authorization": "Bearer k"})
        health = await (await c.get("/health", headers={"Authorization": "Bearer k"})).json()
    assert list(health) == ROUTER_HEALTH_KEYS
    assert health["loaded"] == ["english", "multilingual"]
    assert health["revisions"] == {"english": "0123456789abcdef", "multilingual": "0123456789abcdef"}
    assert health["checkpoint_devices"] == {"english": "cpu", "multilingual": "cpu"}
    # counted from each checkpoint's load: a provider that never attached is not a fallback
    assert health["cpu_fallbacks"]["english"] == {"count": 2, "last_reason": "no GPU"}
    assert health["cpu_fallbacks"]["multilingual"] == {"count": 0, "last_reason": None}
    assert health["provider_fallbacks"]["english"]["CUDAExecutionProvider"]["count"] == 2
    assert (
        health["memory"]["rss_bytes"] > 10 * 2**20
        and health["memory"]["peak_rss_bytes"] >= health["memory"]["rss_bytes"]
    )


@aio
async def test_models_lists_each_checkpoint_with_a_bundle():
    r = Router({"english": "b/en", "papers": "b/p"}, agent_factory=fake)
    async with serving(r) as c:
        listing = await (await c.get("/v1/models")).json()
    assert [m["name"] for m in listing["models"]] == ["english", "papers"]
    assert listing["models"][0]["x_aliases"] == ["default", "en", "laya"]
    assert listing["models"][1]["x_repo"] == "b/p" and listing["models"][1]["x_loaded"] is False


class Evictions(BaseHook):
    def __init__(self):
        self.threads = []

    def on_evict(self, ctx):
        self.threads.append(threading.current_thread().name)


@aio
async def test_idle_unload_runs_on_the_worker_and_the_next_request_reloads(monkeypatch, caplog):
    monkeypatch.setenv("LAYA_IDLE_UNLOAD_SECONDS", "0.2")
    evictions = Evictions()
    r = router(hooks=[evictions])
    caplog.set_level(logging.INFO, logger="laya_onnx.serve")
    async with serving(r) as c:
        await post(c, URL, {"state": EN, "questions": Q})
        health = await (await c.get("/health")).json()
        assert health["loaded"] == ["english"] and health["idle_unload_seconds"] == 0.2
        for _ in range(100):
            await asyncio.sleep(0.05)
            if not r.loaded:
                break
        health = await (await c.get("/health")).json()
        assert health["loaded"] == [] and health["cpu_fallbacks"] == {} and health["idle_seconds"] >= 0.2
        assert evictions.threads and all(t.startswith("laya-infer") for t in evictions.threads)
        resp, body = await post(c, URL, {"state": EN, "questions": Q})
        assert resp.status == 200 and r.loaded == ["english"]
    loads = [m for m in caplog.messages if m.startswith("loaded checkpoint english in ")]
    assert len(loads) == 2 and any(m.startswith("idle for ") for m in caplog.messages)


@aio
async def test_no_idle_unload_by_default():
    r = router()
    async with serving(r) as c:
        await post(c, URL, {"state": EN, "questions": Q})
        await asyncio.sleep(0.3)
        health = await (await c.get("/health")).json()
    assert health["loaded"] == ["english"] and "idle_unload_seconds" not in health


def _models_dir(tmp_path, *names):
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "laya.onnx").write_bytes(b"")
    return tmp_path


def test_build_router_from_a_models_directory_and_the_environment(tmp_path, monkeypatch):
    models = _models_dir(tmp_path, "english", "multilingual")
    monkeypatch.setenv("LAYA_PRELOAD", "0")
    monkeypatch.setenv("LAYA_MAX_LOADED", "1")
    monkeypatch.setenv("LAYA_AUTO_TASK", "yes")
    monkeypatch.setenv("LAYA_DEFAULT_MODEL", " EN ")
    monkeypatch.setenv("LAYA_EXTRA_MODELS", '{"papers": "org/papers-bundle", "notes": ["org/repo", "notes"]}')
    r = build_router(models, ["legal=/srv/legal"])
    assert r.models == {
        "english": models / "english",
        "multilingual": models / "multilingual",
        "typed-decisions": None,
        "legal": "/srv/legal",
        "papers": "org/papers-bundle",
        "notes": ("org/repo", "notes"),
    }
    assert (r.max_loaded, r.default, r.auto_task_detection, r.loaded) == (1, "english", True, [])
    monkeypatch.setenv("LAYA_MAX_LOADED", "zero")  # unreadable: the Router's default, as laya-serve
    assert build_router(models).max_loaded == 2


@pytest.mark.parametrize(
    "env, value, message",
    [
        ("LAYA_EXTRA_MODELS", "{", "invalid LAYA_EXTRA_MODELS: not a JSON object"),
        ("LAYA_EXTRA_MODELS", "[]", "invalid LAYA_EXTRA_MODELS: a JSON object {name: source}, got list"),
        ("LAYA_EXTRA_MODELS", '{"x": 5}', "source for 'x' must be a bundle folder"),
        ("LAYA_EXTRA_MODELS", '{"a/b": "x"}', "invalid checkpoint name 'a/b'"),
        ("LAYA_DEFAULT_MODEL", "gpt", "invalid LAYA_DEFAULT_MODEL 'gpt': unknown model 'gpt'"),
        ("LAYA_MODELS", "english,nope", "unknown model 'nope'"),
    ],
)
def test_build_router_refuses_a_bad_configuration(tmp_path, monkeypatch, env, value, message):
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("[", r"\[")):
        build_router(_models_dir(tmp_path, "english"))


def test_model_options_and_an_empty_configuration():
    assert parse_model_option(" papers = /srv/p ") == ("papers", "/srv/p")
    for bad in ("papers", "=x", "papers="):
        with pytest.raises(ConfigError, match="--model takes NAME=BUNDLE"):
            parse_model_option(bad)
    with pytest.raises(ConfigError, match="no bundle to serve"):
        build_router(None, [])
    assert settings.EXTRA_MODELS.read() == {}


def test_serve_refuses_bad_model_options_before_binding(capsys):
    from laya_onnx.cli import main

    assert main(["serve"]) == 2
    assert "give a bundle to serve (or a models directory, or --model NAME=BUNDLE)" in capsys.readouterr().err
    assert main(["serve", "--model", "papers", "--port", "1"]) == 2
    assert "--model takes NAME=BUNDLE" in capsys.readouterr().err


@aio
async def test_micro_batching_never_mixes_routes(monkeypatch):
    """With LAYA_BATCH_WINDOW_MS on, concurrent requests that route to different checkpoints
    (or pin another model) each keep their own routing."""
    monkeypatch.setenv("LAYA_BATCH_WINDOW_MS", "50")
    r = router()
    async with serving(r) as c:
        bodies = [
            {"state": EN, "questions": Q},
            {"state": DE, "questions": Q},
            {"state": EN, "questions": Q, "model": "typed"},
            {"state": JA, "questions": Q},
        ]
        answers = await asyncio.gather(*(post(c, URL, b) for b in bodies))
    assert [body["routing"]["model"] for _, body in answers] == [
        "english",
        "multilingual",
        "typed-decisions",
        "multilingual",
    ]


@aio
async def test_metrics_count_each_request_under_the_checkpoint_that_answered_it():
    """A Router's auto-routed requests are counted under the checkpoint its policy picked, a pinned
    one under the pinned checkpoint: never under the Router's own name nor a client's text."""
    from prometheus_client.parser import text_string_to_metric_families

    async with serving(router()) as c:
        for state, model in ((EN, None), (DE, None), (EN, "papers"), (EN, "jev-latest")):
            body = {"state": state, "questions": Q, **({"model": model} if model else {})}
            assert (await post(c, URL, body))[0].status == 200
        text = await (await c.get("/metrics")).text()
    counted = {
        s.labels["checkpoint"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "laya_onnx_request_rows_count"
    }
    assert counted == {"english": 2, "multilingual": 1, "papers": 1}
