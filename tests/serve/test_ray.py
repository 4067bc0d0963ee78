"""Ray Serve and Ray Data on a local Ray instance with 2 CPUs (`ray` tier: .venv-ray in tests/run).

One Ray instance and one Serve deployment for the module, deployed from the shipped example
config (serve/ray/serve-config.yaml, with this test's bundle, port, a key and half a CPU per
replica so Ray Data's actors fit beside them): the parity suite through Ray Serve's HTTP
endpoint equals ONNXAgent; refusals (the body attacks, a page's text/plain POST, a bad batch
item) equal the aiohttp app's byte for byte; concurrent requests micro-batched by question set
equal the agent's answers; killing a replica under load loses no request; 1 000 states scored
through Ray Data equal `predict_batch`, in order; SIGINT stops `laya-onnx serve --ray` and all
it started. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.parity_exchange import assert_close, check_served, core_suite_exchanges, http_json

pytestmark = pytest.mark.ray

CONFIG = Path(__file__).resolve().parents[2] / "serve" / "ray" / "serve-config.yaml"
KEY = "s3cret"
AUTH = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}
DEPLOY_TIMEOUT_S = 180
Q1 = {
    "queue": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "billing and refunds", "tech": "login", "other": "else"},
    },
    "refund": {"type": "noul", "instructions": "Wants a refund?"},
}
Q2 = {"urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["calm", "firm", "angry"]}}


def _routed_models(bundle_factory) -> list[str]:
    return [
        "english=%s" % bundle_factory("tiny-english"),
        "multilingual=%s" % bundle_factory("tiny-multilingual"),
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_session(sid: int) -> list[str]:
    """The live processes of session `sid` (Ray's actors take groups of their own, not sessions)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            pid, rest = stat.read_text().split(" (", 1)
            name, fields = rest.rsplit(") ", 1)
            state, _, _, session = fields.split()[:4]
            if int(session) == sid and state != "Z":
                found.append("%s %s" % (pid, name))
    return found


def test_sigint_to_serve_ray_stops_serve_run_and_its_ray_instance(tiny_english, tmp_path):
    """`laya-onnx serve --ray` started with SIGINT ignored (a shell's background job): SIGINT still
    stops `serve run`, its applications and the Ray instance it started; nothing of it is left."""
    import yaml

    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    port = config["http_options"]["port"] = _free_port()
    (app,) = config["applications"]
    app["args"]["bundle"] = str(tiny_english)
    for deployment in app["deployments"]:
        deployment["num_replicas"] = 1
        deployment["ray_actor_options"]["num_cpus"] = 0
    path = tmp_path / "serve-config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    env = dict(os.environ, RAY_ADDRESS="local")  # its own Ray instance, not this module's
    proc = subprocess.Popen(
        [sys.executable, "-m", "laya_onnx", "serve", "--ray", str(path)],
        env=env,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + DEPLOY_TIMEOUT_S
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
            with contextlib.suppress(OSError, ValueError):
                if http_json("http://127.0.0.1:%d/health/live" % port, timeout=5)[0] == 200:
                    break
            time.sleep(1)
        assert any("raylet" in p for p in _in_session(proc.pid)), _in_session(proc.pid)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
        deadline = time.monotonic() + 30
        while _in_session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _in_session(proc.pid) == []
    finally:
        for line in _in_session(proc.pid):  # a failed run leaves nothing behind either
            with contextlib.suppress(OSError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def ray_instance():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def base(ray_instance, tiny_english, bundle_factory, tmp_path_factory):
    """The example config, deployed with `run_config` (what `laya-onnx serve --ray` runs)."""
    import yaml
    from ray import serve

    from laya_onnx.serve.ray_app import run_config

    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    port = _free_port()
    config["http_options"]["port"] = port
    (app,) = config["applications"]
    app["args"].update(bundle=str(tiny_english), settings={**app["args"]["settings"], "api_key": KEY})
    model = next(d for d in app["deployments"] if d["name"] == "LayaModel")
    assert model["num_replicas"] == 2
    model["ray_actor_options"]["num_cpus"] = 0.5
    # a second application: one replica behind a Router over two bundles, under /routed
    routed = copy.deepcopy(app)
    routed.update(name="routed", route_prefix="/routed")
    routed["args"] = {"models": _routed_models(bundle_factory), "settings": {"api_key": KEY}, "threads": 1}
    for deployment in routed["deployments"]:
        deployment["num_replicas"] = 1
        deployment["ray_actor_options"]["num_cpus"] = 0
    config["applications"].append(routed)
    # a third: one model replica that takes one request and queues one more, under /tight
    tight = copy.deepcopy(app)
    tight.update(name="tight", route_prefix="/tight")
    for deployment in tight["deployments"]:
        deployment["num_replicas"] = 1
        deployment["ray_actor_options"]["num_cpus"] = 0
    tight_model = next(d for d in tight["deployments"] if d["name"] == "LayaModel")
    tight_model.update(max_ongoing_requests=1, max_queued_requests=1)
    config["applications"].append(tight)
    path = tmp_path_factory.mktemp("ray") / "serve-config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    run_config(str(path), blocking=False)
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    while True:
        statuses = [serve.status().applications.get(a["name"]) for a in config["applications"]]
        if all(s is not None and s.status == "RUNNING" for s in statuses):
            break
        assert all(s is None or s.status != "DEPLOY_FAILED" for s in statuses), statuses
        assert time.monotonic() < deadline, "Ray Serve did not start in %d s: %s" % (
            DEPLOY_TIMEOUT_S,
            statuses,
        )
        time.sleep(0.5)
    url = "http://127.0.0.1:%d" % port
    while True:  # and Ray's proxy listening (it restarts when its readiness check times out)
        with contextlib.suppress(OSError, ValueError):
            if http_json(url + "/health/live", timeout=5)[0] == 200:
                return url
        assert time.monotonic() < deadline, "Ray Serve's proxy did not answer in %d s" % DEPLOY_TIMEOUT_S
        time.sleep(0.5)


def test_parity_suite_through_ray_serve_equals_the_agent(base, tiny_english_agent):
    checked = 0
    for name, route, body, local in core_suite_exchanges(tiny_english_agent):
        status, _, served = http_json(base + route, body, AUTH, timeout=120)
        checked += check_served(name, route, status, served, local)
    assert checked >= 35


# (method, path, body bytes, extra headers): refusals in contract order, and the encodings
EDGE_CASES = [
    ("GET", "/health", None, {}),
    (
        "POST",
        "/v1/systemone",
        json.dumps({"state": "x", "questions": Q1}).encode(),
        {"Authorization": "Bearer no"},
    ),
    ("POST", "/v1/systemone", b"{not json", {}),
    ("POST", "/v1/systemone", json.dumps({"state": "x"}).encode(), {}),
    ("POST", "/v1/systemone", json.dumps({"state": "x", "questions": Q1, "model": "/etc/x"}).encode(), {}),
    ("POST", "/v1/systemone", json.dumps({"state": "x", "questions": Q1, "max_len": "9"}).encode(), {}),
    ("POST", "/v1/systemone", json.dumps({"state": "x", "questions": {"q": {"type": "bogus"}}}).encode(), {}),
    ("POST", "/v1/systemone", json.dumps({"state": "x" * 50001, "questions": Q1}).encode(), {}),
    ("POST", "/v1/systemone", b" " * (2 * 1024 * 1024 + 1), {}),
    (
        "POST",
        "/v1/systemone",
        gzip.compress(json.dumps({"state": "gz", "questions": Q1}).encode()),
        {"Content-Encoding": "gzip"},
    ),
    ("POST", "/v1/systemone", b"\x1f\x8b not gzip", {"Content-Encoding": "gzip"}),
    (
        "POST",
        "/v1/systemone/batch",
        json.dumps({"states": ["a", "b"], "questions": Q2, "diagnostics": {}}).encode(),
        {},
    ),
    ("POST", "/v1/systemone/batch", json.dumps({"states": ["a"] * 65, "questions": Q2}).encode(), {}),
    ("GET", "/v1/systemone", None, {}),
    ("POST", "/nowhere", b"{}", {}),
    ("GET", "/metrics", None, {"Authorization": "Bearer no"}),
    ("GET", "/metrics/", None, {}),
    ("POST", "/v1/systemone/?q=1", b"{}", {}),
    ("GET", "/v1/models", None, {}),
    ("GET", "/v1/models", None, {"Authorization": "Bearer no"}),
    ("POST", "/v1/models", b"{}", {}),
    # the body's codings, read by the one pipeline: an unknown coding and a chain of two are a
    # 415 on both front ends (the Ray ingress once read only the first header, and handed an
    # unknown coding to the JSON parser)
    (
        "POST",
        "/v1/systemone",
        json.dumps({"state": "x", "questions": Q1}).encode(),
        {"Content-Encoding": "br"},
    ),
    (
        "POST",
        "/v1/systemone",
        gzip.compress(gzip.compress(json.dumps({"state": "x", "questions": Q1}).encode())),
        [("Content-Encoding", "gzip"), ("Content-Encoding", "gzip")],
    ),
    ("POST", "/v1/systemone", gzip.compress(b" " * (64 * 1024 * 1024)), {"Content-Encoding": "gzip"}),
    # a page on another origin may POST text/plain without a preflight: 415 before the body
    (
        "POST",
        "/v1/systemone",
        json.dumps({"state": "x", "questions": Q1}).encode(),
        {"Origin": "https://evil.example", "Content-Type": "text/plain"},
    ),
    # a batch refusal about one state names its index (X-Batch-Item)
    ("POST", "/v1/systemone/batch", json.dumps({"states": ["a", None, "b"], "questions": Q2}).encode(), {}),
]


async def _exchange(url_of, cases):
    from aiohttp import ClientSession
    from multidict import CIMultiDict

    out = []
    async with ClientSession(auto_decompress=False) as session:
        for method, path, body, headers in cases:
            sent = CIMultiDict(AUTH)
            if "Content-Type" in CIMultiDict(headers):
                sent.popall("Content-Type")
            sent.extend(headers)
            async with session.request(
                method, url_of(path), data=body, headers=sent, allow_redirects=False
            ) as r:
                payload = await r.read()
                head = tuple(r.headers.get(h) for h in ("Allow", "Location", "Content-Type", "X-Batch-Item"))
                out.append((r.status, head, json.loads(payload) if payload else None))
    return out


def test_refusals_and_encodings_equal_the_aiohttp_app(base, tiny_english_agent):
    """The same wire contract, Ray Serve vs `laya-onnx serve`'s app: the status, Allow, Location,
    Content-Type, X-Batch-Item and JSON body of each case, the body attacks included."""
    from aiohttp.test_utils import TestServer

    from laya_onnx.serve import create_app

    async def via_aiohttp():
        async with TestServer(create_app(tiny_english_agent, api_key=KEY)) as server:
            return await _exchange(lambda p: str(server.make_url(p)), EDGE_CASES)

    ours = asyncio.run(via_aiohttp())
    on_ray = asyncio.run(_exchange(lambda p: base + p, EDGE_CASES))
    for case, want, got in zip(EDGE_CASES, ours, on_ray, strict=True):
        assert got == want, case[:2]
    assert [s for s, _, _ in on_ray] == [
        200,
        401,
        400,
        400,
        422,
        422,
        422,
        413,
        413,
        200,
        400,
        422,
        413,
        405,
        404,
        401,
        307,
        307,
        200,
        200,
        405,
        415,
        415,
        413,
        415,
        400,
    ]
    assert "x_graph_sha256" in on_ray[18][2]["models"][0]  # the full listing with the bearer ...
    assert "x_graph_sha256" not in on_ray[19][2]["models"][0]  # ... Jev's three keys without
    assert on_ray[-1][1][3] == "1"  # X-Batch-Item: the null state's index


def _raw_exchange(base: str, request: bytes) -> tuple[int, bytes]:
    """(status, body) of one raw HTTP/1.1 exchange with Ray's proxy (the connection closes)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_a_transfer_coding_other_than_chunked_is_the_servers_501(base):
    """A Transfer-Encoding the server does not apply (`gzip, chunked`: Ray's proxy takes off the
    chunks, not the gzip) is refused before the body is read as JSON, as `laya-onnx serve` does."""
    body = json.dumps({"state": "x", "questions": Q1}).encode()
    head = "POST /v1/systemone HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\n" % KEY
    head += "Content-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n"
    status, answer = _raw_exchange(base, head.encode() + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
    assert status == 501, answer
    assert json.loads(answer)["detail"].startswith("Transfer-Encoding other than chunked")


def _scrape(url: str, headers: dict[str, str]) -> tuple[set[str], dict[tuple[str, tuple], float]]:
    """A Prometheus scrape: its metric families' names, and every sample as
    {(name, sorted labels): value}."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        families = list(text_string_to_metric_families(resp.read().decode()))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    # a labelled series' `_created` reads as a family of its own once it has a child
    return {f.name for f in families if not f.name.endswith("_created")}, samples


def test_metrics_count_what_the_ingress_answered_under_the_servers_names(base, tiny_english_agent):
    """`/metrics` on Ray Serve: the aiohttp app's metric names, less its single worker's (queue,
    admission limit, provider fallbacks); requests, refusals, passes, rows and tokens counted as
    they were answered; `/metrics/` redirects to it under the application's prefix."""
    from aiohttp.test_utils import TestServer

    from laya_onnx.serve import create_app

    async def aiohttp_families():
        async with TestServer(create_app(tiny_english_agent, api_key=KEY)) as server:
            return (await asyncio.to_thread(_scrape, str(server.make_url("/metrics")), AUTH))[0]

    _, before = _scrape(base + "/metrics", AUTH)
    status, _, one = http_json(base + "/v1/systemone", {"state": "metrics", "questions": Q1}, AUTH, 120)
    assert status == 200
    body = {"states": ["a", "b"], "questions": Q2}
    status, _, batch = http_json(base + "/v1/systemone/batch", body, AUTH, 120)
    assert status == 200
    assert http_json(base + "/v1/systemone", {"state": "x"}, AUTH)[0] == 400
    assert http_json(base + "/nowhere", None, AUTH)[0] == 404
    assert http_json(base + "/metrics", None, {"Authorization": "Bearer no"})[0] == 401
    families, after = _scrape(base + "/metrics", AUTH)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    requests = "laya_onnx_http_requests_total"
    assert delta(requests, route="/v1/systemone", method="POST", status="200") == 1
    assert delta(requests, route="/v1/systemone", method="POST", status="400") == 1
    assert delta(requests, route="/v1/systemone/batch", method="POST", status="200") == 1
    assert delta(requests, route="unmatched", method="GET", status="404") == 1
    assert delta(requests, route="/metrics", method="GET", status="401") == 1
    assert delta(requests, route="/metrics", method="GET", status="200") == 1  # the first scrape
    assert delta("laya_onnx_http_request_duration_seconds_count", route="/v1/systemone") == 2
    assert delta("laya_onnx_inference_duration_seconds_count", route="/v1/systemone") == 1
    assert delta("laya_onnx_inference_duration_seconds_count", route="/v1/systemone/batch") == 1
    assert delta("laya_onnx_rows_total") == len(Q1) + 2 * len(Q2)
    tokens = one["usage"]["input_tokens"] + sum(r["usage"]["input_tokens"] for r in batch["results"])
    assert delta("laya_onnx_input_tokens_total") == tokens
    assert after[("laya_onnx_http_requests_in_flight", (("route", "/metrics"),))] == 1  # itself
    assert after[("process_resident_memory_bytes", ())] > 0
    worker_only = {
        "laya_onnx_inference_queue_wait_seconds",
        "laya_onnx_inference_queue_depth",
        "laya_onnx_admission_limit",
        "laya_onnx_provider_fallbacks",
    }
    theirs = asyncio.run(aiohttp_families())
    assert worker_only <= theirs
    assert families == theirs - worker_only
    ((status, (_, location, content_type, _), payload),) = asyncio.run(
        _exchange(lambda p: base + p, [("GET", "/routed/metrics/", None, {})])
    )
    assert (status, location, content_type) == (307, "/routed/metrics", "application/json")
    assert payload == {"detail": "Temporary Redirect"}


def test_decisions_carry_the_timing_headers_and_refusals_do_not(base):
    """Server-Timing and X-Inference-Time-Ms as the aiohttp app sets them: the pass's ms on a
    200 (single, micro-batched, and batch), on no refusal; X-Model-Fallback as it sets it."""
    import re

    def headers_of(path, body):
        status, headers, _ = http_json(base + path, body, AUTH, timeout=120)
        return status, {k.lower(): v for k, v in headers.items()}

    for path, body in [
        ("/v1/systemone", {"state": "timing", "questions": Q1}),
        ("/v1/systemone/batch", {"states": ["a", "b"], "questions": Q2}),
        ("/routed/v1/systemone", {"state": "timing", "questions": Q1}),
    ]:
        status, headers = headers_of(path, body)
        assert status == 200, path
        ms = headers["x-inference-time-ms"]
        assert re.fullmatch(r"\d+\.\d\d", ms) and float(ms) > 0, (path, ms)
        assert headers["server-timing"] == "inference;dur=" + ms, path
        assert "x-model-fallback" not in headers, path
    status, headers = headers_of("/v1/systemone", {"state": "x"})
    assert status == 400 and "server-timing" not in headers and "x-inference-time-ms" not in headers
    # a model the server does not know is answered as the aiohttp app answers it, and says so
    for path, body, answered in [
        ("/v1/systemone", {"state": "x", "questions": Q1, "model": "englsh"}, "tiny-english"),
        ("/v1/systemone/batch", {"states": ["a"], "questions": Q2, "model": "englsh"}, "tiny-english"),
        (
            "/routed/v1/systemone",
            {"state": "I was charged twice, refund me", "questions": Q1, "model": "x"},
            "english",
        ),
    ]:
        status, headers = headers_of(path, body)
        assert status == 200 and headers["x-model-fallback"] == answered, path


def test_the_index_lists_the_ingress_routes(base):
    """`GET /` as the aiohttp app answers it, with the ingress's own routes (no /docs on Ray),
    under the application's route prefix; no version on a keyed server."""
    status, _, index = http_json(base + "/")
    assert status == 200 and index["name"] == "laya-onnx" and "version" not in index
    assert set(index["routes"]) == {
        "GET /",
        "GET /health",
        "GET /health/live",
        "GET /health/ready",
        "POST /v1/systemone",
        "POST /v1/systemone/batch",
        "GET /v1/models",
        "GET /metrics",
    }
    status, _, index = http_json(base + "/routed")
    assert status == 200 and "POST /routed/v1/systemone" in index["routes"]


def _ask(base, state, questions):
    status, _, body = http_json(
        base + "/v1/systemone", {"state": state, "questions": questions}, AUTH, timeout=120
    )
    return status, body


def _local(tiny_english_agent, state, questions):
    return json.loads(json.dumps(tiny_english_agent.predict(state, questions)))


def _without_wire_fields(body):
    body = dict(body)
    body.pop("routing")
    body["answers"] = {
        k: {f: v for f, v in a.items() if f != "x_jev_confidence"} for k, a in body["answers"].items()
    }
    return body


def test_concurrent_requests_are_answered_per_question_set(base, tiny_english_agent):
    """Concurrent single requests over two question sets, micro-batched on the replicas as on one
    server (the config's `batch_window_ms`)."""
    _, before = _scrape(base + "/metrics", AUTH)
    jobs = [("state number %d %s" % (i, "refund" * (i % 4)), Q1 if i % 2 else Q2) for i in range(24)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda job: _ask(base, *job), jobs))
    for (state, questions), (status, body) in zip(jobs, answers, strict=True):
        assert status == 200, body
        assert_close(_without_wire_fields(body), _local(tiny_english_agent, state, questions), state)
    _, after = _scrape(base + "/metrics", AUTH)

    def delta(sample):
        return after.get(sample, 0.0) - before.get(sample, 0.0)

    assert delta(("laya_onnx_microbatch_size_count", ())) == len(jobs)
    alone = delta(("laya_onnx_microbatch_size_bucket", (("le", "1.0"),)))
    assert alone < len(jobs), alone  # requests did share passes


def _ask_batch(base, states, questions):
    body = {"states": states, "questions": questions}
    status, _, answer = http_json(base + "/v1/systemone/batch", body, AUTH, timeout=120)
    return status, answer


def test_killing_a_replica_under_load_loses_no_request(ray_instance, base, tiny_english_agent):
    """Batches long enough that both replicas are mid-pass when one is killed: every request is
    still answered (the ingress retries a request whose replica died on the other one)."""
    from ray import serve

    replicas = [
        a
        for a in ray_instance.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::laya#LayaModel#")
    ]
    assert len(replicas) == 2, replicas
    jobs = [["kill run %d: %s" % (i, "refund please " * (20 + j)) for j in range(16)] for i in range(16)]
    done = []
    killed = threading.Event()

    def one(states):
        out = _ask_batch(base, states, Q1)
        done.append(out)
        if len(done) == 2 and not killed.is_set():
            victim = ray_instance.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"])
            ray_instance.kill(victim, no_restart=True)
            killed.set()
        return out

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(one, jobs))
    assert killed.is_set()
    for states, (status, body) in zip(jobs, answers, strict=True):
        assert status == 200, (states[0][:12], body)
        want = json.loads(json.dumps(tiny_english_agent.predict_batch(states, Q1)))
        assert_close([_without_wire_fields(r) for r in body["results"]], want, states[0][:12])
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    while serve.status().applications["laya"].status != "RUNNING":  # the replica is replaced
        assert time.monotonic() < deadline
        time.sleep(0.5)


def test_a_full_queue_is_the_contracts_503(base, tiny_english_agent):
    """Past a replica's max_ongoing_requests + max_queued_requests, Ray refuses the call; the
    caller gets the server's own busy answer (503, Retry-After, {"detail"}), and every request
    that was taken is answered as the agent answers it."""
    from laya_onnx.serve.errors import BUSY

    jobs = [["tight %d: %s" % (i, "refund please " * 40)] * 8 for i in range(8)]

    def one(states):
        status, headers, body = http_json(
            base + "/tight/v1/systemone/batch", {"states": states, "questions": Q1}, AUTH, timeout=120
        )
        return states, status, headers, body

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, jobs))
    statuses = sorted(status for _, status, _, _ in outcomes)
    assert set(statuses) <= {200, 503} and 503 in statuses and 200 in statuses, statuses
    for states, status, headers, body in outcomes:
        if status == 503:
            assert body == {"detail": BUSY}
            assert {k.lower(): v for k, v in headers.items()}["retry-after"] == "1"
        else:
            want = json.loads(json.dumps(tiny_english_agent.predict_batch(states, Q1)))
            assert_close([_without_wire_fields(r) for r in body["results"]], want, states[0][:12])


