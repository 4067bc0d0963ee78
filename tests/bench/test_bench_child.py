"""Bench children run the laya_onnx their parent runs (`laya_onnx/bench/child.py`)."""

from __future__ import annotations

import subprocess
import sys

import laya_onnx
from laya_onnx.bench.child import python_module


def test_a_bench_child_imports_this_laya_onnx_whatever_its_working_directory_holds(tmp_path):
    shadow = tmp_path / "laya_onnx"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('the copy in the working directory')\n")
    (shadow / "__main__.py").write_text("")

    # what `python -m` imports there: the working directory's copy
    plain = subprocess.run(
        [sys.executable, "-m", "laya_onnx", "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode != 0 and "the copy in the working directory" in plain.stderr

    done = subprocess.run(
        python_module("laya_onnx", "--version"), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert laya_onnx.__version__ in done.stdout
