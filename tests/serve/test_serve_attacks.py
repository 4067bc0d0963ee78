"""Attacks on the serving pipeline and its aiohttp connections, each reproduced and bounded.

  * log injection: control characters in a path never reach a text access line as themselves;
  * an API key no client can send (surrounding whitespace, a control character) stops the start;
  * a batch refusal about one state names its index (`X-Batch-Item`; Jev: the error's `loc`),
    the detail staying laya-serve's;
  * a refusal before the body (401, 413) closes the connection instead of reading a huge body;
  * HEAD answers on the GET routes; `/health/live` and `/health/ready` apart from `/health`;
  * a connection flood: past LAYA_MAX_CONNECTIONS a request gets 503 and its connection closes,
    while the health routes still answer; failed accepts log one line a while;
  * answers: a client that stops reading is cut after LAYA_SEND_TIMEOUT, every answer (whole or
    cut) has its access line saying how it ended, and a half-closed client still gets its
    answer (a drain that waits for an answer still being written: tests/serve/test_serve_drain.py).

Each fails on the server as it was before (no cap, no send timeout, no escaping, ...).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import time

import pytest

from laya_onnx.core.errors import ConfigError
from laya_onnx.serve import create_app
from laya_onnx.serve.app import DRAIN
from laya_onnx.serve.connection import on_loop_error
from laya_onnx.serve.settings import ServerLimits
from tests.serve_support import (
    BATCH,
    BODY,
    URL,
    FakeAgent,
    Q,
    aio,
    collecting_logger,
    exchange,
    listening,
    parse_responses,
    post,
    request,
    served,
)

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]

TEXT_LOG = ServerLimits(keepalive_timeout=5, header_read_timeout=2, access_log="text")


@aio
async def test_control_characters_in_a_path_are_escaped_in_the_text_access_log():
    logger, lines = collecting_logger("test.access.inject")
    async with listening(FakeAgent(), TEXT_LOG, access_log=logger) as srv:
        raw, _ = await exchange(
            srv.port,
            b"GET /x%0Aforged%201.2.3.4%20200%1B%5B2J%22 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        )
        await asyncio.sleep(0.1)
    assert parse_responses(raw)[0].status == 404
    (line,) = [line for line in lines if "forged" in line]
    assert "\n" not in line and "\x1b" not in line and line.count('"') == 2, line
    assert "/x\\x0aforged 1.2.3.4 200\\x1b[2J\\x22" in line and line.endswith("ended=whole")


@pytest.mark.parametrize("key", ["s3cret ", " s3cret", "s3cret\n", "s3\x01cret", "s3cret\t"])
def test_an_api_key_no_client_can_send_is_refused_at_startup(key):
    with pytest.raises(ConfigError, match="LAYA_API_KEY holds") as refused:
        create_app(FakeAgent(), api_key=key)
    assert "s3cret" not in str(refused.value)  # the key itself is never echoed
    create_app(FakeAgent(), api_key="s3 cret")  # an inner space is sendable


def test_laya_onnx_serve_exits_2_on_such_a_key(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "LAYA_API_KEY": "s3cret\n"}
    proc = subprocess.run(
        [sys.executable, "-m", "laya_onnx", "serve", str(tmp_path / "no-bundle")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        "LAYA_API_KEY holds a control character at index 6" in proc.stderr and "Traceback" not in proc.stderr
    )


@aio
async def test_a_batch_refusal_about_one_state_names_its_index():
    async with served() as c:
        states = ["fine"] * 50
        states[25] = None
        r, out = await post(c, BATCH, {"states": states, "questions": Q})
        assert (r.status, out, r.headers["X-Batch-Item"]) == (400, {"detail": "'state' is required"}, "25")
        states[25], states[3] = "fine", "x" * 60000
        r, out = await post(c, BATCH, {"states": states, "questions": Q})
        assert (
            r.status == 413
            and out["detail"].startswith("state too large")
            and r.headers["X-Batch-Item"] == "3"
        )
        r, _ = await post(c, BATCH, {"states": ["a"], "questions": []})
        assert r.status == 400 and "X-Batch-Item" not in r.headers  # about the questions, no item
    async with served(jev_profile="typesafe") as c:
        r, out = await post(c, BATCH, {"states": ["a", None], "questions": Q})
        assert r.status == 422 and r.headers["X-Batch-Item"] == "1"
        assert any(e["loc"] == ["body", "states", 1] for e in out["detail"]), out


@aio
async def test_a_refusal_before_the_body_closes_the_connection_without_reading_it():
    async with listening(FakeAgent(), api_key="k") as srv:
        for head in (
            b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Length: 900000000\r\n\r\n",  # no bearer
            b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k\r\nContent-Length: 900000000\r\n\r\n",
        ):
            raw, seconds = await exchange(srv.port, head, read_timeout=3)
            (resp,) = parse_responses(raw)
            assert resp.status in (401, 413) and seconds < 2, (resp, seconds)


@aio
async def test_liveness_and_readiness_apart_from_health():
    agent = FakeAgent()
    async with listening(agent, api_key="k") as srv:
        for path, status, body in (
            ("/health/live", 200, {"status": "ok"}),
            ("/health/ready", 200, {"status": "ready"}),
            ("/health", 200, {"status": "ok"}),
        ):
            (resp,) = parse_responses(
                (await exchange(srv.port, request("GET", path, headers={"Connection": "close"})))[0]
            )
            assert (resp.status, resp.json()) == (status, body), path
        srv.server.app[DRAIN].begin(asyncio.get_running_loop().time() + 5)
        (resp,) = parse_responses((await exchange(srv.port, request("GET", "/health/ready")))[0])
        assert (resp.status, resp.json()) == (503, {"status": "draining"})
        (resp,) = parse_responses((await exchange(srv.port, request("GET", "/health/live")))[0])
        assert resp.status == 200


@aio
async def test_past_the_connection_cap_only_the_health_routes_answer():
    limits = ServerLimits(keepalive_timeout=5, header_read_timeout=5, max_connections=4)
    async with listening(FakeAgent(), limits) as srv:
        held = []
        for _ in range(4):  # four connections with a request begun: not idle, so none is closed
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            writer.write(b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\n")
            await writer.drain()
            held.append(writer)
        await asyncio.sleep(0.1)
        raw, _ = await exchange(srv.port, request("GET", "/health"))
        (resp,) = parse_responses(raw)
        assert resp.status == 200  # answered, then closed
        raw, _ = await exchange(srv.port, request("POST", URL, json.dumps(BODY).encode()))
        (resp,) = parse_responses(raw)
        assert (resp.status, resp.json()["detail"]) == (503, "too many open connections, try again later")
        assert resp.headers["connection"] == "close"
        for writer in held:
            writer.close()
        await asyncio.sleep(0.1)
        raw, _ = await exchange(
            srv.port, request("POST", URL, json.dumps(BODY).encode(), {"Connection": "close"})
        )
        assert parse_responses(raw)[0].status == 200


@aio
async def test_idle_connections_make_room_past_the_cap():
    limits = ServerLimits(keepalive_timeout=30, header_read_timeout=5, max_connections=3)
    async with listening(FakeAgent(), limits) as srv:
        idle = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(6)]
        await asyncio.sleep(0.1)
        raw, _ = await exchange(
            srv.port, request("POST", URL, json.dumps(BODY).encode(), {"Connection": "close"})
        )
        assert parse_responses(raw)[0].status == 200
        closed = 0
        for reader, writer in idle:
            try:
                closed += await asyncio.wait_for(reader.read(), 1) == b""
            except asyncio.TimeoutError:
                pass
            writer.close()
        assert closed >= 3


def test_failed_accepts_log_one_line_a_while(caplog):
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.WARNING, logger="laya_onnx.serve"):
            for _ in range(500):
                on_loop_error(
                    loop,
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(24, "Too many open files"),
                    },
                )
    finally:
        loop.close()
    lines = [r for r in caplog.records if "cannot accept connections" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None


def _big_agent(size: int) -> FakeAgent:
    return FakeAgent(result_hook=lambda result: {**result, "x_pad": "p" * size})


@aio
async def test_a_client_that_stops_reading_is_cut_at_the_send_timeout_and_logged():
    logger, lines = collecting_logger("test.access.slow-reader")
    async with listening(_big_agent(8_000_000), TEXT_LOG, access_log=logger, send_timeout=1.0) as srv:
        sock = socket.create_connection(("127.0.0.1", srv.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(request("POST", URL, json.dumps(BODY).encode(), {"X-Request-Id": "slow-1"}))
        began = time.monotonic()
        while not any("slow-1" in line for line in lines) and time.monotonic() - began < 10:
            await asyncio.sleep(0.1)
        sock.close()
        (resp,) = parse_responses(
            (await exchange(srv.port, request("GET", "/health", headers={"Connection": "close"})))[0]
        )
        assert resp.status == 200
    (line,) = [line for line in lines if "slow-1" in line]
    assert " 200 " in line and line.endswith("ended=send-timeout"), line
    assert time.monotonic() - began < 8


@aio
async def test_a_reset_mid_answer_leaves_an_access_line_saying_so():
    logger, lines = collecting_logger("test.access.reset")
    async with listening(_big_agent(8_000_000), TEXT_LOG, access_log=logger) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(request("POST", URL, json.dumps(BODY).encode(), {"X-Request-Id": "reset-1"}))
        await reader.readexactly(200_000)  # part of the answer, then a reset
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.close()
        began = time.monotonic()
        while not any("reset-1" in line for line in lines) and time.monotonic() - began < 5:
            await asyncio.sleep(0.05)
    (line,) = [line for line in lines if "reset-1" in line]
    assert " 200 " in line and line.endswith("ended=reset"), line


@aio
async def test_http_0_9_and_2_0_request_lines_get_a_505_in_http_1_1():
    async with listening(FakeAgent()) as srv:
        for line in (b"GET /health HTTP/2.0", b"GET /health HTTP/0.9", b"GET /health"):
            raw, _ = await exchange(srv.port, line + b"\r\nHost: t\r\n\r\n")
            assert raw.startswith(b"HTTP/1.1 505 "), raw[:60]
            assert parse_responses(raw)[0].json() == {"detail": "HTTP version not supported; send HTTP/1.1"}
        raw, _ = await exchange(srv.port, b"GET /health HTTP/1.0\r\nHost: t\r\n\r\n")
        assert raw.startswith(b"HTTP/1.0 200 ")


@aio
async def test_a_one_megabyte_url_gets_the_431_not_a_reset():
    async with listening(FakeAgent()) as srv:
        raw, _ = await exchange(srv.port, b"GET /" + b"a" * 1_000_000 + b" HTTP/1.1\r\nHost: t\r\n\r\n")
        (resp,) = parse_responses(raw)
        assert (resp.status, resp.json()) == (431, {"detail": "request line or header field too long"})
        raw, _ = await exchange(srv.port, request("GET", "/health", headers={"Connection": "close"}))
        assert parse_responses(raw)[0].status == 200


@aio
async def test_a_half_closed_client_still_gets_its_answer():
    agent = FakeAgent(block=True)
    async with listening(agent) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(request("POST", URL, json.dumps(BODY).encode()))
        await writer.drain()
        writer.write_eof()  # sent everything, closes its side
        await asyncio.sleep(0.5)  # past the server's look at the socket
        agent.release.set()
        data = await asyncio.wait_for(reader.read(), 5)  # the answer, then the server closes
        writer.close()
    final = data.split(b"\r\n\r\n", 1)[1] if data.startswith(b"HTTP/1.1 100 ") else data
    (resp,) = parse_responses(final)
    assert resp.status == 200 and resp.json()["answers"]


@aio
async def test_a_web_page_cannot_post_a_decision_as_plain_text():
    """A page on another origin may send a text/plain POST without a CORS preflight; laya-serve
    parses any Content-Type, so without a key it would answer. A browser names the page's Origin:
    such a request must be JSON (which a browser only sends after a preflight this server never
    grants). Clients that are not browsers keep laya-serve's behaviour."""
    async with served() as c:
        page = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
        r, out = await post(c, URL, BODY, headers=page)
        assert (r.status, out) == (
            415,
            {"detail": "a request from a web page must send its body as application/json"},
        )
        assert c.agent.calls == []
        r, _ = await post(c, URL, BODY, headers={"Content-Type": "text/plain"})  # not a browser
        assert r.status == 200
        r, _ = await post(c, URL, BODY, headers={**page, "Content-Type": "application/json; charset=utf-8"})
        assert r.status == 200
