"""`ExportOptions`: everything an export can be asked for, checked once, when the options are made.

A bad value raises `ExportOptionError` naming the option, before anything is read or written.
The checks that depend on the filesystem (the output directory, the calibration file) are the
export's first step, when it runs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from laya_onnx.core.bundle import DEFAULT_EXTERNAL_DATA_THRESHOLD
from laya_onnx.export.errors import ExportOptionError
from laya_onnx.export.precision import (
    DEFAULT_PRECISION,
    Int8Plan,
    PrecisionBar,
    check_int8_plan,
    check_precision,
)

DEFAULT_OPSET = 17
#: scaled_dot_product_attention needs opset 14.
MIN_OPSET = 14
DEFAULT_TOLERANCE = 1e-4
DYNAMO_MIN_OPSET = 18
#: Attention graphs the exporter can write (`DecisionModel.use_attention`).
ATTENTION_KINDS = ("fused", "unfused")
#: The TorchScript exporter writes fused attention (one MultiHeadAttention node per layer, masks
#: built once); "unfused" keeps transformers' op-by-op SDPA graph, the only one dynamo writes.
DEFAULT_ATTENTION = "fused"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ExportOptions:
    """How `export_bundle` exports a checkpoint (see its docstring for what each option does).

    `attention` None means the exporter's own kind (`attention_kind`: "unfused" with `dynamo`,
    else "fused").
    """

    revision: str | None = None
    opset: int = DEFAULT_OPSET
    tolerance: float = DEFAULT_TOLERANCE
    dynamo: bool = False
    force: bool = False
    verbose: bool = True
    cache_dir: os.PathLike | str | None = None
    name: str | None = None
    attention: str | None = None
    measure_memory: bool = True
    external_data_threshold: int = DEFAULT_EXTERNAL_DATA_THRESHOLD
    optimize: bool = False
    calibration: os.PathLike | str | None = None
    precision: str = DEFAULT_PRECISION
    precision_bar: PrecisionBar | None = None
    int8_plan: Int8Plan | None = None

    def __post_init__(self) -> None:
        try:
            check_int8_plan(self.precision, self.int8_plan)
            check_precision(self.precision)
        except ValueError as exc:
            raise ExportOptionError(str(exc)) from None
        if self.precision_bar is not None and not isinstance(self.precision_bar, PrecisionBar):
            raise ExportOptionError(f"precision_bar must be a PrecisionBar, got {self.precision_bar!r}")
        for flag in ("dynamo", "force", "verbose", "measure_memory", "optimize"):
            if not isinstance(getattr(self, flag), bool):
                raise ExportOptionError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        for text in ("revision", "name"):
            if getattr(self, text) is not None and not isinstance(getattr(self, text), str):
                raise ExportOptionError(f"{text} must be a string, got {getattr(self, text)!r}")
        attention = self.attention_kind
        if attention not in ATTENTION_KINDS:
            raise ExportOptionError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
        if self.dynamo and attention == "fused":
            raise ExportOptionError(
                "fused attention is written by the TorchScript exporter; use attention='unfused' with dynamo"
            )
        if not _is_int(self.opset) or self.opset < MIN_OPSET:
            raise ExportOptionError(
                f"opset must be an integer >= {MIN_OPSET} (scaled_dot_product_attention), got {self.opset!r}"
            )
        if not _is_int(self.external_data_threshold) or self.external_data_threshold < 0:
            raise ExportOptionError(
                "external_data_threshold must be a non-negative number of bytes, got "
                f"{self.external_data_threshold!r}"
            )
        tolerance = self.tolerance
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
            raise ExportOptionError(f"tolerance must be a positive number, got {tolerance!r}")
        if not (math.isfinite(tolerance) and tolerance > 0):
            raise ExportOptionError(f"tolerance must be a positive number, got {tolerance!r}")

    @property
    def attention_kind(self) -> str:
        """The attention the graph is written with."""
        if self.attention is None:
            return "unfused" if self.dynamo else DEFAULT_ATTENTION
        return self.attention

    @property
    def constant_shape_layers(self) -> bool:
        """Whether the encoder layers are traced with constant shapes (`constant_shapes.py`): for
        the fused graph of the TorchScript exporter, but not for a bf16 bundle. OpenVINO, which
        runs bf16 bundles, fuses transformers' traced RoPE into its own RoPE kernel and not
        ours; with ours the bf16 answers of random-english-large moved further from fp32 (max
        printed gap 0.0022 -> 0.0152 on one question, 0.0168 -> 0.0237 on three)."""
        return self.attention_kind == "fused" and not self.dynamo and self.precision != "bf16"

    @property
    def rotary_op(self) -> bool:
        """Whether those layers' RoPE is one `com.microsoft.RotaryEmbedding` (`constant_shapes.Rotary`):
        for int8 graphs only. onnxruntime computes it in one pass (RoPE 3.0% -> 0.8% of the kernel
        time of one question on random-english-large) but not bit for bit as the formula, and
        fp32 and fp16 graphs keep answering as transformers' layers do."""
        return self.constant_shape_layers and self.precision == "int8"

    @property
    def graph_opset(self) -> int:
        """The opset the graph is written at: the dynamo exporter translates at 18+ (converting its
        graph down to 17 leaves opset-18 attributes behind, e.g. Split's num_outputs)."""
        return max(self.opset, DYNAMO_MIN_OPSET) if self.dynamo else self.opset

    @property
    def lowered(self) -> bool:
        """Whether the validated fp32 graph is lowered to another precision."""
        return self.precision != DEFAULT_PRECISION
