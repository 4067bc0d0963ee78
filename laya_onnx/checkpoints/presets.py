"""The checkpoint presets: architecture, tokenizer family, budgets and temperatures.

Plain data, importable without torch: the CLI reads the preset names for its help.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class InitScales:
    embedding_std: float = 1.0
    qk_gain: float = 1.6  # attention logits get std ~ gain**2
    out_gain: float = 1.0
    norm_noise: float = 0.1  # LayerNorm weights are 1 + N(0, norm_noise)
    bias_std: float = 0.02
    type_std: float = 0.5
    scorer_gain: float = 4.0  # last scorer layer: logit spread across options
    act_gain: float = 2.0


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    tokenizer: str  # "english", "english-modernbert-ids" or "multilingual"
    tokenizer_vocab: int  # BPE training target
    encoder_id: str  # recorded as `encoder` in rl_agent_config.json
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    local_attention: int  # total sliding window (ModernBERT: half on each side)
    global_attn_every_n_layers: int
    global_rope_theta: float
    local_rope_theta: float
    max_len: int
    head_max_len: int
    head_layers: int
    act_costs: dict[str, float]
    temperature: tuple[float, float, float]
    temperature_by_options: dict[str, float]
    vocab_size: int | None = None  # None: the tokenizer's size rounded up to a multiple of 64
    max_position_embeddings: int = 8192
    scales: InitScales = field(default_factory=InitScales)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="tiny-english",
            description="ModernBERT-shaped toy: 4 layers (global attention on layers 0 and 3, sliding "
            "window 16 elsewhere), RoPE 160000/10000, byte-level BPE; budgets 512/192",
            tokenizer="english",
            tokenizer_vocab=1400,
            encoder_id="laya-onnx/tiny-english-encoder",
            hidden_size=64,
            num_hidden_layers=4,
            num_attention_heads=2,
            intermediate_size=96,
            local_attention=16,
            global_attn_every_n_layers=3,
            global_rope_theta=160000.0,
            local_rope_theta=10000.0,
            max_len=512,
            head_max_len=192,
            head_layers=2,
            act_costs={"ask": 0.05},
            temperature=(1.3, 0.8, 1.1),
            temperature_by_options={"choice:2": 1.2, "choice:6-10": 1.7, "score:3-5": 0.9, "noul:2": 1.05},
        ),
        Preset(
            name="tiny-multilingual",
            description="mmBERT-shaped toy: 6 layers, sliding window 32, both RoPE bases 160000, "
            "Metaspace BPE with byte fallback and <bos>/<eos> as CLS/SEP; budgets 1024/256",
            tokenizer="multilingual",
            tokenizer_vocab=2000,
            encoder_id="laya-onnx/tiny-multilingual-encoder",
            hidden_size=64,
            num_hidden_layers=6,
            num_attention_heads=2,
            intermediate_size=128,
            local_attention=32,
            global_attn_every_n_layers=3,
            global_rope_theta=160000.0,
            local_rope_theta=160000.0,
            max_len=1024,
            head_max_len=256,
            head_layers=1,
            act_costs={"ask": 0.05},
            temperature=(1.1, 0.9, 1.4),
            temperature_by_options={"choice:3-5": 1.25, "score:6-10": 2.0, "noul:2": 0.8},
        ),
        Preset(
            name="tiny-typed-decisions",
            description="English toy with a wider encoder (128, 4 heads; head attention 2 heads), "
            "3 act outputs, budgets 1024/256, and temperatures outside [0.5, 5] that "
            "runtimes must clamp (with a warning)",
            tokenizer="english",
            tokenizer_vocab=1400,
            encoder_id="laya-onnx/tiny-typed-decisions-encoder",
            hidden_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=192,
            local_attention=16,
            global_attn_every_n_layers=3,
            global_rope_theta=160000.0,
            local_rope_theta=10000.0,
            max_len=1024,
            head_max_len=256,
            head_layers=2,
            act_costs={"ask": 0.05, "escalate": 0.2},
            temperature=(0.9, 1.2, 1.0),
            temperature_by_options={
                "choice:11+": 0.1006,
                "choice:3-5": 1.4,
                "score:11+": 6.25,
                "noul:2": 1.15,
            },
        ),
        Preset(
            name="random-english-large",
            description="Full-size ModernBERT-large shape (28 x 1024, 16 heads, intermediate 2624, vocab "
            "50368, window 128) with random weights, for speed and memory work only",
            tokenizer="english-modernbert-ids",
            tokenizer_vocab=1400,
            encoder_id="answerdotai/ModernBERT-large",
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            intermediate_size=2624,
            local_attention=128,
            global_attn_every_n_layers=3,
            global_rope_theta=160000.0,
            local_rope_theta=10000.0,
            max_len=512,
            head_max_len=192,
            head_layers=2,
            act_costs={"ask": 0.05},
            temperature=(1.0, 1.0, 1.0),
            temperature_by_options={},
            vocab_size=50368,
        ),
    )
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown checkpoint preset {name!r}; choose one of {sorted(PRESETS)}") from None
