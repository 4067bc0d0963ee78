"""Which writing system the letters of a text are in (stdlib only, torch-free).

Language detection (`laya_onnx.core.lang`) starts here: a text's letters are counted per script
(Unicode blocks named as the routing reason prints them), and a non-Latin plurality, or enough
lowercase words of one non-Latin script inside Latin text, says the text is not English. What
counts as a letter does not depend on the interpreter's Unicode version (`NEWER_LETTERS`).
"""

from __future__ import annotations

import bisect
import unicodedata

__all__ = [
    "NEWER_LETTERS",
    "detect_script",
    "dominant_script",
    "letter_counts",
    "non_latin_words",
    "script_profile",
    "script_shares",
]

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
NEWER_LETTERS: tuple[tuple[int, int], ...] = (
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
    return any(lo <= cp <= hi for lo, hi in NEWER_LETTERS)


def _is_latin_cp(cp: int, ceiling: int) -> bool:
    # Basic Latin through Latin Extended-B (and IPA below `ceiling`), Latin Extended Additional,
    # fullwidth A-Z and a-z.
    return cp < ceiling or 0x1E00 <= cp <= 0x1EFF or 0xFF21 <= cp <= 0xFF3A or 0xFF41 <= cp <= 0xFF5A


def _block_script(cp: int) -> str | None:
    at = bisect.bisect_right(_BLOCK_STARTS, cp) - 1
    if at >= 0 and cp <= _BLOCKS[at][1]:
        return _BLOCKS[at][2]
    return None


def letter_counts(text: str) -> tuple[dict[str, int], int]:
    """Non-Latin letters per script in order of first appearance, and the Latin letter count."""
    # One pass per request over up to `lang.MAX_CHARS` characters: the per-character path is inlined
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


def dominant_script(others: dict[str, int], latin: int) -> str:
    best, top = "unknown", 0
    for name, n in others.items():
        if n > top:
            best, top = name, n
    # a named script wins a tie with Latin
    return "latin" if latin > top else best


def script_shares(others: dict[str, int], latin: int) -> dict[str, float]:
    total = latin + sum(others.values())
    if not total:
        return {}
    shares = {"latin": latin / total} if latin else {}
    shares.update((name, n / total) for name, n in others.items() if n)
    return shares


def detect_script(text: str) -> str:
    """The script most letters of `text` are written in, or "unknown" when it has none."""
    return dominant_script(*letter_counts(text))


def script_profile(text: str) -> dict[str, float]:
    """Fraction of the letters of `text` in each script (Latin first, then as they appear)."""
    return script_shares(*letter_counts(text))


def _named_script(ch: str) -> str | None:
    cp = ord(ch)
    if _is_latin_cp(cp, 0x0250):
        return None
    return _block_script(cp)


def non_latin_words(text: str) -> list[str]:
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
