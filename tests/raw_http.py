"""Raw HTTP/1.1 over loopback sockets, and the real server stack started in-process.

`listening(agent, limits)` starts the app the way `laya-onnx serve` does — `RunningServer`,
i.e. aiohttp behind `LayaRequestHandler` on a socket bound to 127.0.0.1 — so connection-level
behaviour (timeouts, parser refusals, drain) is exercised without a subprocess. `exchange`
writes bytes and reads until the server closes; `parse_responses` splits what came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass, field
from typing import Any

from laya_onnx.serve import create_app
from laya_onnx.serve.server import RunningServer
from laya_onnx.serve.settings import ServerLimits

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
    extra: dict[str, Any] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def listening(agent: Any, limits: ServerLimits = FAST_LIMITS, access_log=None, **settings):
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
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        out.append(Response(status, headers, rest[:length]))
        raw = rest[length:]
    return out


async def exchange(port: int, data: bytes, read_timeout: float = 5.0) -> tuple[bytes, float]:
    """Send `data`, read until the server closes; (bytes read, seconds from send to close)."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
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
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    (parsed,) = parse_responses(head)
    length = int(parsed.headers.get("content-length", "0"))
    parsed.body = await asyncio.wait_for(reader.readexactly(length), timeout)
    return parsed


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: test"]
    lines += ["%s: %s" % kv for kv in (headers or {}).items()]
    if body or method == "POST":
        lines.append("Content-Length: %d" % len(body))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
