"""The language-routing corpus (parity/lang/) and our agreement with the reference's routing."""

from __future__ import annotations

import json

import pytest

from laya_onnx.parity import lang_corpus


def test_generated_corpus_is_what_the_generator_makes():
    # the committed file is the generator's output: regenerate with `python -m laya_onnx.parity.lang_corpus`
    committed = (lang_corpus.CORPUS_DIR / "generated.jsonl").read_text(encoding="utf-8").splitlines()
    made = [json.dumps(r, ensure_ascii=False) for r in lang_corpus.generate()]
    assert made == committed


def test_corpus_size_and_breadth():
    records = lang_corpus.load_corpus()
    assert len(records) >= 3000
    assert len({r["id"] for r in records}) == len(records)
    languages = {r.get("lang") for r in records} - {None}
    assert len(languages) >= 50
    kinds = {r["kind"] for r in records}
    assert {
        "plain",
        "conversation",
        "nested",
        "ascii",
        "shouted",
        "short",
        "no-letters",
        "mixed-script",
    } <= kinds


@pytest.mark.reference
def test_routing_agrees_with_the_reference():
    from laya_onnx.parity.lang_agreement import TARGET, build_report

    report = build_report(lang_corpus.load_corpus())
    listed = "\n".join("%s %s: %s" % (d["id"], d["state"], d["explanation"]) for d in report.disagreements)
    assert report.checkpoint_agreement >= TARGET, listed
    # every disagreement is listed, with its explanation
    assert len(report.disagreements) == round((1 - report.checkpoint_agreement) * report.states)
    assert all(d["explanation"] for d in report.disagreements)
