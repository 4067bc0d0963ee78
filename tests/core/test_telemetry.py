"""onnxruntime's telemetry stays off: a process that uses laya-onnx writes nothing under its home
(onnxruntime would otherwise create ~/.cache/Microsoft/DeveloperTools/ on import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def fresh_env(home) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    return env


def written_under(home) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


@pytest.mark.parametrize("how", ["library", "cli"])
def test_a_fresh_process_writes_nothing_under_home(bundle_factory, tmp_path, how):
    bundle = str(bundle_factory("tiny-english"))
    home = tmp_path / "home"
    home.mkdir()
    request = json.dumps({"state": "x", "questions": {"r": {"type": "noul", "instructions": "R?"}}})
    if how == "library":
        code = (
            "import sys, json, warnings; warnings.simplefilter('ignore')\n"
            "from laya_onnx import ONNXAgent\n"
            "print(ONNXAgent(sys.argv[1]).predict('x', json.loads(sys.argv[2])['questions'])['answers'])"
        )
        argv = [sys.executable, "-c", code, bundle, request]
    else:
        argv = [sys.executable, "-m", "laya_onnx", "predict", bundle, "--request", request]
    done = subprocess.run(
        argv, env=fresh_env(home), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "noul" in done.stdout
    assert written_under(home) == []


def test_an_explicit_setting_wins(tmp_path):
    """ORT_DISABLE_TELEMETRY is only defaulted: a value the operator set is kept."""
    env = fresh_env(tmp_path)
    env["ORT_DISABLE_TELEMETRY"] = "0"
    code = "import os, laya_onnx.core; print(os.environ['ORT_DISABLE_TELEMETRY'])"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "0", done.stderr
