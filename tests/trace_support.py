"""Tracing a tiny checkpoint's fused graph the way the export does (for tests that compare two
traces of one model) and random feeds for them. Torch is imported inside the functions: the
runtime tier imports no torch."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import numpy as np

#: (rows, tokens, marker columns) of the compared calls: inside and past the tiny checkpoints'
#: sliding window (16), one to several rows.
CALL_SHAPES = ((1, 9, 2), (3, 40, 3), (4, 120, 6))


def trace_graph(
    checkpoint: Path,
    path: Path,
    *,
    constant: bool = True,
    rotary_op: bool = False,
    patch: Callable[[], AbstractContextManager] = nullcontext,
) -> tuple[Path, bool]:
    """Trace the fused graph of `checkpoint` to `path` (weights inline) inside `patch()`; returns
    the path and whether the constant-shape layers were swapped in."""
    import torch

    from laya_onnx.export.constant_shapes import constant_shape_layers
    from laya_onnx.export.graph_file import write_torchscript_graph
    from laya_onnx.export.model import load_decision_model, ordered_rotary_tables
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
        constant_shape_layers(model, enabled=constant, rotary_op=rotary_op) as rewritten,
        patch(),
    ):
        write_torchscript_graph(model, args, path, opset=DEFAULT_OPSET, external_data_threshold=2**40)
    return path, rewritten


def random_feeds(rng: np.random.Generator, batch: int, length: int, markers: int) -> dict[str, np.ndarray]:
    """Every row but the first padded at its end; in rows past the first the last marker column
    is padding (it reads position 0), and the first row's first two columns read one position."""
    mask = np.ones((batch, length), dtype=np.int64)
    for row in range(1, batch):
        mask[row, length - rng.integers(1, length // 2) :] = 0
    marker_mask = np.ones((batch, markers), dtype=bool)
    marker_mask[1:, -1] = False
    pos = rng.integers(1, length // 2, (batch, markers)).astype(np.int64)
    pos[0, 1] = pos[0, 0]
    return {
        "input_ids": rng.integers(5, 200, (batch, length)).astype(np.int64),
        "attention_mask": mask,
        "marker_pos": np.where(marker_mask, pos, 0),
        "marker_mask": marker_mask,
        "qtype": rng.integers(0, 3, batch).astype(np.int64),
    }


def paired_outputs(graphs: Sequence[Path], seed: int) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(what, first graph's output, second's) for each output of each call in CALL_SHAPES, both
    graphs run by onnxruntime on the same random feeds."""
    import onnxruntime as ort

    first, second = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in graphs)
    rng = np.random.default_rng(seed)
    for batch, length, markers in CALL_SHAPES:
        feeds = random_feeds(rng, batch, length, markers)
        for name, a, b in zip(
            ("logits", "act_logits"), first.run(None, feeds), second.run(None, feeds), strict=True
        ):
            yield f"{name} of {batch} x {length}", a, b
