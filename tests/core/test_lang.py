"""laya_onnx.core.lang: script and language detection for routing (torch-free, runtime tier)."""

from __future__ import annotations

import types
from collections import UserDict

import pytest

from laya_onnx.core import lang
from laya_onnx.core.lang import (
    analyse,
    detect_script,
    english_from_code,
    is_english,
    route_detection,
    script_profile,
)

KEYS = [
    "script",
    "script_profile",
    "language",
    "is_english",
    "language_undecided",
    "diacritic_rate",
    "non_latin_fraction",
    "mixed_segment",
]


def routed(state, default="multilingual"):
    return route_detection(analyse(state), default)


# -- the examples of docs/semantics.md#language-detection


def test_verified_examples():
    assert analyse("Mein Konto wurde zweimal belastet")["language"] == "de"
    assert routed("Mein Konto wurde zweimal belastet") == (
        "multilingual",
        "Latin script but language looks like 'de', not English",
    )
    assert routed("I was charged twice") == ("english", "English Latin text")
    assert routed("Quero cancelar") == (
        "multilingual",
        "Latin script, language not identified and no non-English letters; using default (multilingual)",
    )
    assert routed("Quero cancelar", "english")[0] == "english"
    assert analyse("12345")["script"] == "unknown"
    assert routed("12345", "english") == ("english", "no letters detected in state; using default (english)")


def test_result_keys_in_order():
    assert list(analyse("hello world")) == KEYS
    assert list(analyse("Привет мир")) == KEYS
    assert list(analyse("")) == KEYS
    assert list(analyse({"a": "hi", "b": "Ich möchte bitte mein Abonnement kündigen, danke."})) == KEYS


# -- scripts


def test_detect_script_and_profile():
    assert detect_script("hello") == "latin"
    assert detect_script("Привет") == "cyrillic"
    assert detect_script("שלום") == "hebrew"
    assert detect_script("東京") == "han"
    assert detect_script("ひらがな") == "kana"
    assert detect_script("한국어") == "hangul"
    assert detect_script("ᚠᚢᚦ") == "other"  # Runic: no listed block
    assert detect_script("123 !?") == "unknown"
    assert detect_script("") == "unknown"
    # a tie goes to the named script
    assert detect_script("ab аб") == "cyrillic"
    assert script_profile("ab аб") == {"latin": 0.5, "cyrillic": 0.5}
    # Latin comes first in the profile whatever the order of the text
    assert list(script_profile("аб ab")) == ["latin", "cyrillic"]
    assert script_profile("...") == {}
    # fullwidth Latin letters are Latin
    assert detect_script("Ｈｅｌｌｏ") == "latin"


def test_non_latin_script_routes_multilingual_with_share():
    det = analyse("Почему моя карта до сих пор не доставлена?")
    assert det["script"] == "cyrillic" and det["is_english"] is False and det["non_latin_fraction"] == 1.0
    assert routed("Почему моя карта до сих пор не доставлена?") == (
        "multilingual",
        "non-Latin script (cyrillic, 100% of letters); the English checkpoint cannot read it",
    )


def test_latin_plurality_promoted_by_lowercase_non_latin_words():
    # a brand name outvotes the Korean request letter for letter, but the Korean words carry it
    det = analyse("Samsung Galaxy S24 Ultra 512GB 화면이 깨졌어요")
    assert det["script"] == "hangul"
    # a capitalised Cyrillic name inside English is not a Russian message
    det = analyse("Please contact Дмитрий Петрович about the contract renewal.")
    assert det["script"] == "latin" and det["is_english"] is True
    # a Greek symbol is one letter, not a word
    assert analyse("Set α to 0.05 before running the test again.")["script"] == "latin"


# -- the Latin-script guess


def test_english_and_foreign_sentences():
    assert analyse("Why hasn't my card been delivered yet?")["language"] == "en"
    assert analyse("Pourquoi ma carte n'est pas encore arrivée, je ne comprends pas")["language"] == "fr"
    assert analyse("Por favor, cancelem a minha assinatura antes da próxima cobrança.")["is_english"] is False
    assert analyse("Il pacco risulta consegnato ma non è mai arrivato.")["is_english"] is False


def test_too_few_words_is_undecided():
    det = analyse("Esqueci minha senha")
    assert det["language"] is None and det["language_undecided"] is True and det["is_english"] is True
    # ... unless non-English letters say otherwise
    det = analyse("Não funciona")
    assert det["is_english"] is False and det["diacritic_rate"] >= lang.NON_EN_DIACRITIC_RATE


