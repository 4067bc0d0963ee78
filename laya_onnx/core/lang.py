"""Language and script detection for checkpoint routing (stdlib only, torch-free).

The Router needs one bit per state: can the English checkpoint read it, or must it go to the
multilingual one? These functions answer it with the rules of the reference `laya.lang`
(docs/semantics.md#language-detection), implemented here with our own code and our own word lists
(the scripts in `lang_scripts`, the word lists in `lang_words`):

1. the state's string leaves are joined (keys ignored) and the letters counted by script;
2. a non-Latin plurality, or a Latin plurality carried by enough lowercase non-Latin words, is
   not English;
3. Latin text is scored against function-word lists of en, fr, de, es, pt, it, nl, sv, ro, bn
   (romanized) and az, weighed against the share of letters ordinary English does not use;
4. text that reads as English as a whole is re-read line by line and field by field, so a
   foreign message inside an English payload still routes multilingual.

Public API (same inputs, outputs and semantics as the reference's functions of the same name):

- ``analyse(state, *, explain=False) -> dict``: keys, in order, ``script``, ``script_profile``,
  ``language``, ``is_english``, ``language_undecided``, ``diacritic_rate``,
  ``non_latin_fraction``, ``mixed_segment``; with ``explain=True`` also ``diagnostic``
  (``stage``, ``reason``, ``source``). ``state`` is a str, bytes, any Mapping, list/tuple or None.
- ``is_english(state) -> bool``: ``analyse(state)["is_english"]``.
- ``detect_script(text) -> str``: the dominant script (``"latin"``, ``"han"``, ...,
  ``"other"``) or ``"unknown"`` when the text has no letters.
- ``script_profile(text) -> dict``: the fraction of letters per script, Latin first.
- ``state_text(state, max_chars=4000) -> str``: the flattened text detection reads.
- ``latin_profile(text) -> dict``: ``language``, ``english_hits``, ``diacritic_rate``,
  ``looks_non_english`` for Latin text; ``guess_latin_language(text)`` is its ``language``.
- ``english_from_code(code) -> bool | None``: whether a language code (``en``, ``en_US.UTF-8``,
  ``pt-BR``) names English; None when it names no language (blank, ``C``, ``POSIX``, ``und``).

- ``route_detection(detection, default="multilingual") -> (checkpoint, reason)``: the Router's
  choice from an ``analyse`` result (its detection step, docs/semantics.md#routing step 6), with the
  reference's reason texts: script ``unknown`` -> ``default``; another non-Latin script ->
  ``"multilingual"``; ``is_english`` false -> ``"multilingual"``; ``language_undecided`` ->
  ``default``; otherwise ``"english"``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from laya_onnx.core.lang_scripts import (
    detect_script,
    dominant_script,
    letter_counts,
    non_latin_words,
    script_profile,
    script_shares,
)
from laya_onnx.core.lang_words import (
    ENGLISH_LOOKALIKES,
    ENGLISH_ONLY,
    FUNCTION_WORDS,
    NON_ENGLISH_LETTERS,
    NORDIC_SHARED,
    SHARED,
    SHORT_SWEDISH,
)

__all__ = [
    "NON_EN_DIACRITIC_RATE",
    "analyse",
    "route_detection",
    "detect_script",
    "english_from_code",
    "guess_latin_language",
    "is_english",
    "latin_profile",
    "script_profile",
    "state_text",
]

# ---------------------------------------------------------------- thresholds (reference facts)

#: A share of non-English letters at or above this marks Latin text as not English.
NON_EN_DIACRITIC_RATE = 0.02
#: English function words can outvote non-English letters only below this share.
ENGLISH_RESCUE_DIACRITIC_RATE = 0.06
#: A Latin plurality is promoted to its non-Latin script at this non-Latin share ...
NON_LATIN_FRACTION = 0.2
#: ... or at this share when the non-Latin letters number at least NON_LATIN_MIN_LETTERS.
NON_LATIN_MIN_FRACTION = 0.1
NON_LATIN_MIN_LETTERS = 10
#: An all-caps line names a language only with a matched function word this long ...
SHOUTED_MIN_STOPWORD = 4
#: ... and a token this long; shorter all-caps runs read as acronyms.
SHOUTED_MIN_WORD = 5
#: The flattened state is read up to this many characters.
MAX_CHARS = 4000
#: Nesting depth below which state_text stops walking.
MAX_DEPTH = 6
#: A value line shorter than this cannot reach four words, so the value scan skips it.
MIN_VALUE_LINE = 7


def _non_latin_carries(fraction: float, letters: int) -> bool:
    return fraction >= NON_LATIN_FRACTION or (
        fraction >= NON_LATIN_MIN_FRACTION and letters >= NON_LATIN_MIN_LETTERS
    )


# ---------------------------------------------------------------- tokens

_WORD = re.compile(r"[^\W\d_]+")
# A token whose dot or @ sits between word characters names a thing (a domain, a mail address, a
# version), and its pieces (`com`, `e`, `o`) are not words of any language.
_IDENTIFIER = re.compile(r"(?<![-\w])[-\w]*(?:[@.][-\w]+)+")
# Program text: assignment, statement ends, braces, brackets, or a call `name(`.
_CODE = re.compile(r"[=;{}\[\]]|\w\(")
# A letter or digit, a joiner (. _ / \) and another: a path, a compound, an identifier.
_JOINED = re.compile(r"[^\W_][._/\\][^\W_]")
_LETTER_RUN = re.compile(r"[^\W\d_]{2,}")


# ---------------------------------------------------------------- state flattening


def _path_key(key: Any) -> bool:
    # Only short names and machine-size ints go into a diagnostic path.
    return (type(key) is str and len(key) <= 128) or (type(key) is int and key.bit_length() <= 63)


def _leaves(
    state: Any, depth: int = 0, path: tuple[Any, ...] | None = ()
) -> Iterator[tuple[str, tuple[Any, ...] | None]]:
    """Each string leaf of `state` (values and items, not keys) with its path."""
    if depth > MAX_DEPTH or state is None:
        return
    if isinstance(state, str):
        yield state, path
    elif isinstance(state, (bytes, bytearray)):
        try:
            yield bytes(state).decode("utf-8"), path
        except UnicodeDecodeError:
            return
    elif isinstance(state, Mapping):
        for key, value in state.items():
            sub = path + (key,) if path is not None and _path_key(key) else None
            yield from _leaves(value, depth + 1, sub)
    elif isinstance(state, (list, tuple)):
        for index, value in enumerate(state):
            yield from _leaves(value, depth + 1, None if path is None else path + (index,))


def _leaf_texts(state: Any) -> list[str]:
    return [text for text, _ in _leaves(state)]


def state_text(state: Any, max_chars: int = MAX_CHARS) -> str:
    """The text detection reads: string leaves joined by spaces, keys ignored, capped."""
    parts: list[str] = []
    room = max_chars
    for text in _leaf_texts(state):
        if room <= 0:
            break
        parts.append(text[:room])
        if len(text) > room:
            break
        room -= len(text) + 1
    return " ".join(parts)[:max_chars]


# ---------------------------------------------------------------- the Latin-script guess


def _diacritic_rate(text: str) -> float:
    lowered = text.lower()
    return sum(ch in NON_ENGLISH_LETTERS for ch in lowered) / max(1, len(lowered))


def _english_outvotes_letters(words: list[str], rate: float) -> bool:
    """Two English-only function words and at most one word with a foreign letter beat a low rate
    (an accented loanword or name in English prose)."""
    if rate >= ENGLISH_RESCUE_DIACRITIC_RATE:
        return False
    distinct = set(words)
    if len(distinct & ENGLISH_ONLY) < 2:
        return False
    return sum(1 for w in distinct if not NON_ENGLISH_LETTERS.isdisjoint(w)) <= 1


def _latin_profile(text: str, diagnostic: dict[str, Any] | None = None) -> dict[str, Any]:
    # `İ` lowercases to `i` plus a combining dot, which no list holds.
    words = _WORD.findall(_IDENTIFIER.sub(" ", text).replace("İ", "i").lower())
    rate = _diacritic_rate(text)
    lettered = rate >= NON_EN_DIACRITIC_RATE
    distinct = set(words)
    nordic = bool(distinct & NORDIC_SHARED) and not distinct & ENGLISH_ONLY

    def verdict(language: str | None, reason: str, hits: int, looks: bool) -> dict[str, Any]:
        if diagnostic is not None:
            diagnostic["reason"] = reason
        return {
            "language": language,
            "english_hits": hits,
            "diacritic_rate": rate,
            "looks_non_english": looks,
        }

    if 1 < len(words) < 4 and distinct & SHORT_SWEDISH:
        return verdict("sv", "short_swedish", 0, lettered)
    if len(words) < 4:
        return verdict(None, "insufficient_words", 0, lettered or nordic)

    seen = Counter(words)
    scores = {
        lg: sum(1 if w in ENGLISH_LOOKALIKES else n for w, n in seen.items() if w in listed)
        for lg, listed in FUNCTION_WORDS.items()
    }
    english = scores["en"]
    # Only a language with a word of its own may be named; shared words only add to its score.
    best_lg, best = None, 0
    for lg, listed in FUNCTION_WORDS.items():
        if lg == "en" or not any(w not in SHARED for w in distinct & listed):
            continue
        if best_lg is None or scores[lg] > best:
            best_lg, best = lg, scores[lg]

    language: str | None = None
    if best_lg and best >= max(2, english + 2):
        language = best_lg
    elif (
        best_lg == "sv" and {"inte", "kan"} <= distinct and words[0] in ("kan", "jag", "vi") and english <= 1
    ):
        # "kan inte logga in": a Swedish phrase with one English-looking token
        language = "sv"
    elif best_lg and lettered and best >= max(2, english):
        language = best_lg
    elif english and (not lettered or _english_outvotes_letters(words, rate)):
        language = "en"
    reason = "language_evidence" if language else "no_language_evidence"
    return verdict(language, reason, english, lettered or (language is None and nordic))


def latin_profile(text: str) -> dict[str, Any]:
    """Evidence for the language of Latin text: `language` (None when undecided),
    `english_hits`, `diacritic_rate`, `looks_non_english`."""
    return _latin_profile(text)


def guess_latin_language(text: str) -> str | None:
    """The language code `latin_profile` names for `text`, or None when undecided."""
    return _latin_profile(text)["language"]


def _all_caps(text: str) -> bool:
    """Cased text with no lowercase letter (caseless scripts are not shouting)."""
    return any(ch.isupper() for ch in text) and not any(ch.islower() for ch in text)


def _caps_evidence(tokens: list[str], language: str, rate: float) -> bool:
    """Whether an all-caps text's evidence for `language` is more than acronyms."""
    if all(len(t) < SHOUTED_MIN_WORD for t in tokens):
        return False
    if rate >= NON_EN_DIACRITIC_RATE:
        return True
    hits = {t.lower() for t in tokens} & FUNCTION_WORDS.get(language, frozenset())
    return any(len(w) >= SHOUTED_MIN_STOPWORD for w in hits)