def test_ray_data_scores_1000_states_like_predict_batch(
    ray_instance, tiny_english, tiny_english_agent, tmp_path
):
    from laya_onnx.score import scorer as score
    from laya_onnx.score.ray_data import ray_scorer

    words = ["refund", "login", "charged", "twice", "broken", "thanks", "please", "now"]
    states = [" ".join(words[(i * k) % len(words)] for k in range(1, 2 + i % 7)) for i in range(1000)]
    src = tmp_path / "states.jsonl"
    src.write_text("".join(json.dumps({"state": s, "id": i}) + "\n" for i, s in enumerate(states)))
    scorer = ray_scorer(str(tiny_english), Q1, {}, batch_size=50, actors=2, cpus_per_actor=0.5, threads=1)
    summary = score.score_file(src, tmp_path / "out.jsonl", Q1, {}, scorer, progress=False)
    assert summary.as_json() == {"rows": 1000, "resumed_after": 0, "written": 1000, "errors": 0}
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r["row"], r["id"]) for r in rows] == [(i, i) for i in range(1000)]
    want = json.loads(json.dumps(tiny_english_agent.predict_batch(states, Q1, batch_size=50)))
    assert_close([r["result"] for r in rows], want, "results")


def test_an_application_behind_a_router_answers_as_the_routed_server(base, bundle_factory):
    """`args: {models: [...]}` (the /routed application): its replica runs the Router that
    `laya-onnx serve --model` runs; answers (routing blocks included) and /health equal the
    aiohttp app's over the same Router."""
    from aiohttp.test_utils import TestServer

    from laya_onnx.serve import create_app
    from laya_onnx.serve.served import build_router

    cases = [
        ("POST", "/v1/systemone", json.dumps({"state": s, "questions": Q1, **extra}).encode(), {})
        for s, extra in [
            ("I was charged twice, refund me", {}),
            ("Mir wurde zweimal abgebucht, ich will mein Geld zurück", {}),
            ("x", {"model": "multilingual"}),
            ("x", {"model": "typed-decisions"}),
        ]
    ]
    cases.append(
        (
            "POST",
            "/v1/systemone/batch",
            json.dumps({"states": ["thanks", "Danke, alles gut"], "questions": Q2}).encode(),
            {},
        )
    )
    cases.append(("GET", "/v1/models", None, {}))  # the Router's catalog

    async def via_aiohttp():
        router = build_router(None, _routed_models(bundle_factory), providers=["CPUExecutionProvider"])
        async with TestServer(create_app(router, api_key=KEY)) as server:
            return await _exchange(lambda p: str(server.make_url(p)), cases)

    want = asyncio.run(via_aiohttp())
    got = asyncio.run(_exchange(lambda p: base + "/routed" + p, cases))
    assert [s for s, _, _ in want] == [200, 200, 200, 422, 200, 200]
    assert got == want
    assert [body["routing"]["model"] for _, _, body in want[:2]] == ["english", "multilingual"]
    status, _, health = http_json(base + "/routed/health", headers=AUTH)
    assert status == 200 and health["loaded"] == ["english", "multilingual"]


