"""The precision ladder: `export_bundle(precision="fp16"|"int8")`, its gate, and what the runtime says.

Every tiny preset is exported at fp16 and int8 (each gated against fp32 torch on the export cases
and the parity suite); a gate that cannot be met refuses to write the bundle; int8 answers do not
depend on the rest of the batch (bit-identical logits alone, among 8 other states, and with more
padding), and the same check catches onnxruntime's per-tensor dynamic quantization, which does.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections import Counter

import numpy as np
import pytest

from laya_onnx.core.bundle import ReducedPrecisionWarning

pytestmark = pytest.mark.torch  # the export extra: torch for exports, onnx for the rewrites

TINY_PRESETS = ("tiny-english", "tiny-multilingual", "tiny-typed-decisions")
QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "tech", "sales"]},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high", "top"]},
    "refund": {"type": "noul", "instructions": "The customer wants money back."},
}
STATE = "I was charged twice for the same order, please refund the second payment."
NEIGHBOURS = [
    "Hi",
    "The app crashes whenever I upload a photo. " * 12,
    "Can I get a quote for 300 units?",
    "The delivery is late again. " * 40,
    "ok",
    "Where is my parcel? It is late and nobody answers my emails.",
    "Please close my account and delete my data. " * 6,
]


def _agent(bundle):
    from laya_onnx.core.agent import ONNXAgent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReducedPrecisionWarning)
        warnings.simplefilter("ignore", RuntimeWarning)  # clamped temperatures of tiny-typed-decisions
        return ONNXAgent(bundle)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_tiny_presets_export_at_every_precision_with_their_gate(lowered, preset, precision):
    import onnx

    from laya_onnx.core.agent import ONNXAgent
    from laya_onnx.export.precision import PRECISION_BARS

    bundle = lowered(preset, precision)
    record = json.loads((bundle / "manifest.json").read_text())["precision"]
    gate = PRECISION_BARS[precision]
    assert record["precision"] == precision and record["passed"] is True
    assert record["gate"] == gate.as_dict() and "fp32 torch" in record["reference"]
    assert set(record["suites"]) == {"export-cases", "parity-core"}
    for name, m in record["suites"].items():
        assert m["requests"] > 5 and m["decisions"] >= m["requests"], name
        assert m["decisive_agreement"] >= gate.min_agreement and m["max_abs_dp"] <= gate.max_abs_dp, name
        # the graph really was lowered: an fp32 graph is within 1e-5 of torch
        assert m["max_abs_dp"] > 1e-5, name
        # a flip needs fp32's own margin below the measured |dp|: every flip is a near tie
        assert m["decisions"] - m["agreeing"] <= m["near_ties"] < m["decisions"], name

    graph = onnx.load(str(bundle / "laya.onnx"))
    ops = Counter(n.op_type for n in graph.graph.node)
    assert record["matmuls"] > 0 and "DynamicQuantizeLinear" not in ops
    if precision == "int8":
        # one QuantizeLinear per row and one fused integer GEMM per lowered MatMul
        assert ops["MatMulIntegerToFloat"] == ops["QuantizeLinear"] == record["matmuls"]
        assert "MatMulInteger" not in ops
        assert record["weight_bits"] == 8 and record["keep_fp32"] == ["layers.0.attn.Wqkv"]  # default
        assert record["kept_fp32"] == ["layers.0.attn.Wqkv"]
    else:
        halves = [t for t in graph.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
        assert len(halves) == record["matmuls"] + record["embedding_tables"]
        # the first encoder layer's four weight MatMuls stay fp32 (precision.FP16_KEEP_FP32)
        assert record["keep_fp32"] == ["layers.0"] and len(record["kept_fp32"]) == 4
        first = [
            n for n in graph.graph.node if n.name.startswith("/encoder/layers.0/") and n.op_type == "MatMul"
        ]
        assert len(first) == 4 and not [n for n in first if any("fp16" in i for i in n.input)]
        assert record["cpu_ep"]["export-cases"]["decisions"] > 0

    with pytest.warns(ReducedPrecisionWarning, match=rf"runs in {precision} \(not fp32; export-cases: "):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            agent = ONNXAgent(bundle)
    assert agent.precision == precision and agent.precision_record.as_json() == record
    assert f"precision='{precision}'" in repr(agent)
    answer = agent.predict(STATE, QUESTIONS)["answers"]
    assert set(answer) == set(QUESTIONS)


def test_an_fp32_bundle_says_nothing_and_reports_fp32(bundle_factory):
    from laya_onnx.core.agent import ONNXAgent

    with warnings.catch_warnings():
        warnings.simplefilter("error", ReducedPrecisionWarning)
        agent = ONNXAgent(bundle_factory("tiny-english"))
    assert agent.precision == "fp32" and agent.precision_record.as_json() == {"precision": "fp32"}


def test_a_gate_that_fails_refuses_to_write_the_bundle(checkpoint_factory, tmp_path):
    from laya_onnx.export import ValidationError, export_bundle
    from laya_onnx.export.precision import PrecisionBar

    out = tmp_path / "never"
    impossible = PrecisionBar(max_abs_dp=0.0, min_agreement=1.0)  # a lowered graph always moves some p
    with pytest.raises(
        ValidationError, match=r"int8 misses its precision bar .*export-cases: .*no bundle was written"
    ):
        export_bundle(
            checkpoint_factory("tiny-english"),
            out,
            verbose=False,
            precision="int8",
            precision_bar=impossible,
            measure_memory=False,
        )
    assert not out.exists() and not list(tmp_path.iterdir())


def _row_outputs(agent, call):
    """The raw (logits, act probabilities) of STATE's rows in whatever run `call` makes."""
    from laya_onnx.core.questions import normalize_questions
    from laya_onnx.core.sequences import encode_state
    from laya_onnx.parity.observe import instrument_agent

    if not hasattr(agent, "_capture"):
        agent._capture = instrument_agent(agent)
    rows = encode_state(agent.tok, STATE, normalize_questions(QUESTIONS), agent.max_len, agent.head_max_len)
    agent._capture.clear()
    answer = call()
    return answer, [agent._capture.take(list(r.ids)) for r in rows]


