"""Language and script detection for checkpoint routing (stdlib only, torch-free).

The Router needs one bit per state: can the English checkpoint read it, or must it go to the
multilingual one? These functions answer it with the rules of the reference `laya.lang`
(core.md §8.7), implemented here with our own code and our own word lists:

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
  choice from an ``analyse`` result (its detection step, core.md §8.3 step 6), with the
  reference's reason texts: script ``unknown`` -> ``default``; another non-Latin script ->
  ``"multilingual"``; ``is_english`` false -> ``"multilingual"``; ``language_undecided`` ->
  ``default``; otherwise ``"english"``.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

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

# ---------------------------------------------------------------- scripts

# Unicode blocks per named script; the names are the ones the routing reason prints.
_SCRIPT_BLOCKS: dict[str, tuple[tuple[int, int], ...]] = {
    "greek": ((0x0370, 0x03FF), (0x1F00, 0x1FFF)),
    "cyrillic": ((0x0400, 0x052F), (0x2DE0, 0x2DFF), (0xA640, 0xA69F)),
    "armenian": ((0x0530, 0x058F),),
    "hebrew": ((0x0590, 0x05FF),),
    "arabic": ((0x0600, 0x06FF), (0x0750, 0x077F), (0x08A0, 0x08FF), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF)),
    "devanagari": ((0x0900, 0x097F), (0xA8E0, 0xA8FF)),
    "bengali": ((0x0980, 0x09FF),),
    "gurmukhi": ((0x0A00, 0x0A7F),),
    "gujarati": ((0x0A80, 0x0AFF),),
    "oriya": ((0x0B00, 0x0B7F),),
    "tamil": ((0x0B80, 0x0BFF),),
    "telugu": ((0x0C00, 0x0C7F),),
    "kannada": ((0x0C80, 0x0CFF),),
    "malayalam": ((0x0D00, 0x0D7F),),
    "sinhala": ((0x0D80, 0x0DFF),),
    "thai": ((0x0E00, 0x0E7F),),
    "lao": ((0x0E80, 0x0EFF),),
    "tibetan": ((0x0F00, 0x0FFF),),
    "myanmar": ((0x1000, 0x109F),),
    "georgian": ((0x10A0, 0x10FF),),
    "ethiopic": ((0x1200, 0x137F),),
    "khmer": ((0x1780, 0x17FF),),
    "hangul": ((0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7AF)),
    "kana": ((0x3040, 0x309F), (0x30A0, 0x30FF), (0x31F0, 0x31FF)),
    "han": ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF)),
}
_BLOCKS = sorted((lo, hi, name) for name, spans in _SCRIPT_BLOCKS.items() for lo, hi in spans)
_BLOCK_STARTS = [lo for lo, _, _ in _BLOCKS]

# Letters this interpreter's Unicode database (14.0 on Python 3.11) calls unassigned but Unicode
# 16.0 makes letters, plus the letters of the five scripts Unicode 14.0 introduced (for Python
# 3.10, Unicode 13.0): listed so that what counts as a letter does not depend on the host's
# Python. Printed by `parity/lang/newer_letters.py` from the Unicode databases.
_NEWER_LETTERS: tuple[tuple[int, int], ...] = (
    (0x01C89, 0x01C8A),
    (0x0A7CB, 0x0A7CD),
    (0x0A7DA, 0x0A7DC),
    (0x10570, 0x1057A),
    (0x1057C, 0x1058A),
    (0x1058C, 0x10592),
    (0x10594, 0x10595),
    (0x10597, 0x105A1),
    (0x105A3, 0x105B1),
    (0x105B3, 0x105B9),
    (0x105BB, 0x105BC),
    (0x105C0, 0x105F3),
    (0x10D4A, 0x10D65),
    (0x10D6F, 0x10D85),
    (0x10EC2, 0x10EC4),
    (0x10F70, 0x10F81),
    (0x1123F, 0x11240),
    (0x11380, 0x11389),
    (0x1138B, 0x1138B),
    (0x1138E, 0x1138E),
    (0x11390, 0x113B5),
    (0x113B7, 0x113B7),
    (0x113D1, 0x113D1),
    (0x113D3, 0x113D3),
    (0x11BC0, 0x11BE0),
    (0x11F02, 0x11F02),
    (0x11F04, 0x11F10),
    (0x11F12, 0x11F33),
    (0x12F90, 0x12FF0),
    (0x1342F, 0x1342F),
    (0x13441, 0x13446),
    (0x13460, 0x143FA),
    (0x16100, 0x1611D),
    (0x16A70, 0x16ABE),
    (0x16D40, 0x16D6C),
    (0x18CFF, 0x18CFF),
    (0x1B132, 0x1B132),
    (0x1B155, 0x1B155),
    (0x1DF25, 0x1DF2A),
    (0x1E030, 0x1E06D),
    (0x1E290, 0x1E2AD),
    (0x1E4D0, 0x1E4EB),
    (0x1E5D0, 0x1E5ED),
    (0x1E5F0, 0x1E5F0),
    (0x2B739, 0x2B739),
    (0x2EBF0, 0x2EE5D),
    (0x31350, 0x323AF),
)


def _is_letter(ch: str) -> bool:
    """A letter as the newest Unicode database says, whatever this interpreter ships."""
    if ch.isalpha():
        return True
    cp = ord(ch)
    if cp < 0x1C89 or unicodedata.category(ch) != "Cn":
        return False
    return any(lo <= cp <= hi for lo, hi in _NEWER_LETTERS)


def _is_latin_cp(cp: int, ceiling: int) -> bool:
    # Basic Latin through Latin Extended-B (and IPA below `ceiling`), Latin Extended Additional,
    # fullwidth A-Z and a-z.
    return cp < ceiling or 0x1E00 <= cp <= 0x1EFF or 0xFF21 <= cp <= 0xFF3A or 0xFF41 <= cp <= 0xFF5A


def _block_script(cp: int) -> str | None:
    at = bisect.bisect_right(_BLOCK_STARTS, cp) - 1
    if at >= 0 and cp <= _BLOCKS[at][1]:
        return _BLOCKS[at][2]
    return None


def _letter_counts(text: str) -> tuple[dict[str, int], int]:
    """Non-Latin letters per script in order of first appearance, and the Latin letter count."""
    # One pass per request over up to MAX_CHARS characters: the per-character path is inlined
    # (the Latin test of `_is_latin_cp`, the lookup of `_block_script`).
    others: dict[str, int] = {}
    latin = 0
    starts, blocks, find = _BLOCK_STARTS, _BLOCKS, bisect.bisect_right
    for ch in text:
        if not ch.isalpha() and not _is_letter(ch):
            continue
        cp = ord(ch)
        if cp < 0x02B0 or 0x1E00 <= cp <= 0x1EFF or 0xFF21 <= cp <= 0xFF3A or 0xFF41 <= cp <= 0xFF5A:
            latin += 1
            continue
        at = find(starts, cp) - 1
        # a letter of no listed block still is not Latin: "other" keeps it off English
        name = blocks[at][2] if at >= 0 and cp <= blocks[at][1] else "other"
        others[name] = others.get(name, 0) + 1
    return others, latin


def _dominant(others: dict[str, int], latin: int) -> str:
    best, top = "unknown", 0
    for name, n in others.items():
        if n > top:
            best, top = name, n
    # a named script wins a tie with Latin
    return "latin" if latin > top else best


def _profile(others: dict[str, int], latin: int) -> dict[str, float]:
    total = latin + sum(others.values())
    if not total:
        return {}
    shares = {"latin": latin / total} if latin else {}
    shares.update((name, n / total) for name, n in others.items() if n)
    return shares


def detect_script(text: str) -> str:
    """The script most letters of `text` are written in, or "unknown" when it has none."""
    return _dominant(*_letter_counts(text))


def script_profile(text: str) -> dict[str, float]:
    """Fraction of the letters of `text` in each script (Latin first, then as they appear)."""
    return _profile(*_letter_counts(text))


def _named_script(ch: str) -> str | None:
    cp = ord(ch)
    if _is_latin_cp(cp, 0x0250):
        return None
    return _block_script(cp)


def _non_latin_words(text: str) -> list[str]:
    """Runs of one named non-Latin script, 2+ letters, not capitalised (a name, a symbol or IPA
    inside English prose is not a message in that script). Combining marks never split a run."""
    words: list[str] = []
    run: list[str] = []
    run_script: str | None = None
    for ch in text:
        if unicodedata.combining(ch):
            continue
        script = _named_script(ch)
        if script is not None and script == run_script:
            run.append(ch)
            continue
        if run:
            words.append("".join(run))
        run, run_script = ([ch], script) if script is not None else ([], None)
    if run:
        words.append("".join(run))
    return [w for w in words if len(w) >= 2 and not w[0].isupper()]


def _non_latin_carries(fraction: float, letters: int) -> bool:
    return fraction >= NON_LATIN_FRACTION or (
        fraction >= NON_LATIN_MIN_FRACTION and letters >= NON_LATIN_MIN_LETTERS
    )


# ---------------------------------------------------------------- word lists (our own)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Function words and common support-request words of each language. Which frequent words count,
# and which stay out because a neighbour writes them too, is what decides a route, so those
# choices follow the reference's (measured over `parity/lang/`, see its README): English leaves
# out `a`, `de`, `en`, `no`, `me`, `he`, `or`, `so`, `also`, `an`, `am`, `by`, `her`, `thanks`;
# the Romance lists leave out `de`, `a` and `no`; Dutch and Romanian keep a short core; Swedish
# keeps the words Danish and Norwegian do not write the same way.
_FUNCTION_WORDS: dict[str, frozenset[str]] = {
    "en": _words(
        """
        the this that these those is are was were be been being have has does did done doing will
        would shall should can could might must not and but if because while until than then when
        where why how what which who whom with without within from into onto of to for at on in as
        after before between through during down i you she it we they him his them my your yours
        our their its there here please only very too never always already yet ever any some every
        each many much few both nor doesn didn isn aren wasn weren haven hasn won wouldn couldn
        dont doesnt didnt isnt wasnt havent wont ive youre thats whats
        """
    ),
    "fr": _words(
        """
        le la les des une du au aux ce cette ces et ou mais donc est sont ont être je tu il elle
        nous vous ils elles mon ton ma ta sa mes tes ses que qui pour dans sur avec pas plus très
        bien tout tous toute fait veux veut peux peut dois doit deux trois jour jours mois fois
        quand comment pourquoi alors merci bonjour suis ai avez avons été votre vos notre nos moi
        chez aussi encore déjà jamais rien voudrais pouvez depuis après avant hier demain
        """
    ),
    "de": _words(
        """
        der die das den dem ein eine einen einem einer und oder aber ist sind bin bist wurde werden
        wird habe hat haben hatte ich wir mir mich dir dich uns sich mein meine meinen meinem meiner
        diese dieser diesen dieses nicht mit für auf von zu zum zur im aus bei nach noch auch wie wo
        wann warum welche bitte danke heute jetzt kann kannst können möchte muss gibt sehr schon nur
        kein keine über ohne durch gegen unser in was
        """
    ),
    "es": _words(
        """
        el la los las un una y que qué por para con sin como cómo cuando donde dónde porque aunque
        pero es son está estoy soy fue fueron ser hay han hemos tiene tienen tengo puede pueden
        quiero necesito se del al lo le les su sus mi tu nos yo ni dos tres este esta eso esto esa
        ese todo nada algo más muy también ya nunca siempre sobre entre desde aquí hoy gracias
        """
    ),
    "pt": _words(
        """
        o os as um uma e que para com por em do da dos das na nas nos ao aos pelo pela não nao é
        são sao está estou estamos foi era ser sou tem tenho pode podem quero preciso gostaria eu
        meu minha meus minhas seu sua nosso nossa você vocês voce voces vc vcs se mas como quando
        onde porque mais muito já ja ainda agora hoje ontem depois antes então entao até tá pra
        isso isto este esta aqui ali tudo nada dois três obrigado obrigada olá também tambem
        consigo estava ficou fiz deu ninguém ninguem alguém alguem nenhum nenhuma
        """
    ),
    "it": _words(
        """
        il lo la le gli un uno una e ed o che di da su per con tra fra non è si mi ci ne del della
        dello dei degli delle nel nella nell negli sul sulla sulle dal dalla dallo dagli alla alle
        agli col sono era stato stata ho hai ha abbiamo avete hanno devo deve devono voglio vorrei
        mio mia tuo sua questo questa come quando dove perche perché anche più molto poco sempre
        mai già ancora adesso oggi ieri grazie ciao scusa
        """
    ),
    "nl": _words(
        """
        het een van is op te dat niet met voor zijn aan door maar ook naar deze worden wordt
        """
    ),
    "sv": _words(
        """
        jag är och inte att från till också måste vill ska skulle behöver får gör göra här när två
        mitt min mig om vi kommer upp utan nästa dessa detta säger hjälp hjälpa behover hjalp
        hjalpa nar tva lösenord losenord återbetalning aterbetalning faktura kvittot appen fel paket
        """
    ),
    "ro": _words(
        """
        și să este sunt care pentru din în dar după până fără ale lui fost acum vreau trebuie
        foarte acest această acesta aceasta mi ți vă nu
        """
    ),
    "bn": _words(
        """
        ami amar amake amra amader apni apnar apnake apnara tumi tomar tomake tomra tader ota eita
        oita ekta ei oi ki keno kivabe kibhabe kothay kokhon kobe koto kintu jodi tahole ar theke
        jonno sathe shathe diye niye moddhe kore korte korchi korsi korbo korechi koreche korun
        koren korlam hobe hoyeche hoise hocche hoyni chai chaina lagbe parchi parbo parchina
        peyechi paini dite dilam diyechi nai khub onek ekhon akhon ekhono abar ekbar duibar ajke
        kalke taka bhalo valo kharap shomossa somossa dhonnobad bhai shob keu kichu bolte bolun
        parben asbe jabe pabo ferot dorkar hoye geche gese
        """
    ),
    "az": _words(
        """
        və ve bir bu üçün ucun ilə ile olan olub olmasa var yox yoxdur mən sən biz siz onlar daha
        çox cox hər nə kimi görə sonra əgər eger deyil lakin amma ancaq artıq artiq də isə həm
        yalnız yalniz
        """
    ),
}
# A word of several lists says "not English" without saying which language.
_ALL_LISTED = Counter(w for words in _FUNCTION_WORDS.values() for w in words)
# Words Danish and Norwegian share with Swedish: they say "Nordic", never "Swedish" by themselves.
_NORDIC_SHARED = _words("hej ja nej jo tack mig min om kommer får skulle vi")
_SHARED = frozenset(w for w, n in _ALL_LISTED.items() if n > 1) | _NORDIC_SHARED
_ENGLISH_ONLY = _FUNCTION_WORDS["en"] - _SHARED
# Foreign function words that are everyday English words too: a repeat of one is one piece of
# evidence, not several ("do this, do that").
_ENGLISH_LOOKALIKES = _words("come son do care todo im per plus") & frozenset(
    w for lg, words in _FUNCTION_WORDS.items() if lg != "en" for w in words
)
# Two- and three-word Swedish requests that no other language writes this way.
_SHORT_SWEDISH = _words(
    """
    lösenord losenord lösenordet losenordet glömt glomt glömde glomde behöver behover
    återbetalning aterbetalning inloggning inloggningen betalningen fakturan kvitto kvittot
    beställningen bestallningen leveransen prenumerationen abonnemanget felmeddelande
    """
)

# Letters ordinary English text does not use (lowercase; text is lowercased before counting).
_NON_ENGLISH_LETTERS = frozenset(
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿœß"  # French, Spanish, Portuguese, Italian, German, Nordic
    "ăşţșț"  # Romanian
    "ąćęłńśźż"  # Polish
    "čďěňřšťůž"  # Czech, Slovak
    "őű"  # Hungarian
    "ğı"  # Turkish
    "āēģīķļņū"  # Latvian, Lithuanian
    "đ"  # Croatian, Serbian Latin, Vietnamese
    "ə"  # Azerbaijani
)

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
    return sum(ch in _NON_ENGLISH_LETTERS for ch in lowered) / max(1, len(lowered))


def _english_outvotes_letters(words: list[str], rate: float) -> bool:
    """Two English-only function words and at most one word with a foreign letter beat a low rate
    (an accented loanword or name in English prose)."""
    if rate >= ENGLISH_RESCUE_DIACRITIC_RATE:
        return False
    distinct = set(words)
    if len(distinct & _ENGLISH_ONLY) < 2:
        return False
    return sum(1 for w in distinct if not _NON_ENGLISH_LETTERS.isdisjoint(w)) <= 1


def _latin_profile(text: str, diagnostic: dict[str, Any] | None = None) -> dict[str, Any]:
    # `İ` lowercases to `i` plus a combining dot, which no list holds.
    words = _WORD.findall(_IDENTIFIER.sub(" ", text).replace("İ", "i").lower())
    rate = _diacritic_rate(text)
    lettered = rate >= NON_EN_DIACRITIC_RATE
    distinct = set(words)
    nordic = bool(distinct & _NORDIC_SHARED) and not distinct & _ENGLISH_ONLY

    def verdict(language: str | None, reason: str, hits: int, looks: bool) -> dict[str, Any]:
        if diagnostic is not None:
            diagnostic["reason"] = reason
        return {
            "language": language,
            "english_hits": hits,
            "diacritic_rate": rate,
            "looks_non_english": looks,
        }

    if 1 < len(words) < 4 and distinct & _SHORT_SWEDISH:
        return verdict("sv", "short_swedish", 0, lettered)
    if len(words) < 4:
        return verdict(None, "insufficient_words", 0, lettered or nordic)

    seen = Counter(words)
    scores = {
        lg: sum(1 if w in _ENGLISH_LOOKALIKES else n for w, n in seen.items() if w in listed)
        for lg, listed in _FUNCTION_WORDS.items()
    }
    english = scores["en"]
    # Only a language with a word of its own may be named; shared words only add to its score.
    best_lg, best = None, 0
    for lg, listed in _FUNCTION_WORDS.items():
        if lg == "en" or not any(w not in _SHARED for w in distinct & listed):
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
    hits = {t.lower() for t in tokens} & _FUNCTION_WORDS.get(language, frozenset())
    return any(len(w) >= SHOUTED_MIN_STOPWORD for w in hits)


def _blank_caps(text: str) -> str:
    return _LETTER_RUN.sub(lambda m: " " if m.group().isupper() else m.group(), text)


# ---------------------------------------------------------------- one text


def _analyse_text(text: str, diagnostic: dict[str, Any] | None = None) -> dict[str, Any]:
    """Detection of one flattened text, without the per-line and per-field rereads."""
    others, latin = _letter_counts(text)
    shares = _profile(others, latin)
    script = _dominant(others, latin)
    non_latin = round(1.0 - shares.get("latin", 0.0), 4) if shares else 0.0
    non_latin_letters = round(non_latin * sum(ch.isalpha() for ch in text))
    carried = _non_latin_carries(non_latin, non_latin_letters)
    if script == "latin" and carried and _non_latin_words(text):
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
    if len({t.lower() for t in tokens} & _FUNCTION_WORDS[language]) < 2:
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
            if not (_non_latin_words(line) and sum(ch.isalpha() for ch in line) >= NON_LATIN_MIN_LETTERS):
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
