"""Shutdown drain: every admitted decision request is answered (200) or refused (503 +
Retry-After) within LAYA_SHUTDOWN_GRACE_SECONDS — never cut — and the process exits 0.

Three levels: the inference gate and the drain state on their own; the whole server stack
in-process (`RunningServer.drain`); and a real server process (`tests/slow_agent.py`, the same
`serve_agent` path `laya-onnx serve` takes) sent SIGTERM with requests in flight. The process
tests print their figures (in flight, answered, refused, seconds to exit); run with `-s`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from laya_onnx.serve.errors import SHUTTING_DOWN
from laya_onnx.serve.settings import ServerLimits
from laya_onnx.serve.worker import RETRY_AFTER_SECONDS, Drain, DrainRefusal, WorkerLock
from tests.serve_support import (
    BODY,
    URL,
    aio,
    exchange,
    free_port,
    listening,
    parse_responses,
    request,
    wait_healthy,
)
from tests.slow_agent import SlowAgent

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]

TESTS = Path(__file__).resolve().parents[1]


# -- the gate and the drain state ----------------------------------------------------------


async def _hold(gate, order, name, seconds):
    async with gate:
        order.append(name)
        await asyncio.sleep(seconds)


@aio
async def test_gate_is_first_come_first_served_and_a_cancelled_waiter_passes_its_turn():
    drain = Drain()
    gate = WorkerLock(drain)
    drain.bind(gate)
    order, held = [], []
    loop = asyncio.get_running_loop()

    async def hold(name):
        async with gate:
            began = loop.time()
            order.append(name)
            await asyncio.sleep(0.02)
            held.append(loop.time() - began)

    tasks = [asyncio.ensure_future(hold(i)) for i in range(5)]
    await asyncio.sleep(0)
    tasks[2].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert order == [0, 1, 3, 4] and not gate.busy and gate.waiting == 0
    # the estimate is the longest recent hold, as long as a loaded machine made it
    assert len(held) == 4 and max(held) <= gate.pass_estimate() < max(held) + 0.05


@aio
async def test_drain_refuses_at_once_the_queued_requests_that_cannot_finish_in_time():
    loop = asyncio.get_running_loop()
    drain = Drain()
    gate = WorkerLock(drain)
    drain.bind(gate)
    await _hold(gate, [], "warm-up", 0.2)  # the estimate: 0.2 s a pass
    order = []
    tasks = [asyncio.ensure_future(_hold(gate, order, i, 0.2)) for i in range(6)]
    await asyncio.sleep(0.01)  # 0 holds the gate, 1..5 wait
    began = loop.time()
    drain.begin(began + 0.5)  # room for the running pass and one more (0.2 + 0.2 < 0.5)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert order == [0, 1]
    refused = [r for r in results if isinstance(r, DrainRefusal)]
    assert len(refused) == 4 and drain.refused == 4
    assert refused[0].status == 503 and refused[0].headers == {"Retry-After": str(RETRY_AFTER_SECONDS)}
    assert loop.time() - began < 0.6


@aio
async def test_at_the_stop_time_a_pass_still_running_is_refused_and_abandoned():
    loop = asyncio.get_running_loop()
    drain = Drain()
    gate = WorkerLock(drain)
    drain.bind(gate)
    running = asyncio.ensure_future(drain.run(_hold(gate, [], "long", 5.0)))
    await asyncio.sleep(0.01)
    began = loop.time()
    drain.begin(began + 0.2)
    with pytest.raises(DrainRefusal):
        await running
    assert 0.15 < loop.time() - began < 1.0
    assert (drain.refused, drain.abandoned, drain.in_flight) == (1, 1, 0)


# -- the whole stack in-process ------------------------------------------------------------


def _is_answer_or_clean_refusal(resp):
    if resp.status == 200:
        return True
    return (
        resp.status == 503
        and resp.json() == {"detail": SHUTTING_DOWN}
        and resp.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
        and resp.headers["connection"] == "close"
    )


@aio
async def test_drain_answers_or_refuses_every_request_and_closes_the_doors():
    loop = asyncio.get_running_loop()
    agent = SlowAgent(0.3)
    limits = ServerLimits(shutdown_grace=1.6, keepalive_timeout=30, header_read_timeout=30)
    body = json.dumps(BODY).encode()
    async with listening(agent, limits) as srv:
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", srv.port)
        late_reader, late_writer = await asyncio.open_connection("127.0.0.1", srv.port)
        late = request("POST", URL, body)
        late_writer.write(late[:20])  # a request begun before the signal, finished after it
        await late_writer.drain()
        flights = [
            asyncio.ensure_future(exchange(srv.port, request("POST", URL, body, {"Connection": "close"}), 10))
            for _ in range(8)
        ]
        while not agent.calls:
            await asyncio.sleep(0.01)
        began = loop.time()
        await srv.server.drain("test")
        drained_in = loop.time() - began
        with pytest.raises(OSError):  # no longer accepting
            await asyncio.open_connection("127.0.0.1", srv.port)
        assert await asyncio.wait_for(idle_reader.read(), 2) == b""  # idle: closed, nothing sent
        late_writer.write(late[20:])
        (late_resp,) = parse_responses(await asyncio.wait_for(late_reader.read(), 5))
        responses = [parse_responses(raw) for raw, _ in await asyncio.gather(*flights)]
        idle_writer.close()
        late_writer.close()
    assert all(len(r) == 1 for r in responses)  # every client got exactly one whole answer
    statuses = sorted(r[0].status for r in responses)
    assert all(_is_answer_or_clean_refusal(r[0]) for r in responses), responses
    # 0.3 s passes, stop time at 1.6 - 0.4: the running pass and about two more fit
    assert 2 <= statuses.count(200) <= 4 and statuses.count(503) == 8 - statuses.count(200)
    assert _is_answer_or_clean_refusal(late_resp) and late_resp.status == 503
    assert drained_in < limits.shutdown_grace
    assert len(agent.calls) == statuses.count(200)


# -- a real server process -----------------------------------------------------------------


def _spawn_slow_server(tmp_path, seconds, pad=0, **env_extra):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS.parent), env.get("PYTHONPATH", "")]), **env_extra)
    log_path = tmp_path / "server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "slow_agent.py"), str(port), str(seconds), str(pad)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    log.close()
    try:
        wait_healthy(proc, port, log_path)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return proc, port, log_path


async def _signal_with_requests_in_flight(proc, port, n, signals, pause=0.3):
    """n requests in flight, then `signals` (pause between); (responses, seconds signal→exit)."""
    body = json.dumps(BODY).encode()
    loop = asyncio.get_running_loop()
    flights = [
        asyncio.ensure_future(exchange(port, request("POST", URL, body, {"Connection": "close"}), 60))
        for _ in range(n)
    ]
    await asyncio.sleep(pause)  # all connected and queued, the first pass running
    began = loop.time()
    for i, signum in enumerate(signals):
        if i:
            await asyncio.sleep(pause)
        proc.send_signal(signum)
    code = await loop.run_in_executor(None, proc.wait, 60)
    exited_in = loop.time() - began
    responses = [parse_responses(raw) for raw, _ in await asyncio.gather(*flights)]
    return code, exited_in, responses


def _report(name, n, responses, exited_in, grace):
    statuses = [r[0].status for r in responses]
    print(
        "\n[drain figures] %s: %d in flight -> %d answered (200), %d refused (503), "
        "exit %.2fs after the signal (grace %gs)"
        % (name, n, statuses.count(200), statuses.count(503), exited_in, grace)
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_terminating_signal_with_requests_in_flight_answers_or_refuses_each_and_exits_0_within_the_grace(
    tmp_path, signum
):
    """SIGHUP (a closing terminal, a reload) drains exactly as SIGTERM does, rather than killing
    the process with its requests in flight."""
    grace, n = 4.0, 10
    proc, port, log_path = _spawn_slow_server(tmp_path, 1.0, LAYA_SHUTDOWN_GRACE_SECONDS=str(grace))
    try:
        code, exited_in, responses = asyncio.run(_signal_with_requests_in_flight(proc, port, n, [signum]))
    finally:
        if proc.poll() is None:
            proc.kill()
    log = log_path.read_text()
    _report("%s, 1 s passes" % signum.name, n, responses, exited_in, grace)
    assert code == 0, log
    assert all(len(r) == 1 for r in responses), responses  # none cut, none answered twice
    assert all(_is_answer_or_clean_refusal(r[0]) for r in responses), responses
    statuses = [r[0].status for r in responses]
    answered, refused = statuses.count(200), statuses.count(503)
    assert answered + refused == n and answered >= 2 and refused >= 1
    assert exited_in < grace + 1.0, log
    assert "received %s: draining for up to 4s; %d decision request(s) in flight" % (signum.name, n) in log
    assert "stopped accepting connections" in log
    assert "drained in " in log and ": %d answered, %d refused" % (answered, refused) in log
    assert log.count("503 while draining") == refused
    assert log.rstrip().endswith("stopped")


def test_a_pass_longer_than_the_grace_is_refused_and_the_process_still_exits_in_time(tmp_path):
    grace = 1.0
    proc, port, log_path = _spawn_slow_server(tmp_path, 8.0, LAYA_SHUTDOWN_GRACE_SECONDS=str(grace))
    try:
        code, exited_in, responses = asyncio.run(
            _signal_with_requests_in_flight(proc, port, 2, [signal.SIGTERM])
        )
    finally:
        if proc.poll() is None:
            proc.kill()
    log = log_path.read_text()
    _report("SIGTERM, an 8 s pass, grace 1 s", 2, responses, exited_in, grace)
    assert code == 0, log
    assert [r[0].status for r in responses] == [503, 503]
    assert all(_is_answer_or_clean_refusal(r[0]) for r in responses)
    assert exited_in < grace + 1.5, log
    assert "abandoned" in log


def test_a_second_signal_stops_now(tmp_path):
    proc, port, log_path = _spawn_slow_server(tmp_path, 1.0, LAYA_SHUTDOWN_GRACE_SECONDS="30")
    try:
        code, exited_in, responses = asyncio.run(
            _signal_with_requests_in_flight(proc, port, 6, [signal.SIGTERM, signal.SIGINT])
        )
    finally:
        if proc.poll() is None:
            proc.kill()
    log = log_path.read_text()
    _report("SIGTERM then SIGINT, grace 30 s", 6, responses, exited_in, 30)
    assert code == 0, log
    assert all(len(r) == 1 and _is_answer_or_clean_refusal(r[0]) for r in responses), responses
    assert exited_in < 3.0, log
    assert "received SIGINT again" in log


def test_a_signal_while_a_large_answer_is_written_waits_for_it_within_the_grace(tmp_path):
    """A slow reader of a 12 MB answer (about 3 s) when SIGTERM arrives gets all of it: the drain
    waits for answers still being written, not only for the ones still being decided. (The
    reader's small receive buffer keeps the kernel from taking the whole answer at once.)"""
    proc, port, log_path = _spawn_slow_server(tmp_path, 0.05, 12_000_000, LAYA_SHUTDOWN_GRACE_SECONDS="20")

    async def read_slowly():
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.connect(("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(request("POST", URL, json.dumps(BODY).encode(), {"Connection": "close"}))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        length = int(parse_responses(head)[0].headers["content-length"])
        proc.send_signal(signal.SIGTERM)
        received = 0
        while received < length:  # 400 KB every 100 ms
            chunk = await asyncio.wait_for(reader.read(400_000), 10)
            if not chunk:
                break
            received += len(chunk)
            await asyncio.sleep(0.1)
        writer.close()
        return received, length

    try:
        received, length = asyncio.run(read_slowly())
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (received, code) == (length, 0), log_path.read_text()[-2000:]
