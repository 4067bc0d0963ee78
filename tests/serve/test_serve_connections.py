"""Connection-level limits and the parser's refusals, over raw loopback sockets.

The server runs in-process exactly as `laya-onnx serve` runs it (`RunningServer`: aiohttp behind
`LayaRequestHandler`), with short timeouts. Every response checked here is one no middleware
sees: a slow head (408), an idle connection (closed), bytes aiohttp's parser refuses (JSON 400 /
431 without the bytes echoed), and a Content-Length shorter than the body.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re

import pytest

pytest.importorskip("aiohttp")

from laya_onnx.core import settings as core_settings
from laya_onnx.core.errors import ConfigError
from laya_onnx.serve import settings as serve_settings
from laya_onnx.serve.connection import framed_pieces
from laya_onnx.serve.logs import JsonAccessLogger, RequestIdFormatter, TextAccessLogger
from laya_onnx.serve.settings import ServerLimits
from tests.serve_support import (
    BODY,
    FAST_LIMITS,
    URL,
    FakeAgent,
    aio,
    exchange,
    listening,
    parse_responses,
    post,
    read_one,
    request,
    served,
)

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]

#: Put in requests to prove the refusal does not quote the request back.
MARKER = "zq-echo-marker-7"


def _json_refusal(resp, status):
    assert resp.status == status, resp
    assert resp.headers["content-type"].startswith("application/json")
    assert MARKER not in resp.body.decode("latin-1")
    assert resp.headers["x-request-id"]
    return resp.json()["detail"]


# -- timeouts ------------------------------------------------------------------------------


@aio
async def test_a_slow_head_gets_408_after_the_header_timeout_even_while_it_trickles():
    async with listening(FakeAgent()) as srv:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        began = loop.time()

        async def trickle():  # a byte every 0.1 s: never idle, never done
            for _ in range(30):
                await asyncio.sleep(0.1)
                writer.write(b"X")

        dripping = asyncio.ensure_future(trickle())
        try:
            raw = await asyncio.wait_for(reader.read(), 5)  # to EOF: the server closed
        finally:
            dripping.cancel()
            writer.close()
        elapsed = loop.time() - began
    (resp,) = parse_responses(raw)
    assert _json_refusal(resp, 408) == "request headers were not received in time"
    assert resp.headers["connection"] == "close"
    assert FAST_LIMITS.header_read_timeout <= elapsed < FAST_LIMITS.header_read_timeout + 1.5


@aio
async def test_a_connection_that_sends_nothing_is_closed_silently_after_the_idle_timeout():
    async with listening(FakeAgent()) as srv:
        raw, elapsed = await exchange(srv.port, b"")
    assert raw == b""
    assert FAST_LIMITS.keepalive_timeout <= elapsed < FAST_LIMITS.keepalive_timeout + 1.5


@aio
async def test_keep_alive_connection_is_closed_after_the_idle_timeout_and_kept_while_used():
    async with listening(FakeAgent()) as srv:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            for _ in range(3):  # each request restarts the idle clock: 3 x 0.4 s > 0.6 s
                writer.write(request("GET", "/health"))
                assert (await read_one(reader)).status == 200
                await asyncio.sleep(0.4)
            writer.write(request("GET", "/health"))
            assert (await read_one(reader)).status == 200
            began = loop.time()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing written
            elapsed = loop.time() - began
        finally:
            writer.close()
    assert FAST_LIMITS.keepalive_timeout - 0.05 <= elapsed < FAST_LIMITS.keepalive_timeout + 1.5


@aio
async def test_a_slow_body_is_the_body_timeouts_business_not_the_header_timeout():
    # headers complete at once, then the body dribbles for longer than the header timeout
    async with listening(FakeAgent(), body_read_timeout=5) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        body = json.dumps(BODY).encode()
        writer.write(request("POST", URL, body)[: -len(body)])
        try:
            for i in range(0, len(body), 40):
                await asyncio.sleep(0.1)
                writer.write(body[i : i + 40])
            resp = await read_one(reader)
        finally:
            writer.close()
    assert resp.status == 200 and resp.json()["answers"]


# -- parser refusals -----------------------------------------------------------------------


PARSER_CASES = {
    "bad request line": (b"GET /%s HTTP/1.1 trailing\r\nHost: x\r\n\r\n" % MARKER.encode(), 400),
    "bad method": (b"G<%s> / HTTP/1.1\r\nHost: x\r\n\r\n" % MARKER.encode(), 400),
    "bad header": (b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header<%s>: 1\r\n\r\n" % MARKER.encode(), 400),
    "header too long": (
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + MARKER.encode() * 1000 + b"\r\n\r\n",
        431,
    ),
    "too many headers": (
        b"GET /health HTTP/1.1\r\n"
        + b"".join(b"X-%d: %s\r\n" % (i, MARKER.encode()) for i in range(300))
        + b"\r\n",
        431,
    ),
    "TLS on the plain port": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40), 400),
    "bad chunk size": (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%s\r\n"
        % MARKER.encode(),
        400,
    ),
}


def _aiohttp_counts_headers():
    import aiohttp

    numbers = tuple(int(part) for part in re.findall(r"\d+", aiohttp.__version__)[:3])
    return numbers >= (3, 13, 5)


@pytest.mark.parametrize("name", sorted(PARSER_CASES))
@aio
async def test_parser_refusals_are_json_without_echo_and_close_the_connection(name):
    if name == "too many headers" and not _aiohttp_counts_headers():
        pytest.skip("aiohttp < 3.13.5 sets no limit on the number of headers")
    data, status = PARSER_CASES[name]
    async with listening(FakeAgent()) as srv:
        raw, _ = await exchange(srv.port, data)  # read to EOF: the connection was closed
    (resp,) = parse_responses(raw)
    detail = _json_refusal(resp, status)
    assert detail and "\\x" not in detail and "b'" not in detail
    assert srv.agent.calls == []


@pytest.mark.parametrize("name", ["bad request line", "header too long"])
@aio
async def test_parser_refusals_take_the_jev_error_shape_in_the_jev_profile(name):
    data, status = PARSER_CASES[name]
    async with listening(FakeAgent(), jev_profile="typesafe") as srv:
        raw, _ = await exchange(srv.port, data)
    (resp,) = parse_responses(raw)
    detail = _json_refusal(resp, status)
    assert set(detail) == {"error_type", "message"}
    assert detail["error_type"] == "api_usage_error" and MARKER not in detail["message"]


@aio
async def test_the_header_timeout_408_takes_the_jev_error_shape_in_the_jev_profile():
    async with listening(FakeAgent(), jev_profile="typesafe") as srv:
        raw, _ = await exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\n")
    (resp,) = parse_responses(raw)
    assert _json_refusal(resp, 408) == {
        "error_type": "api_usage_error",
        "message": "request headers were not received in time",
    }


@aio
async def test_a_too_short_content_length_answers_the_framed_request_then_refuses_the_rest():
    # One write: a request whose Content-Length stops inside the JSON, then the JSON's tail.
    # aiohttp alone drops the framed request and answers only the tail's parse error.
    body = json.dumps({"state": MARKER, "questions": {}}).encode()
    head = b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"
    async with listening(FakeAgent()) as srv:
        raw, _ = await exchange(srv.port, head + body)
    first, second = parse_responses(raw)
    assert (first.status, first.json()) == (400, {"detail": "request body must be valid JSON"})
    assert _json_refusal(second, 400).startswith("malformed request")


@aio
async def test_a_valid_framed_request_is_answered_before_the_garbage_after_it():
    body = json.dumps({"state": "x", "questions": {}}).encode()
    data = request("POST", URL, body) + b'"garbage": %s}\r\n' % MARKER.encode()
    async with listening(FakeAgent()) as srv:
        raw, _ = await exchange(srv.port, data)
    first, second = parse_responses(raw)
    assert first.status == 200 and first.json()["answers"] == {}
    _json_refusal(second, 400)
    assert len(srv.agent.calls) == 1


@aio
async def test_pipelined_requests_in_one_write_are_all_answered_in_order():
    body = json.dumps(BODY).encode()
    data = request("GET", "/health") + request("POST", URL, body) + request("GET", "/nope")
    data += request("GET", "/health", headers={"Connection": "close"})
    async with listening(FakeAgent()) as srv:
        raw, _ = await exchange(srv.port, data)
    assert [r.status for r in parse_responses(raw)] == [200, 200, 404, 200]


@aio
async def test_an_undecodable_body_is_400_not_500():
    data = request("POST", URL, b"not gzip at all", headers={"Content-Encoding": "gzip"})
    async with listening(FakeAgent()) as srv:
        raw, _ = await exchange(srv.port, data)
    (resp,) = parse_responses(raw)
    assert (resp.status, resp.json()) == (
        400,
        {"detail": "request body could not be decoded (transfer or content encoding)"},
    )


def test_framed_pieces_cut_only_whole_content_length_requests():
    one = b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
    assert list(framed_pieces(one + b"GET / HTTP/1.1\r\n\r\nxy")) == [one, b"GET / HTTP/1.1\r\n\r\n", b"xy"]
    assert list(framed_pieces(one)) == [one]  # nothing after it: fed whole
    partial = b"POST / HTTP/1.1\r\nContent-Length: 30\r\n\r\nabc"
    assert list(framed_pieces(partial)) == [partial]
    chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET"
    assert list(framed_pieces(chunked)) == [chunked]  # the parser frames chunked bodies
    twice = b"POST / HTTP/1.1\r\nContent-Length: 1\r\ncontent-length: 2\r\n\r\nabc"
    assert list(framed_pieces(twice)) == [twice]  # ambiguous: the parser refuses it whole


# -- request ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "supplied,kept",
    [
        ("abc-123", True),
        ("Root=1-67891233-abcdef012345678912345678", True),
        ("0f8fad5b-d9cb-469f-a165-70867728950e", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("has space", False),
        ("<script>", False),
        ("a;b", False),
        ("", False),
    ],
)
@aio
async def test_request_id_is_echoed_when_acceptable_else_replaced(supplied, kept):
    async with served() as c:
        for path in ("/health", "/nope"):
            r = await c.get(path, headers={"X-Request-Id": supplied})
            rid = r.headers["X-Request-Id"]
            assert (rid == supplied) is kept
            assert 1 <= len(rid) <= 128 and " " not in rid


@aio
async def test_every_response_carries_a_request_id():
    async with served(api_key="k") as c:
        seen = set()
        for method, path, body in (
            ("GET", "/health", None),
            ("GET", "/missing", None),
            ("PUT", "/health", None),
            ("POST", URL, BODY),  # 401
            ("POST", URL + "/", BODY),  # 307
        ):
            r = await c.request(method, path, json=body, allow_redirects=False)
            seen.add(r.headers["X-Request-Id"])
        assert len(seen) == 5  # one fresh id per request
    async with listening(FakeAgent()) as srv:
        raw, _ = await exchange(srv.port, b"BAD\r\n\r\n")
        assert parse_responses(raw)[0].headers["x-request-id"]


@aio
async def test_log_lines_about_a_request_carry_its_id():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RequestIdFormatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("laya_onnx")
    logger.addHandler(handler)
    try:
        async with served(FakeAgent(error=RuntimeError("boom"))) as c:
            r, _ = await post(c, URL, BODY, headers={"X-Request-Id": "trace-42"})
            assert r.status == 500
            r, _ = await post(c, URL, BODY)
            generated = r.headers["X-Request-Id"]
    finally:
        logger.removeHandler(handler)
    lines = [line for line in stream.getvalue().splitlines() if line.startswith("ERROR inference failed")]
    assert len(lines) == 2
    assert lines[0].endswith("request_id=trace-42") and lines[1].endswith("request_id=" + generated)


# -- access log ----------------------------------------------------------------------------


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


async def _access_lines(mode, data):
    logger = logging.getLogger("test.access." + mode)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    collect = _Collect()
    logger.handlers = [collect]
    limits = ServerLimits(keepalive_timeout=0.6, header_read_timeout=0.5, access_log=mode)
    async with listening(FakeAgent(), limits, access_log=logger) as srv:
        raw, _ = await exchange(srv.port, data)
        for _ in range(50):  # the protocol logs right after the response went out
            if collect.lines:
                break
            await asyncio.sleep(0.02)
    return collect.lines, parse_responses(raw)


@aio
async def test_json_access_log_has_one_object_per_response():
    body = json.dumps(BODY).encode()
    data = request("POST", URL + "?secret=1", body, {"X-Request-Id": "rid-1", "Connection": "close"})
    lines, (resp,) = await _access_lines("json", data)
    (line,) = lines
    entry = json.loads(line)
    assert entry["type"] == "access" and entry["ts"].endswith("+00:00")
    assert entry["method"] == "POST" and entry["path"] == URL  # never the query string
    assert entry["status"] == 200 == resp.status
    assert entry["request_id"] == "rid-1" and entry["remote"] == "127.0.0.1"
    assert entry["bytes_sent"] > len(resp.body) and entry["duration_ms"] >= 0


@aio
async def test_text_access_log_line():
    lines, _ = await _access_lines("text", request("GET", "/nope", headers={"Connection": "close"}))
    (line,) = lines
    assert line.startswith('127.0.0.1 "GET /nope" 404 ') and "ms request_id=" in line


def test_access_logger_classes_and_env(monkeypatch):
    from laya_onnx.serve.logs import ACCESS_LOGGERS

    assert ACCESS_LOGGERS == {"text": TextAccessLogger, "json": JsonAccessLogger}
    for raw, want in ((None, "text"), (" JSON ", "json"), ("off", "off"), ("", "text")):
        if raw is None:
            monkeypatch.delenv("LAYA_ACCESS_LOG", raising=False)
        else:
            monkeypatch.setenv("LAYA_ACCESS_LOG", raw)
        assert core_settings.ACCESS_LOG.read() == want
    monkeypatch.setenv("LAYA_ACCESS_LOG", "verbose")
    with pytest.raises(ConfigError, match="invalid LAYA_ACCESS_LOG 'verbose'"):
        core_settings.ACCESS_LOG.read()


# -- limits from the environment -----------------------------------------------------------


def test_server_limits_from_env(monkeypatch):
    assert ServerLimits.from_env() == ServerLimits(30.0, 75.0, 10.0, "text")
    monkeypatch.setenv("LAYA_SHUTDOWN_GRACE_SECONDS", "0")
    monkeypatch.setenv("LAYA_KEEPALIVE_TIMEOUT", " 5 ")
    monkeypatch.setenv("LAYA_HEADER_READ_TIMEOUT", "2.5")
    assert ServerLimits.from_env() == ServerLimits(0.0, 5.0, 2.5, "text")
    for name, bad in (
        ("LAYA_SHUTDOWN_GRACE_SECONDS", "-1"),
        ("LAYA_SHUTDOWN_GRACE_SECONDS", "inf"),
        ("LAYA_KEEPALIVE_TIMEOUT", "0"),
        ("LAYA_HEADER_READ_TIMEOUT", "soon"),
        ("LAYA_HEADER_READ_TIMEOUT", "nan"),
    ):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ConfigError, match="invalid %s %r" % (name, bad)):
            ServerLimits.from_env()
        monkeypatch.delenv(name)


# -- LAYA_ROOT_PATH ------------------------------------------------------------------------


@aio
async def test_root_path_serves_every_route_with_and_without_the_prefix():
    async with served(root_path="/laya", api_key="k") as c:
        auth = {"Authorization": "Bearer k"}
        for path in ("/health", "/laya/health", "/laya/health?x=1"):
            r = await c.get(path, headers=auth)
            assert r.status == 200 and (await r.json())["loaded"] == ["english"], path
        for path in (URL, "/laya" + URL):
            r, body = await post(c, path, BODY, headers=auth)
            assert r.status == 200 and body["answers"], path
            r, body = await post(c, path, BODY)  # auth still applies under the prefix
            assert (r.status, body) == (401, {"detail": "invalid or missing bearer token"})
        r = await c.post("/laya" + URL + "/", json=BODY, allow_redirects=False)
        assert (r.status, r.headers["Location"]) == (307, "/laya" + URL)
        for path in ("/", "/laya"):  # the index, its paths under the prefix
            r = await c.get(path)
            assert r.status == 200 and "GET /laya/health" in (await r.json())["routes"], path
        r = await c.get("/laya/", allow_redirects=False)
        assert (r.status, r.headers["Location"]) == (307, "/laya")
        for path in ("/layax/health", "/laya/laya/health", "/other/health"):
            r = await c.get(path)
            assert (r.status, await r.json()) == (404, {"detail": "Not Found"}), path
        r = await c.post("/laya/health")
        assert r.status == 405 and r.headers["Allow"] == "GET"


@aio
async def test_without_root_path_the_prefix_is_just_a_missing_route():
    async with served() as c:
        assert (await c.get("/laya/health")).status == 404


@pytest.mark.parametrize(
    "raw,want", [(None, ""), ("", ""), ("/", ""), ("/laya", "/laya"), (" /laya/ ", "/laya"), ("/a/b", "/a/b")]
)
def test_root_path_env(monkeypatch, raw, want):
    if raw is not None:
        monkeypatch.setenv("LAYA_ROOT_PATH", raw)
    assert serve_settings.Settings.from_env().root_path == want


@pytest.mark.parametrize("raw", ["laya", "/la ya", "/laya?x=1", "/laya#top", "http://host/laya", "/a//b"])
def test_bad_root_path_is_a_config_error(monkeypatch, raw):
    monkeypatch.setenv("LAYA_ROOT_PATH", raw)
    with pytest.raises(ConfigError, match="invalid LAYA_ROOT_PATH"):
        serve_settings.Settings.from_env()


@aio
async def test_root_path_answers_expect_100_continue_once():
    body = json.dumps(BODY).encode()
    head = request("POST", "/laya" + URL, body, {"Expect": "100-continue", "Connection": "close"})
    head = head[: -len(body)]
    async with listening(FakeAgent(), root_path="/laya") as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            writer.write(head)
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.write(body)
            rest = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert b"100 Continue" not in rest
    (resp,) = parse_responses(rest)
    assert resp.status == 200 and resp.json()["answers"]


# -- the aiohttp versions the connection handler is written against ----------------------


#: What `LayaRequestHandler` overrides, with the parameters it relies on.
OVERRIDDEN = {
    "connection_made": ["self", "transport"],
    "data_received": ["self", "data"],
    "connection_lost": ["self", "exc"],
    "finish_response": ["self", "request", "resp", "start_time"],
    "handle_error": ["self", "request", "status", "exc", "message"],
    "log_exception": ["self", "args", "kw"],
}


def test_the_installed_aiohttp_is_one_pyproject_allows_and_has_what_connection_overrides():
    import inspect
    from pathlib import Path

    import aiohttp
    from aiohttp import web
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    (pinned,) = [
        Requirement(r)
        for r in pyproject["project"]["optional-dependencies"]["serve"]
        if r.startswith("aiohttp")
    ]
    assert pinned.specifier.contains(aiohttp.__version__), (aiohttp.__version__, str(pinned))
    for name, params in OVERRIDDEN.items():
        assert list(inspect.signature(getattr(web.RequestHandler, name)).parameters) == params, name
    # handler_factory wraps the server's request factory to learn when a request began
    assert "request_factory" in inspect.signature(web.Server.__init__).parameters
