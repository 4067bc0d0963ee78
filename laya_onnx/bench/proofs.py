"""`laya-onnx bench soak BUNDLE --proofs`: three attacks, one at a time, on a `laya-onnx serve`
process with a key and otherwise the default settings, each beside the figure that shows the
server held (the soak's clients, `soak.py`):

  * work bombs: a 64-state × 64-question batch at `max_len` 7400, then 8 and 2 questions at
    `max_len` 7000 on one long state (2 rows of 7000 tokens: one large pass within the
    default budget), each from a client that hangs up after 3 s; then the README request: its
    status and its time from the hang-up. And what a request over the budget gets when its
    client waits for the answer (the 413 that names the estimate and the setting).
  * gzip bombs: three 1 GiB gzip bombs in a row while `/health` is polled every 50 ms: what
    the bombs got and the polls' p50/p99/max.
  * slow uploaders: 16 authorised uploaders sending their bodies at 1 byte/s, then the README
    request, three times while they hold their connections: status and latency.

With each: the load average before and after, the server's RSS and its peak RSS over the
attack (Linux's VmHWM, reset per attack where /proc lets it be), and the access lines the
attack added, by how each request ended (`cancelled` when its client left before the answer). The CPU class heads the report. Figures are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from laya_onnx.bench.http import summary_ms
from laya_onnx.bench.soak import (
    HEALTH_STALL_MS,
    Soak,
    cpu_class,
    exchange,
    exchange_raw,
    process_figures,
    served,
    wait_healthy,
    warm,
)

#: When the work bombs' clients hang up.
HANG_UP_S = 3.0
GZIP_BOMBS = 3
SLOW_UPLOADERS = 16
#: How long the slow uploaders have been sending before the README request goes.
UPLOADERS_FIRST_S = 3.0


def _reset_peak_rss(pid: int) -> bool:
    """Start `pid`'s VmHWM again from its RSS now (Linux, our own child); whether it could."""
    try:
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _detail(raw: bytes) -> Any:
    """The JSON body of a raw HTTP response (its `detail` when there is one)."""
    _, _, body = raw.partition(b"\r\n\r\n")
    try:
        payload = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    return payload.get("detail", payload) if isinstance(payload, dict) else payload


