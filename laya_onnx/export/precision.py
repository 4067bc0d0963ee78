"""The precision ladder: rewrite a validated fp32 graph to fp16 (CUDA) or batch-invariant int8 (CPU).

bf16 rewrites nothing: its bundle carries the fp32 graph, which OpenVINO computes in bf16 at load
(`laya_onnx.core.openvino_session`); only its gate is here.

Torch-free (onnx + numpy); the runtime needs none of it, a bundle carries the rewritten graph.
Both rewrites touch weight MatMuls only (a `MatMul` whose second input is a 2-D float
initializer): the encoder's (attention Wqkv and Wo, MLP Wi and Wo, under `/encoder/`; fp16 leaves
the first layer's in fp32, `FP16_KEEP_FP32`), for int8 also the decision head's transformer
layers' (attention in/out projections, linear1, linear2, under `/head/`), plus for fp16 the
encoder's token-embedding table. Everything else stays fp32: LayerNorms, attention products and
softmax (inside `MultiHeadAttention` or op by op), the head's scorer, the act head and the logits.

- **fp16**: each target MatMul runs in fp16 on fp16 weights, with a Cast to fp16 before it and a
  Cast back to fp32 after it (the rest of the graph never sees an fp16 tensor). We cast by hand
  rather than with onnxconverter-common's float16 pass, which writes graphs onnxruntime refuses to
  load for this model family and truncates the mask constants.
- **int8**: weights per output column `s_col = max|W[:, n]| / 127`, `W8 = round(W / s_col)`
  (8-bit codes; 7-bit ones, `/ 63`, are a plan option: `WEIGHT_LEVELS`); activations per ROW
  (token) `s_row = max|x[row, :]| / 127`, `x8 = round(x / s_row) + 128` (u8, zero point 128,
  one per-axis `QuantizeLinear`); `MatMulIntegerToFloat(x8, W8)` (onnxruntime's contrib op: the
  int32 sums times `s_col` in the GEMM's output pass) then `* s_row`. A row's numbers depend on
  that row alone, so an answer does not depend on what else is in the run. onnxruntime's
  `DynamicQuantizeLinear` / `quantize_dynamic` use ONE scale for the whole tensor (every row of
  the batch) and are not batch-invariant; s8 activations fall off MLAS's fast path (0.18x of
  f32). The weight codes are written u8 (zero point 128, the u8 x u8 kernel, exact on every CPU);
  `int8_forms` adds the same codes as s8 for CPUs with VNNI (`laya_onnx.core.int8_kernel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from laya_onnx.export.errors import ExportError

PRECISIONS = ("fp32", "fp16", "int8", "bf16")
DEFAULT_PRECISION = "fp32"
#: Node-name prefix of the encoder in a TorchScript or dynamo export of `DecisionModel`.
ENCODER_SCOPE = "/encoder/"
#: Node-name prefix of the decision head's transformer layers (`HeadStack`): int8 lowers their
#: linear MatMuls too (attention in/out projections, linear1, linear2); fp16 leaves them fp32.
HEAD_SCOPE = "/head/"
#: Where each precision finds its target MatMuls.
TARGET_SCOPES = {"fp16": (ENCODER_SCOPE,), "int8": (ENCODER_SCOPE, HEAD_SCOPE)}
#: The int8 activations' zero point: u8 codes 1..255 stand for -127..127.
U8_ZERO_POINT = 128
#: onnxruntime's contrib operators (MatMulIntegerToFloat), imported by every int8 graph.
MS_DOMAIN = "com.microsoft"
#: 7-bit weight codes span -63..63. x86 CPUs without VNNI multiply u8 x s8 with `vpmaddubsw`, which
#: saturates a pair of products at 16 bits: 2 x 255 x 127 overflows it, 2 x 255 x 63 does not
#: (onnxruntime's quantizer calls this `reduce_range`).
#: 8-bit codes run u8 x s8 only where the CPU has VNNI, u8 x u8 elsewhere (`core.int8_kernel`).
WEIGHT_LEVELS = 63
#: Floor of a row's max |x| so an all-zero row (padding) gets a finite scale.
MIN_ROW_ABSMAX = 1e-12
#: fp16 leaves the first encoder layer's MatMuls in fp32: what is rounded there passes through
#: every later layer, and most of fp16's error comes from it, for 1/num_layers of the encoder's
#: GEMMs (export/README.md#precision). The weights cost nothing: checkpoints store them in fp16,
#: so only the activations' rounding moves p.
FP16_KEEP_FP32 = ("layers.0",)


@dataclass(frozen=True)
class PrecisionBar:
    """What a precision must reach against fp32 torch, on every suite, or the bundle is not written.

    `max_abs_dp`: no unrounded probability (option or noul) may move further. `min_agreement`: the
    least share of the *decisive* decisions that agree, a decision being decisive when fp32 torch
    makes it by a margin (`core.judge.decision_margin`) of at least `tie_margin`; the others are
    near ties, reported and not counted. `tie_margin=None` is the suite's measured max |dp|: a
    decision flips only where some probability moved by at least fp32's margin, so every flip is
    then a near tie and `max_abs_dp` is what the bar holds to; a fixed `tie_margin` below it
    also refuses flips of decisions fp32 makes by more than that. 0 counts every decision.
    """

    max_abs_dp: float
    min_agreement: float
    tie_margin: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return {
            "max_abs_dp": self.max_abs_dp,
            "min_agreement": self.min_agreement,
            "tie_margin": self.tie_margin,
        }


#: fp16: a quality bar over every decision (tie margin 0). int8: max |dp| <= 0.15 bounds how far
#: any probability moves, so every decision fp32 makes by a margin above that holds; a decision
#: fp32 makes by less than the measured max |dp| is a near tie, reported and not counted (random
#: weights have many, so a floor over all decisions would refuse a sound graph). Trained
#: checkpoints can be held tighter from the command line (docs/precision.md#the-int8-precision-bar).
PRECISION_BARS: dict[str, PrecisionBar] = {
    "fp16": PrecisionBar(max_abs_dp=1e-2, min_agreement=0.995, tie_margin=0.0),
    "int8": PrecisionBar(max_abs_dp=0.15, min_agreement=1.0),
    # bf16: the runtime rounds the inputs of the encoder's GEMMs (all but layer 0's) to bf16, as
    # torch's autocast rounds every linear layer's, and keeps everything else f32; every decision
    # counts, with a floor that leaves room for random weights' near ties.
    "bf16": PrecisionBar(max_abs_dp=0.1, min_agreement=0.9, tie_margin=0.0),
}


def check_precision(precision: Any) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return str(precision)


class _Graph:
    """Index of one onnx graph for the rewrite: initializers by name, how many nodes read each.

    `base_dir`: where the external data of a model loaded without it lives; each weight is then
    read from disk when it is rewritten, so the fp32 weights are never all in memory at once.
    """

    def __init__(self, model, base_dir: str = ""):
        self.graph = model.graph
        self.base_dir = base_dir
        self.inits = {t.name: t for t in self.graph.initializer}
        self.readers: dict[str, int] = {}
        for node in self.graph.node:
            for name in node.input:
                self.readers[name] = self.readers.get(name, 0) + 1
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
        self._names = set(self.inits) | {o for n in self.graph.node for o in n.output}
        self._names.update(i.name for i in self.graph.input)

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name

    def float_table(self, name: str) -> np.ndarray | None:
        """The 2-D float32 initializer called `name`, else None."""
        from onnx import TensorProto, numpy_helper

        init = self.inits.get(name)
        if init is None or init.data_type != TensorProto.FLOAT or len(init.dims) != 2:
            return None
        return numpy_helper.to_array(init, self.base_dir)

    def add_init(self, base: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.fresh(base)
        self.graph.initializer.append(numpy_helper.from_array(array, name))
        return name

    def node(self, kind: str, inputs: list[str], outputs: list[str], base: str, **attrs):
        from onnx import helper

        return helper.make_node(kind, inputs, outputs, name=self.fresh(f"{base}/{kind}"), **attrs)

    def op(self, kind: str, inputs: list[str], base: str, **attrs):
        """(node, its one fresh output name)."""
        out = self.fresh(f"{base}_{kind}")
        return self.node(kind, inputs, [out], base, **attrs), out


def _target_weight(g: _Graph, node, scopes: tuple[str, ...]) -> np.ndarray | None:
    """The weight of a MatMul under one of `scopes` by a constant 2-D float matrix, else None."""
    if node.op_type != "MatMul" or not node.name.startswith(scopes) or len(node.input) != 2:
        return None
    return g.float_table(node.input[1])


def _target_table(g: _Graph, node) -> np.ndarray | None:
    """The table of an encoder embedding lookup (Gather on a 2-D float initializer read once)."""
    if node.op_type != "Gather" or not node.name.startswith(ENCODER_SCOPE) or not node.input:
        return None
    if g.readers.get(node.input[0], 0) != 1:
        return None
    return g.float_table(node.input[0])


def _to_fp16(g: _Graph, x: str, base: str, emulate: bool, nodes: list) -> str:
    """`x` as fp16 (a Cast), or with `emulate` still fp32 but rounded to fp16's 11-bit significand.

    The emulation exists for the CPU gate: onnxruntime's CPU EP has no fp16 GEMM and folds a
    Cast(fp16) -> MatMul -> Cast(fp32) chain back to fp32 (measured: |y - x.W| 2e-6 in fp32, i.e.
    no fp16 rounding at all, at every optimisation level), so the written graph alone cannot show
    what fp16 costs. Veltkamp's split `c = x * (2**13 + 1); hi = c - (c - x)` rounds to nearest at
    11 bits with plain float ops no optimiser folds. Not emulated: fp16's range (|x| > 65504
    overflows on a GPU) and its subnormals below 6.1e-5; the CUDA check script measures those.
    """
    from onnx import TensorProto

    if not emulate:
        node, out = g.op("Cast", [x], base, to=TensorProto.FLOAT16)
        nodes.append(node)
        return out
    scaled, s_out = g.op("Mul", [x, g.add_init(f"{base}_veltkamp", np.array(2.0**13 + 1, np.float32))], base)
    gap, gap_out = g.op("Sub", [s_out, x], base)
    hi, hi_out = g.op("Sub", [s_out, gap_out], base)
    nodes.extend([scaled, gap, hi])
    return hi_out


def _from_fp16(g: _Graph, y: str, dst: str, base: str, emulate: bool, nodes: list) -> None:
    from onnx import TensorProto

    if emulate:
        nodes.append(g.node("Identity", [_to_fp16(g, y, base, True, nodes)], [dst], base))
    else:
        nodes.append(g.node("Cast", [y], [dst], base, to=TensorProto.FLOAT))


def _fp16_matmul(g: _Graph, node, weight: np.ndarray, emulate: bool) -> list:
    base, nodes = node.name, list[Any]()
    w16 = weight.astype(np.float16)
    w = g.add_init(f"{node.input[1]}_fp16", w16.astype(np.float32) if emulate else w16)
    x16 = _to_fp16(g, node.input[0], f"{base}_in", emulate, nodes)
    matmul, y16 = g.op("MatMul", [x16, w], f"{base}_fp16")
    nodes.append(matmul)
    _from_fp16(g, y16, node.output[0], f"{base}_out", emulate, nodes)
    return nodes


def _fp16_gather(g: _Graph, node, table: np.ndarray, emulate: bool) -> list:
    base, nodes = node.name, list[Any]()
    t16 = table.astype(np.float16)
    t = g.add_init(f"{node.input[0]}_fp16", t16.astype(np.float32) if emulate else t16)
    gather, y16 = g.op("Gather", [t, *node.input[1:]], f"{base}_fp16")
    gather.attribute.extend(node.attribute)
    nodes.append(gather)
    if emulate:  # the table's values are already fp16's
        nodes.append(g.node("Identity", [y16], [node.output[0]], f"{base}_out"))
    else:
        _from_fp16(g, y16, node.output[0], f"{base}_out", False, nodes)
    return nodes


def quantize_weight(weight: np.ndarray, bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(s8 codes, f32 scales) of a [K, N] weight: symmetric, one scale per output column.

    8 bits: codes -127..127; 7 bits: -63..63 (`WEIGHT_LEVELS`). A bundle stores them twice, as
    u8 (`codes + 128`, `laya.onnx`) and as s8 (`laya.u8s8.onnx`); `core.int8_kernel` picks one.
    """
    levels = WEIGHT_LEVELS if bits == 7 else 127
    absmax = np.max(np.abs(weight), axis=0)
    scale = (np.maximum(absmax, MIN_ROW_ABSMAX) / levels).astype(np.float32)
    codes = np.clip(np.rint(weight / scale), -levels, levels)
    return codes.astype(np.int8), scale


