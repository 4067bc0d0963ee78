"""The checkpoint tokenizer on `tokenizers` alone (no transformers).

Reproduces what laya gets from `AutoTokenizer(...)(text, add_special_tokens=False)`: the raw
`tokenizer.json` pipeline with truncation and padding switched off, and the special tokens read
from `tokenizer_config.json` / `special_tokens_map.json` the way transformers resolves them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from laya_onnx.core.errors import UserError, caller_value

#: laya caps each option's text at the tokenizer with truncation=True, max_length=48.
OPTION_MAX_TOKENS = 48
_SPECIALS = ("cls_token", "sep_token", "pad_token", "mask_token", "unk_token")


class TokenizerError(UserError, ValueError):
    """A tokenizer directory that cannot serve a Laya checkpoint."""


#: From this many characters on a text is tokenized by the batch call, which lets other threads
#: run meanwhile; below it the single call's lower overhead wins.
LONG_TEXT_CHARS = 16 * 1024


def _token_text(value: Any) -> str | None:
    """A special token as stored: a plain string or an AddedToken dict with 'content'."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise TokenizerError(f"{path} is not valid JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


class LayaTokenizer:
    """Encoding, special ids and decoding for one checkpoint's tokenizer directory."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        specials: dict[str, str],
        *,
        truncation_side: str = "right",
        clean_up_tokenization_spaces: bool = False,
    ):
        self._tok = tokenizer
        # Encoding must never pad or truncate: laya's calls disable whatever tokenizer.json
        # stores, and a stored truncation would cut states silently.
        self._tok.no_truncation()
        self._tok.no_padding()
        self.truncation_side = truncation_side
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        for name in ("cls_token", "sep_token", "pad_token", "mask_token"):
            if not specials.get(name):
                raise TokenizerError(
                    f"tokenizer has no {name}; a Laya checkpoint needs cls, sep, pad and mask tokens"
                )
        self.mask_token: str = specials["mask_token"]
        self.mask_token_id = self._id(specials["mask_token"])
        self.cls_token_id = self._id(specials["cls_token"])
        self.sep_token_id = self._id(specials["sep_token"])
        self.pad_token_id = self._id(specials["pad_token"])

    def _id(self, token: str) -> int:
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise TokenizerError(f"special token {token!r} is not in the tokenizer vocabulary")
        return tid

    @classmethod
    def from_dir(cls, directory: str | Path) -> LayaTokenizer:
        d = Path(directory)
        tj = d / "tokenizer.json"
        if not tj.exists():
            raise TokenizerError(f"{d} has no tokenizer.json (laya-onnx needs a fast tokenizer file)")
        try:
            tok = Tokenizer.from_file(str(tj))
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            raise TokenizerError(f"{tj} cannot be loaded: {exc}") from None
        config = _read_json(d / "tokenizer_config.json")
        smap = _read_json(d / "special_tokens_map.json")
        specials: dict[str, str] = {}
        for name in _SPECIALS:
            # transformers lets tokenizer_config.json win over special_tokens_map.json.
            value = _token_text(config.get(name)) or _token_text(smap.get(name))
            if value is not None:
                specials[name] = value
        side = config.get("truncation_side", "right")
        return cls(
            tok,
            specials,
            truncation_side=side if side in ("left", "right") else "right",
            clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without special tokens, untruncated.

        `text` is built from the caller's state, instructions or labels, so what tokenizers
        refuses is the caller's mistake. (A lone surrogate, its "TextInputSequence must be str",
        is refused earlier, naming where it is: `sequences.require_encodable`.)
        """
        with caller_value():
            if len(text) > LONG_TEXT_CHARS:
                # the batch call releases the interpreter lock while it tokenizes (the single one
                # holds it: seconds for a 2 MB text, during which no other thread runs)
                return self._tok.encode_batch([text], add_special_tokens=False)[0].ids
            return self._tok.encode(text, add_special_tokens=False).ids

    def truncate(self, ids: list[int], max_tokens: int) -> list[int]:
        """HF-style truncation of one sequence to `max_tokens`, honouring truncation_side."""
        if len(ids) <= max_tokens:
            return ids
        return ids[-max_tokens:] if self.truncation_side == "left" else ids[:max_tokens]

    def decode(self, ids: Sequence[int]) -> str:
        """`transformers` decode with skip_special_tokens=False (what laya's predict_long uses)."""
        text = self._tok.decode(list(ids), skip_special_tokens=False)
        if self.clean_up_tokenization_spaces:
            text = _clean_up_tokenization(text)
        return text


_CLEANUPS = [
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
]


def _clean_up_tokenization(text: str) -> str:
    for a, b in _CLEANUPS:
        text = text.replace(a, b)
    return text
