"""The lean export: weights streamed into the graph, external data, and the validation cases.

External data is forced on a tiny preset (`external_data_threshold=0`) so CI writes, verifies
and runs `laya.onnx` + `laya.onnx.data` the way a full-size export does.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from laya_onnx.core.bundle import GRAPH_DATA_FILE, GRAPH_FILE, GRAPH_INPUTS, Bundle, BundleError, sha256_file
from laya_onnx.core.manifest import GraphRecord

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def external_bundle(checkpoint_factory, tmp_path_factory):
    """A tiny-english bundle exported with external data into a directory that already held a
    garbage graph and data file from "an earlier export"."""
    from laya_onnx.export import export_bundle

    out = tmp_path_factory.mktemp("external") / "bundle"
    out.mkdir()
    (out / GRAPH_FILE).write_bytes(b"not a graph")
    (out / GRAPH_DATA_FILE).write_bytes(b"\x00garbage" * 4096)
    export_bundle(
        checkpoint_factory("tiny-english"),
        out,
        force=True,
        verbose=False,
        measure_memory=False,
        external_data_threshold=0,
    )
    return out


def _run(graph: Path, feeds):
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    return session.run(None, {k: feeds[k] for k in GRAPH_INPUTS})


def test_external_data_is_written_hashed_and_runs(external_bundle, bundle_factory, checkpoint_factory):
    import onnx

    from laya_onnx.export.cases import CALLS, encode_calls

    manifest = Bundle.open(external_bundle, verify=True).manifest
    assert manifest is not None
    assert manifest.graph == GraphRecord(file=GRAPH_FILE, external_data=[GRAPH_DATA_FILE])
    for name in (GRAPH_FILE, GRAPH_DATA_FILE):
        assert manifest.digest(name) == sha256_file(external_bundle / name)
    assert b"garbage" not in (external_bundle / GRAPH_DATA_FILE).read_bytes()
    # Every initializer but the tiny ones (onnx_ir keeps tensors under 256 bytes inline) lives in
    # the data file.
    proto = onnx.load(str(external_bundle / GRAPH_FILE), load_external_data=False)
    locations = {
        entry.value for t in proto.graph.initializer for entry in t.external_data if entry.key == "location"
    }
    assert locations == {GRAPH_DATA_FILE}
    inline = [t.name for t in proto.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    assert all(len(t.raw_data) <= 256 for t in proto.graph.initializer if t.name in inline)
    assert len(inline) < len(proto.graph.initializer) / 2
    assert manifest.validation.passed is True

    # The same weights and graph as the inline export: identical outputs, bit for bit.
    inline_bundle = bundle_factory("tiny-english")
    assert not (inline_bundle / GRAPH_DATA_FILE).exists()
    assert Bundle.open(inline_bundle).manifest.external_data == []
    ckpt = checkpoint_factory("tiny-english")
    feeds = encode_calls(ckpt / "tokenizer", 512, 192, CALLS[-2:-1])[0]["feeds"]
    for ours, theirs in zip(
        _run(external_bundle / GRAPH_FILE, feeds), _run(inline_bundle / GRAPH_FILE, feeds), strict=True
    ):
        assert np.array_equal(ours, theirs)


def test_reexporting_inline_removes_the_data_file(external_bundle, checkpoint_factory, tmp_path):
    from laya_onnx.export import export_bundle

    out = tmp_path / "again"
    shutil.copytree(external_bundle, out)
    manifest = export_bundle(
        checkpoint_factory("tiny-english"), out, force=True, verbose=False, measure_memory=False
    )
    assert not (out / GRAPH_DATA_FILE).exists() and GRAPH_DATA_FILE not in manifest.files
    assert manifest.graph.external_data == []
    Bundle.open(out, verify=True)


def test_runtime_verifies_the_data_file(external_bundle, bundle_factory, tmp_path):
    from laya_onnx.core.agent import ONNXAgent

    # A changed data file fails its hash.
    tampered = tmp_path / "tampered"
    shutil.copytree(external_bundle, tampered)
    data = bytearray((tampered / GRAPH_DATA_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tampered / GRAPH_DATA_FILE).write_bytes(bytes(data))
    with pytest.raises(BundleError, match="sha256 mismatch for 'laya.onnx.data'"):
        ONNXAgent(tampered)

    # A manifest that names external data without hashing it is refused, even unverified.
    unhashed = tmp_path / "unhashed"
    shutil.copytree(external_bundle, unhashed)
    manifest = json.loads((unhashed / "manifest.json").read_text())
    del manifest["files"][GRAPH_DATA_FILE]
    (unhashed / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="external data 'laya.onnx.data' is not hashed"):
        Bundle.open(unhashed, verify=False)

    # A stray data file beside an inline graph (left by an earlier export) is refused.
    stray = tmp_path / "stray"
    shutil.copytree(bundle_factory("tiny-english"), stray)
    shutil.copyfile(external_bundle / GRAPH_DATA_FILE, stray / GRAPH_DATA_FILE)
    with pytest.raises(BundleError, match="holds laya.onnx.data, which its manifest does not list"):
        Bundle.open(stray)

    # The intact bundle answers as the inline one does.
    questions = {
        "refund": {"type": "noul", "instructions": "Refund?"},
        "q": {"type": "choice", "instructions": "Which?", "criteria": ["a", "b", "c"]},
    }
    state = "I was charged twice, refund me."
    ours = ONNXAgent(external_bundle).predict(state, questions)["answers"]
    assert ours == ONNXAgent(bundle_factory("tiny-english")).predict(state, questions)["answers"]


def test_the_data_file_is_hashed_while_the_session_opens(external_bundle, monkeypatch):
    """The weights' hash and the session's set-up overlap: the hash below waits for the session
    to start opening, which a load that hashed everything first would never do."""
    import threading

    from laya_onnx.core import agent as agent_module

    opening, hashed = threading.Event(), []
    real_open, real_verify = agent_module.open_session, Bundle.verify_weights

    def open_session(*args, **kwargs):
        opening.set()
        return real_open(*args, **kwargs)

    def verify_weights(bundle):
        assert opening.wait(60), "the weights were hashed before the session began to open"
        real_verify(bundle)
        hashed.append(threading.current_thread().name)

    monkeypatch.setattr(agent_module, "open_session", open_session)
    monkeypatch.setattr(Bundle, "verify_weights", verify_weights)
    agent = agent_module.ONNXAgent(external_bundle)
    assert len(hashed) == 1 and hashed[0] != threading.current_thread().name
    assert agent.predict("hi", {"q": {"type": "noul", "instructions": "Hi?"}})["answers"]["q"]
    # the files a load parses are still hashed before anything reads them
    opened = []
    monkeypatch.setattr(
        "laya_onnx.core.bundle.sha256_file", lambda path: opened.append(Path(path).name) or "0" * 64
    )
    with pytest.raises(BundleError, match="sha256 mismatch for 'laya.onnx'"):
        Bundle.open(external_bundle, defer_weights=True)
    assert GRAPH_DATA_FILE not in opened


def test_a_damaged_data_file_is_named_whatever_the_session_says(external_bundle, tmp_path, monkeypatch):
    """A data file cut short makes onnxruntime fail too; the load names the file that differs,
    and no prepared graph is made from bytes that were not verified."""
    from laya_onnx.core.agent import ONNXAgent

    cut = tmp_path / "cut"
    shutil.copytree(external_bundle, cut)
    data = cut / GRAPH_DATA_FILE
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])
    with pytest.raises(BundleError, match="sha256 mismatch for 'laya.onnx.data'"):
        ONNXAgent(cut, providers=["CPUExecutionProvider"])

    cache = tmp_path / "cache"
    monkeypatch.setenv("LAYA_SESSION_CACHE", str(cache))
    flipped = tmp_path / "flipped"
    shutil.copytree(external_bundle, flipped)
    raw = bytearray((flipped / GRAPH_DATA_FILE).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (flipped / GRAPH_DATA_FILE).write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="sha256 mismatch for 'laya.onnx.data'"):
        ONNXAgent(flipped, providers=["CPUExecutionProvider"])
    assert not list(cache.glob("*/prepared.onnx"))


def test_with_a_session_cache_the_data_file_is_hashed_once(external_bundle, tmp_path, monkeypatch):
    """The next load of an unchanged bundle trusts the first one's hashes (core/verified.py); a
    changed data file is hashed again and refused, prepared graph or not."""
    from laya_onnx.core import bundle as bundle_module
    from laya_onnx.core import verified
    from laya_onnx.core.agent import ONNXAgent

    monkeypatch.setattr(verified, "SETTLE_SECONDS", 0.0)
    monkeypatch.setenv("LAYA_SESSION_CACHE", str(tmp_path / "cache"))
    local = tmp_path / "bundle"
    shutil.copytree(external_bundle, local)
    hashed: list[str] = []
    real = bundle_module.sha256_file

    def counting(path, *args, **kwargs):
        hashed.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(bundle_module, "sha256_file", counting)
    questions = {"q": {"type": "noul", "instructions": "Hi?"}}
    first = ONNXAgent(local, providers=["CPUExecutionProvider"]).predict("hi", questions)["answers"]
    assert hashed.count(GRAPH_DATA_FILE) == 1
    second = ONNXAgent(local, providers=["CPUExecutionProvider"]).predict("hi", questions)["answers"]
    assert hashed.count(GRAPH_DATA_FILE) == 1 and hashed.count(GRAPH_FILE) == 1
    assert second == first

    raw = bytearray((local / GRAPH_DATA_FILE).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (local / GRAPH_DATA_FILE).write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="sha256 mismatch for 'laya.onnx.data'"):
        ONNXAgent(local, providers=["CPUExecutionProvider"])


def test_weights_are_folded_and_streamed(external_bundle):
    """No Transpose is left in front of an initializer (the fold torch's constant folding did,
    done one weight at a time), and every initializer is a torch weight or its transpose."""
    import onnx

    proto = onnx.load(str(external_bundle / GRAPH_FILE), load_external_data=False)
    initializers = {t.name for t in proto.graph.initializer}
    assert not [n.name for n in proto.graph.node if n.op_type == "Transpose" and n.input[0] in initializers]
    transposed = [name for name in initializers if name.endswith(".T")]
    assert len(transposed) >= 6  # per layer: Wqkv, Wo, Wi, mlp Wo; plus the head's projections
    assert not [name for name in initializers if name.startswith("onnx::")]


def shape_coverage(cases: Sequence[dict[str, Any]], window: int, max_len: int) -> dict[str, Any]:
    """What a set of encoded cases exercises in the graph: marker counts and columns, question
    types, batch sizes, rows past the sliding window, rows cut at `max_len`, and padding (on the
    token and the marker axis). Cheap to compute; the test below holds the built-in cases to it."""
    out: dict[str, Any] = {
        "marker_counts": set(),
        "marker_columns": set(),
        "qtypes": set(),
        "batch_rows": set(),
        "rows_past_window": 0,
        "rows_past_two_windows": 0,
        "rows_at_max_len": 0,
        "padded_rows": 0,
        "max_padding": 0,
        "rows_with_masked_markers": 0,
    }
    for case in cases:
        feeds = case["feeds"]
        lengths, counts = feeds["attention_mask"].sum(axis=1), feeds["marker_mask"].sum(axis=1)
        rows, width = feeds["input_ids"].shape
        columns = feeds["marker_pos"].shape[1]
        out["marker_counts"].update(int(k) for k in counts)
        out["marker_columns"].add(int(columns))
        out["qtypes"].update(int(q) for q in feeds["qtype"])
        out["batch_rows"].add(int(rows))
        out["rows_past_window"] += int((lengths > window).sum())
        out["rows_past_two_windows"] += int((lengths > 2 * window).sum())
        out["rows_at_max_len"] += int((lengths >= max_len).sum())
        out["padded_rows"] += int((lengths < width).sum())
        out["max_padding"] = max(out["max_padding"], int(width - lengths.min()))
        out["rows_with_masked_markers"] += int((counts < columns).sum())
    return out


def test_validation_cases_keep_their_coverage(checkpoint_factory):
    """The built-in cases are few (validation's cost is their padded tokens) but still cover
    every shape the graph must handle."""
    from laya_onnx.export.cases import CALLS, encode_calls

    cases = encode_calls(checkpoint_factory("tiny-english") / "tokenizer", 512, 192)
    cov = shape_coverage(cases, window=128, max_len=512)
    assert cov["marker_counts"] >= {1, 2, 5, 10, 11, 20}
    assert cov["marker_columns"] >= {2, 5, 20}
    assert cov["qtypes"] == {0, 1, 2}
    assert 1 in cov["batch_rows"] and max(cov["batch_rows"]) >= 12
    assert cov["rows_past_window"] >= 3 and cov["rows_past_two_windows"] >= 1 and cov["rows_at_max_len"] >= 1
    assert cov["padded_rows"] >= 10 and cov["max_padding"] >= 400 and cov["rows_with_masked_markers"] >= 5
    kinds = {type(state).__name__ for call in CALLS for state in call.states}
    assert kinds == {"str", "list", "dict"}
    assert any("option_order" in q for call in CALLS for q in call.questions().values())
    assert sum(c["feeds"]["input_ids"].size for c in cases) <= 3000


def test_optimize_fuses_and_records_it(checkpoint_factory, tmp_path):
    """--optimize on a graph with external data: fused, validated, kept, recorded."""
    from laya_onnx.core.agent import ONNXAgent
    from laya_onnx.export import export_bundle
    from laya_onnx.export.optimize import op_counts

    out = tmp_path / "optimized"
    manifest = export_bundle(
        checkpoint_factory("tiny-english"),
        out,
        verbose=False,
        measure_memory=False,
        external_data_threshold=0,
        optimize=True,
    )
    record = manifest.optimization
    assert record.kept is True and record.validation["passed"] is True
    assert record.fusions["SkipLayerNormalization"] > 0 and record.nodes_after < record.nodes_before
    ops = op_counts(out / GRAPH_FILE)
    assert (
        ops == record.op_types_after
        and ops.get("SkipLayerNormalization") == record.fusions["SkipLayerNormalization"]
    )
    assert record.op_types_before.get("SkipLayerNormalization", 0) == 0
    assert manifest.validation.passed is True and manifest.graph.external_data == [GRAPH_DATA_FILE]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [GRAPH_FILE, GRAPH_DATA_FILE, "manifest.json", "rl_agent_config.json", "tokenizer"]
    )
    questions = {"refund": {"type": "noul", "instructions": "Refund?"}}
    assert ONNXAgent(out).predict("Refund me now.", questions)["answers"]["refund"]


def test_optimized_graph_that_fails_validation_is_not_kept(checkpoint_factory, tmp_path, monkeypatch):
    from laya_onnx.export import export_bundle, validation
    from laya_onnx.export.optimize import op_counts

    real = validation.open_session

    class SkewedWhenOptimized:
        def __init__(self, path):
            self.inner, self.skew = real(path), 1e-2 if Path(path).parent.name == "optimized" else 0.0

        def run(self, names, feeds):
            logits, act = self.inner.run(names, feeds)
            return logits + self.skew, act

    monkeypatch.setattr(validation, "open_session", SkewedWhenOptimized)
    out = tmp_path / "b"
    manifest = export_bundle(
        checkpoint_factory("tiny-english"), out, verbose=False, measure_memory=False, optimize=True
    )
    record = manifest.optimization
    assert (
        record.kept is False and "failed validation" in record.reason and "beyond tolerance" in record.reason
    )
    assert manifest.validation.passed is True and manifest.validation.max_abs_logit_diff < 1e-4
    assert op_counts(out / GRAPH_FILE) == record.op_types_before
    assert not (out / "optimized").exists()
    Bundle.open(out, verify=True)
