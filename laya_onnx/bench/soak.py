"""`laya-onnx bench soak BUNDLE`: honest and hostile traffic together, for minutes, against a real
`laya-onnx serve` process on 127.0.0.1.

Honest clients post the README request (and now and then a small batch) back to back while one
client polls `/health` every 50 ms; meanwhile the hostile clients take turns, one attack at a
time, each bounded: decompression bombs, a work bomb whose client hangs up, a request over the
work budget, a 1.9 MB instruction, slow uploaders, slow headers, a client gone mid-body, an idle
connection flood, and the malformed edges (garbage, an unknown `Expect`, two `Authorization`
headers, unknown codings). The server process is sampled every 5 s from /proc (RSS, open file
descriptors, threads). The report: answered/refused counts per kind, `/health` p50/p99/max, and
RSS and fds over time, idle before and after (Linux: /proc).

Everything is raw HTTP/1.1 over asyncio streams, so a hostile client can misbehave at the byte
level; the server is a child process, so the clients never share its interpreter lock. Figures
are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import random
import signal
import statistics
import string
import struct
import subprocess
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from laya_onnx.bench.child import python_module
from laya_onnx.bench.http import summary_ms
from laya_onnx.bench.sample import README_REQUEST
from laya_onnx.core import settings
from laya_onnx.core.machine import read_cpu
from laya_onnx.serve.body import zstd_module

DEFAULT_MINUTES = 10.0
KEY = "soak-key"
AUTH = "Bearer " + KEY
SAMPLE_EVERY_S = 5.0
HEALTH_EVERY_S = 0.05
#: An answer slower than this counts as a stall in the /health figures.
HEALTH_STALL_MS = 250.0
HONEST_CLIENTS = 4
REQUEST_DEADLINE_S = 60.0


# -- raw HTTP -------------------------------------------------------------------------------


def http_request(
    method: str, path: str, body: bytes | None = b"", headers: list[tuple[str, str]] | None = None
) -> bytes:
    """One HTTP/1.1 request with `Connection: close` (Content-Length unless the headers frame it)."""
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: soak", "Connection: close"]
    lines += ["%s: %s" % kv for kv in headers or []]
    framed = any(k.lower() in ("content-length", "transfer-encoding") for k, _ in headers or [])
    if body is not None and not framed:
        lines.append("Content-Length: %d" % len(body))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def status_of(raw: bytes) -> str:
    """The status code of a raw response, or what happened instead."""
    if raw.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")):
        return raw[9:12].decode("ascii", "replace")
    return "no answer" if not raw else "garbled"


async def exchange(port: int, data: bytes, timeout: float = REQUEST_DEADLINE_S) -> tuple[str, float]:
    """Send `data` while reading the answer to EOF; (status, seconds). A reset or a timeout is
    an outcome too."""
    status, _, seconds = await exchange_raw(port, data, timeout)
    return status, seconds


async def exchange_raw(
    port: int, data: bytes, timeout: float = REQUEST_DEADLINE_S
) -> tuple[str, bytes, float]:
    """`exchange`, with the raw response too: (status, raw bytes read, seconds)."""
    began = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return "refused connection", b"", time.monotonic() - began

    async def send() -> None:
        try:
            writer.write(data)
            await writer.drain()
        except (OSError, ConnectionError):
            pass

    sending = asyncio.ensure_future(send())
    raw = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), max(0.1, timeout - (time.monotonic() - began)))
            if not chunk:
                break
            raw += chunk
    except asyncio.TimeoutError:
        return "timeout", raw, time.monotonic() - began
    except (OSError, ConnectionError):
        return status_of(raw) if raw else "reset", raw, time.monotonic() - began
    finally:
        sending.cancel()
        writer.close()
    return status_of(raw), raw, time.monotonic() - began


async def trickle(port: int, pieces: list[bytes], wait_s: float) -> str:
    """Send `pieces` one by one, waiting up to `wait_s` for an answer after each: the status the
    server answered with, "still open" when it let them all through unanswered, or "reset"."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            try:
                return status_of(await asyncio.wait_for(reader.read(65536), wait_s))
            except asyncio.TimeoutError:
                continue
        return "still open"
    except (OSError, ConnectionError):
        return "reset"
    finally:
        writer.close()