def _blank_caps(text: str) -> str:
    return _LETTER_RUN.sub(lambda m: " " if m.group().isupper() else m.group(), text)


# ---------------------------------------------------------------- one text


def _analyse_text(text: str, diagnostic: dict[str, Any] | None = None) -> dict[str, Any]:
    """Detection of one flattened text, without the per-line and per-field rereads."""
    others, latin = letter_counts(text)
    shares = script_shares(others, latin)
    script = dominant_script(others, latin)
    non_latin = round(1.0 - shares.get("latin", 0.0), 4) if shares else 0.0
    non_latin_letters = round(non_latin * sum(ch.isalpha() for ch in text))
    carried = _non_latin_carries(non_latin, non_latin_letters)
    if script == "latin" and carried and non_latin_words(text):
        script = max((s for s in shares if s != "latin"), key=lambda s: shares[s])

    def result(**fields: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"script": script, "script_profile": shares}
        out.update(fields)
        out["mixed_segment"] = None
        return out

    if script != "latin":
        # no letters reads as English (the Router takes its default); another script does not
        letterless = script == "unknown"
        if diagnostic is not None:
            diagnostic["reason"] = "no_letters" if letterless else "non_latin_script"
        return result(
            language=None,
            is_english=letterless,
            language_undecided=True,
            diacritic_rate=0.0,
            non_latin_fraction=non_latin,
        )
    latin_view = _latin_profile(text, diagnostic)
    language = latin_view["language"]
    if language not in (None, "en") and not carried:
        # Acronyms (`MON DES EST LA`) are not words of the language they happen to spell.
        if _all_caps(text):
            if not _caps_evidence(_WORD.findall(text), language, latin_view["diacritic_rate"]):
                language = None
                if diagnostic is not None:
                    diagnostic["reason"] = "caps_veto"
        else:
            caps = [m.group() for m in _LETTER_RUN.finditer(text) if m.group().isupper()]
            # a capitalised run of word length is emphasis, not an acronym: keep it then
            if caps and all(len(c) < SHOUTED_MIN_WORD for c in caps):
                blanked = _blank_caps(text)
                if blanked != text:
                    language = _latin_profile(blanked)["language"]
                    if diagnostic is not None:
                        diagnostic["reason"] = "caps_filtered"
    undecided = language is None
    english = language == "en" or (undecided and not latin_view["looks_non_english"])
    if diagnostic is not None and undecided and not english:
        diagnostic["reason"] = "non_english_markers"
    return result(
        language=language,
        is_english=english,
        language_undecided=undecided,
        diacritic_rate=round(float(latin_view["diacritic_rate"]), 4),
        non_latin_fraction=non_latin,
    )


