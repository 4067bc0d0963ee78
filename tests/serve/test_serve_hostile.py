"""Hostile clients: each way one client could take the server over, reproduced, bounded.

  * work: a request whose passes are estimated over LAYA_MAX_REQUEST_SECONDS is a 413 before
    any pass; a client that hangs up, or a request past LAYA_REQUEST_TIMEOUT, runs no further
    pass, frees its slot at once and leaves a `cancelled` access line;
  * decoding: a decompression bomb is inflated only up to the 2 MiB cap, off the event loop,
    and /health keeps answering;
  * bodies are read before admission: slow uploaders hold no inference slot, and what bodies
    being read may buffer is bounded;
  * memory: after a request that left the process holding far more than at idle, RSS comes
    back down (judged by RSS, not by a pass estimate);
  * the edges: JSON for every status (an unknown `Expect`, redirects), duplicate
    `Authorization`, unknown `Content-Encoding`, `x-gzip`, a `Transfer-Encoding` other than
    chunked, a client gone mid-upload, a drain behind a long first pass.

Each test fails on the server as it was before these defences (the module's history says how).
Timings use generous bounds: the old behaviour is off by seconds to hours, not milliseconds.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import logging
import os
import random
import string
import time
import zlib

import pytest

from laya_onnx import ONNXAgent
from laya_onnx.serve.settings import ServerLimits
from laya_onnx.serve.validate import MAX_BODY_BYTES
from laya_onnx.serve.worker import Drain, DrainRefusal, WorkerLock
from tests.serve_support import (
    BODY,
    URL,
    FakeAgent,
    aio,
    collecting_logger,
    exchange,
    listening,
    parse_responses,
    post,
    request,
    served,
    wait_healthy,
)

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]

SMALL = {"state": "I was charged twice", "questions": {"refund": {"type": "noul", "instructions": "Refund?"}}}
#: Six questions over a state longer than 2048 tokens: one tiny-english pass per row when a pass
#: may hold one 2048-token row only (`_long_agent`), about a second each on a 2-core machine.
LONG = {
    "state": " ".join("w%d" % i for i in range(3000)),
    "questions": {"q%d" % i: {"type": "noul", "instructions": "Is it %d?" % i} for i in range(6)},
    "max_len": 2048,
}
LONG_WIDTH = 2048


class CountingSession:
    """The agent's session, recording the (rows, width) of every pass it starts."""

    def __init__(self, session):
        self.session = session
        self.passes: list[tuple[int, int]] = []
        self.finished: list[tuple[int, int]] = []  # the passes that ran to their end

    def run(self, feeds, **kw):
        shape = tuple(feeds["input_ids"].shape)
        self.passes.append(shape)
        out = self.session.run(feeds, **kw)
        self.finished.append(shape)
        return out

    def __getattr__(self, name):
        return getattr(self.session, name)

    def long_passes(self) -> int:
        return sum(1 for _, width in self.passes if width >= LONG_WIDTH)


def _long_agent(bundle) -> ONNXAgent:
    """tiny-english whose pass budget fits one 2048-token row: LONG runs as six passes."""
    agent = ONNXAgent(bundle, providers=["CPUExecutionProvider"], max_pass_memory="100M")
    agent.session = CountingSession(agent.session)
    return agent


@pytest.fixture(scope="module")
def tiny(bundle_factory):
    return bundle_factory("tiny-english")


# -- work: the budget, the deadline, a client that hangs up --------------------------------


@aio
async def test_a_request_estimated_over_the_budget_is_a_413_before_any_pass(tiny):
    agent = _long_agent(tiny)
    # LONG is ~44 GFLOP: over 50 ms below ~900 GFLOP/s; SMALL (~25 MFLOP) under it above ~1 GFLOP/s
    async with served(agent, max_request_seconds=0.05) as c:
        began = time.monotonic()
        r, out = await post(c, URL, LONG)
        assert r.status == 413, out
        assert "estimated" in out["detail"] and "LAYA_MAX_REQUEST_SECONDS" in out["detail"]
        assert "6 rows of up to 2048 tokens in 6 passes" in out["detail"]
        assert agent.session.long_passes() == 0 and time.monotonic() - began < 5
        r, out = await post(c, URL, SMALL)  # a request inside the budget is answered
        assert r.status == 200, out


