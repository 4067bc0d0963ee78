"""Parity: proof that laya-onnx answers exactly as the reference `laya` 0.4.15 does.

`rule` (the parity rule), `observe`, `suite` and `versions` are torch-free, so a box without torch
judges its answers against recorded golden answers. `runner` (`run_parity`), `golden` (the
recorder) and `bench` run the reference and need the `dev` extra (laya, torch). Nothing in the
runtime imports this package.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # Lazy, so importing the torch-free parts never loads the runner's imports.
    if name in ("ParityReport", "run_parity"):
        from laya_onnx.parity import runner

        return getattr(runner, name)
    if name == "load_suite":
        from laya_onnx.parity.suite import load_suite

        return load_suite
    raise AttributeError(f"module 'laya_onnx.parity' has no attribute {name!r}")


__all__ = ["ParityReport", "load_suite", "run_parity"]