def u8_codes(codes: np.ndarray) -> np.ndarray:
    """s8 weight codes as the u8 x u8 kernel takes them: `codes + 128` (zero point 128)."""
    return (codes.astype(np.int16) + U8_ZERO_POINT).astype(np.uint8)


def s8_codes(codes: np.ndarray) -> np.ndarray:
    """u8 weight codes (zero point 128) as the u8 x s8 kernel takes them: `codes - 128`."""
    return (codes.astype(np.int16) - U8_ZERO_POINT).astype(np.int8)


def module_path(node_name: str) -> str:
    """The module a target MatMul computes: "/encoder/layers.3/mlp/Wo/MatMul" -> "layers.3.mlp.Wo"
    (the encoder's, as before the head was lowered), "/head/layers.0/linear1/MatMul" ->
    "head.layers.0.linear1"."""
    inner = node_name.removeprefix(ENCODER_SCOPE).strip("/").rsplit("/", 1)[0]
    return inner.replace("/", ".")


def _selects(pattern: str, path: str) -> bool:
    """A module pattern names a kind ("mlp.Wo"), a layer ("layers.3") or one module ("layers.3.mlp.Wo")."""
    return path == pattern or path.endswith("." + pattern) or path.startswith(pattern + ".")


def _kept_fp32(patterns: Sequence[str], node_name: str) -> bool:
    """Whether a target MatMul's module is named by one of the kept-fp32 `patterns`."""
    path = module_path(node_name)
    return any(_selects(p, path) for p in patterns)