@aio
async def test_a_client_that_hangs_up_runs_no_further_pass_and_frees_its_slot(tiny):
    agent = _long_agent(tiny)
    logger, lines = collecting_logger("test.access.hangup")
    limits = ServerLimits(keepalive_timeout=30, header_read_timeout=10, access_log="text")
    async with listening(agent, limits, access_log=logger, max_concurrent=1) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(request("POST", URL, json.dumps(LONG).encode(), {"X-Request-Id": "gone-1"}))
        await writer.drain()
        while agent.session.long_passes() < 1:
            await asyncio.sleep(0.02)
        writer.close()  # the client hangs up during its first pass
        began = time.monotonic()
        # a closed side may be a half-close: the server tells the two apart by an interim answer,
        # which a closed socket answers with a reset, a round trip later (connection.py)
        await asyncio.sleep(0.3)
        # its slot is free at once (max_concurrent=1): this one is admitted and waits its turn
        data = request("POST", URL, json.dumps(SMALL).encode(), {"Connection": "close"})
        (resp,), _ = parse_responses((await exchange(srv.port, data, 30))[0]), None
        assert resp.status == 200, resp
        waited = time.monotonic() - began
        await asyncio.sleep(1.0)  # time for a pass that should not have started to show up
    # the pass in flight finished; of the other five, at most one had started by the hang-up
    assert agent.session.long_passes() <= 2, agent.session.passes
    assert waited < 10
    cancelled = [line for line in lines if "gone-1" in line]
    assert len(cancelled) == 1 and '"POST /v1/systemone" cancelled 0B' in cancelled[0], lines


@aio
async def test_a_request_that_cannot_meet_its_deadline_is_a_504_before_any_pass(tiny):
    agent = _long_agent(tiny)
    # LONG is ~44 GFLOP: it cannot finish in 0.2 s below ~220 GFLOP/s (tiny-english runs at ~10)
    async with served(agent, request_timeout=0.2) as c:
        r, out = await post(c, URL, LONG)
        assert r.status == 504 and "LAYA_REQUEST_TIMEOUT" in out["detail"], out
        assert agent.session.long_passes() == 0


@aio
async def test_past_its_deadline_a_request_is_answered_504_at_once_and_frees_its_slot():
    agent = FakeAgent(block=True)
    async with served(agent, request_timeout=0.5, max_concurrent=1) as c:
        began = time.monotonic()
        r, out = await post(c, URL, BODY)
        assert r.status == 504 and "LAYA_REQUEST_TIMEOUT" in out["detail"], out
        assert time.monotonic() - began < 3
        second = asyncio.ensure_future(post(c, URL, BODY))  # admitted: the slot is free
        await asyncio.sleep(0.2)
        assert not second.done()  # ... and waits for the worker, still busy with the first pass
        agent.release.set()
        assert (await second)[0].status == 200


@aio
async def test_queued_behind_a_long_first_pass_a_request_is_refused_when_the_drain_begins():
    from laya_onnx.core.work import CallLimits

    loop = asyncio.get_running_loop()
    drain = Drain()
    gate = WorkerLock(drain)
    drain.bind(gate)
    holder = CallLimits()
    await gate.acquire(holder)  # the first pass ever: no timing history
    holder.charged = 60.0  # its passes were planned: about a minute
    waiter = asyncio.ensure_future(gate.acquire())
    await asyncio.sleep(0.01)
    began = loop.time()
    drain.begin(began + 5.0)
    with pytest.raises(DrainRefusal):
        await asyncio.wait_for(waiter, 2.0)
    assert loop.time() - began < 1.0 and drain.refused == 1
    gate.release()


# -- decoding ------------------------------------------------------------------------------


@functools.cache
def gzip_bomb(mib: int = 1024) -> bytes:
    """1 GiB of zeros, gzipped (~1 MiB): the soak bench's bomb, made once."""
    from laya_onnx.bench.soak import gzip_bomb as bomb

    return bomb(mib)


