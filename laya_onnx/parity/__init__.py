"""Parity: proof that laya-onnx answers exactly as the reference `laya` 0.4.15 does.

Needs the reference package (and so torch): install the `dev` extra. Nothing in the runtime
imports this package.
"""

from laya_onnx.parity.runner import ParityReport, run_parity
from laya_onnx.parity.suite import load_suite

__all__ = ["ParityReport", "load_suite", "run_parity"]
