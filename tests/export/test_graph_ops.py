"""The exported graph avoids op forms a supported execution provider gets wrong."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch  # onnx (export extra) reads the graph

INTEGER_TYPES = {6, 7}  # onnx.TensorProto.INT32, INT64


@pytest.mark.parametrize("preset", ["tiny-english", "tiny-typed-decisions"])
def test_no_clip_on_an_integer_tensor(preset, bundle_factory):
    """OpenVINO's EP turns an int64 Clip without an upper bound (INT64_MAX) into zeros: the
    marker positions all read position 0 and every answer is wrong (export/README.md)."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(bundle_factory(preset) / "laya.onnx")))
    types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.value_info, *model.graph.input]}
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    assert clips, "the graph has no Clip at all: this test would check nothing"
    assert [n.name for n in clips if types.get(n.input[0]) in INTEGER_TYPES] == []
