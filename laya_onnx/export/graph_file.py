"""Writing the traced graph to disk without holding a second copy of the weights.

`torch.onnx.export` (TorchScript) with its weights builds the whole ModelProto in memory, hands
it to Python as bytes and parses those bytes once more before writing: three full copies of the
weights next to the torch model's own, plus a fourth for the transposed linear weights its
constant folding creates (docs/export.md). So the
graph is traced without weights (`export_params=False`, no constant folding: every weight stays
a graph input named after its torch parameter) and `onnx_ir` attaches the torch tensors
themselves as initializers, streamed to disk one at a time. The one fold that matters for the
file - `Transpose(weight)` in front of each linear layer's MatMul - is done here, lazily, one
weight at a time; ONNX Runtime folds the remaining small constants at load as it always did.

Graphs whose weights exceed `external_data_threshold` bytes (default
`laya_onnx.core.bundle.DEFAULT_EXTERNAL_DATA_THRESHOLD`) are written as `laya.onnx` +
`laya.onnx.data` (ONNX external data; protobuf cannot hold a message over 2 GiB).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from laya_onnx.core.bundle import GRAPH_DATA_FILE, GRAPH_INPUTS, GRAPH_OUTPUTS

#: Large tensors start at 64 KiB offsets in the data file, so a reader can map them directly.
DATA_ALIGNMENT = 1 << 16
#: The most bytes onnx_ir holds in flight while streaming tensors to the data file.
MAX_IN_FLIGHT_BYTES = 64 << 20


class GraphWriteError(ValueError):
    """The traced graph does not match the torch model it was traced from."""


def trace_structure(model, args: tuple, path: Path, *, opset: int) -> None:
    """TorchScript-export `model` to `path` without weights: each one stays a named graph input."""
    import warnings

    import torch

    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated upstream and warns about Python branches
        # transformers evaluates at trace time; neither affects the graph we validate.
        warnings.simplefilter("ignore")
        with torch.no_grad():
            torch.onnx.export(
                model,
                args,
                str(path),
                dynamo=False,
                opset_version=opset,
                input_names=list(GRAPH_INPUTS),
                output_names=list(GRAPH_OUTPUTS),
                dynamic_axes=dynamic_axes(),
                export_params=False,
                # Folding would materialise a transposed copy of every linear weight at once.
                do_constant_folding=False,
            )


def dynamic_axes() -> dict[str, dict[int, str]]:
    spec = dict(GRAPH_INPUTS)
    spec.update(GRAPH_OUTPUTS)
    return {name: {i: axis for i, axis in enumerate(axes)} for name, (_dtype, axes) in spec.items()}


def _numpy(tensor) -> np.ndarray:
    """A numpy view of a torch tensor (no copy for the contiguous fp32 weights we export)."""
    return tensor.detach().contiguous().numpy()


def _transposed(array: np.ndarray, perm: list[int], name: str):
    """An onnx_ir tensor computed when it is written, so only one transposed weight exists at a time."""
    import onnx_ir as ir

    return ir.LazyTensor(
        lambda: ir.Tensor(np.ascontiguousarray(array.transpose(perm))),
        dtype=ir.DataType.from_numpy(array.dtype),
        shape=ir.Shape([array.shape[p] for p in perm]),
        name=name,
    )


def attach_weights(path: Path, state: dict[str, Any]):
    """The weight-less graph at `path` with `state`'s tensors as initializers (an onnx_ir Model).

    `state` maps the torch names (parameters and buffers) the trace kept as inputs to tensors.
    A weight whose only use is a Transpose is stored transposed and the Transpose dropped.
    Returns (model, folded), `folded` the number of Transposes folded.
    """
    import onnx_ir as ir

    model = ir.load(str(path))
    graph = model.graph
    weights = [v for v in graph.inputs if v.name not in GRAPH_INPUTS]
    unknown = [v.name for v in weights if v.name not in state]
    if unknown:
        raise GraphWriteError(f"the traced graph takes inputs the torch model does not have: {unknown[:5]}")
    folded = 0
    for value in weights:
        array = _numpy(state[str(value.name)])
        graph.inputs.remove(value)
        uses = list(value.uses())
        node = uses[0].node if len(uses) == 1 else None
        if node is not None and node.op_type == "Transpose" and node.outputs[0] not in graph.outputs:
            attr = node.attributes.get("perm")
            perm = list(attr.as_ints()) if attr is not None else list(range(array.ndim))[::-1]
            out, name = node.outputs[0], f"{value.name}.T"
            tensor = _transposed(array, perm, name)
            folded_value = ir.Value(name=name, type=value.type, shape=tensor.shape, const_value=tensor)
            ir.convenience.replace_all_uses_with(out, folded_value)
            graph.remove(node, safe=True)
            graph.register_initializer(folded_value)
            folded += 1
            continue
        value.const_value = ir.Tensor(array, name=value.name)
        graph.register_initializer(value)
    return model, folded


def weights_bytes(model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def save_graph(model, path: Path, *, external_data_threshold: int) -> list[str]:
    """Write an onnx_ir model to `path`; returns the external data files it references (maybe none).

    The data file is written next to the graph and replaced, never appended to, so a stale one
    left by an earlier export is neither kept nor referenced.
    """
    import onnx_ir as ir

    data = path.with_name(GRAPH_DATA_FILE)
    if weights_bytes(model) > external_data_threshold:
        ir.save(
            model,
            str(path),
            external_data=data.name,
            max_in_flight_bytes=MAX_IN_FLIGHT_BYTES,
            alignment=DATA_ALIGNMENT,
        )
        return [data.name]
    # Inline means every tensor in the file: a model read lazily (the precision step's) still
    # refers to its source's data file, which may be the one unlinked here.
    ir.external_data.load_to_model(model)
    data.unlink(missing_ok=True)
    ir.save(model, str(path))
    return []


def write_torchscript_graph(
    model, args: tuple, path: Path, *, opset: int, external_data_threshold: int
) -> dict:
    """Trace `model` with `args` and write the graph with its weights; returns what was written."""
    trace_structure(model, args, path, opset=opset)
    state = {**dict(model.named_buffers()), **dict(model.named_parameters())}
    ir_model, folded = attach_weights(path, state)
    external = save_graph(ir_model, path, external_data_threshold=external_data_threshold)
    return {"external_data": external, "folded_transposes": folded, "weights_bytes": weights_bytes(ir_model)}
