"""make_checkpoint: the release layout, determinism, and that the reference stack loads it.

The reference (`laya` 0.4.15, `transformers`) is used as the oracle: its Agent must load our
checkpoints unmodified and offline, its `build_model` must describe the same state dict as our
`DecisionModel`, and its forward must give the same numbers as ours on the same weights.
The module is in the torch tier (torch is imported inside the tests, so it still collects in the
torch-free runtime tier).
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from laya_onnx.checkpoints import PRESETS, make_checkpoint, state_dict_shapes
from laya_onnx.core.bundle import OutputExistsError

pytestmark = pytest.mark.torch

TINY = ("tiny-english", "tiny-multilingual", "tiny-typed-decisions")
RELEASE_FILES = (
    "rl_agent_config.json",
    "model.safetensors",
    "encoder/config.json",
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
    "tokenizer/special_tokens_map.json",
)


def _digests(root: Path):
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_presets_are_the_cli_choices():
    from laya_onnx.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    mk = sub.choices["make-checkpoint"]
    preset_action = next(a for a in mk._actions if a.dest == "preset")
    assert sorted(preset_action.choices) == sorted(PRESETS)


@pytest.mark.parametrize("preset", TINY)
def test_release_layout_and_config(preset, checkpoint_factory):
    root = checkpoint_factory(preset)
    for name in RELEASE_FILES:
        assert (root / name).is_file(), name
    assert sorted(_digests(root)) == sorted(RELEASE_FILES)  # nothing else
    cfg = json.loads((root / "rl_agent_config.json").read_text())
    assert set(cfg) == {
        "encoder",
        "max_len",
        "head_max_len",
        "head_layers",
        "act_costs",
        "temperature",
        "temperature_by_options",
        "option_layout",
    }
    assert cfg["option_layout"] == "sequential"
    assert len(cfg["temperature"]) == 3 and all(isinstance(t, float) for t in cfg["temperature"])
    assert cfg["temperature_by_options"] and all(
        isinstance(v, float) for v in cfg["temperature_by_options"].values()
    )
    budgets = {
        "tiny-english": (512, 192),
        "tiny-multilingual": (1024, 256),
        "tiny-typed-decisions": (1024, 256),
    }
    assert (cfg["max_len"], cfg["head_max_len"]) == budgets[preset]
    outside = {k: v for k, v in cfg["temperature_by_options"].items() if not 0.5 <= v <= 5}
    if preset == "tiny-typed-decisions":
        assert outside.get("choice:11+") == 0.1006
    else:
        assert not outside and all(0.5 <= t <= 5 for t in cfg["temperature"])


def test_same_seed_gives_identical_files(tmp_path):
    a = make_checkpoint("tiny-english", tmp_path / "a", seed=3)
    b = make_checkpoint("tiny-english", tmp_path / "b", seed=3)
    c = make_checkpoint("tiny-english", tmp_path / "c", seed=4)
    da, db, dc = _digests(a), _digests(b), _digests(c)
    assert da == db
    assert dc["model.safetensors"] != da["model.safetensors"]
    assert {k: v for k, v in dc.items() if k != "model.safetensors"} == {
        k: v for k, v in da.items() if k != "model.safetensors"
    }
    # An existing checkpoint is replaced only when asked (as export does), with the same bytes.
    with pytest.raises(OutputExistsError, match=r"is not empty; pass force=True to replace it"):
        make_checkpoint("tiny-english", a, seed=4)
    assert _digests(a) == da
    assert _digests(make_checkpoint("tiny-english", a, seed=3, force=True)) == da


def test_multilingual_is_deterministic_too(tmp_path, checkpoint_factory):
    again = make_checkpoint("tiny-multilingual", tmp_path / "m", seed=0)
    assert _digests(again) == _digests(checkpoint_factory("tiny-multilingual"))


def test_refuses_to_overwrite_a_non_empty_directory_or_a_file(tmp_path):
    (tmp_path / "keep.txt").write_text("precious")
    with pytest.raises(OutputExistsError, match="not empty"):
        make_checkpoint("tiny-english", tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "precious"
    with pytest.raises(ValueError, match="exists and is not a directory"):
        make_checkpoint("tiny-english", tmp_path / "keep.txt", force=True)
    assert (tmp_path / "keep.txt").read_text() == "precious"
    with pytest.raises(ValueError, match="unknown checkpoint preset"):
        make_checkpoint("tiny-klingon", tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.reference
@pytest.mark.parametrize("preset", TINY)
def test_reference_agent_loads_it_offline_and_unmodified(preset, checkpoint_factory):
    import laya

    root = checkpoint_factory(preset)
    before = _digests(root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agent = laya.Agent(str(root), device="cpu")
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if preset == "tiny-typed-decisions":
        assert any("choice:11+=0.1006 -> 0.5" in m for m in messages), messages
    else:
        assert not messages, messages
    # laya rewrites a tokenizer_config.json it has to patch; ours must need no patch.
    assert _digests(root) == before
    result = agent.predict(
        "I was charged twice, please refund me.",
        {
            "q": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": ["billing", "technical", "sales"],
            }
        },
    )
    assert result["answers"]["q"]["choice"] in ("billing", "technical", "sales")


SAMPLES = [
    "The customer was charged twice. Please refund the second payment!",
    "  leading spaces, tabs\tand\nnewlines  ",
    "Der Kunde wurde zweimal belastet. Клиента списали 客户 שלום ภาษาไทย 🙂",
    '{"ticket": 1042, "text": "refund"} [SEP] literal specials [CLS]',
    "Café naïve — “quotes” and emoji 👍🏽",
]


@pytest.mark.parametrize("preset", TINY)
def test_transformers_autotokenizer_agrees_with_tokenizers(preset, checkpoint_factory):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok_dir = checkpoint_factory(preset) / "tokenizer"
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    raw = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    assert hf.is_fast
    expected = {"tiny-multilingual": ("<bos>", "<eos>", "<pad>", "<mask>", "<unk>")}.get(
        preset, ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")
    )
    assert (hf.cls_token, hf.sep_token, hf.pad_token, hf.mask_token, hf.unk_token) == expected
    for token in expected:
        assert hf.convert_tokens_to_ids(token) == raw.token_to_id(token)
    assert hf.truncation_side == "right"
    assert hf.clean_up_tokenization_spaces is False
    for text in SAMPLES:
        ids = raw.encode(text, add_special_tokens=False).ids
        assert hf(text, add_special_tokens=False)["input_ids"] == ids
        assert hf.decode(ids) == raw.decode(ids, skip_special_tokens=False)
    vocab_size = json.loads((tok_dir.parent / "encoder" / "config.json").read_text())["vocab_size"]
    assert raw.get_vocab_size(with_added_tokens=True) <= vocab_size


def test_multilingual_tokenizer_uses_byte_fallback(checkpoint_factory):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(checkpoint_factory("tiny-multilingual") / "tokenizer" / "tokenizer.json"))
    assert [raw.id_to_token(i) for i in range(5)] == ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    assert raw.token_to_id("<0x00>") == 5 and raw.token_to_id("<0xFF>") == 260
    enc = raw.encode("שלום", add_special_tokens=False)  # Hebrew is not in the corpus
    assert any(t.startswith("<0x") for t in enc.tokens)
    assert raw.decode(enc.ids) == "שלום"


@pytest.mark.reference
@pytest.mark.parametrize("preset", TINY)
def test_state_dict_matches_the_reference_model(preset, checkpoint_factory):
    from laya.common import build_model
    from safetensors import safe_open

    root = checkpoint_factory(preset)
    cfg = json.loads((root / "rl_agent_config.json").read_text())
    ref = build_model(cfg, encoder_dir=str(root / "encoder"), pretrained=False)
    ref_shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    ours = state_dict_shapes(str(root))
    assert ours == ref_shapes
    with safe_open(str(root / "model.safetensors"), "pt") as f:
        stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
    assert stored == ref_shapes
    head_keys = {k.split(".", 3)[-1] for k in ours if k.startswith("head.layers.")}
    assert head_keys == {
        "self_attn.in_proj_weight",
        "self_attn.in_proj_bias",
        "self_attn.out_proj.weight",
        "self_attn.out_proj.bias",
        "linear1.weight",
        "linear1.bias",
        "linear2.weight",
        "linear2.bias",
        "norm1.weight",
        "norm1.bias",
        "norm2.weight",
        "norm2.bias",
    }
    assert len({k.split(".")[2] for k in ours if k.startswith("head.layers.")}) == cfg["head_layers"]
    assert ours["act_head.2.weight"][0] == len(cfg["act_costs"]) + 1


@pytest.mark.reference
@pytest.mark.parametrize("preset", TINY)
def test_forward_equals_the_reference_forward(preset, checkpoint_factory):
    import torch
    from laya.common import build_model
    from safetensors.torch import load_file

    from laya_onnx.export.cases import encode_calls
    from laya_onnx.export.model import load_decision_model

    root = checkpoint_factory(preset)
    ours, cfg = load_decision_model(root)
    ref = build_model(cfg, encoder_dir=str(root / "encoder"), pretrained=False)
    ref.load_state_dict(load_file(str(root / "model.safetensors")), strict=True)
    ref = ref.float().eval()
    # Padding, 1-20 options, past the window, a row cut at max_len, a conversation and a dict state
    # (the first two cases, a single row and three question types, run in export).
    cases = encode_calls(root / "tokenizer", cfg["max_len"], cfg["head_max_len"])[2:]
    assert len(cases) >= 4
    with torch.no_grad():
        for case in cases:
            args = [
                torch.from_numpy(case["feeds"][k])
                for k in ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")
            ]
            a_logits, a_act = ours(*args)
            b_logits, b_act = ref(*args)
            torch.testing.assert_close(a_logits, b_logits, rtol=0, atol=2e-5, msg=case["name"])
            torch.testing.assert_close(a_act, b_act, rtol=0, atol=2e-5, msg=case["name"])


def test_encoder_has_every_architectural_feature_live(checkpoint_factory):
    from laya_onnx.export.model import load_encoder_config

    en = load_encoder_config(checkpoint_factory("tiny-english") / "encoder")
    assert en.num_hidden_layers >= 4 and en.local_attention == 16
    assert en.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert en.rope_parameters["full_attention"]["rope_theta"] == 160000.0
    assert en.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    ml = load_encoder_config(checkpoint_factory("tiny-multilingual") / "encoder")
    assert ml.rope_parameters["full_attention"]["rope_theta"] == 160000.0
    assert ml.rope_parameters["sliding_attention"]["rope_theta"] == 160000.0
    assert (ml.pad_token_id, ml.cls_token_id, ml.sep_token_id) == (0, 2, 1)
    # The flat 4.x keys are written too, so an older transformers reads the same bases.
    raw = json.loads((checkpoint_factory("tiny-multilingual") / "encoder" / "config.json").read_text())
    assert raw["global_rope_theta"] == raw["local_rope_theta"] == 160000.0


def test_sliding_window_and_rope_change_the_answer(checkpoint_factory):
    """States longer than the window must be read through it: widening the window (or swapping
    the local RoPE base) changes the logits, so a runtime that ignored either would be caught."""
    import torch

    from laya_onnx.export.cases import encode_calls
    from laya_onnx.export.model import load_decision_model

    root = checkpoint_factory("tiny-english")
    model, cfg = load_decision_model(root)
    case = encode_calls(root / "tokenizer", cfg["max_len"], cfg["head_max_len"])[5]  # past the window
    assert case["feeds"]["input_ids"].shape[1] > 4 * model.encoder.config.local_attention
    args = [
        torch.from_numpy(case["feeds"][k])
        for k in ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")
    ]
    with torch.no_grad():
        base = model(*args)[0]
        wide_cfg = model.encoder.config
        wide_cfg.local_attention = 4096
        for layer in model.encoder.layers:
            if layer.attn.sliding_window is not None:
                layer.attn.sliding_window = wide_cfg.sliding_window + 1
        wide = model(*args)[0]
    real = case["feeds"]["marker_mask"]
    assert float((base - wide).abs()[torch.from_numpy(real)].max()) > 1e-3


@pytest.mark.parametrize("preset", TINY)
def test_probabilities_are_clearly_spread(preset, checkpoint_factory):
    """Random weights must not give near-uniform answers, or decision parity is a coin flip."""
    import torch

    from laya_onnx.export.cases import encode_calls
    from laya_onnx.export.model import load_decision_model

    root = checkpoint_factory(preset)
    model, cfg = load_decision_model(root)
    gaps, tops = [], []
    with torch.no_grad():
        for case in encode_calls(root / "tokenizer", cfg["max_len"], cfg["head_max_len"]):
            feeds = case["feeds"]
            args = [
                torch.from_numpy(feeds[k])
                for k in ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")
            ]
            logits = model(*args)[0].numpy()
            for row, mask in zip(logits, feeds["marker_mask"], strict=False):
                k = int(mask.sum())
                if k < 2:
                    continue
                p = np.exp(row[:k] - row[:k].max())
                p /= p.sum()
                top = np.sort(p)[::-1]
                gaps.append(top[0] - top[1])
                tops.append(top[0] * k)  # 1.0 would be uniform
    assert np.median(tops) > 1.5, np.median(tops)
    assert np.median(gaps) > 0.05, np.median(gaps)
    assert min(gaps) > 1e-4  # no exact tie anywhere in the built-in requests


def test_large_preset_has_the_full_size_shape_without_writing_it():
    from laya_onnx.checkpoints import build_tokenizer, encoder_config_dict, get_preset

    preset = get_preset("random-english-large")
    tok, specials = build_tokenizer(preset)
    assert [tok.token_to_id(t) for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")] == [
        50280,
        50281,
        50282,
        50283,
        50284,
    ]
    enc = encoder_config_dict(preset, tok, specials)
    assert (
        enc["vocab_size"],
        enc["hidden_size"],
        enc["num_hidden_layers"],
        enc["num_attention_heads"],
        enc["intermediate_size"],
        enc["local_attention"],
    ) == (50368, 1024, 28, 16, 2624, 128)
    assert enc["layer_types"].count("full_attention") == 10  # every 3rd of 28 layers
    assert (enc["pad_token_id"], enc["cls_token_id"], enc["sep_token_id"]) == (50283, 50281, 50282)
    shapes = state_dict_shapes("random-english-large")
    assert shapes["encoder.embeddings.tok_embeddings.weight"] == (50368, 1024)
    assert shapes["encoder.layers.27.mlp.Wi.weight"] == (2 * 2624, 1024)
    assert shapes["head.layers.0.self_attn.in_proj_weight"] == (3 * 1024, 1024)
    params = sum(math.prod(s) for s in shapes.values())
    assert 415e6 < params < 425e6  # laya README: the English checkpoint has 421M parameters
