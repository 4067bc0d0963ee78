"""The torch side of laya-onnx: our DecisionModel and the checkpoint -> bundle exporter.

Needs the `export` extra (torch, transformers, safetensors, onnx, onnxscript). The runtime
never imports this package. The names below load the exporter (and torch) on first use, so the
command line reads `precision`'s gates and plans for its help without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laya_onnx.export.errors import ExportError, ExportOptionError, ValidationError
    from laya_onnx.export.exporter import export_bundle
    from laya_onnx.export.model import DecisionModel, load_decision_model
    from laya_onnx.export.options import ExportOptions
    from laya_onnx.export.validation import validate_graph

_LAZY = {
    **dict.fromkeys(("ExportError", "ExportOptionError", "ValidationError"), "errors"),
    "ExportOptions": "options",
    "export_bundle": "exporter",
    "validate_graph": "validation",
    **dict.fromkeys(("DecisionModel", "load_decision_model"), "model"),
}

__all__ = [
    "DecisionModel",
    "ExportError",
    "ExportOptionError",
    "ExportOptions",
    "ValidationError",
    "export_bundle",
    "load_decision_model",
    "validate_graph",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"laya_onnx.export.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'laya_onnx.export' has no attribute {name!r}")
