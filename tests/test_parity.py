"""ONNXAgent equals laya.Agent (torch) on every tiny preset over the core parity suite."""

import json

import pytest

pytest.importorskip("laya.agent")

from laya_onnx.parity import run_parity

PRESETS = ["tiny-english", "tiny-multilingual", "tiny-typed-decisions"]


@pytest.mark.parametrize("preset", PRESETS)
def test_core_suite_parity(preset, checkpoint_factory, bundle_factory, tmp_path):
    report = run_parity(
        checkpoint_factory(preset),
        bundle_factory(preset),
        suite="core",
        tolerance=1e-5,
        report_path=tmp_path / f"{preset}.json",
    )
    summary = report.summary()
    print(preset, json.dumps(summary))
    assert summary["requests"] >= 40 and summary["rows"] >= 70
    assert report.passed, "\n".join(report.failures())
    assert summary["tokens_identical"] and summary["decisions_identical"] and summary["json_equal"]
    # a rounding flip is a 4-decimal boundary straddled by |dp| <= 1e-5; they must stay rare
    assert summary["rounding_flips"] <= max(2, summary["rows"] // 20)
    assert summary["max_abs_dp"] <= 1e-5


def test_parity_detects_a_wrong_answer(checkpoint_factory, bundle_factory, monkeypatch):
    """The comparison can fail: perturb our logits and the report must say so."""
    from laya_onnx import session as session_mod

    real_run = session_mod.GraphSession.run

    def skewed(self, feeds):
        logits, act = real_run(self, feeds)
        logits = logits.copy()
        logits[:, 0] += 0.01
        return logits, act

    monkeypatch.setattr(session_mod.GraphSession, "run", skewed)
    report = run_parity(checkpoint_factory("tiny-english"), bundle_factory("tiny-english"), suite="core")
    assert not report.passed
    assert report.summary()["max_abs_dp"] > 1e-5
