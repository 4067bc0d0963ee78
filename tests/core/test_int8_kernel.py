"""The int8 kernel choice: u8 x s8 where the CPU has VNNI, u8 x u8 elsewhere, the same answers.

The choice itself is tested on described CPUs (no VNNI, VNNI, flags unknown); the bundle tests
run on this machine's CPU: both forms of a tiny int8 bundle give bit-identical logits where both
can run (the u8 x s8 one needs VNNI here; the test says so when it skips).
"""

from __future__ import annotations

import dataclasses
import json
from functools import partial

import numpy as np
import pytest

from laya_onnx.core import settings
from laya_onnx.core.errors import ConfigError
from laya_onnx.core.int8_kernel import (
    AUTO,
    U8S8,
    U8S8_GRAPH_FILE,
    U8U8,
    Int8KernelError,
    choose_kernel,
    cpu_info,
    requested_kernel,
)
from laya_onnx.core.machine import Cpu, read_cpu
from laya_onnx.core.manifest import PrecisionRecord

ZEN3 = Cpu("AMD EPYC 7763", frozenset({"avx2", "fma"}), 2)
ZEN4 = Cpu("AMD EPYC 9654", frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}), 2)
ALDER_LAKE = Cpu("12th Gen Intel Core i7", frozenset({"avx2", "avx_vnni"}), 2)
UNKNOWN = Cpu("arm64", frozenset(), 2)
TWO_FORMS = PrecisionRecord.parse(
    {"precision": "int8", "weight_bits": 8, "kernels": {U8U8: "laya.onnx", U8S8: U8S8_GRAPH_FILE}}
)
NEEDS_VNNI = pytest.mark.skipif(
    not cpu_info().vnni,
    reason=f"this CPU ({cpu_info().model}) has no VNNI: u8 x s8 with 8-bit codes saturates",
)


def test_cpuinfo_is_read_from_the_first_processor():
    text = (
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_vnni\n\nprocessor\t: 1\n"
    )
    cpu = read_cpu(text)
    assert cpu.model == "AMD EPYC" and cpu.vnni and not cpu.bf16 and "avx2" in cpu.flags
    assert cpu.as_dict()["features"]["avx512_vnni"] and cpu.as_dict()["vnni"]
    assert not read_cpu("Features\t: fp asimd asimddp\n").vnni  # ARM: no x86 VNNI flag


@pytest.mark.parametrize(("cpu", "kernel"), [(ZEN3, U8U8), (ZEN4, U8S8), (ALDER_LAKE, U8S8), (UNKNOWN, U8U8)])
def test_auto_takes_u8s8_only_where_the_cpu_has_vnni(cpu, kernel):
    choice = choose_kernel(TWO_FORMS, AUTO, cpu)
    assert choice.kernel == kernel and choice.graph == TWO_FORMS.kernels[kernel]
    assert cpu.model in choice.reason
    assert ("no VNNI" if cpu is ZEN3 else "flags unknown" if cpu is UNKNOWN else "VNNI: ") in choice.reason


def test_forcing_a_kernel_that_would_answer_wrongly_is_refused():
    assert choose_kernel(TWO_FORMS, U8U8, ZEN4).kernel == U8U8
    assert choose_kernel(TWO_FORMS, U8S8, ZEN4).graph == U8S8_GRAPH_FILE
    with pytest.raises(Int8KernelError, match=r"u8s8 was asked for .* has no VNNI: .*saturates"):
        choose_kernel(TWO_FORMS, U8S8, ZEN3)
    with pytest.raises(Int8KernelError, match="has no VNNI"):
        choose_kernel(TWO_FORMS, U8S8, UNKNOWN)  # flags unknown: not known to be safe


def test_seven_bit_codes_run_u8s8_everywhere():
    seven = dataclasses.replace(TWO_FORMS, weight_bits=7)
    assert choose_kernel(seven, AUTO, ZEN3).kernel == U8S8
    assert choose_kernel(seven, U8S8, ZEN3).kernel == U8S8


def test_bundles_with_one_form_run_it_and_refuse_the_other():
    old_8bit = PrecisionRecord.parse({"precision": "int8", "weight_bits": 8})
    old_7bit = PrecisionRecord.parse({"precision": "int8", "weight_bits": 7})
    assert choose_kernel(old_8bit, AUTO, ZEN4).kernel == U8U8
    assert choose_kernel(old_7bit, AUTO, ZEN3).kernel == U8S8
    with pytest.raises(Int8KernelError, match="holds the u8u8 form only; re-export"):
        choose_kernel(old_8bit, U8S8, ZEN4)
    fp32 = choose_kernel(PrecisionRecord(), U8S8, ZEN3)  # nothing to choose: not refused
    assert fp32.kernel is None and fp32.graph == "laya.onnx"


