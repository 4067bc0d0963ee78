"""bf16 bundles: `export_bundle(precision="bf16")` gates OpenVINO's bf16 computation of the fp32
graph against fp32 torch; `ONNXAgent` runs it on OpenVINO where the CPU has bf16 and falls back,
counted and said, to fp32 onnxruntime where it has not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from laya_onnx.core.bundle import ReducedPrecisionWarning
from laya_onnx.core.machine import Cpu
from laya_onnx.core.openvino_session import OPENVINO, bf16_unavailable

STATE = "I was charged twice for my subscription this month and nobody answers my emails."
QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "tech", "sales"]},
    "refund": {"type": "noul", "instructions": "Should we refund?"},
}
NO_BF16 = Cpu(model="a CPU without bf16", flags=frozenset({"avx2", "avx512f"}), cores=2)

needs_bf16 = pytest.mark.skipif(
    bf16_unavailable() is not None, reason=f"bf16 cannot run here: {bf16_unavailable()}"
)


def _agent(bundle, **kwargs):
    from laya_onnx.core.agent import ONNXAgent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReducedPrecisionWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        return ONNXAgent(bundle, **kwargs)


def _probabilities(result) -> np.ndarray:
    out = []
    for answer in result["answers"].values():
        out += list((answer.get("probabilities") or {}).values())
        if "p_yes" in answer:
            out.append(answer["p_yes"])
    return np.array(out, dtype=np.float64)


def test_a_cpu_without_bf16_or_openvino_is_named():
    assert "has no bf16 in hardware" in (bf16_unavailable(NO_BF16) or "")
    with_bf16 = Cpu(model="x", flags=frozenset({"avx512_bf16"}), cores=2)
    try:
        import openvino  # noqa: F401
    except ImportError:
        assert "pip install 'laya-onnx[openvino]'" in (bf16_unavailable(with_bf16) or "")
    else:
        assert bf16_unavailable(with_bf16) is None


@pytest.mark.torch
@needs_bf16
def test_bf16_bundle_manifest_gate_and_answers(lowered, bundle_factory):
    from laya_onnx.export.precision import PRECISION_BARS

    bundle = lowered("tiny-english", "bf16")
    record = json.loads((bundle / "manifest.json").read_text())["precision"]
    gate = PRECISION_BARS["bf16"]
    assert record["precision"] == "bf16" and record["passed"] is True and record["rewrite"] is None
    assert record["gate"] == gate.as_dict() and "OpenVINO" in record["runtime"]
    assert set(record["suites"]) == {"export-cases", "parity-core"}
    for name, m in record["suites"].items():
        assert m["requests"] > 5 and m["agreement"] >= gate.min_agreement, name
        # measured in bf16: an fp32 computation is within 1e-5 of torch
        assert 1e-4 < m["max_abs_dp"] <= gate.max_abs_dp, name
        # laya's own bf16 mode, measured beside it on the same requests
        beside = record["torch_bf16"][name]
        assert beside["requests"] == m["requests"] and 0 < beside["max_abs_dp"] < 0.5, name
    # an fp32 graph, traced with transformers' layers (OpenVINO fuses their RoPE): on onnxruntime
    # it answers bit for bit as the fp32 bundle's constant-shape layers do
    export = json.loads((bundle / "manifest.json").read_text())["export"]
    assert export["layers"] == "transformers"
    fp32 = bundle_factory("tiny-english")
    assert json.loads((fp32 / "manifest.json").read_text())["export"]["layers"] == "constant-shape"
    from laya_onnx.export.validation import open_session

    exact = _agent(fp32)
    passes: list[dict] = []
    run = exact.session.run
    exact.session.run = lambda feeds, **kw: (passes.append(dict(feeds)), run(feeds, **kw))[1]
    exact.predict(STATE, QUESTIONS)
    assert passes
    sessions = [open_session(path / "laya.onnx") for path in (fp32, bundle)]
    for feeds in passes:
        got, expected = (s.run(None, feeds) for s in sessions)
        assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))

    with pytest.warns(ReducedPrecisionWarning, match=r"runs in bf16 \(not fp32; export-cases: "):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            from laya_onnx.core.agent import ONNXAgent

            agent = ONNXAgent(bundle)
    assert agent.precision == "bf16" and agent.providers == [OPENVINO] and agent.fallbacks == {}
    ours, theirs = agent.predict(STATE, QUESTIONS), exact.predict(STATE, QUESTIONS)
    dp = np.abs(_probabilities(ours) - _probabilities(theirs))
    assert 0 < dp.max() <= gate.max_abs_dp


def test_a_bf16_bundle_on_a_cpu_without_bf16_runs_fp32_and_says_so(bundle_factory, monkeypatch):
    import laya_onnx.core.openvino_session as ovs
    from laya_onnx.core.session import ProviderUnavailable

    bundle = bundle_factory("tiny-english")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["precision"] = {"precision": "bf16", "rewrite": None, "suites": {}}
    monkeypatch.setattr(ovs, "read_cpu", lambda: NO_BF16)
    staged = _stage(bundle, manifest)
    with pytest.warns(RuntimeWarning, match="bf16 bundle runs fp32 on onnxruntime.*has no bf16 in hardware"):
        agent = _agent_warned(staged)
    assert agent.precision == "bf16" and agent.providers == ["CPUExecutionProvider"]
    assert agent.fallbacks[OPENVINO]["count"] == 1
    assert "a CPU without bf16" in agent.fallbacks[OPENVINO]["last_reason"]
    exact = _agent(bundle)
    assert np.array_equal(
        _probabilities(agent.predict(STATE, QUESTIONS)), _probabilities(exact.predict(STATE, QUESTIONS))
    )
    with pytest.raises(ProviderUnavailable, match="cannot run at bf16 here"):
        _agent(staged, strict_providers=True)


def _stage(bundle, manifest):
    """A copy of `bundle` with `manifest` (its files' digests unchanged)."""
    import shutil
    import tempfile
    from pathlib import Path

    out = Path(tempfile.mkdtemp(prefix="bf16-")) / bundle.name
    shutil.copytree(bundle, out)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def _agent_warned(bundle):
    from laya_onnx.core.agent import ONNXAgent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReducedPrecisionWarning)
        return ONNXAgent(bundle)