# -- bodies ---------------------------------------------------------------------------------


def gzip_bomb(mib: int) -> bytes:
    """A valid gzip body of `mib` MiB of zeros, about 1 KiB per MiB (built without compressing
    it all: after a full flush each MiB of zeros deflates to the same bytes)."""
    zeros = b"\0" * (1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    steady = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + first + steady * (mib - 1) + c.flush() + struct.pack("<II", crc, (mib << 20) & 0xFFFFFFFF)


def _words(rng: random.Random, n: int) -> str:
    vocab = [
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(5000)
    ]
    return " ".join(rng.choice(vocab) for _ in range(n))


class Bodies:
    """The request bodies of every kind, built once."""

    def __init__(self) -> None:
        rng = random.Random(0)
        self.small = json.dumps(README_REQUEST).encode()
        self.batch = json.dumps(
            {"states": [README_REQUEST["state"]] * 8, "questions": README_REQUEST["questions"]}
        ).encode()
        self.gzip_bomb = gzip_bomb(1024)
        self.zstd_bomb = zstd_module().compress(b"\0" * (256 << 20))
        many = {
            "q%d" % i: {
                "type": "choice",
                "instructions": "Which team %d?" % i,
                "criteria": {"a": "billing", "b": "tech"},
            }
            for i in range(64)
        }
        states = [_words(rng, 4000) for _ in range(64)]
        self.work_bomb = json.dumps({"states": states, "questions": many, "max_len": 7400}).encode()
        eight = {k: many[k] for k in list(many)[:8]}
        self.over_budget = json.dumps(
            {"state": _words(rng, 7000), "questions": eight, "max_len": 7000}
        ).encode()
        instructions = _words(rng, 330_000)[:1_900_000]
        self.huge_instructions = json.dumps(
            {"state": "x", "questions": {"r": {"type": "noul", "instructions": instructions}}}
        ).encode()


# -- the clients ----------------------------------------------------------------------------


class Soak:
    def __init__(self, port: int, pid: int, seconds: float, progress: Callable[[str], Any]):
        self.port, self.pid, self.seconds, self.progress = port, pid, seconds, progress
        self.bodies = Bodies()
        self.honest: Counter[str] = Counter()
        self.honest_ms: list[float] = []
        self.hostile: dict[str, Counter[str]] = defaultdict(Counter)
        self.health_ms: list[float] = []
        self.samples: list[dict[str, Any]] = []
        self.stop = asyncio.Event()

    def post(self, path: str, body: bytes | None, headers: list[tuple[str, str]] | None = None) -> bytes:
        return http_request("POST", path, body, [("Authorization", AUTH), *(headers or [])])

    async def honest_client(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            batch = n % 5 == 0
            data = self.post(
                "/v1/systemone/batch" if batch else "/v1/systemone",
                self.bodies.batch if batch else self.bodies.small,
            )
            status, seconds = await exchange(self.port, data)
            self.honest[status] += 1
            if status == "200":
                self.honest_ms.append(seconds * 1000)
            elif status == "503":
                await asyncio.sleep(0.2)

    async def health(self) -> None:
        data = http_request("GET", "/health", None)
        while not self.stop.is_set():
            status, seconds = await exchange(self.port, data, 30)
            self.health_ms.append(seconds * 1000 if status == "200" else 30_000.0)
            await asyncio.sleep(HEALTH_EVERY_S)

    async def sampler(self) -> None:
        began = time.monotonic()
        seen = 0  # /health answers already summarised by an earlier sample
        while not self.stop.is_set():
            window, seen = self.health_ms[seen:], len(self.health_ms)
            self.samples.append(
                {
                    "t_s": round(time.monotonic() - began, 1),
                    **process_figures(self.pid),
                    **health_window(window),
                }
            )
            try:
                await asyncio.wait_for(self.stop.wait(), SAMPLE_EVERY_S)
            except asyncio.TimeoutError:
                pass

    # one attack each; every one ends within ~15 s
    async def gzip_bombs(self) -> None:
        for coding, bomb in (("gzip", self.bodies.gzip_bomb), ("zstd", self.bodies.zstd_bomb)):
            status, _ = await exchange(
                self.port, self.post("/v1/systemone", bomb, [("Content-Encoding", coding)])
            )
            self.hostile["decompression bomb (" + coding + ")"][status] += 1

    async def work_bomb_hang_up(self) -> None:
        data = self.post("/v1/systemone/batch", self.bodies.work_bomb)
        status, _ = await exchange(self.port, data, timeout=3.0)
        self.hostile["work bomb, client gone after 3 s"]["gone" if status == "timeout" else status] += 1

    async def over_budget(self) -> None:
        status, _ = await exchange(self.port, self.post("/v1/systemone", self.bodies.over_budget))
        self.hostile["8 questions at max_len 7000"][status] += 1

    async def huge_instructions(self) -> None:
        status, _ = await exchange(self.port, self.post("/v1/systemone", self.bodies.huge_instructions))
        self.hostile["1.9 MB instructions"][status] += 1

    async def slow_upload(self) -> str:
        """An authorised request whose body comes at 1 byte/s, for up to 15 s: what it got."""
        head = self.post("/v1/systemone", b"", [("Content-Length", str(len(self.bodies.small)))])
        body = self.bodies.small
        return await trickle(self.port, [head] + [body[k : k + 1] for k in range(15)], 1.0)

    async def slow_uploaders(self) -> None:
        for status in await asyncio.gather(*(self.slow_upload() for _ in range(16))):
            self.hostile["slow uploader (1 byte/s)"][status] += 1

    async def slow_headers(self) -> None:
        head = b"POST /v1/systemone HTTP/1.1\r\nHost: soak\r\nX-Slow: " + b"a" * 20
        crawl = [bytes([byte]) for byte in head]
        for status in await asyncio.gather(*(trickle(self.port, crawl, 0.5) for _ in range(8))):
            self.hostile["slow headers (2 bytes/s)"][status] += 1

    async def gone_mid_body(self) -> None:
        data = self.post("/v1/systemone", self.bodies.batch)
        for _ in range(4):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            writer.write(data[: len(data) // 2])
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.close()
            self.hostile["client gone mid-body"]["gone"] += 1

    async def idle_flood(self) -> None:
        conns = []
        for _ in range(200):
            try:
                conns.append(await asyncio.open_connection("127.0.0.1", self.port))
            except OSError:
                self.hostile["idle connections"]["refused connection"] += 1
        await asyncio.sleep(5)
        for _, writer in conns:
            writer.close()
        self.hostile["idle connections"]["held 5 s"] += len(conns)

    async def edges(self) -> None:
        small = self.bodies.small
        cases = {
            "garbage bytes": b"GARBAGE\r\n\r\n",
            "unknown Expect": self.post("/v1/systemone", small, [("Expect", "ECH0ME")]),
            "two Authorization headers": http_request(
                "POST", "/v1/systemone", small, [("Authorization", AUTH), ("Authorization", "Bearer nope")]
            ),
            "Content-Encoding foo": self.post("/v1/systemone", small, [("Content-Encoding", "foo")]),
            "Transfer-Encoding gzip, chunked": self.post(
                "/v1/systemone", None, [("Transfer-Encoding", "gzip, chunked")]
            )
            + b"%x\r\n" % len(small)
            + small
            + b"\r\n0\r\n\r\n",
            "x-gzip body": self.post("/v1/systemone", gzip.compress(small), [("Content-Encoding", "x-gzip")]),
            "no bearer": http_request("POST", "/v1/systemone", small),
            "431 header": self.post("/v1/systemone", small, [("X-Big", "a" * 9000)]),
        }
        for name, data in cases.items():
            status, _ = await exchange(self.port, data, 15)
            self.hostile[name][status] += 1

    async def attacker(self) -> None:
        attacks = [
            self.gzip_bombs,
            self.edges,
            self.work_bomb_hang_up,
            self.slow_uploaders,
            self.over_budget,
            self.gone_mid_body,
            self.huge_instructions,
            self.slow_headers,
            self.idle_flood,
        ]
        n = 0
        while not self.stop.is_set():
            await attacks[n % len(attacks)]()
            n += 1
            await asyncio.sleep(1.0)

    async def run(self) -> None:
        tasks = [asyncio.ensure_future(self.honest_client(i)) for i in range(HONEST_CLIENTS)]
        tasks += [asyncio.ensure_future(t()) for t in (self.health, self.sampler, self.attacker)]
        began = time.monotonic()
        while time.monotonic() - began < self.seconds:
            await asyncio.sleep(min(60.0, self.seconds - (time.monotonic() - began)))
            self.progress(
                "soak: %.0f s, honest %s, /health n=%d max %.0f ms, RSS %s MiB"
                % (
                    time.monotonic() - began,
                    dict(self.honest),
                    len(self.health_ms),
                    max(self.health_ms or [0]),
                    self.samples[-1]["rss_mib"] if self.samples else "?",
                )
            )
        self.stop.set()
        await asyncio.wait(tasks, timeout=REQUEST_DEADLINE_S + 5)
        for task in tasks:
            task.cancel()


# -- the server process ---------------------------------------------------------------------


def process_figures(pid: int) -> dict[str, Any]:
    """RSS and peak RSS (MiB), open file descriptors and threads of `pid`, from /proc."""
    figures: dict[str, Any] = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    figures["rss_mib"] = round(int(line.split()[1]) / 1024, 1)
                elif line.startswith("VmHWM:"):
                    figures["peak_rss_mib"] = round(int(line.split()[1]) / 1024, 1)
                elif line.startswith("Threads:"):
                    figures["threads"] = int(line.split()[1])
        figures["fds"] = len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        pass
    return figures


def health_window(latencies_ms: list[float]) -> dict[str, float]:
    """/health's p50 and max (ms) over the answers since the previous sample; {} for none."""
    if not latencies_ms:
        return {}
    return {
        "health_p50_ms": round(statistics.median(latencies_ms), 2),
        "health_max_ms": round(max(latencies_ms), 2),
    }


def cpu_class() -> str:
    """This CPU as the reports name it: model, the instruction sets that matter, cores."""
    cpu = read_cpu()
    return "%s, %d cores" % (cpu.label, cpu.cores)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_healthy(port: int, proc: subprocess.Popen[bytes], within: float = 120.0) -> None:
    began = time.monotonic()
    while time.monotonic() - began < within:
        if proc.poll() is not None:
            raise RuntimeError("the server exited with %s before it answered" % proc.returncode)
        status, _ = await exchange(port, http_request("GET", "/health", None), 2)
        if status == "200":
            return
        await asyncio.sleep(0.5)
    raise RuntimeError("the server did not answer /health within %g s" % within)


async def _idle_figures(pid: int, settle_s: float) -> dict[str, Any]:
    await asyncio.sleep(settle_s)
    return process_figures(pid)


@contextlib.contextmanager
def served(
    bundle: os.PathLike[str] | str, log_path: os.PathLike[str] | str | None, quiet: bool = True
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """`laya-onnx serve BUNDLE` in a child process on a free port of 127.0.0.1, with `KEY` and
    otherwise the default settings (`quiet`: no access log, warnings only); (port, process).
    Stopped with SIGTERM on the way out."""
    port = _free_port()
    env = settings.without_settings(os.environ)
    env[settings.API_KEY.env] = KEY
    if quiet:
        env.update({settings.ACCESS_LOG.env: "off", settings.LOG_LEVEL.env: "warning"})
    log = open(log_path or os.devnull, "wb")
    proc = subprocess.Popen(
        python_module("laya_onnx", "serve", str(bundle), "--port", str(port)),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        yield port, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


async def warm(port: int, soak: Soak) -> None:
    """A warm server: the first requests load what every later one uses."""
    for _ in range(3):
        await exchange(port, soak.post("/v1/systemone", soak.bodies.small))


def run_soak(
    bundle: os.PathLike[str] | str,
    minutes: float = DEFAULT_MINUTES,
    progress: Callable[[str], Any] = print,
    log_path: os.PathLike[str] | str | None = None,
    settle_s: float = 10.0,
) -> dict[str, Any]:
    """Serve `bundle` in a child process, soak it for `minutes`, stop it; the figures (the idle
    ones after `settle_s` seconds of quiet, time for the server to give memory back)."""
    with served(bundle, log_path) as (port, proc):

        async def main() -> dict[str, Any]:
            await wait_healthy(port, proc)
            soak = Soak(port, proc.pid, minutes * 60.0, progress)
            await warm(port, soak)
            idle_before = await _idle_figures(proc.pid, 2.0)
            await soak.run()
            idle_after = await _idle_figures(proc.pid, settle_s)
            return _report(soak, bundle, minutes, idle_before, idle_after)

        return asyncio.run(main())


def format_summary(report: dict[str, Any]) -> str:
    """The soak in a few lines: the honest clients, each hostile kind's outcomes, /health's
    latency, and memory, descriptors and threads before, at most and after."""
    honest, health = report["honest"], report["health_ms"]
    stalls = next((v for k, v in health.items() if k.startswith("over_")), 0)
    lines = [
        "%s, %g min against %s" % (report["cpu"], report["minutes"], report["bundle"]),
        "honest: %d answered, refused or failed %s, latency p50 %s / p99 %s ms"
        % (
            honest["answered"],
            honest["refused_or_failed"] or "none",
            honest["latency_ms"]["p50"],
            honest["latency_ms"]["p99"],
        ),
        "/health: n=%s p50 %s / p99 %s / max %s ms, %s over %d ms"
        % (health["n"], health["p50"], health["p99"], health["max"], stalls, HEALTH_STALL_MS),
    ]
    lines += ["hostile %-24s %s" % (kind, outcomes) for kind, outcomes in report["hostile"].items()]
    for what in ("rss_mib", "fds", "threads"):
        lines.append("%-8s %s" % (what, "  ".join("%s %s" % kv for kv in report[what].items())))
    return "\n".join(lines)


def _report(
    soak: Soak, bundle: Any, minutes: float, before: dict[str, Any], after: dict[str, Any]
) -> dict[str, Any]:
    rss = [s["rss_mib"] for s in soak.samples if "rss_mib" in s]
    fds = [s["fds"] for s in soak.samples if "fds" in s]
    every = max(1, round(30.0 / SAMPLE_EVERY_S))
    return {
        "bundle": Path(str(bundle)).name,
        "minutes": minutes,
        "cpu": cpu_class(),
        "honest": {
            "answered": soak.honest.get("200", 0),
            "refused_or_failed": {k: v for k, v in soak.honest.items() if k != "200"},
            "latency_ms": summary_ms(soak.honest_ms),
        },
        "hostile": {kind: dict(outcomes) for kind, outcomes in sorted(soak.hostile.items())},
        "health_ms": {
            **summary_ms(soak.health_ms),
            "over_%dms" % HEALTH_STALL_MS: sum(1 for v in soak.health_ms if v > HEALTH_STALL_MS),
        },
        "rss_mib": {
            "idle_before": before.get("rss_mib"),
            "min": min(rss, default=None),
            "max": max(rss, default=None),
            "idle_after": after.get("rss_mib"),
        },
        "fds": {
            "idle_before": before.get("fds"),
            "max": max(fds, default=None),
            "idle_after": after.get("fds"),
        },
        "threads": {"idle_before": before.get("threads"), "idle_after": after.get("threads")},
        "samples_every_30s": soak.samples[::every],
        "samples": soak.samples,  # every SAMPLE_EVERY_S, with /health's latency in that window
    }
