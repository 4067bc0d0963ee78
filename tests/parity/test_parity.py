"""ONNXAgent equals laya.Agent (torch) on every tiny preset over the core parity suite, by the rule:
the whole suite on tiny-english, a seeded third of each kind of request on the other presets."""

import json

import pytest

from laya_onnx.parity import run_parity
from tests.parity_support import failures, suite_sample

pytestmark = [pytest.mark.torch, pytest.mark.reference]
PRESETS = ["tiny-english", "tiny-multilingual", "tiny-typed-decisions"]
FULL_SUITE_PRESET = "tiny-english"  # the reference comparison runs the whole core suite here


@pytest.mark.parametrize("preset", PRESETS)
def test_core_suite_parity(preset, checkpoint_factory, bundle_factory, tmp_path):
    """The whole suite on tiny-english; a seeded third of each kind of request on the others."""
    whole = preset == FULL_SUITE_PRESET
    report = run_parity(
        checkpoint_factory(preset),
        bundle_factory(preset),
        suite="core" if whole else suite_sample("core", tmp_path),
        report_path=tmp_path / f"{preset}.json",
    )
    summary = report.summary()
    print(preset, json.dumps(summary))
    if whole:
        assert summary["requests"] >= 40 and summary["rows"] >= 70
    else:
        assert summary["requests"] >= 25
    # the parity rule alone decides (laya_onnx/core/judge.py); rounding flips are information
    assert report.passed, failures(report)
    written = json.loads((tmp_path / f"{preset}.json").read_text())
    assert written["summary"]["passed"] is True and written["tools"]["onnxruntime"]


def test_parity_detects_a_wrong_answer(checkpoint_factory, bundle_factory, monkeypatch):
    """The comparison can fail: perturb our logits and the report must say so."""
    from laya_onnx.core import session as session_mod

    real_run = session_mod.GraphSession.run

    def skewed(self, feeds, **options):
        logits, act = real_run(self, feeds, **options)
        logits = logits.copy()
        logits[:, 0] += 0.01
        return logits, act

    monkeypatch.setattr(session_mod.GraphSession, "run", skewed)
    report = run_parity(checkpoint_factory("tiny-english"), bundle_factory("tiny-english"), suite="core")
    assert not report.passed
    summary = report.summary()
    assert summary["max_abs_dp"] > 1e-5 and not summary["within_tolerance"]
    assert summary["tokens_identical"] and summary["refusals_identical"]


def test_export_validation_judges_answers_by_the_rule(checkpoint_factory, tmp_path, monkeypatch):
    """An ONNX graph whose logits pass a loose logit tolerance is still refused when its answers
    break the parity rule (one option's logit +0.01 moves probabilities by ~2e-3)."""
    from laya_onnx.export import ValidationError, export_bundle, validation

    real = validation.open_session

    class Skewed:
        def __init__(self, path):
            self.inner = real(path)

        def run(self, names, feeds):
            logits, act = self.inner.run(names, feeds)
            logits = logits.copy()
            logits[:, 0] += 0.01
            return logits, act

    monkeypatch.setattr(validation, "open_session", Skewed)
    out = tmp_path / "b"
    with pytest.raises(ValidationError, match="answers differ from torch's by the parity rule: .*tolerance"):
        export_bundle(checkpoint_factory("tiny-english"), out, tolerance=0.1, verbose=False)
    assert not out.exists()