def test_the_setting_is_read_from_the_argument_then_the_environment(monkeypatch):
    env = settings.INT8_KERNEL.env
    monkeypatch.delenv(env, raising=False)
    assert requested_kernel() == AUTO
    monkeypatch.setenv(env, " U8U8 ")
    assert requested_kernel() == U8U8 and requested_kernel("u8s8") == U8S8
    monkeypatch.setenv(env, "vnni")
    with pytest.raises(ConfigError, match=rf"invalid {env} 'vnni': must be one of auto, u8s8, u8u8"):
        requested_kernel()
    with pytest.raises(Int8KernelError, match="int8_kernel must be one of"):
        requested_kernel("fast")


# -- a tiny int8 bundle on this machine's CPU ---------------------------------------------------


def _agent(bundle, kernel):
    import warnings

    from laya_onnx.core.agent import ONNXAgent
    from laya_onnx.core.bundle import ReducedPrecisionWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReducedPrecisionWarning)
        return ONNXAgent(bundle, int8_kernel=kernel)


@pytest.mark.torch
def test_an_int8_bundle_holds_both_forms_of_the_same_codes(lowered):
    import onnx
    from onnx import numpy_helper

    bundle = lowered("tiny-english", "int8")
    record = json.loads((bundle / "manifest.json").read_text())["precision"]
    assert record["kernels"] == {U8U8: "laya.onnx", U8S8: U8S8_GRAPH_FILE}
    assert record["kernels_identical"] is True or "no VNNI" in record["kernels_identical"]
    here = choose_kernel(PrecisionRecord.parse(record), AUTO)
    assert record["measured_on"].endswith(f"{here.kernel} kernel ({here.graph})")

    def weights(name):
        graph = onnx.load(str(bundle / name)).graph
        gemms = [n for n in graph.node if n.op_type in ("MatMulInteger", "MatMulIntegerToFloat")]
        tables = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        return [tables[n.input[1]] for n in gemms]

    u8, s8 = weights("laya.onnx"), weights(U8S8_GRAPH_FILE)
    assert len(u8) == len(s8) == record["matmuls"]
    for a, b in zip(u8, s8, strict=True):
        assert a.dtype == np.uint8 and b.dtype == np.int8
        assert np.array_equal(a.astype(np.int16) - 128, b) and np.abs(b).max() == 127


@pytest.mark.torch
def test_auto_runs_the_form_this_cpu_takes(lowered):
    agent = _agent(lowered("tiny-english", "int8"), AUTO)
    assert agent.int8_kernel == (U8S8 if cpu_info().vnni else U8U8)
    assert f"int8_kernel={agent.int8_kernel!r}" in repr(agent)


@pytest.mark.torch
def test_u8s8_is_refused_on_a_cpu_without_vnni(lowered, monkeypatch):
    import laya_onnx.core.int8_kernel as kernel_module

    monkeypatch.setattr(kernel_module, "cpu_info", lambda: ZEN3)
    bundle = lowered("tiny-english", "int8")
    assert _agent(bundle, AUTO).int8_kernel == U8U8
    with pytest.raises(Int8KernelError, match="has no VNNI"):
        _agent(bundle, U8S8)


@NEEDS_VNNI
@pytest.mark.torch
def test_both_kernels_give_bit_identical_logits_alone_and_in_a_batch(lowered):
    from tests.export.test_precision import NEIGHBOURS, QUESTIONS, STATE, _batch_dependence, _row_outputs

    bundle = lowered("tiny-english", "int8")
    agents = {kernel: _agent(bundle, kernel) for kernel in (U8S8, U8U8)}
    assert {k: a.int8_kernel for k, a in agents.items()} == {U8S8: U8S8, U8U8: U8U8}
    calls = {
        "alone": lambda a: a.predict(STATE, QUESTIONS),
        "in a batch": lambda a: a.predict_batch(NEIGHBOURS[:3] + [STATE] + NEIGHBOURS[3:], QUESTIONS)[3],
    }
    for name, call in calls.items():
        (answer_s8, rows_s8), (answer_u8, rows_u8) = (
            _row_outputs(agents[k], partial(call, agents[k])) for k in (U8S8, U8U8)
        )
        assert answer_s8 == answer_u8, name
        for (a_logits, a_act), (b_logits, b_act) in zip(rows_s8, rows_u8, strict=True):
            assert np.array_equal(a_logits, b_logits) and np.array_equal(a_act, b_act), name
    for agent in agents.values():
        assert _batch_dependence(agent) == []


@NEEDS_VNNI
def test_u8s8_sums_full_8_bit_codes_exactly_with_vnni():
    """The kernel the u8s8 form runs: exact integer sums with codes -127..127 (no saturation)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    a = rng.integers(1, 256, (64, 512)).astype(np.uint8)
    w = rng.integers(-127, 128, (512, 96)).astype(np.int8)
    w[:2] = 127  # the pairs vpmaddubsw would saturate: 255 * 127 * 2 > 32767
    a[:, :2] = 255
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "azp"], ["y"])],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, 512])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [None, 96])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0, np.uint8), "azp")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert np.array_equal(session.run(None, {"a": a})[0], a.astype(np.int64) @ w.astype(np.int64))
