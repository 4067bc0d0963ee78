"""What every serve test shares: the request fixtures, the fake agent and the harness.

No pytest plugin: each async test is wrapped by `aio`, which runs it on a fresh loop, and
`served()` starts the app on aiohttp's in-process TestServer (a real loopback socket).
`listening()` runs the app as `laya-onnx serve` does instead (`RunningServer`), for what only
the real server does: connection timeouts, the parser's refusals, the drain; `exchange`,
`request`, `parse_responses` and `read_one` speak raw HTTP/1.1 to either.
The fake agent implements `laya_onnx.serve.served.ServedAgent`; it is deterministic, records
every call and the thread it ran on, and can be made to block on an Event so tests can prove
that /health answers during inference and that the admission bound refuses the excess.

A serve test module starts with
`pytestmark = [pytest.mark.serve, pytest.mark.usefixtures("no_laya_env")]` (tests/conftest.py):
its tier, and no LAYA_* variable from the developer's shell changing what it sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")
from aiohttp.test_utils import TestClient, TestServer

from laya_onnx.core.bundle import Bundle
from laya_onnx.core.errors import InvalidRequest
from laya_onnx.core.gate import apply_confidence_gate
from laya_onnx.core.manifest import Manifest
from laya_onnx.core.tournament import DEFAULT_GROUP_SIZE
from laya_onnx.serve import create_app
from laya_onnx.serve.app import RunningServer
from laya_onnx.serve.served import ServedAgent
from laya_onnx.serve.settings import ServerLimits

URL = "/v1/systemone"
BATCH = "/v1/systemone/batch"
Q = {
    "queue": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "billing and refunds", "tech": "login", "other": "else"},
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent?",
        "criteria": ["calm", "firm", "angry", "furious"],
    },
    "refund": {"type": "noul", "instructions": "Wants a refund?"},
}
BODY = {"state": "I was charged twice this month, I want my money back", "questions": Q}


# -- the fake agent ------------------------------------------------------------------------


def _answer(qid, q):
    kind = q.get("type") if isinstance(q, dict) else None
    if kind not in ("choice", "score", "noul"):
        raise InvalidRequest(
            "question %r: unknown type %r; use one of ['choice', 'noul', 'score']" % (qid, kind)
        )
    if kind == "noul":
        return {
            "type": "noul",
            "noul": 0.8,
            "confidence": 0.8,
            "answer_confidence": 0.8,
            "action": {"act_probability": 1.0},
        }
    crit = q["criteria"]
    labels = [str(c) for c in crit] if kind == "choice" else [str(i) for i in range(len(crit))]
    n = len(labels)
    probs = [1.0] if n == 1 else [0.6] + [round(0.4 / (n - 1), 4)] * (n - 1)
    if kind == "score" and n > 1:
        probs = probs[1:2] + probs[:1] + probs[2:]  # peak on level 1
    p = dict(zip(labels, probs, strict=False))
    ans = {"type": kind}
    if kind == "choice":
        ans["choice"] = labels[probs.index(max(probs))]
    else:
        ans["score"] = round(sum(i * v for i, v in enumerate(probs)), 4)
        ans["legend"] = {str(i): c for i, c in enumerate(crit)}
    ans.update(
        {
            "probabilities": p,
            "confidence": 0.5,
            "answer_confidence": max(probs),
            "action": {"act_probability": 1.0},
        }
    )
    return ans


class FakeAgent:
    """A `ServedAgent` answering from `_answer`; `error` is raised by every pass when set."""

    name = "english"
    revision = "0123456789abcdef"

    def __init__(self, *, block=False, error=None, result_hook=None):
        self.calls = []
        self.threads = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not block:
            self.release.set()
        self.error = error
        self.result_hook = result_hook
        self._lock = threading.Lock()
        self.active = self.max_active = 0
        self.providers = ["CPUExecutionProvider"]
        self.requested_providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        self.fallbacks = {}
        self.int8_kernel = None
        self.bundle = Bundle(
            root=Path("/srv/bundles/english"),
            manifest=Manifest.parse({"source": {"repo": "convaiinnovations/laya"}}),
            config={},
        )

    def _one(self, state, questions, min_confidence=None):
        result = {
            "model": "laya-rl-agent-onnx",
            "answers": {qid: _answer(qid, q) for qid, q in questions.items()},
            "usage": {
                "input_tokens": 10 * len(questions),
                "output_tokens": 0,
                "state_tokens": 5,
                "state_tokens_dropped": 0,
                "truncated": False,
                "truncated_questions": [],
            },
        }
        apply_confidence_gate([result], min_confidence)
        return self.result_hook(result) if self.result_hook else result

    def _enter(self, call):
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            self.calls.append(call)
            self.threads.append(threading.current_thread().name)
            self.entered.set()
            assert self.release.wait(10), "test never released the fake agent"
            time.sleep(0.01)  # long enough for an overlapping pass to show up in max_active
            if self.error is not None:
                raise self.error
        finally:
            with self._lock:
                self.active -= 1

    def tournament_group_size(self, questions, head_max_len=None):
        """No head budget to measure: laya's default group (`laya.shortlist`)."""
        return DEFAULT_GROUP_SIZE

    def predict(self, state, questions, **kw):
        self._enter(("predict", state, questions, kw))
        return self._one(state, questions, kw.get("min_confidence"))

    def predict_batch(self, states, questions, **kw):
        self._enter(("predict_batch", states, questions, kw))
        return [self._one(s, questions, kw.get("min_confidence")) for s in states]


