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


# Pieces of text the rules treat specially: acronyms, accents, names and runs in other scripts,
# identifiers, code syntax, digits, emoji, line breaks.
_PIECES = (
    "xyz Qwerty blorp ABC NASA MON DES EST LA LOS ÉTÉ ça naïve Zürich łódź straße İstanbul ǅ привет Дмитрий мир "
    "ελλάδα Α 東京 ひらがな 한국어 שלום مرحبا हिन्दी ไทย ᚠᚢᚦ ɐˈdʲ Влади́мир github.com a.b x@y.z v1.2.3 os.path "
    "Nav/Com C:\\DOS f(x) a=b ; { [ ] 12 3.5 🙂 — … É À Ä"
).split() + ["\n", "\n", "  ", "-", "_"]


def _random_states(n: int, seed: int = 6):
    """States built from the words both sides' lists hold alike and the pieces above."""
    import random

    from laya import lang as reference

    from laya_onnx.core import lang
    from laya_onnx.core.lang_words import FUNCTION_WORDS, NORDIC_SHARED, SHORT_SWEDISH

    def membership(word, ours):
        lists = FUNCTION_WORDS if ours else reference._STOP
        nordic = NORDIC_SHARED if ours else reference._NORDIC_OVERLAP_WORDS
        swedish = SHORT_SWEDISH if ours else reference._SHORT_SWEDISH_WORDS
        return [word in lists.get(code, ()) for code in FUNCTION_WORDS] + [
            word in nordic,
            word in swedish,
        ]

    listed = set().union(*FUNCTION_WORDS.values(), *reference._STOP.values())
    agreed = sorted(w for w in listed if membership(w, True) == membership(w, False))
    disputed = listed - set(agreed)
    pool = agreed + [p for p in _PIECES if not set(lang._WORD.findall(p.lower())) & disputed]
    rng = random.Random(seed)

    def text():
        words = [rng.choice(pool) for _ in range(rng.choice((1, 2, 3, 4, 5, 6, 8, 12, 20)))]
        words = [
            w.upper() if rng.random() < 0.15 else w.capitalize() if rng.random() < 0.1 else w for w in words
        ]
        return rng.choice((" ", "", ", ")).join(words)

    for _ in range(n):
        pick = rng.random()
        if pick < 0.5:
            yield text()
        elif pick < 0.75:
            yield {"a": text(), "b": [text(), {"c": text()}]}
        else:
            yield [text() for _ in range(rng.randint(1, 4))]


@pytest.mark.reference
def test_rules_agree_with_the_reference_where_the_lists_do():
    # every rule, not only the route: the whole detection dict and its diagnostic, on random
    # states whose words both sides' lists treat alike (20 000 such states agreed when tried)
    from laya import lang as reference

    from laya_onnx.core import lang

    for state in _random_states(1500):
        assert lang.analyse(state, explain=True) == reference.analyse(state, explain=True), state


@pytest.mark.reference
def test_letters_and_scripts_agree_with_the_reference_on_every_codepoint():
    from laya import lang as reference

    from laya_onnx.core import lang
    from laya_onnx.core.lang_scripts import NEWER_LETTERS

    # the same table of letters newer than this interpreter's Unicode (both from the databases)
    assert [tuple(r) for r in NEWER_LETTERS] == [tuple(r) for r in reference._POST_DATABASE_LETTER_RANGES]
    letters = "".join(chr(cp) for cp in range(0x110000) if chr(cp).isalpha())
    letters += "".join(chr(cp) for lo, hi in NEWER_LETTERS for cp in range(lo, hi + 1))
    # one profile over every letter: each letter counted in the same script
    assert lang.script_profile(letters) == reference.script_profile(letters)