@dataclass(frozen=True)
class Int8Plan:
    """How int8 lowers the target MatMuls (the fields' defaults: all of them, 7-bit weights; the
    export's default is DEFAULT_INT8_PLAN).

    `keep_fp32`: module patterns (`_selects`: "attn.Wqkv", "layers.0", "layers.3.mlp.Wo") whose
    MatMuls stay fp32, a mixed int8 graph; `weight_bits`: 8 or 7 (codes -63..63, which the u8 x s8
    kernel multiplies exactly on every x86 CPU, VNNI or not).
    """

    keep_fp32: tuple[str, ...] = ()
    weight_bits: int = 7

    def __post_init__(self):
        if self.weight_bits not in (7, 8):
            raise ValueError(f"int8 weight bits must be 7 or 8, got {self.weight_bits!r}")
        if isinstance(self.keep_fp32, str) or not all(isinstance(p, str) and p for p in self.keep_fp32):
            raise ValueError(f"int8 keep_fp32 must be a list of module patterns, got {self.keep_fp32!r}")

    def keeps(self, node_name: str) -> bool:
        return _kept_fp32(self.keep_fp32, node_name)


def check_int8_plan(precision: str, plan: Int8Plan | None) -> None:
    """An int8 plan goes with precision int8 only (ValueError naming the precision otherwise)."""
    if plan is not None and check_precision(precision) != "int8":
        raise ValueError(f"int8_plan applies to precision 'int8', not {precision!r}")


