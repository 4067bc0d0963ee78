"""The decision head's last layer runs only at the positions read after it (`export/model.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from trace_support import paired_outputs, trace_graph

pytestmark = pytest.mark.torch


def _all_rows(self, x, keep, rows):
    """Every layer at every position, then the rows picked."""
    from laya_onnx.export.model import pick_rows

    for layer in self.layers:
        x = layer(x, keep)
    return pick_rows(x, rows)


@contextmanager
def _all_rows_head() -> Iterator[None]:
    """For the time of a trace: HeadStack.forward as it was before (every layer at every position)."""
    from laya_onnx.export.model import HeadStack

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(HeadStack, "forward", _all_rows)
        yield


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
    ckpt = checkpoint_factory(preset)
    every, _ = trace_graph(ckpt, tmp_path / "every.onnx", patch=_all_rows_head)
    picked, _ = trace_graph(ckpt, tmp_path / "picked.onnx")

    # the last layer's feed-forward reads the picked rows, an earlier layer's never does
    # (tiny-english has two head layers, tiny-multilingual one)
    layers = _head_layers(picked)
    last = f"/head/layers.{layers - 1}/linear1/MatMul"
    assert _reads_picked_rows(picked, last) and not _reads_picked_rows(every, last)
    for layer in range(layers - 1):
        assert not _reads_picked_rows(picked, f"/head/layers.{layer}/linear1/MatMul")

    for what, expected, got in paired_outputs((every, picked), seed=3):
        assert expected.shape == got.shape and np.array_equal(expected, got), (preset, what)


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