# ---------------------------------------------------------------- lines and fields


def _line_language(line: str) -> str | None:
    """The non-English language one prose line is written in, else None: four words, a named
    language, two different words of it; code, compounds and acronyms do not count."""
    if not line.strip() or _CODE.search(line):
        return None
    prose = " ".join(tok for tok in line.split() if not _JOINED.search(tok))
    shouted = _all_caps(prose)
    if not shouted:
        prose = _blank_caps(prose)
    tokens = _WORD.findall(prose)
    if len(tokens) < 4:
        return None
    view = _latin_profile(prose)
    language = view["language"]
    if language in (None, "en"):
        return None
    if shouted and not _caps_evidence(tokens, language, float(view["diacritic_rate"])):
        return None
    if len({t.lower() for t in tokens} & FUNCTION_WORDS[language]) < 2:
        return None
    return language


def _source(path: tuple[Any, ...] | None, index: int, line: int) -> dict[str, Any]:
    return {"leaf_index": index, "path": list(path) if path is not None else None, "line": line}


def _foreign_line(state: Any, diagnostic: dict[str, Any] | None) -> tuple[str, str] | None:
    """The first line of any leaf that reads as a named non-English language, with its text;
    reads MAX_CHARS characters in all."""
    read = 0
    for index, (text, path) in enumerate(_leaves(state)):
        for number, line in enumerate(text.split("\n"), 1):
            if read >= MAX_CHARS:
                return None
            line = line[: MAX_CHARS - read]
            read += len(line)
            language = _line_language(line)
            if language:
                if diagnostic is not None:
                    diagnostic.update(
                        stage="segment", reason="named_segment", source=_source(path, index, number)
                    )
                return language, line.strip()
    return None