#: The int8 default (measured in export/README.md "Which Wqkv"): 8-bit weights everywhere (the
#: decision head's layers included), the first layer's attention Wqkv kept fp32. Its rounding passes
#: through every later layer and its Q and K errors through the softmax: on random-english-large
#: all 28 Wqkv in int8 moved p by 0.25, all but layer 0's by 0.10, all but layers 0-3's by 0.08 (as
#: much as keeping all 28 fp32, which is 1.5x slower on a VNNI CPU).
DEFAULT_INT8_PLAN = Int8Plan(keep_fp32=("layers.0.attn.Wqkv",), weight_bits=8)


def _int8_matmul(g: _Graph, node, weight: np.ndarray, plan: Int8Plan) -> list:
    """One target MatMul as: the per-row scale, one QuantizeLinear, one MatMulIntegerToFloat.

    The row's max |x| is max(ReduceMax(x), -ReduceMin(x)): two reads of x, no |x| written.
    QuantizeLinear does `round(x / s_row) + 128` to u8 in one pass (round half to even, as Round
    does), per row: per axis over x seen as [rows, K], so each row has its own scale (the
    per-tensor `DynamicQuantizeLinear` would scale a batch as one). onnxruntime's
    MatMulIntegerToFloat (com.microsoft) sums the codes in int32 and writes `sum * s_col` as float
    in the GEMM's own output pass, then scales it by `s_row`: no Cast, no separate Muls.
    """
    from onnx import numpy_helper

    base, x = node.name, node.input[0]

    def const(name: str, value, dtype=np.float32) -> str:
        return g.add_init(f"{base}_{name}", np.array(value, dtype))

    nodes = []

    def op(kind: str, inputs: list[str], **attrs) -> str:
        node_, out = g.op(kind, inputs, base, **attrs)
        nodes.append(node_)
        return out

    def reduce(kind: str) -> str:
        if g.opset >= 18:  # Reduce*'s axes became an input in opset 18
            return op(kind, [x, const("axes", [-1], np.int64)], keepdims=1)
        return op(kind, [x], axes=[-1], keepdims=1)

    codes, col_scale = quantize_weight(weight, plan.weight_bits)
    w8 = g.add_init(f"{node.input[1]}_u8", u8_codes(codes))
    s_col = g.add_init(f"{node.input[1]}_scale", col_scale)

    # s_row = max(max|x[row, :]|, floor) / 127, one scale per row (token): [..., 1]
    rowmax = op("Max", [reduce("ReduceMax"), op("Neg", [reduce("ReduceMin")])])
    s_row = op("Mul", [op("Max", [rowmax, const("floor", MIN_ROW_ABSMAX)]), const("inv127", 1.0 / 127.0)])
    # x8 = round(x / s_row) + 128 as u8 (codes 1..255), each row by its own scale
    rows = op("Reshape", [x, const("rows", [-1, weight.shape[0]], np.int64)])
    s_rows = op("Reshape", [s_row, const("flat", [-1], np.int64)])
    zp_value = numpy_helper.from_array(np.array([U8_ZERO_POINT], np.uint8))
    zp_rows = op("ConstantOfShape", [op("Shape", [s_rows])], value=zp_value)
    x8 = op("Reshape", [op("QuantizeLinear", [rows, s_rows, zp_rows], axis=0), op("Shape", [x])])
    # The weights' zero point is their own initializer: the u8 x s8 form replaces it (int8_forms).
    x_zp, w_zp = const("zp", U8_ZERO_POINT, np.uint8), const("wzp", U8_ZERO_POINT, np.uint8)
    fused = g.node("MatMulIntegerToFloat", [x8, w8, s_row, s_col, x_zp, w_zp], [node.output[0]], base)
    fused.domain = MS_DOMAIN
    nodes.append(fused)
    return nodes


