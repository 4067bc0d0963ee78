"""End to end: a real `laya-onnx serve` process on a loopback port, a real HTTP client.

Uses the session's `bundle_factory` fixture (tests/conftest.py) for the tiny english bundle and
compares what the server answers with what `ONNXAgent.predict` answers in-process on the same
bundle. Skipped when the fixture is not available. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from laya_onnx.bench.sample import README_REQUEST as REQUEST
from tests.parity_exchange import check_served, core_suite_exchanges
from tests.parity_exchange import http_json as _call

pytestmark = [pytest.mark.serve, pytest.mark.runtime]

STARTUP_SECONDS = 90


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tiny_bundle(request):
    try:
        factory = request.getfixturevalue("bundle_factory")
    except pytest.FixtureLookupError:
        pytest.skip("no bundle_factory fixture in tests/conftest.py")
    return factory("tiny-english")


@pytest.fixture
def server(tiny_bundle, tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    env.update({"LAYA_API_KEY": "s3cret", "LAYA_LOG_LEVEL": "warning", "LAYA_PORT": "not-used"})
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "laya_onnx",
            "serve",
            str(tiny_bundle),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--providers",
            "CPUExecutionProvider",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    base = "http://127.0.0.1:%d" % port
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if proc.poll() is not None:
                log.flush()
                pytest.fail(
                    "server exited with %s:\n%s"
                    % (proc.returncode, (tmp_path / "server.log").read_text()[-4000:])
                )
            try:
                if _call(base + "/health", timeout=2)[0] == 200:
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail("server did not answer /health within %ds" % STARTUP_SECONDS)
            time.sleep(0.2)
        yield base, proc, tiny_bundle
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        log.close()


def test_real_server_answers_like_the_agent(server):
    from laya_onnx import ONNXAgent

    base, proc, bundle = server
    auth = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}

    # health: liveness only without the bearer, full payload with it
    assert _call(base + "/health")[2] == {"status": "ok"}
    status, _, health = _call(base + "/health", headers=auth)
    assert status == 200 and health["status"] == "ok"
    assert list(health)[:7] == [
        "status",
        "loaded",
        "revisions",
        "device",
        "device_is_preference",
        "checkpoint_devices",
        "cpu_fallbacks",
    ]
    name = health["loaded"][0]
    assert health["device"] == "cpu" and health["providers"] == {name: ["CPUExecutionProvider"]}

    status, _, body = _call(base + "/v1/systemone", REQUEST)
    assert (status, body) == (401, {"detail": "invalid or missing bearer token"})

    status, headers, body = _call(base + "/v1/systemone", REQUEST, auth)
    assert status == 200, body
    assert float(headers["X-Inference-Time-Ms"]) >= 0
    assert headers["Server-Timing"].startswith("inference;dur=")

    agent = ONNXAgent(bundle, providers=["CPUExecutionProvider"])
    local = agent.predict(REQUEST["state"], REQUEST["questions"])
    assert body["model"] == local["model"] and body["usage"] == local["usage"]
    assert body["routing"]["model"] == name == agent.name
    assert body["routing"]["reason"] == "served bundle"
    for qid, answer in local["answers"].items():
        served = dict(body["answers"][qid])
        jev = served.pop("x_jev_confidence", None)
        assert served == answer
        assert (jev is None) == (answer["type"] == "noul")

    # batch over two states equals the agent's own batch
    status, _, batch = _call(
        base + "/v1/systemone/batch",
        {"states": [REQUEST["state"], {"ticket": "login fails"}], "questions": REQUEST["questions"]},
        auth,
    )
    assert status == 200, batch
    local_batch = agent.predict_batch([REQUEST["state"], {"ticket": "login fails"}], REQUEST["questions"])
    assert [r["usage"] for r in batch["results"]] == [r["usage"] for r in local_batch]
    assert batch["total_usage"]["input_tokens"] == sum(r["usage"]["input_tokens"] for r in local_batch)

    # the model's own question validation comes back as a 422 with its text
    bad = {"state": "x", "questions": {"refund": {"type": "X", "instructions": "x"}}}
    status, _, body = _call(base + "/v1/systemone", bad, auth)
    assert status == 422 and body["detail"].startswith("question 'refund': unknown type 'X'")

    # and a graceful stop on SIGTERM
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_serve_refuses_a_missing_bundle_with_a_message(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "laya_onnx",
            "serve",
            str(tmp_path / "nope"),
            "--host",
            "127.0.0.1",
            "--port",
            str(_free_port()),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2  # bad input, as for every subcommand
    assert "laya-onnx serve: error: cannot serve" in done.stderr and "Traceback" not in done.stderr


def test_parity_suite_through_the_server_equals_the_agent(server):
    """The parity suite's requests over HTTP: the served answers equal ONNXAgent's (which
    tests/parity/test_parity.py holds equal to laya.Agent's), refusals come back as 422 with the same text."""
    from laya_onnx import ONNXAgent

    base, _, bundle = server
    auth = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
    agent = ONNXAgent(bundle, providers=["CPUExecutionProvider"])
    checked = 0
    for name, route, body, local in core_suite_exchanges(agent):
        status, _, served = _call(base + route, body, auth, timeout=120)
        checked += check_served(name, route, status, served, local)
    assert checked >= 35