def _batch_dependence(agent) -> list[str]:
    """Where STATE's numbers differ between alone, in a batch of 8, and with more padding."""
    alone, ref = _row_outputs(agent, lambda: agent.predict(STATE, QUESTIONS))
    runs = {
        "in a batch of 8": lambda: agent.predict_batch(NEIGHBOURS[:3] + [STATE] + NEIGHBOURS[3:], QUESTIONS)[
            3
        ],
        "with more padding": lambda: agent.predict_batch([STATE, "word " * 400], QUESTIONS)[0],
    }
    found = []
    for name, call in runs.items():
        answer, outs = _row_outputs(agent, call)
        assert len(outs) == len(ref) and all(o is not None for o in outs)
        for (a_logits, a_act), (b_logits, b_act) in zip(ref, outs, strict=True):
            if not (np.array_equal(a_logits, b_logits) and np.array_equal(a_act, b_act)):
                found.append(f"{name}: logits differ by {np.nanmax(np.abs(a_logits - b_logits)):.3g}")
        if answer != alone:
            found.append(f"{name}: answer differs")
    return found


def test_int8_answers_do_not_depend_on_the_rest_of_the_batch(lowered):
    agent = _agent(lowered("tiny-english", "int8"))
    assert _batch_dependence(agent) == []