def test_the_decoder_stops_inflating_at_the_cap():
    from laya_onnx.serve.body import Decoder

    assert gzip.decompress(gzip_bomb(4)) == b"\0" * (4 << 20)  # the bomb is a real gzip body
    decoder = Decoder("gzip")
    out = decoder.feed(gzip_bomb(), MAX_BODY_BYTES)
    assert len(out) == MAX_BODY_BYTES + 1  # one byte past the cap says "over", then it stops


async def _health_latencies(port: int, stop: asyncio.Event, out: list[float]) -> None:
    data = request("GET", "/health", headers={"Connection": "close"})
    while not stop.is_set():
        began = time.monotonic()
        await exchange(port, data, 10)
        out.append(time.monotonic() - began)
        await asyncio.sleep(0.02)


@aio
async def test_three_decompression_bombs_in_a_row_never_stall_the_loop():
    import backports.zstd as zstd

    bombs = [("gzip", gzip_bomb())] * 2 + [("zstd", zstd.compress(b"\0" * (256 << 20)))]
    async with listening(FakeAgent()) as srv:
        stop, latencies = asyncio.Event(), []
        poll = asyncio.ensure_future(_health_latencies(srv.port, stop, latencies))
        for coding, bomb in bombs:
            began = time.monotonic()
            data = request("POST", URL, bomb, {"Content-Encoding": coding, "Connection": "close"})
            raw, _ = await exchange(srv.port, data, 20)
            (resp,) = parse_responses(raw)
            assert (resp.status, resp.json()) == (413, {"detail": "request body too large"})
            assert time.monotonic() - began < 3
        await asyncio.sleep(0.3)
        stop.set()
        await poll
    # before: 1.4-8 s right after each bomb (inflated on the loop after the 413)
    assert len(latencies) > 5 and max(latencies) < 1.0, latencies


@aio
async def test_compressed_bodies_are_read_in_every_supported_coding():
    body = json.dumps(SMALL).encode()
    raw_deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    codings = {
        "gzip": gzip.compress(body),
        "x-gzip": gzip.compress(body),
        "deflate": zlib.compress(body),
        "identity": body,
    }
    async with served() as c:
        for coding, data in codings.items():
            r, out = await post(c, URL, data, headers={"Content-Encoding": coding})
            assert r.status == 200, (coding, out)
        raw = raw_deflate.compress(body) + raw_deflate.flush()  # deflate without its zlib wrapper
        assert (await post(c, URL, raw, headers={"Content-Encoding": "deflate"}))[0].status == 200
        truncated = gzip.compress(body)[:-12]
        r, out = await post(c, URL, truncated, headers={"Content-Encoding": "gzip"})
        assert r.status == 400 and "could not be decoded" in out["detail"]


@aio
async def test_an_unknown_content_encoding_is_a_415():
    body = json.dumps(SMALL).encode()
    async with served() as c:
        for coding in ("foo", "compress", "br", "gzip, deflate"):
            r, out = await post(c, URL, body, headers={"Content-Encoding": coding})
            assert r.status == 415 and out["detail"].startswith("Content-Encoding is not supported"), coding
            assert "X-Request-Id" in r.headers


@aio
async def test_a_transfer_coding_other_than_chunked_is_a_501():
    body = json.dumps(SMALL).encode()
    head = (
        "POST %s HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n" % URL
    )
    data = head.encode() + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    async with listening(FakeAgent()) as srv:
        (resp,) = parse_responses((await exchange(srv.port, data))[0])
    assert resp.status == 501 and resp.json()["detail"].startswith("Transfer-Encoding other than chunked")


# -- bodies before admission ---------------------------------------------------------------


@aio
async def test_slow_uploaders_hold_no_inference_slot():
    body = json.dumps(BODY).encode()
    async with served(FakeAgent(), max_concurrent=2, body_read_timeout=5) as c:
        slow = []
        for _ in range(4):
            reader, writer = await asyncio.open_connection(c.server.host, c.server.port)
            head = request("POST", URL, body)[: -len(body)]
            writer.write(head + body[:1])  # then nothing: 1 byte of the body, far below 1 byte/s
            await writer.drain()
            slow.append(writer)
        await asyncio.sleep(0.3)
        began = time.monotonic()
        r, out = await post(c, URL, BODY)
        assert r.status == 200, out
        assert time.monotonic() - began < 2
        for writer in slow:
            writer.close()


