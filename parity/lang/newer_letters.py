"""Print `laya_onnx.core.lang_scripts.NEWER_LETTERS`: the letters a Python 3.11 interpreter does not know.

Run under CPython 3.11 (Unicode 14.0) with `unicodedataplus==16.0.0.post1` (Unicode 16.0), in a
scratch venv (it is no dependency of laya-onnx):

    python parity/lang/newer_letters.py

A codepoint is listed when Unicode 16.0 makes it a letter (category L*) and this interpreter
calls it unassigned (Cn), or when it is a letter of one of the five scripts Unicode 14.0
introduced (Vithkuqi, Old Uyghur, Cypro-Minoan, Tangsa, Toto), which Python 3.10 (Unicode 13.0)
does not know yet. Contiguous codepoints are printed as one range.
"""

import unicodedata

import unicodedataplus

UNICODE_14_SCRIPTS = (
    (0x10570, 0x105BF),
    (0x10F70, 0x10FAF),
    (0x12F90, 0x12FFF),
    (0x16A70, 0x16ACF),
    (0x1E290, 0x1E2BF),
)


def newer_letter(cp: int) -> bool:
    ch = chr(cp)
    if unicodedataplus.category(ch).startswith("L") and unicodedata.category(ch) == "Cn":
        return True
    return ch.isalpha() and any(lo <= cp <= hi for lo, hi in UNICODE_14_SCRIPTS)


def main() -> None:
    assert unicodedata.unidata_version == "14.0.0" and unicodedataplus.unidata_version == "16.0.0"
    start = last = None
    for cp in range(0x110000 + 1):
        if cp <= 0x10FFFF and newer_letter(cp):
            if start is None:
                start = cp
            last = cp
        elif start is not None:
            print("    (0x%05X, 0x%05X)," % (start, last))
            start = None


if __name__ == "__main__":
    main()