def test_bf16_export_is_refused_where_bf16_cannot_run(monkeypatch):
    import laya_onnx.core.openvino_session as ovs
    from laya_onnx.export.ladder import PrecisionStep

    monkeypatch.setattr(ovs, "read_cpu", lambda: NO_BF16)
    with pytest.raises(ValueError, match="exported and gated on a CPU that runs bf16: .*no bf16 in hardware"):
        PrecisionStep("bf16")


def test_the_bf16_runtime_path_imports_without_torch():
    script = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "transformers"):
                    raise ImportError(name)
        sys.meta_path.insert(0, Block())
        import laya_onnx.core.openvino_session as ovs
        ovs.bf16_unavailable()
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def _weighted_matmuls(model):
    return [
        n
        for n in model.get_ordered_ops()
        if n.get_type_name() == "MatMul" and n.input_value(1).get_node().get_type_name() == "Constant"
    ]


def test_the_encoder_gemms_but_the_first_layers_are_put_in_bf16_and_nothing_else(bundle_factory):
    ov = pytest.importorskip("openvino")
    from laya_onnx.core.openvino_session import bf16_gemms

    model = ov.Core().read_model(str(bundle_factory("tiny-english") / "laya.onnx"))
    weight = {
        n.get_friendly_name(): n.input_value(1).get_node().get_friendly_name()
        for n in _weighted_matmuls(model)
    }
    expected = {n for n, w in weight.items() if w.startswith("encoder.layers.") and ".layers.0." not in w}
    kept = {
        n for n, w in weight.items() if w.startswith(("encoder.layers.0.", "head.", "scorer.", "act_head."))
    }
    assert expected and kept and len(expected) + len(kept) == len(weight)
    assert bf16_gemms(model) == len(expected)
    bf16 = ov.Type.bf16
    in_bf16 = set()
    for node in model.get_ordered_ops():
        if node.get_type_name() == "MatMul" and node.input_value(0).get_element_type() == bf16:
            # both inputs arrive in bf16, through a conversion; every reader gets f32 back
            assert node.input_value(1).get_element_type() == bf16
            readers = [r.get_node() for r in node.output(0).get_target_inputs()]
            assert [(r.get_type_name(), r.output(0).get_element_type()) for r in readers] == [
                ("Convert", ov.Type.f32)
            ] * len(readers)
            in_bf16.add(node.get_friendly_name())
        elif node.get_type_name() != "Convert":
            # nothing else computes in bf16
            assert all(out.get_element_type() != bf16 for out in node.outputs()), node
    assert in_bf16 == expected


def test_a_graph_without_parameter_names_gets_every_weighted_gemm_in_bf16(bundle_factory):
    ov = pytest.importorskip("openvino")
    from laya_onnx.core.openvino_session import bf16_gemms

    model = ov.Core().read_model(str(bundle_factory("tiny-english") / "laya.onnx"))
    weighted = _weighted_matmuls(model)
    for i, node in enumerate(weighted):  # as the dynamo exporter names its constants
        node.input_value(1).get_node().set_friendly_name(f"val_{i}")
    assert bf16_gemms(model) == len(weighted)


@needs_bf16
def test_the_bf16_session_rounds_the_gemms_and_nothing_else(bundle_factory):
    """Compiled with the bf16 config but without the conversions, the graph answers as fp32 does
    (so the config leaves every op f32); with them, it answers as a bf16 computation."""
    import openvino as ov

    from laya_onnx.core.openvino_session import BF16_CONFIG, OpenVINOSession

    bundle = bundle_factory("tiny-english")
    graph = str(bundle / "laya.onnx")
    exact = _agent(bundle, providers=["CPUExecutionProvider"])
    feeds: list[dict] = []
    run = exact.session.run
    exact.session.run = lambda f, **kw: (feeds.append(dict(f)), run(f, **kw))[1]
    exact.predict(STATE, QUESTIONS)
    reference = run(feeds[0])[0]
    core = ov.Core()
    plain = core.compile_model(core.read_model(graph), "CPU", BF16_CONFIG)
    f32 = np.array(plain.create_infer_request().infer(feeds[0])[plain.output("logits")])
    assert np.abs(f32 - reference).max() < 1e-4
    ours = OpenVINOSession(graph).run(feeds[0])[0]
    assert 1e-3 < np.abs(ours - reference).max() < 0.5
