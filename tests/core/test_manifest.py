"""The typed manifest: what an export writes reads back unchanged, older manifests load, newer keys
survive, a value of the wrong shape is not believed, and the file list is strict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laya_onnx.core.bundle import Bundle, BundleError, bundle_origin, sha256_file
from laya_onnx.core.calibration_file import bundle_calibration
from laya_onnx.core.manifest import FP32, Manifest, ManifestError, PrecisionRecord, SourceRecord
from laya_onnx.core.memory import PassMemoryModel


def _bundle(root: Path, manifest: dict) -> Path:
    """A bundle folder with stand-in files (only their digests matter here) and `manifest`."""
    (root / "tokenizer").mkdir(parents=True)
    (root / "laya.onnx").write_bytes(b"graph")
    (root / "rl_agent_config.json").write_text("{}")
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    files = {
        name: {"sha256": sha256_file(root / name), "bytes": (root / name).stat().st_size}
        for name in ("laya.onnx", "rl_agent_config.json", "tokenizer/tokenizer.json")
    }
    (root / "manifest.json").write_text(json.dumps({**manifest, "files": files}))
    return root


#: The sections an export wrote before precisions, calibration files and memory records existed.
EARLY = {
    "format": "laya-onnx-bundle",
    "format_version": 1,
    "source": {"path": "/ckpt", "repo": None, "revision": None},
    "tools": {"laya_onnx": "0.0.1", "torch": "2.2.0"},
    "export": {"opset": 17, "exporter": "torch.onnx.export (TorchScript)", "seconds": 3.1},
    "graph": {"file": "laya.onnx"},
    "validation": {"cases": 12, "rows": 23, "max_abs_logit_diff": 0, "tolerance": 1e-4, "passed": True},
}


def test_an_exported_manifest_reads_and_writes_back_unchanged(bundle_factory):
    root = bundle_factory("tiny-english")
    text = (root / "manifest.json").read_text()
    manifest = Bundle.open(root).manifest
    assert manifest is not None
    assert json.dumps(manifest.as_json(), indent=2, ensure_ascii=False) + "\n" == text  # keys in order
    assert manifest.source.name == "tiny-english" and manifest.graph_precision.precision == FP32
    assert manifest.validation.passed is True and manifest.validation.answers.rounding_flips == 0
    assert manifest.export.attention == "fused" and manifest.export.architecture["layers"] >= 1
    assert manifest.digest("laya.onnx") == sha256_file(root / "laya.onnx")
    assert manifest.memory.model["source"] == "measured" and manifest.extra == {}


def test_a_manifest_from_an_earlier_version_loads_with_defaults(tmp_path):
    bundle = Bundle.open(_bundle(tmp_path / "early", EARLY))
    manifest = bundle.manifest
    assert manifest is not None and manifest.source == SourceRecord(path="/ckpt")
    assert bundle.precision == PrecisionRecord() and bundle.precision.precision == FP32
    assert bundle.precision.describe() == FP32
    assert manifest.external_data == [] and manifest.export.architecture is None
    assert manifest.validation.answers is None and manifest.validation.max_abs_logit_diff == 0
    assert bundle_calibration(bundle.root, manifest) is None
    assert "largest" in PassMemoryModel.for_bundle(manifest).source
    assert bundle_origin(manifest, bundle.root) == "early"


def test_keys_this_version_does_not_know_are_kept_in_place():
    later = {
        **EARLY,
        "source": {"name": "english", "repo": "org/laya", "subfolder": "english", "signed_by": "x"},
        "precision": {
            "precision": "int8",
            "rewrite": "...",
            "tiles": {"avx512": 16},
            "passed": True,
        },
        "lineage": {"parent": "abc"},
        "files": {"laya.onnx": {"sha256": "00", "bytes": 5, "mode": "0644"}},
    }
    manifest = Manifest.parse(later)
    assert json.dumps(manifest.as_json()) == json.dumps(later)  # same keys, same values, same order
    assert manifest.extra == {"lineage": {"parent": "abc"}} and manifest.source.extra == {"signed_by": "x"}
    assert manifest.precision.precision == "int8" and manifest.precision.passed is True
    assert manifest.precision.extra == {"rewrite": "...", "tiles": {"avx512": 16}}
    assert manifest.files["laya.onnx"].sha256 == "00" and manifest.files["laya.onnx"].extra == {
        "mode": "0644"
    }
    assert bundle_origin(manifest, Path("/b/x")) == "org/laya/english"


@pytest.mark.parametrize(
    "sections, check",
    [
        # a precision that is not a record: not believed, the graph is fp32
        ({"precision": "fp16"}, lambda m: m.graph_precision.precision == FP32),
        # a repo that is not a string: the origin is the folder's name
        ({"source": {"repo": 5, "name": "n"}}, lambda m: m.source.repo is None and m.source.name == "n"),
        ({"calibration": {"file": ["c.json"]}}, lambda m: m.calibration.file is None),
        ({"memory": {"model": "fast"}}, lambda m: m.memory.model is None),
        ({"validation": {"passed": "yes", "rows": True}}, lambda m: m.validation.passed is None),
    ],
)
def test_a_value_of_the_wrong_shape_is_not_believed_but_kept(sections, check, tmp_path):
    data = {**EARLY, **sections}
    manifest = Manifest.parse(data)
    assert check(manifest)
    assert manifest.as_json() == data
    assert bundle_origin(manifest, tmp_path) == tmp_path.name
    assert bundle_calibration(tmp_path, manifest) is None


def test_the_file_list_and_the_graph_data_are_strict(tmp_path):
    with pytest.raises(ManifestError, match="files must be an object"):
        Manifest.parse({**EARLY, "files": ["laya.onnx"]})
    with pytest.raises(ManifestError, match=r"graph.external_data must be a list of file names"):
        Manifest.parse({**EARLY, "graph": {"file": "laya.onnx", "external_data": "laya.onnx.data"}})
    bad = _bundle(tmp_path / "bad", {**EARLY, "graph": {"external_data": [1]}})
    with pytest.raises(BundleError, match=r"graph.external_data must be a list of file names"):
        Bundle.open(bad, verify=False)
    # a digest of the wrong shape matches no file: verification refuses it
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["graph"] = {"file": "laya.onnx"}
    manifest["files"]["laya.onnx"] = {"sha256": 7}
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="sha256 mismatch for 'laya.onnx'"):
        Bundle.open(bad)
