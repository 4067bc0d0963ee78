"""Token ids and sequences equal laya's (transformers tokenizer + laya.common) on every tiny preset.

Every test needs torch (checkpoint_factory) and transformers; transformers and the reference are
imported inside the tests, so the module collects in the torch-free runtime tier."""

import os

import pytest

from laya_onnx.core.questions import normalize_questions
from laya_onnx.core.sequences import build_heads, encode_state
from laya_onnx.core.tokenizer import LayaTokenizer

pytestmark = pytest.mark.torch

PRESETS = ["tiny-english", "tiny-multilingual", "tiny-typed-decisions"]
TEXTS = [
    "",
    " ",
    "hello world",
    "  leading and trailing  ",
    "I was charged twice, I want my money back!",
    "Café crème brûlée 🍮 — naïve résumé ☕️ 東京 Привет مرحبا 👍🏽",
    "e\u0301 vs \u00e9 and \ufb01",
    "tabs\tand\nnewlines\r\n",
    "[CLS] [SEP] [MASK] [PAD] <bos> <eos> <mask> <pad> literal specials",
    "numbers 1234567890 3.14159 -42",
    '{"json": [1, 2, {"k": null}]}',
    "x" * 300,
    "Ünïcödé ÀÉÎÕÜ ß ø å æ œ ğ ş ı",
    "क्षत्रिय हिन्दी",
    "😀😃😄😁😆😅😂🤣",
]


@pytest.fixture(scope="module", params=PRESETS)
def tokenizers_pair(request, checkpoint_factory):
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok_dir = checkpoint_factory(request.param) / "tokenizer"
    return (
        request.param,
        LayaTokenizer.from_dir(tok_dir),
        transformers.AutoTokenizer.from_pretrained(str(tok_dir)),
    )


def test_special_tokens_match_transformers(tokenizers_pair):
    _, ours, hf = tokenizers_pair
    assert ours.mask_token == hf.mask_token
    assert (ours.mask_token_id, ours.cls_token_id, ours.sep_token_id, ours.pad_token_id) == (
        hf.mask_token_id,
        hf.cls_token_id,
        hf.sep_token_id,
        hf.pad_token_id,
    )


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_encode_matches_transformers(tokenizers_pair, text):
    _, ours, hf = tokenizers_pair
    assert ours.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
    assert (
        ours.truncate(ours.encode(" " + text), 48)
        == hf(" " + text, add_special_tokens=False, truncation=True, max_length=48)["input_ids"]
    )


def test_long_texts_tokenize_as_short_ones_do(tokenizers_pair):
    """Past LONG_TEXT_CHARS the tokenizer's batch call runs (it lets other threads run): the
    same ids as the single call."""
    from laya_onnx.core.tokenizer import LONG_TEXT_CHARS

    _, ours, hf = tokenizers_pair
    text = " ".join(TEXTS) * (LONG_TEXT_CHARS // len(" ".join(TEXTS)) + 2)
    assert len(text) > LONG_TEXT_CHARS
    whole = hf(text, add_special_tokens=False)["input_ids"]
    assert ours.encode(text) == whole


def test_decode_matches_transformers(tokenizers_pair):
    _, ours, hf = tokenizers_pair
    for text in TEXTS:
        ids = ours.encode(text)
        assert ours.decode(ids) == hf.decode(ids)


QUESTION_SETS = [
    {
        "c": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": "refunds", "tech": None, "x": ""},
        },
        "s": {"type": "score", "instructions": {"rate": "urgency"}, "criteria": ["low", {"d": "mid"}, 3]},
        "n": {
            "type": "noul",
            "instructions": "Refund?",
            "criteria": {"TRUE": "yes it is"},
            "labels": {"true": " Y ", "false": "N"},
        },
    },
    {
        "many": {
            "type": "choice",
            "instructions": "Pick " * 80,
            "criteria": {f"o{i}": "a long description of this option " * 5 for i in range(20)},
        }
    },
    {
        "same": {
            "type": "choice",
            "instructions": "Which?",
            "criteria": {
                f"o{i}": "identical prefix text that is long enough " * 4 + str(i) for i in range(14)
            },
        },
        "ord": {"type": "score", "instructions": "x", "criteria": ["a", "b", "c"], "option_order": [2, 0, 1]},
    },
]
STATES = [
    "short",
    "word " * 700,
    {"k": ["v", 1, None, True], "t": "x [MASK] <mask>"},
    [{"role": "user", "content": "turn %d" % i} for i in range(200)],
    [],
    "",
    3.5,
]


@pytest.mark.reference
@pytest.mark.parametrize("budget", [None, (128, 64), (40, 200)], ids=["config", "small", "overflowing"])
@pytest.mark.parametrize("qset", range(len(QUESTION_SETS)))
def test_rows_match_reference(tokenizers_pair, checkpoint_factory, qset, budget):
    from laya import common
    from laya.agent import Agent

    preset, ours, hf = tokenizers_pair
    questions = QUESTION_SETS[qset]
    cfg = {"max_len": 512, "head_max_len": 192}
    import json

    cfg.update(json.loads((checkpoint_factory(preset) / "rl_agent_config.json").read_text()))
    max_len, head_max_len = budget or (cfg["max_len"], cfg["head_max_len"])
    qs = normalize_questions(questions)
    heads = build_heads(ours, qs, head_max_len)
    for state in STATES:
        try:
            rows = encode_state(ours, state, qs, max_len, head_max_len, heads)
            ours_out = [(r.ids, r.markers, r.options, r.state_stats) for r in rows]
        except ValueError as exc:
            ours_out = ("error", str(exc))
        ref_out = []
        try:
            state_ids = hf(
                common.serialize_state(state).replace(hf.mask_token, " "), add_special_tokens=False
            )["input_ids"]
            for qid, qdef in questions.items():
                q = Agent._to_internal(qdef)
                ids, markers, stats, tstats = common.build_sequence(
                    hf,
                    state,
                    q,
                    max_len,
                    head_max_len,
                    option_order=q.get("option_order"),
                    truncate_left=isinstance(state, list),
                    state_ids=state_ids,
                    return_stats=True,
                    return_truncation_stats=True,
                )
                if len(markers) != stats["options"]:
                    raise ValueError(
                        "question %r: only %d of its %d option markers fit in max_len=%d with "
                        "head_max_len=%d spent on the question; lower head_max_len, raise max_len, "
                        "or use fewer options" % (qid, len(markers), stats["options"], max_len, head_max_len)
                    )
                ref_out.append((ids, markers, stats, tstats))
        except ValueError as exc:
            ref_out = ("error", str(exc))
        assert ours_out == ref_out, f"state {str(state)[:40]!r}"
