"""The controls a request may send: `model` / `task`, token budgets, `lang`, `min_confidence`
(docs/http-api.md#controls)."""

from __future__ import annotations

import logging

import pytest

from tests.serve_support import BATCH, BODY, URL, Q, aio, kwargs_of, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]


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


@pytest.mark.parametrize("model", ["englsh", "jev-1", "gpt-5", "not-a-checkpoint", True, 5])
@aio
async def test_a_model_naming_nothing_served_says_who_answered(model, caplog):
    """laya-serve answers such a name with its default checkpoint and says nothing; here the
    answer is the same (200, same body) and X-Model-Fallback names the checkpoint, on both routes."""
    caplog.set_level(logging.INFO, logger="laya_onnx.serve")
    async with served() as c:
        r, body = await post(c, URL, {**BODY, "model": model})
        assert r.status == 200 and r.headers["X-Model-Fallback"] == "english"
        assert "x_model_fallback" not in body and body["routing"]["model"] == "english"
        _, plain = await post(c, URL, BODY)
        assert {**body, "usage": None} == {**plain, "usage": None}  # laya-serve's body, untouched
        r, batch = await post(c, BATCH, {"states": ["a", "b"], "questions": Q, "model": model})
        assert r.status == 200 and r.headers["X-Model-Fallback"] == "english"
        assert all("x_model_fallback" not in x for x in batch["results"])
    lines = [m for m in caplog.messages if "names no checkpoint" in m]
    assert lines == ["model %r names no checkpoint served here; answered by english" % str(model).strip()] * 2


@aio
async def test_fields_nothing_reads_are_named_to_the_client():
    """laya-serve ignores a misspelt optional field in silence (no gate, no error); here the answer
    is the same and X-Unknown-Fields names each such field, with the one it most resembles."""
    question = next(iter(Q))
    misspelt = {**Q, question: {**Q[question], "critera_": 1}}
    async with served() as c:
        _, plain = await post(c, URL, BODY)
        assert "X-Unknown-Fields" not in _.headers
        r, body = await post(c, URL, {**BODY, "questions": misspelt, "min_confidnce": 0.9, "zz": 1})
        assert r.status == 200 and {**body, "usage": None} == {**plain, "usage": None}
        assert r.headers["X-Unknown-Fields"] == (
            "min_confidnce=min_confidence, zz, %s.critera_=criteria" % question
        )
        r, _ = await post(c, BATCH, {"states": ["a"], "questions": Q, "sort_by_length": True})
        assert r.status == 200 and "X-Unknown-Fields" not in r.headers
        r, _ = await post(c, BATCH, {"states": ["a"], "questions": Q, "state": "a", "\u00e9,\n": 1})
        assert r.headers["X-Unknown-Fields"] == "state=states, ???"
        many = {**BODY, **{"k%d" % i: i for i in range(5000)}}
        r, _ = await post(c, URL, many)
        assert r.headers["X-Unknown-Fields"] == ", ".join("k%d" % i for i in range(16))


@pytest.mark.parametrize(
    "model", ["english", " English ", "en", "", None, False, "jev-latest", "convaiinnovations/laya"]
)
@aio
async def test_a_model_naming_this_checkpoint_is_no_fallback(model):
    async with served() as c:
        for path, base in ((URL, BODY), (BATCH, {"states": ["x"], "questions": Q})):
            r, _ = await post(c, path, {**base, "model": model})
            assert r.status == 200 and "X-Model-Fallback" not in r.headers


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
    monkeypatch.setenv("LAYA_MAX_TOKEN_BUDGET", "2048")
    async with served() as c:
        r, out = await post(c, URL, {**BODY, "max_len": 4096})
        assert out == {"detail": "max_len exceeds server limit (4096 > 2048)"}
        monkeypatch.setenv("LAYA_MAX_TOKEN_BUDGET", "4096")  # read once, when the app was built
        r, out = await post(c, URL, {**BODY, "max_len": 4096})
        assert out == {"detail": "max_len exceeds server limit (4096 > 2048)"}
    monkeypatch.setenv("LAYA_MAX_TOKEN_BUDGET", "lots")
    with caplog.at_level(logging.WARNING, "laya_onnx.serve"):
        async with served() as c:
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
        assert kwargs_of(c.agent) == {}  # the gate is the Router's, in front of the bundle
        assert {a["abstention"] for a in body["answers"].values()} == {"passed"}
        assert {a["abstention_threshold"] for a in body["answers"].values()} == {0.0}
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