def test_short_swedish():
    assert analyse("glömt lösenord")["language"] == "sv"
    assert analyse("kan inte logga in")["language"] == "sv"


def test_diacritics_alone_mark_a_language_without_a_list():
    det = analyse("Dzień dobry, mam problem z zamówieniem")
    assert det["language"] is None and det["is_english"] is False
    assert routed("Dzień dobry, mam problem z zamówieniem")[1].startswith(
        "Latin script, language not identified but "
    )


def test_one_loanword_does_not_make_english_foreign():
    assert analyse("I had a café au lait before the meeting and it was great.")["is_english"] is True


def test_identifiers_are_not_words():
    det = analyse("Check github.com/acme/app and mail user@acme.com or visit the v1.2.3 notes.")
    assert det["language"] == "en"


def test_acronym_line_is_not_french():
    det = analyse("MON DES EST LA")
    assert det["language"] is None
    det = analyse("Meeting notes for Tuesday and the rest: MON DES EST LA")
    assert det["language"] != "fr"


def test_dotted_capital_i_matches_lowercase_words():
    # "İ".lower() is "i" + a combining dot; the words still match the English list
    assert lang.guess_latin_language("İT İS İN THE BOX") == "en"
    assert lang.guess_latin_language("Il pacco arrivato") is None  # three words: undecided


# -- states, lines and fields


def test_state_text_walks_values_not_keys():
    state = {"English key": "eins", "b": ["zwei", {"c": b"drei"}], "d": 4, "e": None}
    assert lang.state_text(state) == "eins zwei drei"
    assert lang.state_text("x" * 5000) == "x" * 4000
    assert lang.state_text(["ab", "cd"], max_chars=4) == "ab c"
    assert lang.state_text(b"\xff\xfe") == ""


def test_depth_limit():
    deep = "Ich möchte mein Abonnement kündigen, bitte helfen Sie mir."
    at_six = {"a": {"b": {"c": {"d": {"e": {"f": deep}}}}}}
    below = {"a": {"b": {"c": {"d": {"e": {"f": {"g": deep}}}}}}}
    assert lang.state_text(at_six) == deep
    assert lang.state_text(below) == ""


def test_any_mapping_counts():
    text = "Mein Paket ist nicht angekommen und ich warte seit zwei Wochen."
    for state in (UserDict(m=text), types.MappingProxyType({"m": text})):
        assert analyse(state)["language"] == "de"


def test_foreign_line_in_english_text_is_a_mixed_segment():
    state = (
        "Thanks for the update, we will check it with the team and get back to you when we have news.\n"
        "It is on our list for this week, and you can reply to this mail if there is anything else.\n"
        "Merci pour votre aide, tout est réglé."
    )
    det = analyse(state)
    assert det["is_english"] is False and det["language"] == "fr"
    assert det["mixed_segment"].startswith("Merci pour votre aide")
    model, reason = route_detection(det)
    assert model == "multilingual" and reason.startswith(
        "Latin script, mostly English, but a line or field reads as 'fr'"
    )


def test_short_foreign_value_beside_long_english_note():
    state = {
        "notes": "Customer called twice about the same issue and was promised a callback. " * 60,
        "message": "Je voudrais être remboursé pour la commande annulée, merci de répondre vite.",
    }
    det = analyse(state, explain=True)
    assert det["is_english"] is False
    assert det["diagnostic"]["stage"] in ("segment", "value")


def test_code_lines_are_not_prose():
    state = {"body": "Please see the error below.\n    os.path.join(el, data) = para[0]; return\nThanks."}
    assert analyse(state)["is_english"] is True


def test_name_field_does_not_flip_english():
    assert analyse({"name": "José", "message": "I would like to change my delivery address, please."})[
        "is_english"
    ]


def test_explain_diagnostic():
    det = analyse("Mein Konto wurde zweimal belastet", explain=True)
    assert det["diagnostic"] == {"stage": "whole_state", "reason": "language_evidence", "source": None}
    assert analyse("12345", explain=True)["diagnostic"]["reason"] == "no_letters"
    assert analyse("Привет мир", explain=True)["diagnostic"]["reason"] == "non_latin_script"
    state = {
        "a": "Hello there, this is fine.",
        "b": ["ok", "Hello.\nMi pedido llegó roto y quiero devolverlo ahora."],
    }
    det = analyse(state, explain=True)
    assert det["diagnostic"]["stage"] == "segment"
    assert det["diagnostic"]["source"] == {"leaf_index": 2, "path": ["b", 1], "line": 2}
    assert "diagnostic" not in analyse("hello")