def test_the_batch_check_catches_per_tensor_dynamic_quantization(bundle_factory, tmp_path):
    """onnxruntime's quantize_dynamic scales activations per tensor (one scale for every row of
    the batch): the same check must find it batch-dependent, or the test above proves nothing."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from laya_onnx.core.agent import ONNXAgent

    per_tensor = tmp_path / "per-tensor"
    shutil.copytree(bundle_factory("tiny-english"), per_tensor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(per_tensor / "laya.onnx", per_tensor / "laya.onnx", weight_type=QuantType.QInt8)
    assert _batch_dependence(ONNXAgent(per_tensor, verify=False))


def test_fp16_emulation_rounds_like_fp16_and_the_written_graph_runs():
    """The CPU gate's emulation (explicit rounding) matches numpy's fp16 arithmetic; the written
    graph (real fp16 MatMul between Casts) loads and runs on the CPU EP."""
    onnx = pytest.importorskip("onnx")
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from laya_onnx.export.precision import lower_precision

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((96, 80)) * 0.1).astype(np.float32)
    x = rng.standard_normal((3, 7, 96)).astype(np.float32)
    fp16 = (x.astype(np.float16).astype(np.float32) @ weight.astype(np.float16).astype(np.float32)).astype(
        np.float16
    )
    outputs = {}
    for emulate in (False, True):
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"], name="/encoder/layers.1/mlp/Wi/MatMul")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, 96])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, 80])],
            [numpy_helper.from_array(weight, "w")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        assert lower_precision(model, "fp16", emulate=emulate)["matmuls"] == 1
        onnx.checker.check_model(model)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        outputs[emulate] = session.run(None, {"x": x})[0]
    ulp = np.abs(np.spacing(fp16)).astype(np.float32)
    assert np.all(np.abs(outputs[True] - fp16) <= ulp)  # at most one fp16 unit (summation order)
    assert np.abs(outputs[True] - x @ weight).max() > 1e-4  # it does round
    assert np.abs(outputs[False] - x @ weight).max() < 1e-2


def test_int8_weights_per_column_and_the_row_scales_are_exact_to_a_code():
    pytest.importorskip("onnx")
    from laya_onnx.export.precision import WEIGHT_LEVELS, quantize_weight

    rng = np.random.default_rng(1)
    weight = rng.standard_normal((64, 5)).astype(np.float32) * np.array(
        [1e-3, 0.1, 1.0, 10.0, 0.0], np.float32
    )
    for bits, levels in ((7, WEIGHT_LEVELS), (8, 127)):  # 7 bits: no u8 x s8 pair overflows 16 bits
        codes, scale = quantize_weight(weight, bits)
        assert codes.dtype == np.int8 and scale.shape == (5,)
        assert np.abs(codes).max() == levels
        assert np.all(np.abs(codes * scale - weight) <= scale / 2 + 1e-12)
        assert np.all(codes[:, 4] == 0)  # an all-zero column stays zero with a finite scale


def _one_matmul_model(weight: np.ndarray, names: tuple[str, ...] = ("/encoder/layers.0/mlp/Wi/MatMul",)):
    """A graph of `len(names)` chained encoder MatMuls by `weight` (square when more than one)."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = weight.shape
    nodes = [
        helper.make_node(
            "MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}" if i + 1 < len(names) else "y"], name=name
        )
        for i, name in enumerate(names)
    ]
    nodes[0].input[0] = "x"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, n])],
        [numpy_helper.from_array(weight, f"w{i}") for i in range(len(names))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("bits", [7, 8])
def test_int8_matmul_computes_the_quantized_product_exactly(bits):
    """The written graph (u8 x u8) returns the exact integer product of the row and column codes at
    7-bit and 8-bit weights: no 16-bit saturation. 8-bit weights round half as coarsely."""
    pytest.importorskip("onnx")
    import onnxruntime as ort

    from laya_onnx.export.precision import Int8Plan, lower_precision, quantize_weight

    rng = np.random.default_rng(2)
    weight = (rng.standard_normal((256, 48)) * 0.05).astype(np.float32)
    x = rng.standard_normal((2, 9, 256)).astype(np.float32)
    x[0, 0] = 0.0  # an all-zero row (padding) stays finite and zero
    model = _one_matmul_model(weight)
    record = lower_precision(model, "int8", plan=Int8Plan(weight_bits=bits))
    assert record["weight_bits"] == bits and record["matmuls"] == 1 and record["kept_fp32"] == []
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]

    codes, col_scale = quantize_weight(weight, bits)
    w_int = codes.astype(np.int64)
    assert np.abs(w_int).max() == (127 if bits == 8 else 63)
    row_scale = np.maximum(np.abs(x).max(-1, keepdims=True), 1e-12) / 127
    x_int = np.rint(x / row_scale).astype(np.int64)
    expected = (x_int @ w_int) * row_scale * col_scale
    assert np.allclose(y, expected, rtol=1e-5, atol=1e-6)
    assert np.all(y[0, 0] == 0.0)
    rms = np.sqrt(np.mean((y - x @ weight) ** 2))  # |x @ weight| is 0.62 on average
    assert rms < (0.0095 if bits == 8 else 0.0135)  # measured 0.0081 and 0.0122


