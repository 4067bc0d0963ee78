"""`--plot FILE` on every bench and on parity: each writes a PNG of the figure's size, fed by a
small real run on tiny-english where one takes seconds (agent, saturate, memory, parity) and by
the bench's own report builder where a real run takes minutes (soak) or needs a server elsewhere
(http); without matplotlib the option is refused, naming the plot extra, before anything runs."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from laya_onnx.cli import main

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")

from laya_onnx.bench.plot import SIZE_PX

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, the first after the signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR", head
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def drawn(capsys, argv: list[str], path: Path) -> str:
    status = main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "figure written: %s" % path in out
    assert png_size(path) == SIZE_PX
    return out


@pytest.mark.torch
@pytest.mark.reference
def test_bench_agent_plots_speed_against_dp(checkpoint_factory, bundle_factory, tmp_path, capsys):
    path = tmp_path / "agent.png"
    argv = ["bench", "agent", str(checkpoint_factory("tiny-english")), str(bundle_factory("tiny-english"))]
    drawn(
        capsys, [*argv, "--repeats", "1", "--workloads", "short-1x1", "--no-rss", "--plot", str(path)], path
    )


def test_agent_points_place_each_runtime_by_its_speedup_and_gap(tmp_path):
    """The points of a report with laya torch bf16 (a measured run has it only on a CPU with
    bf16), and the figure drawn from them."""
    from laya_onnx.bench.plot import _agent_points, plot_agent

    workload = {
        "cpu": "AMD EPYC",
        "bundles": {
            "m/int8": {
                "speedup_vs_reference": 2.5,
                "agreement": {"max_printed_gap": 0.003, "decisions_identical": False},
            }
        },
        "reference_bf16": {"speedup": 1.4, "agreement": {"max_printed_gap": 0.01}},
    }
    other = json.loads(json.dumps(workload))
    other["bundles"]["m/int8"]["speedup_vs_reference"] = 3.5
    report = {"bundles": {"m/int8": {"precision": "int8"}}, "workloads": {"a": workload, "b": other}}
    points = {p["label"]: p for p in _agent_points(report)}
    assert list(points) == ["laya torch f32", "laya torch bf16", "int8 (int8)"]
    assert points["int8 (int8)"]["speedups"] == [2.5, 3.5] and points["int8 (int8)"]["gap"] == 0.003
    assert points["int8 (int8)"]["differ"] is True and points["laya torch bf16"]["gap"] == 0.01
    assert png_size(plot_agent(report, tmp_path / "agent.png")) == SIZE_PX


@pytest.mark.serve
def test_bench_saturate_plots_throughput_and_latency(tiny_english, tmp_path, capsys):
    path = tmp_path / "saturate.png"
    argv = ["bench", "saturate", str(tiny_english), "--clients", "2", "--seconds", "1"]
    drawn(capsys, [*argv, "--plot", str(path)], path)


def test_bench_http_plots_each_client_count(monkeypatch, tmp_path, capsys):
    from laya_onnx.bench import http
    from laya_onnx.bench.plot import load_runs_of_http

    def run(clients: int, per_s: float, p50: float, p99: float) -> dict:
        statuses = {"200": int(per_s * 10), **({"503": 4} if clients > 8 else {})}
        latency = {"n": statuses["200"], "p50": p50, "p99": p99, "max": p99 * 1.5}
        return {"clients": clients, "answered_per_s": per_s, "statuses": statuses, "latency_ms_200": latency}

    runs = [run(1, 90.0, 10.5, 14.0), run(8, 300.0, 26.0, 48.0), run(32, 310.0, 101.0, 190.0)]
    report = {"url": "http://127.0.0.1:9", "seconds": 10.0, "runs": {str(r["clients"]): r for r in runs}}
    monkeypatch.setattr(http, "drive_server", lambda *a, **k: report)
    assert [r["refused"] for r in load_runs_of_http(report)] == [0, 0, 4]
    path = tmp_path / "http.png"
    drawn(capsys, ["bench", "http", "http://127.0.0.1:9", "--plot", str(path)], path)


def test_bench_soak_plots_rss_fds_and_health_over_time(monkeypatch, tmp_path, capsys):
    from laya_onnx.bench import soak

    # the soak's own report, from a Soak whose sampler saw /health answer in each window
    run = soak.Soak(port=9, pid=1, seconds=60.0, progress=print)
    run.honest.update({"200": 600})
    run.honest_ms.extend([8.0] * 600)
    for i in range(12):
        window = [1.0 + (i % 3), 2.0, 40.0 if i == 7 else 3.0]
        run.health_ms.extend(window)
        run.samples.append(
            {"t_s": 5.0 * i, "rss_mib": 120.0 + i, "fds": 20 + i % 4, **soak.health_window(window)}
        )
    report = soak._report(
        run, "tiny-english", 1.0, {"rss_mib": 118.0, "fds": 19}, {"rss_mib": 125.0, "fds": 19}
    )
    assert report["samples"][7]["health_max_ms"] == 40.0 and report["samples"][0]["health_p50_ms"] == 2.0
    monkeypatch.setattr(soak, "run_soak", lambda *a, **k: report)
    path = tmp_path / "soak.png"
    drawn(capsys, ["bench", "soak", "BUNDLE", "--minutes", "1", "--plot", str(path)], path)


def test_bench_memory_plots_the_model_against_measured_passes(tiny_english, tmp_path, capsys):
    from laya_onnx.bench.memory import pass_model_of

    figures = pass_model_of(tiny_english)
    assert figures["model"]["source"] and figures["probes"], figures  # tiny-english's memory is measured
    path = tmp_path / "memory.png"
    argv = ["bench", "memory", str(tiny_english), "--states", "1", "--words", "60", "--tokens", "64"]
    drawn(capsys, [*argv, "--repeats", "1", "--plot", str(path)], path)


@pytest.mark.torch
@pytest.mark.reference
def test_parity_plots_every_dp_and_the_agreement(checkpoint_factory, bundle_factory, tmp_path, capsys):
    from tests.parity_support import suite_sample

    suite = suite_sample("core", tmp_path, fraction=0.08)
    path, report = tmp_path / "parity.png", tmp_path / "parity.json"
    argv = ["parity", str(checkpoint_factory("tiny-english")), str(bundle_factory("tiny-english"))]
    drawn(capsys, [*argv, "--suite", str(suite), "--report", str(report), "--plot", str(path)], path)
    cases = json.loads(report.read_text())["cases"]
    # every option probability's |Δp|, not only each request's largest
    assert sum(len(c["abs_dps"]) for c in cases) > len([c for c in cases if c["abs_dps"]])
    assert all(max(c["abs_dps"], default=0.0) == pytest.approx(c["max_abs_dp"], rel=1e-2) for c in cases)


def test_plot_without_matplotlib_names_the_extra_before_running(monkeypatch, capsys, tmp_path):
    from laya_onnx.bench import http

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(http, "drive_server", lambda *a, **k: pytest.fail("the bench ran"))
    status = main(["bench", "http", "http://127.0.0.1:9", "--plot", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert status == 2 and "matplotlib" in err and "pip install 'laya-onnx[plot]'" in err, err
    assert not (tmp_path / "x.png").exists()