def _foreign_value(text: str) -> tuple[dict[str, Any], int, str] | None:
    """The line of one string value that is itself not for the English checkpoint (the one with
    most letters), with its 1-based number and the reason; None when every line is English."""
    chosen: tuple[dict[str, Any], int, str] | None = None
    most = -1
    for number, whole in enumerate(text.split("\n"), 1):
        if len(whole) < MIN_VALUE_LINE:
            continue
        line = whole[:MAX_CHARS]
        if not line.strip() or _CODE.search(line):
            continue
        det = _analyse_text(line)
        if det["is_english"]:
            continue
        named = det["language"] not in (None, "en") and _line_language(line) is not None
        if named:
            reason = "named_value"
        elif det["script"] not in ("latin", "unknown"):
            # a non-Latin name or symbol in an English field is not a message
            if not (non_latin_words(line) and sum(ch.isalpha() for ch in line) >= NON_LATIN_MIN_LETTERS):
                continue
            reason = "non_latin_value"
        elif det["diacritic_rate"] >= NON_EN_DIACRITIC_RATE and len(_WORD.findall(line)) >= 4:
            reason = "diacritic_value"
        else:
            continue
        letters = sum(ch.isalpha() for ch in line)
        if letters > most:
            most, chosen = letters, (det, number, reason)
    return chosen