def test_int8_plan_keeps_the_named_modules_fp32_and_records_them():
    pytest.importorskip("onnx")
    from collections import Counter as Count

    from laya_onnx.export.precision import Int8Plan, lower_precision

    weight = (np.random.default_rng(3).standard_normal((32, 32)) * 0.1).astype(np.float32)
    names = (
        "/encoder/layers.0/attn/Wqkv/MatMul",
        "/encoder/layers.0/mlp/Wo/MatMul",
        "/encoder/layers.1/attn/Wqkv/MatMul",
        "/encoder/layers.1/mlp/Wo/MatMul",
    )
    model = _one_matmul_model(weight, names)
    record = lower_precision(model, "int8", plan=Int8Plan(keep_fp32=("attn.Wqkv", "layers.1.mlp.Wo")))
    ops = Count(n.op_type for n in model.graph.node)
    assert ops["MatMulIntegerToFloat"] == record["matmuls"] == 1 and ops["MatMul"] == 3
    assert record["kept_fp32"] == ["layers.0.attn.Wqkv", "layers.1.attn.Wqkv", "layers.1.mlp.Wo"]
    assert record["keep_fp32"] == ["attn.Wqkv", "layers.1.mlp.Wo"] and "3 kept fp32" in record["rewrite"]

    with pytest.raises(ValueError, match=r"no lowered MatMul matches \['mlp.W0'\]"):
        lower_precision(_one_matmul_model(weight, names), "int8", plan=Int8Plan(keep_fp32=("mlp.W0",)))
    with pytest.raises(ValueError, match="weight bits must be 7 or 8"):
        Int8Plan(weight_bits=4)


def test_int8_lowers_the_head_layers_too_fp16_does_not():
    pytest.importorskip("onnx")
    from laya_onnx.export.precision import Int8Plan, lower_precision

    weight = (np.random.default_rng(5).standard_normal((16, 16)) * 0.1).astype(np.float32)
    names = (
        "/encoder/layers.1/mlp/Wi/MatMul",
        "/head/layers.0/linear1/MatMul",
        "/head/layers.1/self_attn/out_proj/MatMul",
        "/scorer/scorer.1/MatMul",
    )

    def lowered(precision, plan=None):
        model = _one_matmul_model(weight, names)
        record = lower_precision(model, precision, plan=plan)
        fp32 = [n.name for n in model.graph.node if n.op_type == "MatMul"]
        return record, fp32

    record, fp32 = lowered("int8", Int8Plan())
    assert record["matmuls"] == 3 and fp32 == ["/scorer/scorer.1/MatMul"]  # the scorer stays fp32
    record, fp32 = lowered("int8", Int8Plan(keep_fp32=("head",)))
    assert record["kept_fp32"] == ["head.layers.0.linear1", "head.layers.1.self_attn.out_proj"]
    record, fp32 = lowered("fp16")
    assert record["matmuls"] == 1 and set(names[1:]) <= set(fp32)


def test_decision_margin_is_the_least_move_that_flips_a_decision():
    from laya_onnx.core.judge import decision_margin

    assert decision_margin(
        {"type": "choice", "probabilities": {"a": 0.5, "b": 0.3, "c": 0.2}}
    ) == pytest.approx(0.1)
    assert decision_margin(
        {"type": "score", "probabilities": {"0": 0.2, "1": 0.2, "2": 0.6}}
    ) == pytest.approx(0.2)
    assert decision_margin({"type": "noul", "noul": 0.7}) == pytest.approx(0.2)
    assert decision_margin({"type": "choice", "probabilities": {"escalate": 0.9}}) == float("inf")


def _outcomes(flips_at: list[float], holds_at: list[float]) -> list[tuple[float, bool, str]]:
    return [(m, True, f"flip {i}") for i, m in enumerate(flips_at)] + [(m, False, "held") for m in holds_at]