def kwargs_of(agent, i=-1):
    """The keyword arguments of the agent's `i`-th call (the last by default)."""
    return agent.calls[i][3]


# -- harness -------------------------------------------------------------------------------


def aio(fn):
    """Run an async test on a fresh event loop, bounded to 60 s."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 60))

    return wrapper


@contextlib.asynccontextmanager
async def served(agent=None, **settings):
    """A client for `create_app(agent, **settings)` on a loopback port; `client.agent` is the agent."""
    agent = agent if agent is not None else FakeAgent()
    # The protocol is what the server relies on; a fake that drifts from it fails here.
    assert isinstance(agent, ServedAgent), "the served agent must implement ServedAgent"
    async with TestClient(TestServer(create_app(agent, **settings))) as client:
        client.agent = agent
        yield client


def collecting_logger(name: str) -> tuple[logging.Logger, list[str]]:
    """The logger `name`, made to keep its messages in the returned list (and to pass them on to
    nothing else): what an access logger under test wrote."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.handlers = [Collect()]
    return logger, lines


async def post(client, path, body, **kw):
    """POST `body` (JSON-encoded unless bytes/str); returns (response, parsed JSON body)."""
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    resp = await client.post(path, data=data, **kw)
    return resp, await resp.json(content_type=None)


async def raw_request(client, head: bytes, body: bytes = b"") -> bytes:
    """Send bytes exactly as given and read the reply to EOF (send `Connection: close`)."""
    data, _ = await exchange(client.server.port, head + body, host=client.server.host)
    return data


# -- raw HTTP/1.1 and the server as `laya-onnx serve` runs it ------------------------------

#: Short connection timeouts for `listening`, so the timeout tests take a second, not a minute.
FAST_LIMITS = ServerLimits(shutdown_grace=5.0, keepalive_timeout=0.6, header_read_timeout=0.5)


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Listening:
    port: int
    server: RunningServer
    agent: Any


@contextlib.asynccontextmanager
async def listening(agent: Any, limits: ServerLimits = FAST_LIMITS, access_log=None, **settings):
    """The app as `laya-onnx serve` runs it: `RunningServer` (aiohttp behind
    `LayaRequestHandler`) on a 127.0.0.1 socket, in-process. `served()` uses aiohttp's test
    server instead, which has none of the connection-level behaviour (timeouts, parser
    refusals as JSON, drain)."""
    app = create_app(agent, **settings)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    server = await RunningServer.start(app, [sock], limits, access_log)
    try:
        yield Listening(port=sock.getsockname()[1], server=server, agent=agent)
    finally:
        await server.close()
        sock.close()


def parse_responses(raw: bytes) -> list[Response]:
    """Every complete Content-Length-framed response in `raw`, in order."""
    out = []
    while raw:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            raise AssertionError("incomplete response head: %r" % raw[:200])
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        out.append(Response(int(lines[0].split()[1]), headers, rest[:length]))
        raw = rest[length:]
    return out


async def exchange(
    port: int, data: bytes, read_timeout: float = 5.0, host: str = "127.0.0.1"
) -> tuple[bytes, float]:
    """Send `data`, read until the server closes; (bytes read, seconds from send to close)."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        began = loop.time()
        raw = await asyncio.wait_for(reader.read(), read_timeout)
        return raw, loop.time() - began
    finally:
        writer.close()


async def read_one(reader: asyncio.StreamReader, timeout: float = 5.0) -> Response:
    """One Content-Length-framed response from a connection that stays open."""
    (parsed,) = parse_responses(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout))
    length = int(parsed.headers.get("content-length", "0"))
    parsed.body = await asyncio.wait_for(reader.readexactly(length), timeout)
    return parsed


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    """The bytes of one HTTP/1.1 request (Content-Length set for a body or a POST)."""
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: test"]
    lines += ["%s: %s" % kv for kv in (headers or {}).items()]
    if body or method == "POST":
        lines.append("Content-Length: %d" % len(body))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def free_port() -> int:
    """A loopback port nothing listens on right now (for a server started as a process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc, port: int, log_path: Path, within: float = 60.0) -> None:
    """Wait until the server process answers GET /health; fail with its log if it exits or stalls."""
    import urllib.request

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail("server exited with %s:\n%s" % (proc.returncode, log_path.read_text()[-3000:]))
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    pytest.fail("server did not answer /health within %gs" % within)