def test_is_english_and_bytes():
    assert is_english("I was charged twice") is True
    assert is_english(b"Mein Konto wurde zweimal belastet") is False
    assert is_english(None) is True  # no letters: the Router takes its default


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("en", True),
        ("EN", True),
        ("en-US", True),
        ("en_US.UTF-8", True),
        ("eng", True),
        ("English", True),
        ("pt-BR", False),
        ("de_DE", False),
        ("zh", False),
        ("", None),
        ("  ", None),
        (None, None),
        ("C", None),
        ("C.UTF-8", None),
        ("POSIX", None),
        ("und", None),
        ("mul", None),
    ],
)
def test_english_from_code(code, expected):
    assert english_from_code(code) is expected


def test_route_detection_reasons():
    det = analyse("Dzień dobry, mam problem z zamówieniem")
    model, reason = route_detection(det)
    assert model == "multilingual"
    assert reason == (
        "Latin script, language not identified but %.0f%% non-English letters; not safe for the English checkpoint"
        % (100 * det["diacritic_rate"])
    )
    assert route_detection(analyse("🙂"), "english") == (
        "english",
        "no letters detected in state; using default (english)",
    )


# -- the finer rules


def test_english_lookalike_counts_once():
    # `do` is Portuguese too; repeated it is still one piece of Portuguese evidence
    assert analyse("do more, do less, do it again")["language"] == "en"


def test_english_rescue_outvotes_one_accented_word():
    det = analyse("I was at the café for it")
    assert det["diacritic_rate"] >= lang.NON_EN_DIACRITIC_RATE
    assert det["language"] == "en" and det["is_english"] is True


def test_nordic_shared_words_say_not_english_but_not_swedish():
    det = analyse("hej tack")
    assert det["language"] is None and det["is_english"] is False


def test_promotion_needs_share_or_letters():
    # 10+ lowercase Cyrillic letters at >= 10% promote a long English text
    text = "Please forward this to the team in charge of the account, thanks for the help. " * 2
    det = analyse(text + "спасибобольшое")
    assert det["script"] == "cyrillic"
    # fewer than 10 letters at under 20% do not
    assert analyse(text + "спасибо")["script"] == "latin"


def test_caps_runs_are_blanked_as_acronyms_in_mixed_case():
    # French by its acronyms only: MON DES EST LA; with a lowercase English word it is re-read
    det = analyse("MON DES EST LA today", explain=True)
    assert det["language"] != "fr"
    assert det["diagnostic"]["reason"] in ("caps_filtered", "no_language_evidence", "language_evidence")
    # emphasis capitals of word length stay: the German still names German
    assert analyse("sag mir bitte das HEUTIGE DATUM und die uhrzeit")["language"] == "de"


def test_value_scan_reasons():
    diacritic = {
        "a": "Fine, thanks for checking with us. We will wait for the reply from the team and then see.",
        "b": "Dzień dobry, mam problem z zamówieniem",
    }
    det = analyse(diacritic, explain=True)
    assert det["is_english"] is False and det["mixed_segment"] is None
    assert det["diagnostic"]["stage"] == "value" and det["diagnostic"]["reason"] == "diacritic_value"
    non_latin = {
        "a": "Please check the order status for me, it has been a while since I ordered it and nothing came. "
        * 3,
        "b": "Заказ не пришёл",
    }
    det = analyse(non_latin, explain=True)
    assert det["is_english"] is False
    assert det["diagnostic"] == {
        "stage": "value",
        "reason": "non_latin_value",
        "source": {"leaf_index": 1, "path": ["b"], "line": 1},
    }


def test_segment_scan_reads_at_most_max_chars():
    english = "This line is plain English and says nothing else at all.\n" * 80  # ~4600 characters
    state = {"a": english, "b": "x"}
    tail = {"a": english, "b": "Mi pedido llegó roto y quiero devolverlo ahora mismo por favor."}
    assert analyse(state)["is_english"] is True
    # past the segment budget the value scan still reads the Spanish field on its own
    det = analyse(tail, explain=True)
    assert det["is_english"] is False and det["diagnostic"]["stage"] == "value"


def test_unassigned_here_but_letter_in_newer_unicode():
    # U+1C89 CYRILLIC CAPITAL LETTER TJE (Unicode 16): a letter of no listed block
    assert detect_script("\u1c89\u1c8a") == "other"
    assert detect_script("\u0378") == "unknown"  # unassigned everywhere