class Proofs(Soak):
    """The soak's clients, run as three scripted attacks."""

    def __init__(self, port: int, pid: int, log_path: Path):
        super().__init__(port, pid, 0.0, print)
        self.log_path = log_path

    async def readme_request(self) -> dict[str, Any]:
        status, seconds = await exchange(self.port, self.post("/v1/systemone", self.bodies.small))
        return {"status": status, "seconds": round(seconds, 3)}

    async def work_bombs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        # one large pass within the default budget: 2 rows of 7000 tokens
        within = json.loads(self.bodies.over_budget)
        within["questions"] = dict(list(within["questions"].items())[:2])
        for name, path, body in (
            ("64 states x 64 questions, max_len 7400", "/v1/systemone/batch", self.bodies.work_bomb),
            ("1 long state, 8 questions, max_len 7000", "/v1/systemone", self.bodies.over_budget),
            ("1 long state, 2 questions, max_len 7000", "/v1/systemone", json.dumps(within).encode()),
        ):
            status, seconds = await exchange(self.port, self.post(path, body), timeout=HANG_UP_S)
            bomb = (
                "client hung up after %.0f s" % HANG_UP_S
                if status == "timeout"
                else "%s after %.2f s" % (status, seconds)
            )
            out[name] = {"bomb": bomb, "then the README request": await self.readme_request()}
        # over the default budget at any CPU speed this bench meets (~7 TFLOP), and quick to encode
        over = json.loads(self.bodies.over_budget)
        over.update(questions=json.loads(self.bodies.work_bomb)["questions"], max_len=8192)
        data = self.post("/v1/systemone", json.dumps(over).encode())
        status, raw, seconds = await exchange_raw(self.port, data)
        out["1 long state, 64 questions, max_len 8192, client waits"] = {
            "status": status,
            "seconds": round(seconds, 2),
            "detail": _detail(raw),
        }
        return out

    async def gzip_bombs_under_health(self) -> dict[str, Any]:
        self.health_ms.clear()
        self.stop.clear()
        poller = asyncio.ensure_future(self.health())
        await asyncio.sleep(1.0)
        bombs = []
        for _ in range(GZIP_BOMBS):
            data = self.post("/v1/systemone", self.bodies.gzip_bomb, [("Content-Encoding", "gzip")])
            status, raw, seconds = await exchange_raw(self.port, data)
            bombs.append({"status": status, "seconds": round(seconds, 2), "detail": _detail(raw)})
        await asyncio.sleep(1.0)
        self.stop.set()
        await poller
        health = summary_ms(self.health_ms)
        health["over_%dms" % HEALTH_STALL_MS] = sum(1 for v in self.health_ms if v > HEALTH_STALL_MS)
        return {
            "bombs (1 GiB of zeros, gzip, %d KiB sent)" % (len(self.bodies.gzip_bomb) // 1024): bombs,
            "health_ms": health,
        }

    async def slow_uploads(self) -> dict[str, Any]:
        uploads = [asyncio.ensure_future(self.slow_upload()) for _ in range(SLOW_UPLOADERS)]
        await asyncio.sleep(UPLOADERS_FIRST_S)
        requests = [await self.readme_request() for _ in range(3)]
        held = sum(1 for u in uploads if not u.done())
        outcomes = Counter(await asyncio.gather(*uploads))
        return {
            "the README request while they upload": requests,
            "uploaders still sending after the requests": held,
            "uploaders got": dict(outcomes),
        }

    async def measured(self, attack: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """One attack, with the load average, RSS and peak RSS around it and the access lines it
        added, counted by how each request ended."""
        ended = self._access_lines()
        reset = _reset_peak_rss(self.pid)
        before = process_figures(self.pid)
        load_before = os.getloadavg()
        figures = await attack()
        after = process_figures(self.pid)
        figures["server"] = {
            "rss_mib_before": before.get("rss_mib"),
            "rss_mib_after": after.get("rss_mib"),
            ("peak_rss_mib" if reset else "peak_rss_mib_since_start"): after.get("peak_rss_mib"),
            "access_log_ended": dict(await self._settled_access_lines() - ended),
        }
        figures["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
        return figures

    async def _settled_access_lines(self, quiet_s: float = 0.5, most_s: float = 5.0) -> Counter[str]:
        """The access lines once the server has stopped adding to them: it writes a cut
        request's line when it notices the cut, which can come after the client has gone."""
        lines, waited = self._access_lines(), 0.0
        while waited < most_s:
            await asyncio.sleep(quiet_s)
            waited += quiet_s
            now = self._access_lines()
            if now == lines:
                return now
            lines = now
        return lines

    def _access_lines(self) -> Counter[str]:
        """The access log's lines so far, counted by their `ended=` field."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return Counter()
        return Counter(re.findall(r" ended=([a-z-]+)$", text, re.MULTILINE))


def run_proofs(
    bundle: os.PathLike[str] | str, log_path: os.PathLike[str] | str | None = None
) -> dict[str, Any]:
    """Serve `bundle` in a child process (default settings, a key, the access log on), run the
    three proofs one after another, stop it; the figures."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(log_path) if log_path else Path(tmp) / "server.log"
        with served(bundle, log, quiet=False) as (port, proc):

            async def main() -> dict[str, Any]:
                await wait_healthy(port, proc)
                proofs = Proofs(port, proc.pid, log)
                await warm(port, proofs)
                report: dict[str, Any] = {
                    "bundle": str(bundle),
                    "cpu": cpu_class(),
                    "server_idle": process_figures(proc.pid),
                }
                for name, attack in (
                    ("work bombs, clients gone after %.0f s" % HANG_UP_S, proofs.work_bombs),
                    ("%d gzip bombs under /health every 50 ms" % GZIP_BOMBS, proofs.gzip_bombs_under_health),
                    ("%d slow uploaders at 1 byte/s" % SLOW_UPLOADERS, proofs.slow_uploads),
                ):
                    report[name] = await proofs.measured(attack)
                peaks = [
                    figures["server"].get("peak_rss_mib") or figures["server"].get("peak_rss_mib_since_start")
                    for figures in report.values()
                    if isinstance(figures, dict) and "server" in figures
                ]
                report["server_peak_rss_mib"] = max((p for p in peaks if p), default=None)
                return report

            return asyncio.run(main())


def format_summary(report: dict[str, Any]) -> str:
    """The proofs in a few lines: per attack, what each request got, then the server's figures."""
    lines = [
        "%s, against %s (idle RSS %s MiB)"
        % (report["cpu"], report["bundle"], report["server_idle"].get("rss_mib"))
    ]
    for name, figures in report.items():
        if not isinstance(figures, dict) or "server" not in figures:
            continue
        server, load = figures["server"], figures["load_average_before_after"]
        peak = server.get("peak_rss_mib") or server.get("peak_rss_mib_since_start")
        lines.append(
            "%s: load %s -> %s, RSS %s -> %s MiB, peak %s MiB, access lines %s"
            % (
                name,
                load[0],
                load[1],
                server["rss_mib_before"],
                server["rss_mib_after"],
                peak,
                ", ".join("%d %s" % (n, e) for e, n in sorted(server["access_log_ended"].items())) or "none",
            )
        )
        for what, outcome in figures.items():
            if what not in ("server", "load_average_before_after"):
                lines.append("  %s: %s" % (what, _outcome(outcome)))
    return "\n".join(lines)


def _outcome(outcome: Any) -> str:
    if isinstance(outcome, list):
        return "; ".join(_outcome(item) for item in outcome)
    if isinstance(outcome, dict) and "status" in outcome:
        text = "%s in %s s" % (outcome["status"], outcome["seconds"])
        return text + (" (%s)" % outcome["detail"] if "detail" in outcome else "")
    if isinstance(outcome, dict):
        return ", ".join("%s %s" % (k, _outcome(v)) for k, v in outcome.items())
    return str(outcome)
