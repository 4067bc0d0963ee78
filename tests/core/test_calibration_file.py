"""Calibration files: laya's payload rules and binning map, `calibration=`, bundles that carry one."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import pytest

from laya_onnx.core.calibration_file import CalibrationFileError, load_calibration

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the user ask for a refund?"},
    "queue": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "money", "tech": "bugs", "other": None},
    },
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "soon", "now"]},
}
#: Out-of-range and non-numeric temperatures (clamped, with a warning) and a binning map.
PAYLOAD = {
    "version": 1,
    "temperature": [0.7, 2.0, 9.0],
    "temperature_by_options": {"choice:3-5": 1.5, "noul:2": "x"},
    "model_id_or_path": "somewhere-else",
    "subfolder": None,
    "config": None,
    "binning_map": {
        "choice:3-5": {"bins": 4, "values": [0.1, 0.3, 0.6, 0.9]},
        "noul:2": {"bins": 2, "values": [0.2, 0.8]},
    },
}
STATES = ["I was charged twice, refund please", "the app crashes " * 200]

#: (payload, the fault laya names) for every shape it refuses.
BAD = [
    ([1, 2, 3], "calibration JSON must be an object, got list"),
    ({"version": 1.5, "temperature": [1, 1, 1]}, "calibration JSON version must be an integer, got 1.5"),
    ({"version": "two", "temperature": [1, 1, 1]}, "calibration JSON version must be an integer, got 'two'"),
    ({"version": True, "temperature": [1, 1, 1]}, "calibration JSON version must be an integer, got True"),
    ({"temperature": {"a": 1, "b": 2, "c": 3}}, "calibration JSON must contain temperature: [3 floats]"),
    ({"temperature": [1, 1]}, "calibration JSON must contain temperature: [3 floats]"),
    (
        {"temperature": [1, 1, 1], "temperature_by_options": [1]},
        "calibration JSON temperature_by_options must be an object of bucket -> float, got list",
    ),
    (
        {"temperature": [1, 1, 1], "binning_map": []},
        "calibration JSON binning_map must be an object of bucket -> {bins, values}, got list",
    ),
    (
        {"temperature": [1, 1, 1], "binning_map": {"noul:2": 3}},
        'calibration JSON binning_map[\'noul:2\'] must be an object with "bins" and "values", got int',
    ),
    (
        {"temperature": [1, 1, 1], "binning_map": {"noul:2": {"bins": 0, "values": []}}},
        "calibration JSON binning_map['noul:2'] must have an integer \"bins\" >= 1, got 0",
    ),
    (
        {"temperature": [1, 1, 1], "binning_map": {"noul:2": {"bins": 2, "values": [0.5]}}},
        'calibration JSON binning_map[\'noul:2\'] must have "values" of length "bins" (2)',
    ),
    (
        {"temperature": [1, 1, 1], "binning_map": {"noul:2": {"bins": 2, "values": [0.5, "1"]}}},
        "calibration JSON binning_map['noul:2'] values must be numbers, got [0.5, '1']",
    ),
    (
        {"temperature": [1, 1, 1], "binning_map": {"noul:2": {"bins": 2, "values": [0.5, 1.5]}}},
        "calibration JSON binning_map['noul:2'] values must be in [0, 1], got [0.5, 1.5]",
    ),
    (
        {"temperature": [1, 1, 1], "binning_map": {"noul:2": {"bins": 2, "values": [0.5, float("nan")]}}},
        "calibration JSON binning_map['noul:2'] values must be finite, got [0.5, nan]",
    ),
]


def _write(tmp_path: Path, payload, name="cal.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(payload), encoding="utf-8")
    return path


@pytest.mark.parametrize("payload, fault", BAD, ids=[f for _, f in BAD])
def test_a_bad_file_is_refused_naming_the_file_and_the_fault(tmp_path, payload, fault):
    path = _write(tmp_path, payload)
    with pytest.raises(CalibrationFileError) as caught:
        load_calibration(path)
    assert str(caught.value) == f"calibration file {str(path)!r}: {fault}"


def test_unreadable_files_name_the_file(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(CalibrationFileError, match=r"calibration file '.*broken\.json' is not valid JSON"):
        load_calibration(broken)
    with pytest.raises(FileNotFoundError, match=r"calibration file '.*missing\.json' does not exist"):
        load_calibration(tmp_path / "missing.json")


@pytest.mark.torch
@pytest.mark.reference
@pytest.mark.parametrize("payload, fault", BAD, ids=[f for _, f in BAD])
def test_faults_are_worded_as_laya_words_them(payload, fault):
    from laya.calibrate import apply_calibration_payload

    class Target:
        cfg: dict = {}

    with pytest.raises(ValueError) as caught:
        apply_calibration_payload(Target(), payload)
    assert str(caught.value) == fault


def test_binning_and_clamped_temperatures_change_the_answers(bundle_factory, tmp_path):
    from laya_onnx import ONNXAgent

    plain = ONNXAgent(bundle_factory("tiny-english"))
    with pytest.warns(
        RuntimeWarning, match=r"laya: calibration temperatures are invalid .*temperature\[2\]=9"
    ):
        calibrated = ONNXAgent(bundle_factory("tiny-english"), calibration=_write(tmp_path, PAYLOAD))
    before, after = plain.predict(STATES[0], QUESTIONS), calibrated.predict(STATES[0], QUESTIONS)
    assert after["answers"]["refund"]["answer_confidence"] in (0.2, 0.8)  # a bin value
    assert after["answers"]["queue"]["answer_confidence"] in (0.1, 0.3, 0.6, 0.9)
    assert after["answers"]["queue"]["probabilities"] != before["answers"]["queue"]["probabilities"]
    # a language override stands in for the calibration: no binning under it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        overridden = ONNXAgent(
            bundle_factory("tiny-english"),
            calibration=_write(tmp_path, PAYLOAD),
            lang_temperatures={"de": {"temperature": [1.0, 1.0, 1.0]}},
        )
    german = overridden.predict(STATES[0], QUESTIONS, lang="de")["answers"]["refund"]
    assert german["answer_confidence"] == german["confidence"]  # max(p) of a noul, unbinned
    # a file without a map clears the one installed: the file is the whole calibration state
    overridden.load_calibration(_write(tmp_path, {"temperature": [1.3, 0.8, 1.1]}, "plain.json"))
    assert overridden.calibration.binning_map is None


def test_identity_mismatch_warns_and_still_loads(bundle_factory, tmp_path):
    from laya_onnx import ONNXAgent
    from laya_onnx.core.calibration_file import config_identity

    agent = ONNXAgent(bundle_factory("tiny-english"))
    same = {
        "version": 2,
        "temperature": [1.0, 1.0, 1.0],
        "model_id_or_path": agent.model_id_or_path,
        "subfolder": agent.subfolder,
        "config": config_identity(agent.cfg),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        agent.load_calibration(_write(tmp_path, same))
    with pytest.warns(UserWarning, match="calibration was fitted for model_id_or_path='elsewhere'"):
        agent.load_calibration(_write(tmp_path, {**same, "model_id_or_path": "elsewhere"}))
    assert agent.calibration.temperature == [1.0, 1.0, 1.0]


def test_a_bundle_carries_its_calibration_file_hashed(bundle_factory, tmp_path):
    from laya_onnx import ONNXAgent
    from laya_onnx.core.bundle import MANIFEST_FILE, BundleError, write_manifest
    from laya_onnx.core.manifest import CalibrationRecord, Manifest

    bundle = tmp_path / "calibrated"
    shutil.copytree(bundle_factory("tiny-english"), bundle)
    shutil.copyfile(_write(tmp_path, PAYLOAD), bundle / "calibration.json")
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    calibration = CalibrationRecord(file="calibration.json", source="cal.json")
    write_manifest(bundle, dataclasses.replace(Manifest.parse(manifest), calibration=calibration))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        carried = ONNXAgent(bundle).predict(STATES[0], QUESTIONS)
        given = ONNXAgent(bundle_factory("tiny-english"), calibration=bundle / "calibration.json")
    assert carried == given.predict(STATES[0], QUESTIONS)
    (bundle / "calibration.json").write_text(json.dumps({**PAYLOAD, "temperature": [1, 1, 1]}))
    with pytest.raises(BundleError, match="sha256 mismatch for 'calibration.json'"):
        ONNXAgent(bundle)


@pytest.mark.torch
@pytest.mark.reference
def test_same_answers_as_laya_onnx_agent_with_the_same_file(checkpoint_factory, bundle_factory, tmp_path):
    """predict, predict_batch (with a language override) and predict_long on one calibration
    file: byte-identical JSON to laya's ONNXAgent on our graph, and the same clamp warning."""
    from laya.onnx_agent import ONNXAgent as Reference

    from laya_onnx import ONNXAgent

    path = _write(tmp_path, PAYLOAD)
    bundle = bundle_factory("tiny-english")
    langs = {"fr": {"temperature": [2.0, 2.0, 2.0]}}
    agents, warned = [], []
    for make in (
        lambda: Reference(
            str(checkpoint_factory("tiny-english")),
            onnx_path=str(bundle / "laya.onnx"),
            calibration=str(path),
            lang_temperatures=langs,
        ),
        lambda: ONNXAgent(bundle, calibration=path, lang_temperatures=langs),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            agents.append(make())
        warned.append([str(w.message) for w in caught if "calibration temperatures" in str(w.message)])
    assert warned[0] == warned[1] and len(warned[0]) == 1

    def answers(agent):
        return json.dumps(
            [
                agent.predict(STATES[0], QUESTIONS),
                agent.predict_batch(STATES, QUESTIONS, lang="fr-CA"),
                agent.predict_long(STATES[1], QUESTIONS, window=100),
            ]
        )

    assert answers(agents[1]) == answers(agents[0])


@pytest.mark.torch
def test_export_refuses_a_bad_calibration_file_before_exporting(checkpoint_factory, tmp_path):
    from laya_onnx.export import export_bundle

    bad = _write(tmp_path, {"temperature": [1, 1]})
    with pytest.raises(CalibrationFileError, match="must contain temperature"):
        export_bundle(checkpoint_factory("tiny-english"), tmp_path / "out", calibration=bad, verbose=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.torch
def test_export_calibration_copies_the_file_into_the_bundle(checkpoint_factory, bundle_factory, tmp_path):
    """`laya-onnx export --calibration FILE`: the file is in the bundle, named and hashed in the
    manifest, and the bundle answers as a plain bundle given the same file does."""
    from laya_onnx import ONNXAgent
    from laya_onnx.cli import main

    path = _write(tmp_path, PAYLOAD)
    out = tmp_path / "bundle"
    ckpt = checkpoint_factory("tiny-english")
    assert main(["export", str(ckpt), "-o", str(out), "--calibration", str(path), "--no-memory-probe"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["calibration"] == {"file": "calibration.json", "source": str(path)}
    assert "calibration.json" in manifest["files"]
    assert json.loads((out / "calibration.json").read_text()) == PAYLOAD
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        carried = ONNXAgent(out)
        given = ONNXAgent(bundle_factory("tiny-english"), calibration=path)
    assert carried.predict_batch(STATES, QUESTIONS) == given.predict_batch(STATES, QUESTIONS)
