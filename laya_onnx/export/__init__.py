"""The torch side of laya-onnx: our DecisionModel and the checkpoint -> bundle exporter.

Needs the `export` extra (torch, transformers, safetensors, onnx, onnxscript). The runtime
never imports this package.
"""

from laya_onnx.export.exporter import ExportError, ValidationError, export_bundle, validate_graph
from laya_onnx.export.model import DecisionModel, load_decision_model

__all__ = [
    "DecisionModel",
    "ExportError",
    "ValidationError",
    "export_bundle",
    "load_decision_model",
    "validate_graph",
]
