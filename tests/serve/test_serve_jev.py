"""The server's Jev profile (`LAYA_JEV_PROFILE=typesafe`, docs/http-api.md#the-jev-profile) and the
255-option choice cap, on the deterministic fake agent of tests/serve_support.py.

The default profile is laya-serve's wire format, proven request by request against the real
laya.serve in tests/serve/test_serve_reference.py; these tests pin what the Jev profile changes and
that it changes nothing else (same checks, same numbers).
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("pydantic")

from laya_onnx.core.errors import ConfigError, InvalidRequest
from laya_onnx.serve import create_app, validate
from laya_onnx.serve import settings as serve_settings
from laya_onnx.serve.contract import jev_confidence
from tests.serve_support import BATCH, BODY, URL, FakeAgent, Q, aio, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]

JEV = {"jev_profile": "typesafe"}
CONTRACT = {
    "choice": ["type", "choice", "confidence", "probabilities"],
    "score": ["type", "score", "confidence", "legend", "probabilities"],
    "noul": ["type", "noul"],
}


def choice(n, **extra):
    return {"type": "choice", "instructions": "x", "criteria": ["opt %d" % i for i in range(n)], **extra}


# -- answers -------------------------------------------------------------------------------


@aio
async def test_jev_answers_carry_the_contract_first_and_every_extra_as_x():
    async with served() as c:
        _, laya = await post(c, URL, BODY)
    async with served(**JEV) as c:
        r, body = await post(c, URL, BODY)
    assert r.status == 200 and "Server-Timing" in r.headers
    assert list(body) == ["model", "answers", "usage", "x_routing"]
    assert body["x_routing"] == laya["routing"]
    assert list(body["usage"]) == ["input_tokens", "output_tokens"] + [
        "x_" + k for k in laya["usage"] if k not in ("input_tokens", "output_tokens")
    ]
    for qid, answer in body["answers"].items():
        kind, theirs = answer["type"], laya["answers"][qid]
        assert list(answer)[: len(CONTRACT[kind])] == CONTRACT[kind]
        extras = list(answer)[len(CONTRACT[kind]) :]
        assert extras and all(k.startswith("x_") for k in extras)
        # the same numbers: only names and confidence change
        assert answer["x_laya_confidence"] == theirs["confidence"]
        for key in ("choice", "score", "noul", "probabilities", "legend"):
            assert answer.get(key) == theirs.get(key)
        assert answer["x_answer_confidence"] == theirs["answer_confidence"]
        assert answer["x_action"] == theirs["action"]


@aio
async def test_jev_confidence_is_typesafes_formula():
    async with served(**JEV) as c:
        _, body = await post(c, URL, BODY)
    a = body["answers"]
    p = a["queue"]["probabilities"]
    n, top = len(p), max(p.values())
    assert a["queue"]["confidence"] == round((n * top - 1) / (n - 1), 4) == 0.4
    levels = [a["urgency"]["probabilities"][str(i)] for i in range(4)]
    mode = levels.index(max(levels))
    total = sum(levels)
    spread = sum(v / total * abs(i - mode) for i, v in enumerate(levels))
    uniform = sum(abs(i - 1.5) for i in range(4)) / 4
    assert a["urgency"]["confidence"] == round(max(0.0, 1 - spread / uniform), 4)
    assert "confidence" not in a["refund"]  # a Jev noul has none; laya's is x_laya_confidence


@aio
async def test_jev_strict_keeps_the_contract_only_with_jev_confidence(monkeypatch):
    monkeypatch.setenv("LAYA_JEV_STRICT", "1")
    async with served(**JEV) as c:
        _, body = await post(c, URL, BODY)
        _, batch = await post(c, BATCH, {"states": ["a", "b"], "questions": Q})
    assert list(body) == ["model", "answers", "usage"]
    assert body["usage"] == {"input_tokens": 30, "output_tokens": 0}
    for answer in body["answers"].values():
        assert sorted(answer) == sorted(CONTRACT[answer["type"]])
    assert body["answers"]["queue"]["confidence"] == 0.4
    assert body["answers"]["urgency"]["confidence"] == round(
        jev_confidence({"type": "score", "probabilities": body["answers"]["urgency"]["probabilities"]}), 4
    )
    assert [list(r) for r in batch["results"]] == [["model", "answers", "usage"]] * 2
    assert batch["total_usage"] == {"input_tokens": 60, "output_tokens": 0}


@aio
async def test_a_model_naming_nothing_served_is_answered_and_named_as_a_fallback(monkeypatch):
    """docs/http-api.md#the-model-field: `model` is answered (jev-latest plainly); a name this server does not know is
    answered too, with `x_model_fallback` in each result and X-Model-Fallback; strict keeps the header."""
    async with served(**JEV) as c:
        r, body = await post(c, URL, {**BODY, "model": "englsh"})
        assert r.status == 200 and r.headers["X-Model-Fallback"] == "english"
        assert list(body) == ["model", "answers", "usage", "x_routing", "x_model_fallback"]
        assert body["x_model_fallback"] == {"requested": "englsh", "answered_by": "english"}
        r, batch = await post(c, BATCH, {"states": ["a", "b"], "questions": Q, "model": "jev-1.13"})
        assert r.status == 200 and r.headers["X-Model-Fallback"] == "english"
        assert [x["x_model_fallback"]["requested"] for x in batch["results"]] == ["jev-1.13"] * 2
        r, body = await post(c, URL, {**BODY, "model": "jev-latest"})
        assert "X-Model-Fallback" not in r.headers and "x_model_fallback" not in body
    monkeypatch.setenv("LAYA_JEV_STRICT", "1")
    async with served(**JEV) as c:
        r, body = await post(c, URL, {**BODY, "model": "englsh"})
    assert r.headers["X-Model-Fallback"] == "english" and list(body) == ["model", "answers", "usage"]


@aio
async def test_jev_batch_results_are_shaped_too():
    async with served(**JEV) as c:
        r, body = await post(c, BATCH, {"states": ["a", "b"], "questions": Q})
    assert r.status == 200 and list(body) == ["results", "total_usage"]
    for result in body["results"]:
        assert list(result) == ["model", "answers", "usage", "x_routing"]
        assert result["answers"]["queue"]["confidence"] == 0.4


# -- validation: the 422 list --------------------------------------------------------------

INVALID = [
    ({"state": "x", "questions": {}}, ["body", "questions"], "too_short"),
    ({"state": "x", "questions": []}, ["body", "questions"], "dict_type"),
    ({"questions": Q}, ["body", "state"], "missing"),
    ({"state": None, "questions": Q}, ["body", "state"], "missing"),
    ({"state": "x"}, ["body", "questions"], "missing"),
    (
        {"state": "x", "questions": {"a": {"instructions": "x"}}},
        ["body", "questions", "a"],
        "union_tag_not_found",
    ),
    ({"state": "x", "questions": {"a": {"type": "box"}}}, ["body", "questions", "a"], "union_tag_invalid"),
    (
        {"state": "x", "questions": {"a": {"type": "choice", "instructions": "x", "criteria": {}}}},
        ["body", "questions", "a", "choice", "criteria"],
        "too_short",
    ),
    (
        {"state": "x", "questions": {"a": {"type": "choice", "instructions": "x"}}},
        ["body", "questions", "a", "choice", "criteria"],
        "missing",
    ),
    (
        {
            "state": "x",
            "questions": {"a": {"type": "score", "instructions": "x", "criteria": {"0": "a", "1": "b"}}},
        },
        ["body", "questions", "a", "score", "criteria"],
        "list_type",
    ),
    ({"state": "x", "questions": {"a": {"type": "noul"}}}, ["body", "questions", "a", "noul"], "value_error"),
    # laya's own refusals of a body keep their text, as one entry at the body
    ({"state": "x", "questions": Q, "max_len": "fast"}, ["body"], "value_error"),
    ({"state": "\ud800", "questions": Q}, ["body"], "value_error"),
    ({"state": "x", "questions": Q, "hooks": 1}, ["body"], "value_error"),
]


@pytest.mark.parametrize("body,loc,kind", INVALID)
@aio
async def test_invalid_requests_are_a_422_list_and_never_reach_the_model(body, loc, kind):
    async with served(**JEV) as c:
        r, out = await post(c, URL, body)
        assert r.status == 422 and "Server-Timing" not in r.headers
        assert isinstance(out["detail"], list) and out["detail"]
        assert all(set(e) == {"loc", "msg", "type"} and e["loc"][0] == "body" for e in out["detail"])
        assert (out["detail"][0]["loc"], out["detail"][0]["type"]) == (loc, kind)
        assert c.agent.calls == []


@aio
async def test_every_fault_the_jev_document_states_is_an_entry_at_its_place():
    """One schema checks and documents a Jev body: a question the document refuses (blank
    instructions, an option_order index below 0, a blank id) is one list entry per fault, at the
    field, never one text at the body; and the laya-serve profile still answers it in laya's
    words, from the question checks."""
    from laya_onnx.serve.openapi import openapi_document
    from tests.serve.test_serve_openapi import validator

    q = {"type": "choice", "instructions": " ", "criteria": ["a", "b"], "option_order": [-1, 0]}
    body = {"state": "x", "questions": {"q": q, " ": Q["refund"]}}
    assert not validator(openapi_document(jev_profile=True), "JevSystemOneRequest").is_valid(body)
    async with served(**JEV) as c:
        r, out = await post(c, URL, body)
        assert r.status == 422 and c.agent.calls == []
    assert [(e["loc"], e["type"]) for e in out["detail"]] == [
        (["body", "questions", "q", "choice", "instructions"], "string_pattern_mismatch"),
        (["body", "questions", "q", "choice", "option_order", 0], "greater_than_equal"),
        (["body", "questions", " ", "[key]"], "string_pattern_mismatch"),
    ]
    async with served(FakeAgent(error=InvalidRequest("question 'q': 'instructions' must not be empty"))) as c:
        r, out = await post(c, URL, body)
    assert (r.status, out) == (422, {"detail": "question 'q': 'instructions' must not be empty"})


@pytest.mark.parametrize("raw", [b"not json", b"", b"\xff\xfe\xfa", b'{"state": ', b"[" * 100000])
@aio
async def test_malformed_json_is_a_422_list(raw):
    async with served(**JEV) as c:
        for path in (URL, BATCH):
            r, out = await post(c, path, raw)
            assert (r.status, out) == (
                422,
                {
                    "detail": [
                        {"loc": ["body"], "msg": "request body must be valid JSON", "type": "json_invalid"}
                    ]
                },
            )


@aio
async def test_model_refusals_at_inference_are_a_422_list():
    agent = FakeAgent(error=InvalidRequest("question 'q': only 3 of its 9 option markers fit"))
    async with served(agent, **JEV) as c:
        r, out = await post(c, URL, BODY)
    assert (r.status, out) == (
        422,
        {
            "detail": [
                {
                    "loc": ["body"],
                    "msg": "question 'q': only 3 of its 9 option markers fit",
                    "type": "value_error",
                }
            ]
        },
    )


@aio
async def test_batch_validation_is_the_same_list():
    async with served(**JEV) as c:
        r, out = await post(c, BATCH, {"states": [], "questions": Q})
        assert r.status == 422 and out["detail"][0]["loc"] == ["body", "states"]
        r, out = await post(c, BATCH, {"states": ["a", None], "questions": Q})
        assert (r.status, out["detail"]) == (
            422,
            [{"loc": ["body", "states", 1], "msg": "'state' is required", "type": "value_error"}],
        )
        r, out = await post(c, BATCH, {"states": ["a"], "questions": {"a": {"type": "noul"}}})
        assert r.status == 422 and out["detail"][0]["loc"] == ["body", "questions", "a", "noul"]


# -- what the Jev profile accepts that laya does not ---------------------------------------


@aio
async def test_questions_without_instructions_get_a_neutral_one():
    questions = {
        "n": {"type": "noul", "criteria": {"true": "the customer asks for money back"}},
        "m": {"type": "noul", "instructions": None, "criteria": {"false": "no refund", "true": None}},
        "c": {"type": "choice", "criteria": {"a": None, "b": "bee"}},
        "s": {"type": "score", "criteria": ["low", "high"]},
    }
    async with served(**JEV) as c:
        r, out = await post(c, URL, {"state": "x", "questions": questions})
        assert r.status == 200 and list(out["answers"]) == ["n", "m", "c", "s"]
        sent = c.agent.calls[0][2]
    assert {qid: q["instructions"] for qid, q in sent.items()} == {
        "n": validate.DEFAULT_INSTRUCTIONS["noul"],
        "m": validate.DEFAULT_INSTRUCTIONS["noul"],
        "c": validate.DEFAULT_INSTRUCTIONS["choice"],
        "s": validate.DEFAULT_INSTRUCTIONS["score"],
    }
    assert sent["n"]["criteria"] == questions["n"]["criteria"]  # everything else as sent


@aio
async def test_jev_clients_may_send_model_and_authorization_without_auth_configured():
    async with served(**JEV) as c:
        r, _ = await post(
            c, URL, {**BODY, "model": "jev-latest"}, headers={"Authorization": "Bearer anything"}
        )
    assert r.status == 200


# -- other errors: {"detail": {"error_type", "message"}} -----------------------------------


@aio
async def test_non_validation_errors_name_their_type():
    async with served(api_key="s3cret", **JEV) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r, out = await post(c, URL, BODY, headers=headers)
            assert (r.status, out) == (
                401,
                {
                    "detail": {
                        "error_type": "authentication_error",
                        "message": "invalid or missing bearer token",
                    }
                },
            )
        ok = {"Authorization": "Bearer s3cret"}
        r = await c.get("/v1/nothing-here")
        assert (r.status, await r.json()) == (
            404,
            {"detail": {"error_type": "not_found", "message": "Not Found"}},
        )
        r, out = await post(
            c, URL, {"state": "x", "questions": {"q%d" % i: Q["refund"] for i in range(65)}}, headers=ok
        )
        assert (r.status, out["detail"]) == (
            413,
            {"error_type": "api_usage_error", "message": "too many questions (65 > 64)"},
        )
        r, out = await post(c, URL, b"x" * (2 * 1024 * 1024 + 1), headers=ok)
        assert (r.status, out["detail"]["error_type"]) == (413, "api_usage_error")


@aio
async def test_inference_failure_is_an_internal_error_without_details():
    async with served(FakeAgent(error=RuntimeError("CUDA OOM at /secret/path")), **JEV) as c:
        r, out = await post(c, URL, BODY)
    assert (r.status, out) == (
        500,
        {"detail": {"error_type": "internal_error", "message": "inference failed"}},
    )


@aio
async def test_busy_is_503_with_retry_after():
    agent = FakeAgent(block=True)
    async with served(agent, max_concurrent=1, **JEV) as c:
        first = asyncio.ensure_future(post(c, URL, BODY))
        assert await asyncio.to_thread(agent.entered.wait, 5)
        r, out = await post(c, URL, BODY)
        assert (r.status, out["detail"]["error_type"], r.headers["Retry-After"]) == (
            503,
            "overloaded_error",
            "1",
        )
        agent.release.set()
        assert (await first)[0].status == 200


# -- the profile setting -------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw,expect", [(None, None), ("", None), (" TypeSafe ", "typesafe"), ("typesafe", "typesafe")]
)
def test_jev_profile_env(monkeypatch, raw, expect):
    if raw is not None:
        monkeypatch.setenv("LAYA_JEV_PROFILE", raw)
    assert serve_settings.Settings.from_env().jev_profile == expect


def test_unknown_jev_profile_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("LAYA_JEV_PROFILE", "openai")
    with pytest.raises(ConfigError, match="invalid LAYA_JEV_PROFILE 'openai': use 'typesafe'"):
        create_app(FakeAgent())
    with pytest.raises(ValueError, match="invalid LAYA_JEV_PROFILE 'jev'"):
        create_app(FakeAgent(), jev_profile="jev")


# -- 2 to 255 options ----------------------------------------------------------------------


@pytest.mark.parametrize("profile", [{}, JEV])
@pytest.mark.parametrize("n", [2, 100, 101, 128, 255])
@aio
async def test_two_to_255_options_are_answered(profile, n):
    async with served(**profile) as c:
        r, out = await post(c, URL, {"state": "x", "questions": {"c": choice(n)}})
        calls = len(c.agent.calls)
    assert r.status == 200
    answer = out["answers"]["c"]
    assert list(answer["probabilities"]) == ["opt %d" % i for i in range(n)]
    total = sum(answer["probabilities"].values())
    assert abs(total - 1) <= n * 5e-5  # the fake rounds each of its n probabilities to 4 places
    assert answer["choice"] == max(answer["probabilities"], key=answer["probabilities"].get)
    # one pass up to laya-serve's cap of 100, elimination past it (the fake has no head budget: 16)
    assert (calls == 1) == (n <= 100)
    assert ("x_tournament" in answer) == (n > 100)
    if profile:
        top = max(answer["probabilities"].values()) / total
        assert answer["confidence"] == round((n * top - 1) / (n - 1), 4)


@aio
async def test_over_255_options_is_still_a_413():
    async with served() as c:
        r, out = await post(c, URL, {"state": "x", "questions": {"c": choice(256)}})
        assert (r.status, out) == (413, {"detail": "too many choice options for 'c' (256 > 255)"})
        r, out = await post(c, BATCH, {"states": ["x"], "questions": {"c": choice(256)}})
        assert r.status == 413
        assert c.agent.calls == []


@aio
async def test_a_narrowed_choice_needs_string_labels():
    async with served() as c:
        body = {
            "state": "x",
            "questions": {"c": {"type": "choice", "instructions": "x", "criteria": list(range(120))}},
        }
        r, out = await post(c, URL, body)
    assert r.status == 422 and "needs every label to be a string" in out["detail"]


@aio
async def test_batch_narrows_per_state_and_sums_usage():
    async with served() as c:
        r, out = await post(
            c, BATCH, {"states": ["a", "b"], "questions": {"c": choice(120), "n": Q["refund"]}}
        )
        calls = c.agent.calls
    assert r.status == 200 and len(out["results"]) == 2
    assert all(call[0] == "predict" for call in calls)  # rounds are per state, not one batch
    assert {call[1] for call in calls} == {"a", "b"}
    assert out["total_usage"]["input_tokens"] == sum(res["usage"]["input_tokens"] for res in out["results"])


@pytest.mark.parametrize(
    "raw,expect",
    [
        (None, 0),
        ("", 0),
        ("abc", 0),
        ("1", 0),
        ("2", 2),
        ("16", 16),
        (" 16 ", 16),
        ("100", 100),
        ("101", 0),
        ("3.5", 0),
    ],
)
def test_tournament_group_env_reads_as_laya_serve(monkeypatch, raw, expect):
    if raw is not None:
        monkeypatch.setenv("LAYA_TOURNAMENT_GROUP", raw)
    assert serve_settings.Settings.from_env().tournament_group == expect


@pytest.mark.parametrize("bad", [1, 101, True, "16"])
def test_tournament_group_argument_is_checked(bad):
    with pytest.raises(ValueError, match="tournament_group must be 0"):
        create_app(FakeAgent(), tournament_group=bad)


@aio
async def test_configured_group_narrows_every_choice_over_it():
    async with served(tournament_group=8) as c:
        r, out = await post(c, URL, {"state": "x", "questions": {"c": choice(20), "d": choice(8)}})
    assert r.status == 200
    assert out["answers"]["c"]["x_tournament"]["rounds"] == 1
    assert "x_tournament" not in out["answers"]["d"]


# -- compressed bodies (typesafe-sdk sends zstd past 1 KiB when it can) --------------------


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
@aio
async def test_compressed_bodies_are_read_and_broken_ones_refused(encoding):
    import gzip
    import json

    if encoding == "zstd":
        zstd = pytest.importorskip("backports.zstd")  # serve extra below Python 3.14
        compress = zstd.compress
    else:
        compress = gzip.compress
    raw = json.dumps(BODY).encode()
    undecodable = "request body could not be decoded (transfer or content encoding)"
    for profile, refusal in (
        ({}, {"detail": undecodable}),
        (JEV, {"detail": {"error_type": "api_usage_error", "message": undecodable}}),
    ):
        async with served(**profile) as c:
            r, out = await post(c, URL, compress(raw), headers={"Content-Encoding": encoding})
            assert r.status == 200 and out["answers"]["queue"]["choice"] == "billing"
        async with served(**profile) as c:  # the server closes a connection after a broken payload
            r, out = await post(
                c, URL, b"(\xb5/\xfd not really compressed", headers={"Content-Encoding": encoding}
            )
            assert (r.status, out) == (400, refusal)