@aio
async def test_the_bytes_of_bodies_being_read_are_bounded():
    body = json.dumps({**BODY, "pad": "x" * 60_000}).encode()
    async with served(FakeAgent(), body_buffer=100_000, body_read_timeout=5) as c:
        reader, writer = await asyncio.open_connection(c.server.host, c.server.port)
        head = request("POST", URL, body)[: -len(body)]
        writer.write(head + body[:-10])  # holds ~60 KB of the buffer while it stalls
        await writer.drain()
        await asyncio.sleep(0.3)
        r, out = await post(c, URL, body)  # 60 KB more would pass 100 KB: refused, not buffered
        assert (r.status, out["detail"]) == (503, "server busy, try again later")
        assert r.headers["Retry-After"] == "1"
        writer.write(body[-10:])  # the first upload ends: its bytes are given back
        await writer.drain()
        await asyncio.sleep(0.3)
        assert (await post(c, URL, body))[0].status == 200
        writer.close()


@aio
async def test_a_client_gone_mid_upload_is_cancelled_not_a_500(caplog):
    body = json.dumps(BODY).encode()
    logger, lines = collecting_logger("test.access.upload")
    limits = ServerLimits(keepalive_timeout=30, header_read_timeout=10, access_log="text")
    with caplog.at_level(logging.ERROR, logger="laya_onnx"):
        async with listening(FakeAgent(), limits, access_log=logger) as srv:
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            writer.write(request("POST", URL, body, {"X-Request-Id": "upload-1"})[:-5])
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.close()
            await asyncio.sleep(0.3)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert any("upload-1" in line and " cancelled " in line for line in lines), lines


# -- the edges -----------------------------------------------------------------------------


@aio
async def test_an_unknown_expect_is_a_json_417_with_a_request_id():
    body = json.dumps(SMALL).encode()
    async with listening(FakeAgent()) as srv:
        for method, path in (("POST", URL), ("GET", "/health"), ("GET", "/nope")):
            data = request(
                method, path, body if method == "POST" else b"", {"Expect": "ECH0ME", "Connection": "close"}
            )
            (resp,) = parse_responses((await exchange(srv.port, data))[0])
            assert resp.status == 417 and resp.headers["content-type"] == "application/json"
            assert resp.json() == {"detail": "only the Expect value 100-continue is supported"}
            assert resp.headers["x-request-id"] and b"ECH0ME" not in resp.body


@aio
async def test_two_authorization_headers_are_never_authorized():
    body = json.dumps(SMALL).encode()
    async with listening(FakeAgent(), api_key="k") as srv:
        for first, second in (
            ("Bearer k", "Bearer nope"),
            ("Bearer nope", "Bearer k"),
            ("Bearer k", "Bearer k"),
        ):
            head = "POST %s HTTP/1.1\r\nHost: t\r\nAuthorization: %s\r\nAuthorization: %s\r\n" % (
                URL,
                first,
                second,
            )
            data = (head + "Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)).encode() + body
            (resp,) = parse_responses((await exchange(srv.port, data))[0])
            assert (resp.status, resp.json()) == (401, {"detail": "invalid or missing bearer token"})
        head = "GET /health HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k\r\nAuthorization: Bearer k\r\n"
        (resp,) = parse_responses(
            (await exchange(srv.port, (head + "Connection: close\r\n\r\n").encode()))[0]
        )
        assert resp.json() == {"status": "ok"}  # liveness only


@aio
async def test_redirects_are_json_too():
    async with served() as c:
        for path in ("/metrics/", "/health/"):
            r = await c.get(path, allow_redirects=False)
            assert r.status == 307 and r.headers["Location"] == path.rstrip("/")
            assert r.headers["Content-Type"] == "application/json" and "X-Request-Id" in r.headers
            assert await r.json() == {"detail": "Temporary Redirect"}


# -- memory --------------------------------------------------------------------------------


def _rss_mib(pid: int) -> float:
    with open("/proc/%d/status" % pid) as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))


