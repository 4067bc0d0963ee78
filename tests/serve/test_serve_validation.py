"""Request checks before inference: body reading, JSON, shape, size limits, refusals,
surrogates, the order checks run in, and the routing surface (docs/http-api.md#refusals-in-order)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.serve_support import BATCH, BODY, URL, Q, aio, post, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]


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
    # 101..255 options are answered by elimination (tests/serve/test_serve_jev.py); the cap is Jev's 255
    choice256 = {"c": {"type": "choice", "instructions": "x", "criteria": [str(i) for i in range(256)]}}
    score33 = {"s": {"type": "score", "instructions": "x", "criteria": [str(i) for i in range(33)]}}
    null_level = {"s": {"type": "score", "instructions": "x", "criteria": ["a", None, "c"]}}
    total = {
        "c%d" % i: {"type": "choice", "instructions": "x", "criteria": [str(j) for j in range(100)]}
        for i in range(6)
    }
    cases = [
        (many, 413, "too many questions (65 > 64)"),
        (choice256, 413, "too many choice options for 'c' (256 > 255)"),
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


@aio
async def test_not_found_method_not_allowed_and_slash_redirect():
    async with served() as c:
        for path in ("/ready", "/v1/chat/completions", "/redoc", "/v1/responses"):
            r = await c.get(path)
            assert (r.status, await r.json()) == (404, {"detail": "Not Found"})
        r = await c.get(URL)
        assert (r.status, await r.json()) == (405, {"detail": "Method Not Allowed"})
        assert r.headers["Allow"] == "POST"
        r = await c.post("/health")
        assert r.status == 405 and r.headers["Allow"] == "GET"
        for path in ("/health", "/v1/models", "/"):  # HEAD is GET without the body
            get, head = await c.get(path), await c.head(path)
            assert head.status == 200 and await head.read() == b""
            assert head.headers["Content-Length"] == get.headers["Content-Length"]
        r = await c.head(URL)
        assert r.status == 405 and r.headers["Allow"] == "POST"
        r = await c.post(URL + "/", data=json.dumps(BODY), allow_redirects=False)
        assert r.status == 307 and r.headers["Location"].endswith(URL)
