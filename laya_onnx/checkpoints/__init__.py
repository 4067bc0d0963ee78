"""Deterministic Laya checkpoints in the release layout, generated locally (needs torch).

    make_checkpoint("tiny-english", Path("models/tiny-english"))

writes what laya's training writes (`train.save_checkpoint`) and what both `laya.Agent(dir)`
and `laya-onnx export` read:

    rl_agent_config.json   encoder, max_len, head_max_len, head_layers, act_costs,
                           temperature [3], temperature_by_options {bucket: t}, option_layout
    model.safetensors      the whole DecisionModel state dict, float16
    encoder/config.json    the ModernBertConfig
    tokenizer/             tokenizer.json + tokenizer_config.json + special_tokens_map.json

Same preset and seed give byte-identical files. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from laya_onnx.checkpoints.presets import PRESETS, Preset, get_preset
from laya_onnx.core.bundle import CONFIG_FILE, WEIGHTS_FILE, check_output_dir, staged_directory


def build_tokenizer(preset: Preset):
    """(tokenizers.Tokenizer, Specials) for a preset."""
    from laya_onnx.checkpoints import vocab

    if preset.tokenizer == "english":
        return vocab.english_tokenizer(preset.tokenizer_vocab), vocab.ENGLISH_SPECIALS
    if preset.tokenizer == "english-modernbert-ids":
        return vocab.english_tokenizer(preset.tokenizer_vocab, modernbert_ids=True), vocab.ENGLISH_SPECIALS
    if preset.tokenizer == "multilingual":
        return vocab.multilingual_tokenizer(preset.tokenizer_vocab), vocab.GEMMA_SPECIALS
    raise ValueError(f"preset {preset.name!r}: unknown tokenizer family {preset.tokenizer!r}")


def encoder_config_dict(preset: Preset, tokenizer, specials) -> dict[str, Any]:
    """The encoder's config.json content, as transformers writes it plus the 4.x RoPE keys.

    transformers 5 stores the RoPE bases under `rope_parameters`; 4.x reads only the flat
    `global_rope_theta` / `local_rope_theta`. Writing both keeps the file readable by either
    (5.x ignores the flat keys when `rope_parameters` carries the thetas).
    """
    from transformers import ModernBertConfig

    size = tokenizer.get_vocab_size(with_added_tokens=True)
    vocab_size = preset.vocab_size or -(-size // 64) * 64
    if size > vocab_size:
        raise ValueError(
            f"preset {preset.name!r}: tokenizer has {size} ids but the encoder only {vocab_size}"
        )
    ids = {role: tokenizer.token_to_id(getattr(specials, role)) for role in ("cls", "sep", "pad")}
    cfg = ModernBertConfig(
        vocab_size=vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        local_attention=preset.local_attention,
        # 5.x takes this 4.x key through its **kwargs at run time (its __post_init__ builds
        # layer_types from it) but its dataclass signature does not declare it.
        global_attn_every_n_layers=preset.global_attn_every_n_layers,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": preset.global_rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": preset.local_rope_theta},
        },
        max_position_embeddings=preset.max_position_embeddings,
        pad_token_id=ids["pad"],
        cls_token_id=ids["cls"],
        sep_token_id=ids["sep"],
        bos_token_id=ids["cls"],
        eos_token_id=ids["sep"],
    )
    data = cfg.to_dict()
    data["architectures"] = ["ModernBertModel"]
    data["global_rope_theta"] = preset.global_rope_theta
    data["local_rope_theta"] = preset.local_rope_theta
    data["global_attn_every_n_layers"] = preset.global_attn_every_n_layers
    return data


def agent_config(preset: Preset) -> dict[str, Any]:
    return {
        "encoder": preset.encoder_id,
        "max_len": preset.max_len,
        "head_max_len": preset.head_max_len,
        "head_layers": preset.head_layers,
        "act_costs": dict(preset.act_costs),
        "temperature": [float(t) for t in preset.temperature],
        "temperature_by_options": {k: float(v) for k, v in preset.temperature_by_options.items()},
        "option_layout": "sequential",
    }


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def state_dict_shapes(preset_or_dir) -> dict[str, tuple[int, ...]]:
    """Every state-dict entry of a preset's model (or a checkpoint dir's), from the meta device."""
    from transformers import ModernBertConfig

    from laya_onnx.export.model import (
        build_decision_model,
        expected_shapes,
        load_encoder_config,
        read_checkpoint_config,
    )

    if isinstance(preset_or_dir, (str, Preset)) and not (
        isinstance(preset_or_dir, str) and os.path.isdir(preset_or_dir)
    ):
        preset = get_preset(preset_or_dir) if isinstance(preset_or_dir, str) else preset_or_dir
        tok, specials = build_tokenizer(preset)
        ecfg = ModernBertConfig.from_dict(encoder_config_dict(preset, tok, specials))
        cfg = agent_config(preset)
    else:
        root = Path(preset_or_dir)
        cfg = read_checkpoint_config(root)
        ecfg = load_encoder_config(root / "encoder")
    return expected_shapes(build_decision_model(cfg, ecfg, device="meta"))


def _populate(preset: Preset, root: Path, seed: int) -> None:
    from transformers import ModernBertConfig

    from laya_onnx.checkpoints.vocab import write_tokenizer_dir
    from laya_onnx.checkpoints.weights import write_random_safetensors
    from laya_onnx.export.model import apply_rope_parameters, build_decision_model, expected_shapes

    tok, specials = build_tokenizer(preset)
    write_tokenizer_dir(tok, specials, root / "tokenizer", model_max_length=preset.max_position_embeddings)
    enc = encoder_config_dict(preset, tok, specials)
    _write_json(root / "encoder" / "config.json", enc)
    cfg = agent_config(preset)
    _write_json(root / CONFIG_FILE, cfg)
    ecfg = ModernBertConfig.from_dict(enc)
    apply_rope_parameters(ecfg)
    shapes = expected_shapes(build_decision_model(cfg, ecfg, device="meta"))
    write_random_safetensors(root / WEIGHTS_FILE, shapes, seed=seed, preset=preset.name, scales=preset.scales)


def make_checkpoint(preset: str, out_dir: Path, seed: int = 0, *, force: bool = False) -> Path:
    """Write checkpoint `preset` (see PRESETS) to `out_dir`; returns the directory.

    The checkpoint is assembled in a temporary sibling and moved into place, so `out_dir` never
    holds a half-written checkpoint. A non-empty `out_dir` is refused unless `force` (then it is
    replaced), as `export_bundle` does.
    """
    spec = get_preset(preset)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    out_dir = Path(out_dir)
    check_output_dir(out_dir, force)
    with staged_directory(out_dir) as tmp:
        _populate(spec, tmp, seed)
    return out_dir


__all__ = [
    "PRESETS",
    "Preset",
    "agent_config",
    "build_tokenizer",
    "encoder_config_dict",
    "get_preset",
    "make_checkpoint",
    "state_dict_shapes",
]
