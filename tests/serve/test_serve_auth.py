"""Bearer auth on the decision routes (docs/http-api.md#authentication): exact, constant-time, before the body."""

from __future__ import annotations

import json

import pytest

from tests.serve_support import BATCH, BODY, URL, Q, aio, post, raw_request, served

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]


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
            data = await raw_request(c, head, payload)
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
            data = await raw_request(c, head, payload)
            assert data.startswith(b"HTTP/1.1 " + status), data[:200]