def test_the_int8_gate_counts_a_flip_only_where_fp32_decided_by_more_than_int8_moved():
    """Random weights make near ties: a suite where 3 of 10 decisions flip, each within the
    measured max |dp| of flipping in fp32 itself, passes; the floor over every decision it replaced
    (90%) refused it. A fixed tie margin below the error counts flips above it."""
    from laya_onnx.export.ladder import agreement_record, meets_bar
    from laya_onnx.export.precision import PRECISION_BARS, PrecisionBar

    outcomes = _outcomes(flips_at=[0.01, 0.04, 0.09], holds_at=[0.02, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    m = agreement_record(outcomes, max_dp=0.1, max_dact=0.05, tie_margin=None)
    assert (m["decisions"], m["agreeing"], m["agreement"]) == (10, 7, 0.7)
    assert (m["tie_margin"], m["near_ties"], m["decisive"], m["decisive_agreement"]) == (0.1, 4, 6, 1.0)
    assert m["flipped"][0] == "flip 0 (fp32 margin 0.01)"
    assert meets_bar(m, PRECISION_BARS["int8"])
    old = PrecisionBar(
        max_abs_dp=0.15, min_agreement=0.9, tie_margin=0.0
    )  # the int8 gate before, all decisions
    assert not meets_bar(agreement_record(outcomes, 0.1, 0.05, old.tie_margin), old)
    assert not meets_bar(
        agreement_record(outcomes, 0.16, 0.05, None), PRECISION_BARS["int8"]
    )  # |dp| still binds
    strict = PrecisionBar(max_abs_dp=0.15, min_agreement=1.0, tie_margin=0.03)
    tight = agreement_record(outcomes, 0.1, 0.05, strict.tie_margin)
    assert (tight["near_ties"], tight["decisive"], tight["decisive_agreeing"]) == (4, 8, 6)
    assert not meets_bar(tight, strict)  # the flips at 0.04 and 0.09 count against it


def test_fp16_and_bf16_gates_still_count_every_decision():
    from laya_onnx.export.ladder import agreement_record, meets_bar
    from laya_onnx.export.precision import PRECISION_BARS

    outcomes = _outcomes(flips_at=[0.001], holds_at=[0.5] * 99)
    for name in ("fp16", "bf16"):
        m = agreement_record(outcomes, 1e-3, 0.0, PRECISION_BARS[name].tie_margin)
        assert m["decisive"] == 100 and m["decisive_agreement"] == 0.99
    assert not meets_bar(agreement_record(outcomes, 1e-3, 0.0, 0.0), PRECISION_BARS["fp16"])  # 99% < 99.5%


def test_export_cli_makes_the_gate_from_its_options():
    import argparse

    from laya_onnx.cli.common import UsageError
    from laya_onnx.cli.export import precision_bar
    from laya_onnx.export.precision import PRECISION_BARS, PrecisionBar

    def gate(precision="int8", max_dp=None, agreement=None, tie=None):
        return precision_bar(
            argparse.Namespace(
                precision=precision, gate_max_dp=max_dp, gate_min_agreement=agreement, gate_tie_margin=tie
            )
        )

    assert gate() is None
    assert gate(max_dp=0.05, tie=0.01) == PrecisionBar(0.05, PRECISION_BARS["int8"].min_agreement, 0.01)
    assert gate("fp16", agreement=1.0) == PrecisionBar(PRECISION_BARS["fp16"].max_abs_dp, 1.0, 0.0)
    with pytest.raises(UsageError, match=r"must be within \[0, 1\]"):
        gate(tie=-0.1)
    with pytest.raises(UsageError, match="apply to --precision fp16, int8 or bf16"):
        gate("fp32", max_dp=0.1)


def test_export_cli_refuses_int8_options_for_another_precision(tmp_path, capsys):
    from laya_onnx.cli import main
    from laya_onnx.cli.common import EXIT_USAGE

    argv = ["export", str(tmp_path / "none"), "-o", str(tmp_path / "out"), "--precision", "fp16"]
    assert main([*argv, "--int8-weight-bits", "8"]) == EXIT_USAGE
    assert "--int8-keep-fp32 and --int8-weight-bits apply to --precision int8" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_int8_plan_is_refused_for_another_precision(tmp_path):
    # The exporter and its precision step share one check; the export refuses before any work.
    from laya_onnx.export import export_bundle
    from laya_onnx.export.ladder import PrecisionStep
    from laya_onnx.export.precision import DEFAULT_INT8_PLAN

    for precision in ("fp32", "fp16"):
        with pytest.raises(ValueError, match=f"int8_plan applies to precision 'int8', not '{precision}'"):
            export_bundle(
                tmp_path / "none", tmp_path / "out", precision=precision, int8_plan=DEFAULT_INT8_PLAN
            )
    with pytest.raises(ValueError, match="int8_plan applies to precision 'int8', not 'fp16'"):
        PrecisionStep("fp16", plan=DEFAULT_INT8_PLAN)
    assert PrecisionStep("int8", plan=DEFAULT_INT8_PLAN).plan is DEFAULT_INT8_PLAN
    assert not (tmp_path / "out").exists()


def test_export_cli_int8_options_make_the_plan():
    import argparse

    from laya_onnx.cli.export import int8_plan
    from laya_onnx.export.precision import DEFAULT_INT8_PLAN, Int8Plan

    def plan(keep=None, bits=None):
        return int8_plan(argparse.Namespace(precision="int8", int8_keep_fp32=keep, int8_weight_bits=bits))

    assert plan() is None  # the exporter's default plan
    assert plan(bits=7) == Int8Plan(keep_fp32=DEFAULT_INT8_PLAN.keep_fp32, weight_bits=7)
    assert plan(keep="") == Int8Plan(keep_fp32=(), weight_bits=DEFAULT_INT8_PLAN.weight_bits)
    assert plan(keep=" mlp.Wo, layers.0 ").keep_fp32 == ("mlp.Wo", "layers.0")


def _assert_same_record(got, expected, where: str = "precision") -> None:
    """Equal JSON values, floats within 1e-5 relative (torch's thread-count noise is ~1e-7)."""
    if isinstance(expected, float) and isinstance(got, float):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-9), where
    elif isinstance(expected, dict) and isinstance(got, dict):
        assert sorted(got) == sorted(expected), where
        for key in expected:
            _assert_same_record(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list) and isinstance(got, list):
        assert len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            _assert_same_record(g, e, f"{where}[{i}]")
    else:
        assert got == expected, where


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("lowered_inline", [False, True])
def test_a_lowered_graph_from_external_data_is_the_inline_one(
    lowered, checkpoint_factory, bundle_factory, tmp_path, precision, lowered_inline
):
    """The rewrite reads the fp32 weights from the external data file one at a time and streams the
    kept ones into the new file (or, under the threshold, inlines them): the same graph, bit for
    bit in its answers, as the all-inline export."""
    import onnx

    from laya_onnx.core.bundle import GRAPH_DATA_FILE, GRAPH_FILE
    from laya_onnx.export import export_bundle

    inline = lowered("tiny-english", precision)

    def weights(bundle) -> int:
        return sum(len(t.raw_data) for t in onnx.load(str(bundle / GRAPH_FILE)).graph.initializer)

    lowered_bytes, fp32_bytes = weights(inline), weights(bundle_factory("tiny-english"))
    assert fp32_bytes > lowered_bytes
    between = (lowered_bytes + fp32_bytes) // 2  # fp32 is written external, the lowered graph inline
    out = tmp_path / "external"
    manifest = export_bundle(
        checkpoint_factory("tiny-english"),
        out,
        verbose=False,
        name="tiny-english",
        precision=precision,
        measure_memory=False,
        external_data_threshold=between if lowered_inline else 0,
    )
    data = [] if lowered_inline else [GRAPH_DATA_FILE]
    assert manifest.graph.external_data == data
    assert sorted(p.name for p in out.iterdir()) == sorted([*(p.name for p in inline.iterdir()), *data])
    graph = onnx.load(str(out / GRAPH_FILE), load_external_data=False)
    locations = {e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == set(data)
    # The same record, its measured gate figures up to torch's own float noise: they compare the
    # graph with fp32 torch, whose reductions follow the process's torch thread count, and under
    # pytest-xdist the inline export may come from another worker (the graphs' own answers are
    # held bit for bit below).
    _assert_same_record(
        manifest.precision.as_json(), json.loads((inline / "manifest.json").read_text())["precision"]
    )
    a, b = _agent(inline), _agent(out)
    ref = _row_outputs(a, lambda: a.predict(STATE, QUESTIONS))
    got = _row_outputs(b, lambda: b.predict(STATE, QUESTIONS))
    assert ref[0] == got[0]
    for (a_logits, a_act), (b_logits, b_act) in zip(ref[1], got[1], strict=True):
        assert np.array_equal(a_logits, b_logits) and np.array_equal(a_act, b_act)
