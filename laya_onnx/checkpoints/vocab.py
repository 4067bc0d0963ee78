"""Deterministic tokenizers for the generated checkpoints, trained with `tokenizers` alone.

Two families, shaped like the encoders the released Laya checkpoints use:

* English (ModernBERT-style): NFC normalizer, byte-level pre-tokenizer and decoder, a
  byte-level BPE, specials [UNK] [CLS] [SEP] [PAD] [MASK] appended after the vocabulary
  ([MASK] strips the space on its left, like ModernBERT's), `[CLS] $A [SEP]` post-processor.
  `modernbert_ids=True` pads the vocabulary with unreachable filler entries so the specials
  land on ModernBERT's ids 50280-50284 (CLS 50281, SEP 50282, PAD 50283, MASK 50284).
* Multilingual (mmBERT/Gemma-style): Metaspace pre-tokenizer, BPE with byte fallback, the
  specials <pad> <eos> <bos> <unk> <mask> on ids 0-4 followed by the 256 byte tokens
  <0x00>..<0xFF>; <bos> serves as the CLS token and <eos> as SEP.

The directory written holds tokenizer.json, tokenizer_config.json and special_tokens_map.json,
spelled so `transformers.AutoTokenizer` builds a `PreTrainedTokenizerFast` with the right
special tokens and laya's loader has nothing to patch (it rewrites a config whose
`tokenizer_class` is missing, which would change a checkpoint we promise is byte-stable).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from laya_onnx.checkpoints.corpus import english_lines, multilingual_lines

MODERNBERT_UNK_ID = 50280  # [UNK]; then [CLS] 50281, [SEP] 50282, [PAD] 50283, [MASK] 50284


@dataclass(frozen=True)
class Specials:
    cls: str
    sep: str
    pad: str
    mask: str
    unk: str
    bos: str = ""
    eos: str = ""


ENGLISH_SPECIALS = Specials(cls="[CLS]", sep="[SEP]", pad="[PAD]", mask="[MASK]", unk="[UNK]")
GEMMA_SPECIALS = Specials(
    cls="<bos>", sep="<eos>", pad="<pad>", mask="<mask>", unk="<unk>", bos="<bos>", eos="<eos>"
)


def _train_bpe(
    lines: Sequence[str],
    vocab_size: int,
    pre_tokenizer,
    normalizer=None,
    initial_alphabet: Sequence[str] = (),
    limit_alphabet=None,
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a BPE on `lines`; return its vocab and merges (the trainer is deterministic)."""
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    kwargs: dict[str, Any] = {
        "vocab_size": vocab_size,
        "min_frequency": 1,
        "show_progress": False,
        "special_tokens": [],
        "initial_alphabet": list(initial_alphabet),
    }
    # Only when set: the binding refuses limit_alphabet=None (its stub says it takes None).
    if limit_alphabet is not None:
        kwargs["limit_alphabet"] = limit_alphabet
    tok.train_from_iterator(list(lines), trainers.BpeTrainer(**kwargs))
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]
    return dict(model["vocab"]), merges


def _added(content: str, *, lstrip: bool = False) -> AddedToken:
    return AddedToken(content, special=True, normalized=False, lstrip=lstrip, rstrip=False, single_word=False)


def english_tokenizer(vocab_size: int = 1400, *, modernbert_ids: bool = False) -> Tokenizer:
    """Byte-level BPE trained on the built-in English corpus."""
    normalizer = normalizers.NFC()
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    vocab, merges = _train_bpe(
        english_lines(), vocab_size, pre, normalizer, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    if modernbert_ids:
        if len(vocab) > MODERNBERT_UNK_ID:
            raise ValueError("trained vocabulary does not fit below ModernBERT's special ids")
        # Filler entries have no merge that can produce them, so they are never emitted.
        for i in range(len(vocab), MODERNBERT_UNK_ID):
            vocab["<|unused_%d|>" % i] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    s = ENGLISH_SPECIALS
    tok.add_special_tokens(
        [_added(s.unk), _added(s.cls), _added(s.sep), _added(s.pad), _added(s.mask, lstrip=True)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{s.cls} $A {s.sep}",
        pair=f"{s.cls} $A {s.sep} $B {s.sep}",
        special_tokens=[(s.cls, tok.token_to_id(s.cls)), (s.sep, tok.token_to_id(s.sep))],
    )
    return tok


def multilingual_tokenizer(vocab_size: int = 2000) -> Tokenizer:
    """Metaspace BPE with byte fallback trained on the built-in multilingual corpus."""
    s = GEMMA_SPECIALS
    head = [s.pad, s.eos, s.bos, s.unk, s.mask]
    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    offset = len(head) + len(byte_tokens)
    pre = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    trained, merges = _train_bpe(multilingual_lines(), vocab_size - offset, pre)
    vocab: dict[str, int] = {t: i for i, t in enumerate(head + byte_tokens)}
    for token, _idx in sorted(trained.items(), key=lambda kv: kv[1]):
        if token not in vocab:
            vocab[token] = len(vocab)
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=s.unk, fuse_unk=True, byte_fallback=True)
    )
    tok.pre_tokenizer = pre
    tok.decoder = decoders.Sequence(
        [
            decoders.ByteFallback(),
            decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=True),
        ]
    )
    tok.add_special_tokens([_added(t) for t in head])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{s.bos} $A {s.eos}",
        pair=f"{s.bos} $A {s.eos} $B {s.eos}",
        special_tokens=[(s.bos, tok.token_to_id(s.bos)), (s.eos, tok.token_to_id(s.eos))],
    )
    return tok


def _added_token_entry(content: str, tok: Tokenizer) -> dict[str, object]:
    for entry in json.loads(tok.to_str())["added_tokens"]:
        if entry["content"] == content:
            return {
                k: entry[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
            }
    raise KeyError(content)


def write_tokenizer_dir(tok: Tokenizer, specials: Specials, out: Path, model_max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json, deterministically."""
    out.mkdir(parents=True, exist_ok=True)
    # tokenizers serialises the vocabulary in id order, so the file is stable across runs.
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    roles = {
        "cls_token": specials.cls,
        "sep_token": specials.sep,
        "pad_token": specials.pad,
        "mask_token": specials.mask,
        "unk_token": specials.unk,
    }
    if specials.bos:
        roles["bos_token"] = specials.bos
    if specials.eos:
        roles["eos_token"] = specials.eos
    added = json.loads(tok.to_str())["added_tokens"]
    config = {
        "added_tokens_decoder": {
            str(e["id"]): {
                k: e[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
            }
            for e in added
        },
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": model_max_length,
        "padding_side": "right",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "truncation_side": "right",
    }
    config.update(roles)
    smap = {role: _added_token_entry(token, tok) for role, token in sorted(roles.items())}
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps(smap, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )
