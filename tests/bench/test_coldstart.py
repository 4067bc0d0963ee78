"""`laya-onnx bench coldstart`: fresh processes timed from spawn to the first answer (figures
printed, never asserted against a target: only their shape and consistency)."""

from __future__ import annotations

import json

from laya_onnx.bench.coldstart import STEPS, format_report, run_coldstart
from laya_onnx.core.verified import RECORDS_DIR


def test_coldstart_times_each_step_of_fresh_processes(tiny_english):
    report = run_coldstart([str(tiny_english)], repeats=2, threads=1, progress=False)
    steps = report["runtimes"][str(tiny_english)]
    assert set(steps) == set(STEPS) and report["repeats"] == 2 and report["cpu"]
    for name in ("import_s", "load_s", "first_s"):
        assert 0 < steps[name]["min"] <= steps[name]["median"] <= steps[name]["max"]
    parts = sum(steps[name]["min"] for name in ("import_s", "load_s", "first_s"))
    assert parts <= steps["total_s"]["max"] + 1e-6
    assert 20 < steps["peak_rss_mb"]["median"] < 4096  # a process's own VmHWM, in MiB
    assert "vs_reference" not in report
    table = format_report(report)
    assert "cold start, 1 threads, 2 repeats" in table and str(tiny_english) in table


def test_the_cli_writes_the_report(tiny_english, tmp_path):
    from laya_onnx.cli import main

    out = tmp_path / "cold.json"
    assert main(["bench", "coldstart", str(tiny_english), "--repeats", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["threads"] == 2 and list(report["runtimes"]) == [str(tiny_english)]
    assert main(["bench", "coldstart", str(tiny_english), "--repeats", "0"]) == 2


def test_coldstart_runs_each_bundle_from_its_prepared_graph_too(tiny_english, tmp_path):
    report = run_coldstart(
        [str(tiny_english)], repeats=1, threads=1, progress=False, session_cache=str(tmp_path)
    )
    assert list(report["runtimes"]) == [str(tiny_english), f"{tiny_english} (prepared)"]
    made = [p for p in tmp_path.iterdir() if p.name != RECORDS_DIR]
    assert len(made) == 1  # made once, before the timed runs
