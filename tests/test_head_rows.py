"""The decision head's last layer runs only at the positions read after it (`export/model.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.torch


def _all_rows(self, x, keep, rows):
    """HeadStack.forward as it was: every layer at every position, then the rows picked."""
    from laya_onnx.export.model import pick_rows

    for layer in self.layers:
        x = layer(x, keep)
    return pick_rows(x, rows)


def _trace(checkpoint: Path, path: Path, *, all_rows: bool) -> Path:
    import torch

    from laya_onnx.export.constant_shapes import constant_shape_layers
    from laya_onnx.export.graph_file import write_torchscript_graph
    from laya_onnx.export.model import HeadStack, load_decision_model, ordered_rotary_tables
    from laya_onnx.export.options import DEFAULT_OPSET

    model, _ = load_decision_model(checkpoint)
    model.use_attention("fused")
    args = (
        torch.randint(5, 200, (2, 40)),
        torch.ones(2, 40, dtype=torch.int64),
        torch.tensor([[1, 3], [2, 4]]),
        torch.ones(2, 2, dtype=torch.bool),
        torch.tensor([0, 2]),
    )
    with (
        ordered_rotary_tables(),
        constant_shape_layers(model, enabled=True),
        pytest.MonkeyPatch.context() as mp,
    ):
        if all_rows:
            mp.setattr(HeadStack, "forward", _all_rows)
        write_torchscript_graph(model, args, path, opset=DEFAULT_OPSET, external_data_threshold=2**40)
    return path


def _feeds(rng: np.random.Generator, batch: int, length: int, markers: int) -> dict[str, np.ndarray]:
    mask = np.ones((batch, length), dtype=np.int64)
    for row in range(1, batch):
        mask[row, length - rng.integers(1, length // 2) :] = 0
    marker_mask = np.ones((batch, markers), dtype=bool)
    marker_mask[1:, -1] = False  # a padded marker column (it reads position 0)
    pos = rng.integers(1, length // 2, (batch, markers)).astype(np.int64)
    pos[0, 1] = pos[0, 0]  # two columns reading one position
    return {
        "input_ids": rng.integers(5, 200, (batch, length)).astype(np.int64),
        "attention_mask": mask,
        "marker_pos": np.where(marker_mask, pos, 0),
        "marker_mask": marker_mask,
        "qtype": rng.integers(0, 3, batch).astype(np.int64),
    }


def _head_layers(path: Path) -> int:
    import onnx

    names = {
        n.name.split("/")[2] for n in onnx.load(str(path)).graph.node if n.name.startswith("/head/layers.")
    }
    return len(names)


def _reads_picked_rows(path: Path, node_name: str) -> bool:
    """Whether a GatherElements (the rows picked) lies upstream of `node_name` within the head."""
    import onnx

    nodes = onnx.load(str(path)).graph.node
    producer = {out: n for n in nodes for out in n.output}
    todo = [n for n in nodes if n.name == node_name]
    assert todo, node_name
    seen: set[str] = set()
    while todo:
        node = todo.pop()
        if node.op_type == "GatherElements":
            return True
        for name in node.input:
            up = producer.get(name)
            if up is not None and up.name not in seen and "/head/" in up.name:
                seen.add(up.name)
                todo.append(up)
    return False


@pytest.mark.parametrize("preset", ["tiny-english", "tiny-multilingual"])
def test_the_last_head_layer_at_the_read_rows_answers_bit_for_bit_as_at_every_row(
    checkpoint_factory, tmp_path, preset
):
    import onnxruntime as ort

    ckpt = checkpoint_factory(preset)
    every = _trace(ckpt, tmp_path / "every.onnx", all_rows=True)
    picked = _trace(ckpt, tmp_path / "picked.onnx", all_rows=False)

    # the last layer's feed-forward reads the picked rows, an earlier layer's never does
    # (tiny-english has two head layers, tiny-multilingual one)
    layers = _head_layers(picked)
    last = f"/head/layers.{layers - 1}/linear1/MatMul"
    assert _reads_picked_rows(picked, last) and not _reads_picked_rows(every, last)
    for layer in range(layers - 1):
        assert not _reads_picked_rows(picked, f"/head/layers.{layer}/linear1/MatMul")

    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (every, picked)]
    rng = np.random.default_rng(3)
    for batch, length, markers in ((1, 9, 2), (3, 40, 3), (4, 120, 6)):
        feeds = _feeds(rng, batch, length, markers)
        expected, got = (s.run(None, feeds) for s in sessions)
        for name, a, b in zip(("logits", "act_logits"), expected, got, strict=True):
            assert a.shape == b.shape and np.array_equal(a, b), (preset, batch, length, name)


def test_the_int8_rewrite_lowers_every_head_matmul(lowered):
    """The picked rows come after the packed projection, so no head weight is left behind a Slice
    that the int8 rewrite (MatMuls of initializers only) would skip."""
    import onnx

    from laya_onnx.core.bundle import Bundle

    graph = onnx.load(str(Bundle.open(lowered("tiny-english", "int8")).graph_path)).graph
    head = [n for n in graph.node if n.name.startswith("/head/")]
    assert not [n.name for n in head if n.op_type == "MatMul"]
    # q/k/v, out_proj, linear1 and linear2 of both layers
    assert sum(n.op_type.startswith("MatMulInteger") for n in head) == 4 * 2