async def _post_json_async(port: int, body: dict) -> int:
    from laya_onnx.bench.soak import KEY  # the key `serve_process` starts the server with

    headers = {"Connection": "close", "Authorization": "Bearer " + KEY}
    data = request("POST", URL, json.dumps(body).encode(), headers)
    raw, _ = await exchange(port, data, 120)
    return parse_responses(raw)[0].status


def _post_json(port: int, body: dict) -> int:
    return asyncio.run(_post_json_async(port, body))


async def _health_while(port: int, work) -> dict:
    stop, latencies = asyncio.Event(), []
    poll = asyncio.ensure_future(_health_latencies(port, stop, latencies))
    status = await work
    stop.set()
    await poll
    return {"status": status, "latencies": latencies}


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from /proc")
def test_memory_returns_after_a_request_with_a_huge_instruction(tiny, tmp_path):
    """Before: RSS stayed at the request's peak (107 -> 360 MiB) until a later large batch, and
    /health stalled while the instruction was tokenized."""
    from laya_onnx.bench.soak import served as serve_process

    log_path = tmp_path / "server.log"
    with serve_process(tiny, log_path, quiet=False) as (port, proc):
        wait_healthy(proc, port, log_path)
        assert _post_json(port, SMALL) == 200
        idle = _rss_mib(proc.pid)
        rng = random.Random(0)
        words = [
            "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(5000)
        ]
        huge = " ".join(rng.choice(words) for _ in range(330_000))[:1_900_000]
        body = {"state": "x", "questions": {"r": {"type": "noul", "instructions": huge}}}
        health = asyncio.run(_health_while(port, _post_json_async(port, body)))
        # tokenizing it held the interpreter lock: /health stalled 3-5 s before
        assert health["status"] == 200 and max(health["latencies"]) < 1.5, health
        settled = None
        for _ in range(100):
            time.sleep(0.1)
            settled = _rss_mib(proc.pid)
            if settled < idle + 128 and "gave memory back after a request" in log_path.read_text():
                break
        assert settled is not None and settled < idle + 128, (idle, settled, log_path.read_text()[-2000:])
        assert "gave memory back after a request" in log_path.read_text()


# -- the soak benchmark --------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="samples the server from /proc")
def test_the_soak_benchmark_reports_a_short_run(tiny, tmp_path):
    from laya_onnx.bench.soak import run_soak

    report = run_soak(
        tiny, minutes=0.1, progress=lambda line: None, log_path=tmp_path / "server.log", settle_s=1.0
    )
    assert report["honest"]["answered"] > 0 and not report["honest"]["refused_or_failed"]
    assert report["hostile"]["decompression bomb (gzip)"] == {"413": 1}
    assert report["health_ms"]["n"] > 0 and report["rss_mib"]["idle_before"] > 0
    assert report["fds"]["idle_after"] is not None and report["samples_every_30s"]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="samples the server from /proc")
def test_the_proofs_report_each_attack_and_what_it_got(tiny, tmp_path):
    """`bench soak --proofs`: the answers, not the times (those the bench prints)."""
    from laya_onnx.bench.proofs import format_summary, run_proofs

    report = run_proofs(tiny, log_path=tmp_path / "server.log")
    table = format_summary(report)
    assert table.count("peak") == 3 and "LAYA_MAX_REQUEST_SECONDS" in table
    work = report["work bombs, clients gone after 3 s"]
    over = work.pop("1 long state, 64 questions, max_len 8192, client waits")
    assert over["status"] == "413" and "LAYA_MAX_REQUEST_SECONDS" in over["detail"]
    assert "estimated" in over["detail"]
    hung_up = [v for k, v in work.items() if k.startswith(("64 states", "1 long state"))]
    assert len(hung_up) == 3
    assert all(run["then the README request"]["status"] == "200" for run in hung_up)
    # every request of the attack left one access line: 3 bombs, 3 README requests, the 413; a
    # client that hung up left `cancelled` unless its answer was already on its way (a slow CPU)
    ended = work["server"]["access_log_ended"]
    assert sum(ended.values()) == 7 and ended.get("whole", 0) >= 4, ended
    assert set(ended) <= {"whole", "cancelled", "reset"}, ended
    assert len(work["load_average_before_after"]) == 2
    assert work["64 states x 64 questions, max_len 7400"]["bomb"] != "200"
    (bombs,) = (
        v for k, v in report["3 gzip bombs under /health every 50 ms"].items() if k.startswith("bombs")
    )
    assert [b["status"] for b in bombs] == ["413"] * 3
    assert report["3 gzip bombs under /health every 50 ms"]["health_ms"]["n"] > 0
    slow = report["16 slow uploaders at 1 byte/s"]
    assert [r["status"] for r in slow["the README request while they upload"]] == ["200"] * 3
    assert slow["uploaders got"] == {"408": 16}
    assert report["server_peak_rss_mib"] > report["server_idle"]["rss_mib"] > 0


