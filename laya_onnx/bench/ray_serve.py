"""Ray Serve with N replicas vs one `laya-onnx serve` process, same load, interleaved rounds.

    python -m laya_onnx.bench.ray_serve BUNDLE [--config serve/ray/serve-config.yaml]
        [--replicas 2] [--clients 16] [--seconds 8] [--rounds 3]

Both fronts are up for the whole run; each round loads one, then the other, with `laya_onnx.bench.http`'s
load generator (a child process posting the README request as fast as it is answered, 503s
retried), so the ratio of each round is taken under the same box noise. The Ray side is the
config file (its port, bundle and replica count replaced), on a local Ray instance with this
machine's CPUs. Memory is reported beside the figures: the server's peak RSS, and for Ray the
RSS of every process of its session (GCS, raylet, controller, proxy, replicas, workers) at the
end, summed. Prints one JSON document; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from laya_onnx.bench.child import python_module
from laya_onnx.bench.http import DEFAULT_DEADLINE_S, run_child
from laya_onnx.bench.sample import README_REQUEST
from laya_onnx.core import settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("%s did not answer /health within %.0f s" % (url, timeout))


def _status_kib(pid: int, field: str) -> int:
    try:
        for line in Path("/proc/%d/status" % pid).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _load(url: str, payload: bytes, clients: int, seconds: float) -> dict[str, Any]:
    window = [url, str(clients), str(seconds), str(DEFAULT_DEADLINE_S), "0"]
    return asyncio.run(run_child("load", *window, stdin=payload, timeout=60.0 + seconds + DEFAULT_DEADLINE_S))


def _ray_config(config: Path, bundle: str, port: int, replicas: int, out: Path) -> Path:
    import yaml

    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["http_options"]["port"] = port
    (app,) = data["applications"]
    app["args"]["bundle"] = str(Path(bundle).resolve())
    for deployment in app["deployments"]:
        if deployment["name"] == "LayaModel":
            deployment.pop("autoscaling_config", None)
            deployment["num_replicas"] = replicas
    out.write_text(yaml.safe_dump(data), encoding="utf-8")
    return out


def run(
    bundle: str, config: Path, replicas: int, clients: int, seconds: float, rounds: int
) -> dict[str, Any]:
    import ray

    from laya_onnx.score.ray_data import join_ray
    from laya_onnx.serve.ray_app import run_config

    payload = json.dumps(README_REQUEST).encode("utf-8")
    env = settings.without_settings(os.environ)
    env[settings.LOG_LEVEL.env] = "warning"
    plain_port, ray_port = _free_port(), _free_port()
    plain = subprocess.Popen(
        python_module("laya_onnx", "serve", bundle, "--port", str(plain_port)),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    plain_url, ray_url = "http://127.0.0.1:%d" % plain_port, "http://127.0.0.1:%d" % ray_port
    out: dict[str, Any] = {
        "clients": clients,
        "seconds": seconds,
        "replicas": replicas,
        "cpus": os.cpu_count(),
    }
    try:
        _wait_health(plain_url, 120)
        t0 = time.monotonic()
        join_ray(include_dashboard=False, log_to_driver=False, configure_logging=False)
        with tempfile.TemporaryDirectory() as tmp:
            run_config(
                str(_ray_config(config, bundle, ray_port, replicas, Path(tmp) / "c.yaml")), blocking=False
            )
            _wait_health(ray_url, 300)
        out["ray_start_s"] = round(time.monotonic() - t0, 1)
        _load(plain_url, payload, 2, 2.0)  # warm both before timing
        _load(ray_url, payload, 2, 2.0)
        per_round = []
        for _ in range(rounds):
            a = _load(plain_url, payload, clients, seconds)
            b = _load(ray_url, payload, clients, seconds)
            per_round.append(
                {
                    "serve": a,
                    "ray": b,
                    "ratio_ray_over_serve": round(b["answered_per_s"] / a["answered_per_s"], 3),
                }
            )
        out["rounds"] = per_round
        ratios = [r["ratio_ray_over_serve"] for r in per_round]
        out["ratio_range"] = [min(ratios), max(ratios)]
        out["serve_peak_rss_mib"] = round(_status_kib(plain.pid, "VmHWM") / 1024, 1)
        ray_pids = [p for p in _descendants(os.getpid()) if p != plain.pid]
        out["ray_processes"] = len(ray_pids)
        out["ray_rss_sum_mib"] = round(sum(_status_kib(p, "VmRSS") for p in ray_pids) / 1024, 1)
        out["ray_peak_rss_sum_mib"] = round(sum(_status_kib(p, "VmHWM") for p in ray_pids) / 1024, 1)
    finally:
        plain.terminate()
        plain.wait(30)
        if ray.is_initialized():
            from ray import serve

            serve.shutdown()
            ray.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m laya_onnx.bench.ray_serve", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("bundle")
    p.add_argument("--config", type=Path, default=Path("serve/ray/serve-config.yaml"))
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    print(
        json.dumps(
            run(args.bundle, args.config, args.replicas, args.clients, args.seconds, args.rounds), indent=2
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
