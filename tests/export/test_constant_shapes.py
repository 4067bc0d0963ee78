"""The encoder layers traced with constant shapes (`laya_onnx/export/constant_shapes.py`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from trace_support import paired_outputs, trace_graph

from laya_onnx.core.bundle import Bundle

pytestmark = pytest.mark.torch

#: The ops transformers' eager forwards trace into inside each encoder layer (shape arithmetic,
#: slicing and transposes), none of which the constant-shape layers need.
SHAPE_OPS = ("Shape", "Gather", "Slice", "Transpose", "Squeeze")


def _layer_ops(path: Path) -> Counter:
    import onnx

    graph = onnx.load(str(path)).graph
    return Counter(node.op_type for node in graph.node if "/encoder/layers." in node.name)


@pytest.mark.parametrize("preset", ["tiny-english", "tiny-multilingual"])
def test_constant_shape_layers_answer_bit_for_bit_as_transformers_forwards(
    checkpoint_factory, tmp_path, preset
):
    ckpt = checkpoint_factory(preset)
    plain, plain_rewritten = trace_graph(ckpt, tmp_path / "plain.onnx", constant=False)
    constant, rewritten = trace_graph(ckpt, tmp_path / "constant.onnx", constant=True)
    assert (plain_rewritten, rewritten) == (False, True)

    # transformers' forwards trace shape arithmetic into every layer; ours none of it
    plain_ops, constant_ops = _layer_ops(plain), _layer_ops(constant)
    assert all(plain_ops[op] > 0 for op in ("Shape", "Slice", "Transpose"))
    assert {op: constant_ops[op] for op in SHAPE_OPS if constant_ops[op]} == {}
    # rotate_half's negation is in sin's table, made once per forward, not in any layer
    assert plain_ops["Neg"] > 0 and constant_ops["Neg"] == 0
    assert sum(constant_ops.values()) < sum(plain_ops.values()) // 2

    for what, expected, got in paired_outputs((plain, constant), seed=7):
        assert expected.shape == got.shape and np.array_equal(expected, got), (preset, what)


def test_the_forwards_are_restored_and_a_disabled_block_changes_nothing(checkpoint_factory):
    from transformers.models.modernbert import modeling_modernbert as mb

    from laya_onnx.export.constant_shapes import constant_shape_layers
    from laya_onnx.export.model import load_decision_model

    model, _ = load_decision_model(checkpoint_factory("tiny-english"))
    before = mb.ModernBertAttention.forward, mb.ModernBertMLP.forward
    with constant_shape_layers(model, enabled=False) as rewritten:
        assert rewritten is False and (mb.ModernBertAttention.forward, mb.ModernBertMLP.forward) == before
    with pytest.raises(KeyError), constant_shape_layers(model) as rewritten:
        assert rewritten is True and mb.ModernBertAttention.forward is not before[0]
        raise KeyError("a failed trace")
    assert (mb.ModernBertAttention.forward, mb.ModernBertMLP.forward) == before


def test_the_manifest_says_how_the_layers_were_traced(bundle_factory):
    manifest = Bundle.open(bundle_factory("tiny-english")).manifest
    assert manifest is not None and manifest.export.layers == "constant-shape"


def test_which_exports_trace_the_constant_shape_layers():
    from laya_onnx.export.options import ExportOptions

    assert ExportOptions().constant_shape_layers is True and ExportOptions().rotary_op is False
    assert ExportOptions(precision="int8").constant_shape_layers is True
    # RoPE as one op: int8 only (not bit for bit the formula)
    assert ExportOptions(precision="int8").rotary_op is True
    assert ExportOptions(precision="fp16").rotary_op is False
    # OpenVINO (bf16 bundles) fuses transformers' RoPE, not ours; the dynamo and unfused graphs
    # have no MultiHeadAttention for these layers to feed
    assert ExportOptions(precision="bf16").constant_shape_layers is False
    assert ExportOptions(dynamo=True).constant_shape_layers is False
    assert ExportOptions(attention="unfused").constant_shape_layers is False


def test_rope_as_one_op_replaces_the_formula_s_nodes_within_float32_rounding(checkpoint_factory, tmp_path):
    ckpt = checkpoint_factory("tiny-english")
    formula, _ = trace_graph(ckpt, tmp_path / "formula.onnx", constant=True)
    fused, rewritten = trace_graph(ckpt, tmp_path / "fused.onnx", constant=True, rotary_op=True)
    assert rewritten is True
    ops = _layer_ops(fused)
    layers = _layer_ops(formula)["MultiHeadAttention"]
    assert ops["RotaryEmbedding"] == 2 * layers and layers > 0  # q and k of every layer
    # the formula splits q and k into halves in every layer, the op neither
    assert _layer_ops(formula)["Split"] - ops["Split"] == 2 * layers
    for what, expected, got in paired_outputs((formula, fused), seed=11):
        assert expected.shape == got.shape, what
        assert np.abs(expected - got).max() <= 1e-4 * max(1.0, float(np.abs(expected).max())), what


def test_an_int8_manifest_says_its_rope_is_one_op(lowered):
    from laya_onnx.export.constant_shapes import ROTARY_OP_LAYERS

    manifest = Bundle.open(lowered("tiny-english", "int8")).manifest
    assert manifest is not None and manifest.export.layers == ROTARY_OP_LAYERS