def test_a_cancel_cuts_the_running_pass_short(tiny):
    """Before: the pass running when its client went away ran to its end (seconds of the worker
    for nobody, and everyone queued behind it waited them out); now the cancel sets
    onnxruntime's terminate flag and the pass stops between two operators."""
    import threading

    from laya_onnx.core.work import CallLimits, CallStopped, call_limits

    agent = ONNXAgent(tiny, providers=["CPUExecutionProvider"])
    agent.session = CountingSession(agent.session)
    agent.predict("warm", SMALL["questions"])
    limits = CallLimits()
    questions = {"q%d" % i: {"type": "noul", "instructions": "Is it %d?" % i} for i in range(2)}
    state = " ".join("w%d" % i for i in range(7000))  # one pass of two 7000-token rows

    def cancel_while_it_runs():
        while agent.session.long_passes() < 1:
            time.sleep(0.01)
        time.sleep(0.2)
        limits.cancel("the client went away")

    watcher = threading.Thread(target=cancel_while_it_runs)
    watcher.start()
    with call_limits(limits), pytest.raises(CallStopped, match="the client went away"):
        agent.predict(state, questions, max_len=7000)
    watcher.join()
    assert agent.session.long_passes() == 1
    assert [w for _, w in agent.session.finished if w >= LONG_WIDTH] == []  # cut short
    # the session answers the next call, and a pass already cancelled is not cut (the arena's
    # release): the same call without a cancel is answered
    assert agent.predict(state, questions, max_len=7000)["answers"].keys() == questions.keys()


def test_a_group_pass_is_cut_short_only_once_every_member_is_gone():
    from laya_onnx.core.work import CallLimits, GroupLimits

    first, second = CallLimits(), CallLimits()
    group = GroupLimits([first, second])
    stopped = []
    with group.stopping(lambda: stopped.append(True)):
        first.cancel("gone")
        assert stopped == []
        second.cancel("gone")
        assert stopped == [True]
    with first.stopping(lambda: stopped.append("late")):  # already cancelled: not armed
        pass
    assert stopped == [True]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from /proc")
def test_a_call_stopped_after_a_large_pass_hands_the_arena_back(tiny):
    """Before: only a call's last planned pass released onnxruntime's arena, so a request
    cancelled after a large pass left the process holding it (2.2 GB after a 7000-token pass)."""
    import threading

    from laya_onnx.core.memory import process_memory
    from laya_onnx.core.work import CallLimits, CallStopped, call_limits

    # two 4096-token rows a pass (~660 MB each): six rows are three passes
    agent = ONNXAgent(tiny, providers=["CPUExecutionProvider"], max_pass_memory="700M")
    agent.session = CountingSession(agent.session)
    agent.predict("warm", SMALL["questions"])
    idle = process_memory()["VmRSS"] >> 20
    limits = CallLimits()
    questions = {"q%d" % i: {"type": "noul", "instructions": "Is it %d?" % i} for i in range(6)}
    state = " ".join("w%d" % i for i in range(6000))

    def cancel_after_the_first_pass():
        while agent.session.long_passes() < 1:
            time.sleep(0.01)
        limits.cancel("the client went away")

    watcher = threading.Thread(target=cancel_after_the_first_pass)
    watcher.start()
    with call_limits(limits), pytest.raises(CallStopped):
        agent.predict(state, questions, max_len=4096)
    watcher.join()
    after = process_memory()["VmRSS"] >> 20
    assert agent.session.long_passes() < 3  # stopped before its last pass
    assert after < idle + 150, (idle, after, agent.session.passes)