# ---------------------------------------------------------------- the state


def analyse(state: Any, *, explain: bool = False) -> dict[str, Any]:
    """Detect the script and language of a state (see the module docstring for the keys).

    The whole state is read first. When it reads as English Latin text, each line of each string
    value is read again (a named foreign line sets `mixed_segment`), and then each value on its
    own (a non-English value flips `is_english`, `mixed_segment` stays None): a short foreign
    message must not be outvoted by a long English note beside it.
    """
    diagnostic: dict[str, Any] | None = (
        {"stage": "whole_state", "reason": None, "source": None} if explain else None
    )
    result = _analyse_text(state_text(state), diagnostic)
    if diagnostic is not None:
        result["diagnostic"] = diagnostic
    if result["script"] == "latin" and result["is_english"]:
        texts = _leaf_texts(state)
        # one single-line leaf was just read whole
        if len(texts) > 1 or any("\n" in text for text in texts):
            found = _foreign_line(state, diagnostic)
            if found:
                result = dict(result)
                result.update(
                    language=found[0], is_english=False, language_undecided=False, mixed_segment=found[1]
                )
    if isinstance(state, (str, bytes, bytearray)) or state is None or not result["is_english"]:
        return result
    best: tuple[dict[str, Any], int, str] | None = None
    best_at: tuple[int, tuple[Any, ...] | None] = (0, None)
    most = -1
    for index, (text, path) in enumerate(_leaves(state)):
        found_value = _foreign_value(text)
        if found_value is None:
            continue
        letters = sum(ch.isalpha() for ch in text[:MAX_CHARS])
        if letters > most:
            most, best, best_at = letters, found_value, (index, path)
    if best is None:
        return result
    det, line, reason = best
    result = dict(result)
    result.update(language=det["language"], is_english=False, language_undecided=det["language_undecided"])
    if diagnostic is not None:
        diagnostic.update(stage="value", reason=reason, source=_source(best_at[1], best_at[0], line))
    return result


def is_english(state: Any) -> bool:
    """Whether the English checkpoint can be expected to read `state`."""
    return bool(analyse(state)["is_english"])


# ---------------------------------------------------------------- language codes

_ENGLISH_CODES = ("en", "eng", "english")
# `$LANG` values and ISO 639-2 codes that name no language: they answer nothing.
_NO_LANGUAGE_CODES = ("c", "posix", "und", "zxx", "mul")


def english_from_code(code: Any) -> bool | None:
    """True when a language code names English, False for another language, None for no
    language (None, blank, `C`, `POSIX`, `C.UTF-8`, `und`, `zxx`, `mul`). Accepts `en`, `EN`,
    `en-US`, `en_US`, `en_US.UTF-8`."""
    if code is None:
        return None
    primary = str(code).strip().lower().split(".", 1)[0].replace("_", "-").split("-", 1)[0]
    if not primary or primary in _NO_LANGUAGE_CODES:
        return None
    return primary in _ENGLISH_CODES


# ---------------------------------------------------------------- the Router's reading


def route_detection(detection: Mapping[str, Any], default: str = "multilingual") -> tuple[str, str]:
    """The checkpoint name and routing reason the Router gives for an `analyse` result."""
    script = detection["script"]
    if script == "unknown":
        return default, "no letters detected in state; using default (%s)" % default
    if script != "latin":
        return "multilingual", (
            "non-Latin script (%s, %.0f%% of letters); the English checkpoint cannot read it"
            % (script, 100 * float(detection["non_latin_fraction"]))
        )
    if not detection["is_english"]:
        if detection.get("mixed_segment"):
            return "multilingual", (
                "Latin script, mostly English, but a line or field reads as %r (%r); "
                "the English checkpoint cannot read it"
                % (detection["language"], detection["mixed_segment"][:60])
            )
        if detection["language"]:
            return "multilingual", "Latin script but language looks like %r, not English" % detection[
                "language"
            ]
        return "multilingual", (
            "Latin script, language not identified but %.0f%% non-English letters; "
            "not safe for the English checkpoint" % (100 * float(detection["diacritic_rate"]))
        )
    if detection["language_undecided"]:
        return default, (
            "Latin script, language not identified and no non-English letters; using default (%s)" % default
        )
    return "english", "English Latin text"
