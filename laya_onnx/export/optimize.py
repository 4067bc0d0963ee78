"""`--optimize`: graph fusions ONNX Runtime does not do at load, applied once at export.

The runtime already builds its sessions at `ORT_ENABLE_ALL`, so a graph saved by ONNX Runtime's
own offline optimization (`SessionOptions.optimized_model_filepath`) would only move work from
load time to export time; and above `ORT_ENABLE_EXTENDED` the saved graph is hardware-specific.
`onnxruntime.transformers`' optimizer fuses more for this model family: on top of ONNX Runtime's
basic level it turns each residual `Add` + `LayerNormalization` into one
`SkipLayerNormalization` (which the runtime's own optimizer leaves alone), besides the
`Gelu` / `BiasGelu` fusions ONNX Runtime would also do at load. Attention fusion stays off: the
graph already has one `MultiHeadAttention` node per layer (`--attention fused`).

The optimized graph is validated like the exported one and kept only when it passes; otherwise
the unoptimized graph is written and the manifest says why.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from laya_onnx.core.bundle import GRAPH_DATA_FILE, GRAPH_FILE

#: The op types the fusions replace patterns with (counted before and after in the manifest).
FUSED_OPS = ("SkipLayerNormalization", "Gelu", "BiasGelu", "FastGelu", "SkipSimplifiedLayerNormalization")


def op_counts(graph: Path) -> dict[str, int]:
    """How many nodes of each op type `graph` has (its external data is not read)."""
    import onnx

    proto = onnx.load(str(graph), load_external_data=False)
    return dict(sorted(Counter(node.op_type for node in proto.graph.node).items()))


def optimize_graph(graph: Path, out_dir: Path, *, external_data: bool) -> tuple[Path, dict[str, Any]]:
    """Write the fused graph of `graph` into the fresh directory `out_dir`; returns its path and
    the record of what changed (op-type counts before and after, the fusions that fired)."""
    import logging
    import warnings

    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    shutil.rmtree(out_dir, ignore_errors=True)  # onnx appends to an existing data file
    out_dir.mkdir(parents=True)
    options = FusionOptions("bert")
    options.enable_attention = False
    before = op_counts(graph)
    # The optimizer logs every pattern it tries (and its shape inference's failures on the
    # com.microsoft nodes, which the fusions do not need) at WARNING.
    quiet = logging.getLogger("onnxruntime.transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = optimize_model(
                str(graph),
                model_type="bert",
                num_heads=0,
                hidden_size=0,
                optimization_options=options,
                opt_level=1,
                use_gpu=False,
            )
        fused = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
        out = out_dir / GRAPH_FILE
        model.save_model_to_file(
            str(out), use_external_data_format=external_data, all_tensors_to_one_file=True
        )
        del model
    finally:
        quiet.setLevel(level)
    if external_data and not (out_dir / GRAPH_DATA_FILE).is_file():
        raise RuntimeError(f"the optimizer wrote no {GRAPH_DATA_FILE}")
    after = op_counts(out)
    return out, {
        "tool": "onnxruntime.transformers.optimizer (model_type bert, opt_level 1, attention fusion off)",
        "nodes_before": sum(before.values()),
        "nodes_after": sum(after.values()),
        "fusions": {
            op: after.get(op, 0) - before.get(op, 0)
            for op in FUSED_OPS
            if after.get(op, 0) != before.get(op, 0)
        },
        "optimizer_statistics": fused,
        "op_types_before": before,
        "op_types_after": after,
    }


def adopt(candidate_dir: Path, bundle_dir: Path) -> None:
    """Replace the bundle's graph (and data file) with the optimized one in `candidate_dir`."""
    (bundle_dir / GRAPH_DATA_FILE).unlink(missing_ok=True)
    for name in (GRAPH_FILE, GRAPH_DATA_FILE):
        if (candidate_dir / name).exists():
            (candidate_dir / name).replace(bundle_dir / name)
    shutil.rmtree(candidate_dir)