def _deployments(config):
    (app,) = config["applications"]
    return {d["name"]: d for d in app["deployments"]}


def test_the_shipped_configs_admit_as_the_server_and_set_the_proxy_limits_ray_has():
    """serve-config.yaml and the RayService: a model replica admits LAYA_MAX_CONCURRENT requests
    with as many waiting (then our 503), and Ray's proxy gets the server's keep-alive and an
    end-to-end timeout, the two HTTP limits its http_options take."""
    import yaml

    from laya_onnx.serve.settings import ServerLimits, Settings

    shipped = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    service = yaml.safe_load((CONFIG.parent.parent / "k8s" / "ray" / "rayservice.yaml").read_text())
    cluster = yaml.safe_load(service["spec"]["serveConfigV2"])
    for config in (shipped, cluster):
        model = _deployments(config)["LayaModel"]
        assert (model["max_ongoing_requests"], model["max_queued_requests"]) == (
            Settings().max_concurrent,
        ) * 2
        assert _deployments(config)["LayaIngress"]["max_queued_requests"] > 0  # bounded
        http = config["http_options"]
        assert http["keep_alive_timeout_s"] == ServerLimits().keepalive_timeout
        assert http["request_timeout_s"] > 0


def test_the_nginx_ingress_puts_the_servers_limits_in_front_of_ray():
    """serve/k8s/ray/ingress.yaml: valid Kubernetes objects whose limits are the server's own,
    pointing at the RayService's serve Service, clearing the headers that lift Ray's limits."""
    import yaml
    from ray.serve._private import constants

    from laya_onnx.serve.settings import ServerLimits, Settings
    from laya_onnx.serve.validate import MAX_BODY_BYTES

    k8s = CONFIG.parent.parent / "k8s" / "ray"
    objects = list(yaml.safe_load_all((k8s / "ingress.yaml").read_text()))
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for obj in objects:
        kubernetes_validate.validate(obj, "1.31.0", strict=True)
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    ingress = by_name["Ingress", "laya-ray"]
    notes = {
        k.removeprefix("nginx.ingress.kubernetes.io/"): v
        for k, v in ingress["metadata"]["annotations"].items()
    }
    service = yaml.safe_load((k8s / "rayservice.yaml").read_text())
    http = yaml.safe_load(service["spec"]["serveConfigV2"])["http_options"]
    assert notes["proxy-body-size"] == "%dm" % (MAX_BODY_BYTES // 2**20)
    assert notes["proxy-request-buffering"] == "on"
    assert float(notes["proxy-read-timeout"]) == http["request_timeout_s"]
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    backend = path["backend"]["service"]
    assert backend == {"name": service["metadata"]["name"] + "-serve-svc", "port": {"number": http["port"]}}
    controller = by_name["ConfigMap", "ingress-nginx-controller"]["data"]
    limits = ServerLimits()
    assert controller["large-client-header-buffers"] == "4 8k"
    assert float(controller["client-header-timeout"]) == limits.header_read_timeout
    assert float(controller["client-body-timeout"]) == Settings().body_read_timeout
    assert float(controller["keep-alive"]) == limits.keepalive_timeout
    assert float(controller["upstream-keepalive-timeout"]) < http["keep_alive_timeout_s"]
    cleared = by_name["ConfigMap", "laya-ray-cleared-headers"]
    assert controller["proxy-set-headers"] == "%s/%s" % (
        cleared["metadata"]["namespace"],
        cleared["metadata"]["name"],
    )
    assert cleared["data"] == {
        constants.SERVE_HTTP_REQUEST_TIMEOUT_S_HEADER: "",
        constants.SERVE_HTTP_REQUEST_DISCONNECT_DISABLED_HEADER: "",
    }
