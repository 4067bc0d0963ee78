"""`laya-onnx serve` start and stop as an operator sees them: exit codes, the order of the log
lines, the default bind address.

  * a setting it cannot use: exit 2, one line naming it, before anything is loaded;
  * a port in use: exit 1, one line, before the bundle is loaded and without "serving ...";
  * "serving ... on http://127.0.0.1:PORT" only once the socket listens (127.0.0.1 unless told);
  * SIGTERM: the drain's lines, then "stopped", exit 0.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

pytest.importorskip("aiohttp")

from laya_onnx.serve.app import _bind
from tests.serve_support import BODY, URL, exchange, free_port, parse_responses, request, wait_healthy

pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]

CLI = [sys.executable, "-m", "laya_onnx", "serve"]


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    env.update(extra)
    return env


def _listening_socket():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_bind_refuses_a_port_in_use_with_one_line():
    with _listening_socket() as busy:
        port = busy.getsockname()[1]
        with pytest.raises(OSError) as caught:
            _bind("127.0.0.1", port)
    assert caught.value.errno == errno.EADDRINUSE
    assert caught.value.strerror == "cannot listen on 127.0.0.1:%d: Address already in use" % port


def test_bind_holds_the_port_without_accepting_connections():
    sockets = _bind("127.0.0.1", 0)
    try:
        (sock,) = sockets
        port = sock.getsockname()[1]
        with pytest.raises(ConnectionRefusedError):  # bound while the model loads, not listening
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        for sock in sockets:
            sock.close()


def test_port_in_use_exits_1_before_the_bundle_is_looked_at(tmp_path):
    with _listening_socket() as busy:
        port = busy.getsockname()[1]
        done = subprocess.run(
            CLI + [str(tmp_path / "no-such-bundle"), "--port", str(port)],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=60,
        )
    assert done.returncode == 1
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("laya-onnx serve: failed: ")
    assert line.endswith(" cannot listen on 127.0.0.1:%d: Address already in use" % port)
    assert "serving" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "name,value",
    [
        ("LAYA_SHUTDOWN_GRACE_SECONDS", "soon"),
        ("LAYA_KEEPALIVE_TIMEOUT", "-1"),
        ("LAYA_HEADER_READ_TIMEOUT", "0"),
        ("LAYA_ACCESS_LOG", "loud"),
        ("LAYA_ROOT_PATH", "laya"),
        ("LAYA_PORT", "99999"),
        ("LAYA_LOG_LEVEL", "chatty"),
    ],
)
def test_a_bad_setting_exits_2_with_one_line_naming_it(tmp_path, name, value):
    done = subprocess.run(
        CLI + [str(tmp_path / "no-such-bundle")],
        capture_output=True,
        text=True,
        env=_env(**{name: value}),
        timeout=60,
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in done.stderr


@pytest.fixture
def tiny_bundle(request):
    try:
        factory = request.getfixturevalue("bundle_factory")
    except pytest.FixtureLookupError:
        pytest.skip("no bundle_factory fixture in tests/conftest.py")
    return factory("tiny-english")


def test_real_server_binds_localhost_logs_in_order_and_drains_on_sigterm(tiny_bundle, tmp_path):
    port = free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            CLI + [str(tiny_bundle), "--port", str(port), "--providers", "CPUExecutionProvider"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(LAYA_ACCESS_LOG="json"),
        )
    try:
        wait_healthy(proc, port, log_path)
        started = log_path.read_text()
        assert "serving checkpoint 'tiny-english'" in started
        assert "on http://127.0.0.1:%d with CPUExecutionProvider" % port in started
        # only loopback: the machine's own network address is not served
        address = _outbound_address()
        if address is not None:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((address, port), timeout=2).close()

        async def in_flight_then_sigterm():
            body = json.dumps(BODY).encode()
            flights = [
                asyncio.ensure_future(exchange(port, request("POST", URL, body, {"Connection": "close"}), 30))
                for _ in range(6)
            ]
            await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            return [parse_responses(raw) for raw, _ in await asyncio.gather(*flights)]

        responses = asyncio.run(in_flight_then_sigterm())
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    log = log_path.read_text()
    assert code == 0, log
    assert all(len(r) == 1 and r[0].status in (200, 503) for r in responses), responses
    lines = log.splitlines()
    serving = next(i for i, line in enumerate(lines) if "serving checkpoint" in line)
    received = next(i for i, line in enumerate(lines) if "received SIGTERM: draining" in line)
    drained = next(i for i, line in enumerate(lines) if "drained in" in line)
    assert serving < received < drained and lines[-1].endswith("stopped")
    access = [json.loads(line) for line in lines if line.startswith("{")]
    assert access and all(entry["type"] == "access" and entry["request_id"] for entry in access)


def _outbound_address():
    """This machine's non-loopback IPv4 address, or None (no route: the check is skipped).

    Connecting a UDP socket sends nothing; it only picks the interface a packet would leave by.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address
