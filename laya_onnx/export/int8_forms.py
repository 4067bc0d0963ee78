"""The u8 x s8 form of an int8 graph: the same integer codes, for the CPUs whose kernel takes them.

The int8 rewrite (`precision.py`) writes its weight codes as u8 around the zero point 128
(`laya.onnx`), which onnxruntime's u8 x u8 kernel multiplies exactly on every CPU. CPUs with VNNI
run u8 x s8 two to three times faster, exactly; CPUs without it saturate it (`core.int8_kernel`).
`write_u8s8_form` writes `laya.u8s8.onnx`: the same graph with each integer weight as `u8 - 128`
in s8 and its zero point 0, so both graphs compute the same integer sums and the same logits.

The runtime picks one graph at load (`core.int8_kernel.choose_kernel`); it needs neither onnx nor a
rewrite in memory (which would keep a converted copy of the weights alive beside onnxruntime's
packed one). A graph with external data gets its s8 weights appended to the same data file, so
the kept fp32 weights are stored once; an inline graph gets an inline copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from laya_onnx.core.bundle import GRAPH_DATA_FILE, GRAPH_FILE
from laya_onnx.core.int8_kernel import U8S8, U8S8_GRAPH_FILE, U8U8
from laya_onnx.export.graph_file import DATA_ALIGNMENT
from laya_onnx.export.precision import s8_codes

#: Where an int8 GEMM node takes its weight zero point (its weights are input 1).
WEIGHT_ZERO_POINT_INPUT = {"MatMulInteger": 3, "MatMulIntegerToFloat": 5}


def _weight_nodes(model) -> list[tuple[Any, int]]:
    """(node, index of its weight zero point) of every integer GEMM by a u8 initializer."""
    from onnx import TensorProto

    u8 = {t.name for t in model.graph.initializer if t.data_type == TensorProto.UINT8 and len(t.dims) == 2}
    return [
        (node, WEIGHT_ZERO_POINT_INPUT[node.op_type])
        for node in model.graph.node
        if node.op_type in WEIGHT_ZERO_POINT_INPUT and len(node.input) > 1 and node.input[1] in u8
    ]


def _append(data, array: np.ndarray) -> tuple[int, int]:
    """Write `array`'s bytes to the open data file at the next aligned offset: (offset, length)."""
    end = data.seek(0, 2)
    offset = -(-end // DATA_ALIGNMENT) * DATA_ALIGNMENT
    data.write(b"\0" * (offset - end))
    raw = array.tobytes()
    data.write(raw)
    return offset, len(raw)


def write_u8s8_form(graph: Path) -> dict[str, str]:
    """Write the u8 x s8 form of the int8 graph at `graph` beside it; {kernel: graph file}.

    `graph`'s own file is not changed; an external data file is appended to.
    """
    import onnx
    from onnx import TensorProto, numpy_helper

    model = onnx.load(str(graph), load_external_data=False)
    nodes = _weight_nodes(model)
    if not nodes:
        raise ValueError(f"{graph}: no integer GEMM by u8 weights to write a u8 x s8 form of")
    inits = {t.name: t for t in model.graph.initializer}
    names = set(inits) | {o for n in model.graph.node for o in n.output}

    def fresh(base: str) -> str:
        name, i = base, 0
        while name in names:
            i += 1
            name = f"{base}_{i}"
        names.add(name)
        return name

    zero = numpy_helper.from_array(np.array(0, np.int8), fresh("int8_weight_zero_point_s8"))
    converted: dict[str, str] = {}
    added = [zero]
    external = any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
    data = open(graph.with_name(GRAPH_DATA_FILE), "r+b") if external else None
    try:
        for node, zp_input in nodes:
            u8_name = node.input[1]
            if u8_name not in converted:
                # One weight in memory at a time: read from the data file, converted, appended.
                codes = s8_codes(numpy_helper.to_array(inits[u8_name], str(graph.parent)))
                name = fresh(f"{u8_name.removesuffix('_u8')}_s8")
                if data is None:
                    tensor = numpy_helper.from_array(codes, name)
                else:
                    tensor = TensorProto(name=name, data_type=TensorProto.INT8, dims=codes.shape)
                    offset, length = _append(data, codes)
                    tensor.data_location = TensorProto.EXTERNAL
                    for key, value in (("location", GRAPH_DATA_FILE), ("offset", offset), ("length", length)):
                        tensor.external_data.add(key=key, value=str(value))
                added.append(tensor)
                converted[u8_name] = name
            node.input[1] = converted[u8_name]
            while len(node.input) <= zp_input:
                node.input.append("")
            node.input[zp_input] = zero.name
    finally:
        if data is not None:
            data.close()
    used = {i for n in model.graph.node for i in n.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep + added)
    out = graph.with_name(U8S8_GRAPH_FILE)
    onnx.save(model, str(out))  # external tensors stay references: nothing is loaded or rewritten
    onnx.checker.check_model(str(out))
    return {U8U8: GRAPH_FILE, U8S8: U8S8_GRAPH_FILE}