def lower_precision(
    model, precision: str, *, emulate: bool = False, plan: Int8Plan | None = None, base_dir: str = ""
) -> dict[str, Any]:
    """Rewrite the fp32 `model` (an onnx ModelProto, in place) to `precision`; returns what changed.

    `emulate` (fp16 only): the same rewrite computed in fp32 with every fp16 rounding made
    explicit (`_to_fp16`), for the CPU gate; never written into a bundle. `plan` (int8 only): which
    MatMuls are lowered and how (`Int8Plan`; default: all, 7-bit weights, no smoothing).
    `base_dir`: the directory of a model loaded with `load_external_data=False`; its target
    weights are read from there one at a time, the others stay external references.

    The record (written into the manifest) names the rewrite and counts the nodes it touched, so a
    bundle says what runs in reduced precision; fp32 returns an empty rewrite.
    """
    precision = check_precision(precision)
    if precision == "fp32":
        return {"rewrite": None, "matmuls": 0}
    plan = plan or DEFAULT_INT8_PLAN
    g = _Graph(model, base_dir)
    nodes, replaced, kept = [], set(), []
    matmuls = gathers = 0
    weight_elems = 0
    for node in g.graph.node:
        weight = _target_weight(g, node, TARGET_SCOPES.get(precision, (ENCODER_SCOPE,)))
        keeps = plan.keeps(node.name) if precision == "int8" else _kept_fp32(FP16_KEEP_FP32, node.name)
        if weight is not None and keeps:
            kept.append(node.name)
            weight = None
        elif weight is not None:
            if precision == "fp16":
                nodes.extend(_fp16_matmul(g, node, weight, emulate))
            else:
                nodes.extend(_int8_matmul(g, node, weight, plan))
            replaced.add(node.input[1])
            matmuls += 1
            weight_elems += weight.size
            continue
        table = _target_table(g, node) if precision == "fp16" else None
        if table is not None:
            nodes.extend(_fp16_gather(g, node, table, emulate))
            replaced.add(node.input[0])
            gathers += 1
            continue
        nodes.append(node)
    unmatched = [p for p in plan.keep_fp32 if not any(_selects(p, module_path(n)) for n in kept)]
    if precision == "int8" and unmatched:
        raise ExportError(
            f"int8 keep_fp32: no lowered MatMul matches {unmatched} (e.g. 'attn.Wqkv', 'layers.0', 'head')"
        )
    if not matmuls:
        raise ExportError(f"no encoder MatMul by a constant weight found to run in {precision}")
    del g.graph.node[:]
    g.graph.node.extend(nodes)
    if precision == "int8" and not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.add(domain=MS_DOMAIN, version=1)
    used = {i for n in g.graph.node for i in n.input}
    keep = [t for t in g.graph.initializer if t.name not in replaced or t.name in used]
    del g.graph.initializer[:]
    g.graph.initializer.extend(keep)
    record: dict[str, Any] = {
        "rewrite": (
            "encoder weight MatMuls but the first layer's (and the token-embedding table) in fp16 "
            "between Casts; the rest fp32"
            if precision == "fp16"
            else "encoder and head-layer weight MatMuls as MatMulIntegerToFloat: u8 activations per row (QuantizeLinear, "
            f"zero point 128) x {plan.weight_bits}-bit weight codes per output column, stored u8 (zero point 128)"
            + (f"; {len(kept)} kept fp32" if kept else "")
            + "; the rest fp32"
        ),
        "matmuls": matmuls,
        "matmul_weights": int(weight_elems),
    }
    if precision == "fp16":
        record["embedding_tables"] = gathers
        record["keep_fp32"] = list(FP16_KEEP_FP32)
    else:
        record["weight_bits"] = plan.weight_bits
        record["keep_fp32"] = list(plan.keep_fp32)
    record["kept_fp32"] = [module_path(name) for name in kept]
    return record
