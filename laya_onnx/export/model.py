"""The Laya decision model in torch: a ModernBERT encoder and a typed decision head.

This is our own module, written from the documented behaviour of laya 0.4.15's
`DecisionModel` (sequential option layout only). Its state dict has the same keys and shapes
as the reference's, so a released `model.safetensors` loads into it unchanged:

    encoder.*                                   transformers' ModernBertModel
    head.layers.N.self_attn.in_proj_weight      (3d, d)   packed q/k/v projection
    head.layers.N.self_attn.in_proj_bias        (3d,)
    head.layers.N.self_attn.out_proj.{weight,bias}
    head.layers.N.linear1.{weight,bias}         (4d, d)   feed-forward, ReLU
    head.layers.N.linear2.{weight,bias}         (d, 4d)
    head.layers.N.norm1.{weight,bias}           pre-norm before attention (eps 1e-5)
    head.layers.N.norm2.{weight,bias}           pre-norm before the feed-forward
    type_emb.weight                             (3, d)    one row per question type
    scorer.{0,1,3}.*                            LayerNorm -> Linear(d, d) -> GELU -> Linear(d, 1)
    act_head.{0,2}.*                            Linear(d + 4, 256) -> GELU -> Linear(256, n_act)
    temperature                                 buffer (3,), carried but unused by forward

Everything in `forward` is written with traceable ops: no Python branch depends on a tensor
value and no shape is captured from the example input, so one exported graph serves every
batch size, sequence length and marker count (>= 2 marker columns, see `MIN_MARKER_COLUMNS`).
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from laya_onnx.core.bundle import CONFIG_FILE, WEIGHTS_FILE, read_json_object
from laya_onnx.core.questions import QTYPES  # row order of `type_emb`
from laya_onnx.core.sequences import check_option_layout
from laya_onnx.export.errors import CheckpointError
from laya_onnx.export.options import ATTENTION_KINDS  # the graphs `DecisionModel.attention` writes

if TYPE_CHECKING:
    from transformers import ModernBertModel

ENCODER_DIR = "encoder"

ACT_HIDDEN = 256
HEAD_NORM_EPS = 1e-5
#: The value masked marker columns get; the runtime never reads those columns.
MASKED_LOGIT = -1e4
#: The name our fused attention function is registered under in transformers' AttentionInterface.
FUSED_ATTN_IMPLEMENTATION = "laya_onnx_fused"
#: Mask value for a key that must not be attended: finite, so the graph needs no NaN guard, and
#: exp(score + MASK_MIN - max) is exactly 0 for any real score (as with -inf).
MASK_MIN = float(torch.finfo(torch.float32).min)


# ------------------------------------------------------------------------------ fused attention


class FusedAttention(torch.autograd.Function):
    """softmax(q k^T * scale + masks) v over packed [B, T, heads * dim] tensors, as ONE node.

    In torch it is `scaled_dot_product_attention`; traced by the TorchScript exporter it becomes
    onnxruntime's `com.microsoft.MultiHeadAttention`, whose CPU kernel keeps only the
    [B, heads, T, T] probabilities instead of the scores, the masked sum, the softmax and its
    NaN-guarded copy that the op-by-op graph holds at once. Padding keys are masked by
    `key_mask` ([B, T] int32, 1 for a real token: the kernel's key_padding_mask, no [T, T]
    tensor at all); a sliding window adds `window_bias`, one [1, 1, T, T] float32 shared by
    every row and every sliding layer. RoPE is applied before, in torch.
    """

    @staticmethod
    def forward(ctx, q, k, v, key_mask, window_bias, num_heads: int, scale: float):
        def heads(x):
            return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)

        bias = window_bias if window_bias is not None else torch.zeros((), dtype=q.dtype)
        mask = torch.where((key_mask != 0)[:, None, None, :], bias, torch.tensor(MASK_MIN, dtype=q.dtype))
        out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=mask, scale=scale)
        return out.transpose(1, 2).flatten(-2)

    @staticmethod
    def symbolic(g, q, k, v, key_mask, window_bias, num_heads: int, scale: float):
        from torch.onnx._internal.torchscript_exporter.symbolic_helper import (
            _is_none,
            _optional_input_placeholder_tensor,
        )

        bias = _optional_input_placeholder_tensor(g) if _is_none(window_bias) else window_bias
        # Inputs: query, key, value, bias (of the projections: none), key_padding_mask, attention_bias.
        out = g.op(
            "com.microsoft::MultiHeadAttention",
            q,
            k,
            v,
            _optional_input_placeholder_tensor(g),
            key_mask,
            bias,
            num_heads_i=int(num_heads),
            scale_f=float(scale),
            mask_filter_value_f=MASK_MIN,
        )
        out.setType(q.type())  # same shape and dtype as the query: [B, T, heads * dim]
        return out


def fused_attention_forward(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """transformers AttentionInterface entry: [B, heads, T, dim] inputs after RoPE; the
    `attention_mask` is the (key_mask, window_bias) pair `attention_masks` built."""
    key_mask, window_bias = attention_mask
    num_heads = query.shape[1]
    packed = [x.transpose(1, 2).flatten(-2) for x in (query, key, value)]
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    out = FusedAttention.apply(*packed, key_mask, window_bias, int(num_heads), scale)
    return out.unflatten(-1, (num_heads, -1)), None


def register_fused_attention() -> bool:
    """Make `FUSED_ATTN_IMPLEMENTATION` known to transformers; False when this transformers has
    no AttentionInterface (4.x), which the fused graph needs."""
    try:
        from transformers import AttentionInterface
    except ImportError:
        return False
    AttentionInterface.register(FUSED_ATTN_IMPLEMENTATION, fused_attention_forward)
    return True


def attention_masks(attention_mask: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The masks of a forward, built once and shared by every layer and every row.

    key_mask: [B, T] int32, 1 where the key is a real token. window_bias: [1, 1, T, T] float32,
    0 where |q - k| <= window // 2 (transformers' bidirectional sliding window) else `MASK_MIN`.
    """
    pos = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    near = (pos[None, :] - pos[:, None]).abs() <= window // 2
    zero = torch.zeros((), dtype=torch.float32)
    drop = torch.full((), MASK_MIN, dtype=torch.float32)
    return (attention_mask != 0).to(torch.int32), torch.where(near, zero, drop)[None, None]


# ----------------------------------------------------------------------------------- the head


class HeadAttention(nn.Module):
    """Multi-head self-attention with `nn.MultiheadAttention`'s parameter names.

    q/k/v come from one packed projection (`in_proj_weight`, rows q then k then v) and the
    heads are split with constant-argument reshapes, so the trace keeps batch and sequence
    dynamic. Attention runs through `scaled_dot_product_attention` with a boolean keep-mask, or,
    given the [B, T] int32 key mask of the fused graph, through `FusedAttention` (one node).
    """

    def __init__(self, d_model: int, nhead: int):
        super().__init__()
        if d_model % nhead:
            raise ValueError(f"head width {d_model} is not divisible by {nhead} heads")
        self.nhead = nhead
        self.head_dim = d_model // nhead
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * d_model))
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, keep: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        # x: (B, T, d); keep: (B, 1, 1, T) bool, True where a key is a real token, or the
        # fused graph's (B, T) int32 key mask. `rows` (B, R): only those positions query, so
        # the output is (B, R, d); keys and values still come from every position.
        # split at a constant width: `chunk` traces to shape arithmetic run on every call
        width = self.nhead * self.head_dim
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).split(width, dim=-1)
        if rows is not None:
            # picked after the packed projection, not projected from picked rows: slices of
            # in_proj_weight would stay Slice nodes in the graph, which the int8 rewrite (it
            # lowers MatMuls of initializers) would leave in fp32
            q = pick_rows(q, rows)
        if keep.dim() == 2:
            out = FusedAttention.apply(q, k, v, keep, None, self.nhead, self.head_dim**-0.5)
            return self.out_proj(out)
        q, k, v = (part.unflatten(-1, (self.nhead, self.head_dim)).transpose(1, 2) for part in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.out_proj(out.transpose(1, 2).flatten(-2))


class HeadLayer(nn.Module):
    """One pre-norm transformer encoder layer: x + attn(norm1(x)), then x + ff(norm2(x))."""

    def __init__(self, d_model: int, nhead: int):
        super().__init__()
        self.self_attn = HeadAttention(d_model, nhead)
        self.linear1 = nn.Linear(d_model, 4 * d_model)
        self.linear2 = nn.Linear(4 * d_model, d_model)
        self.norm1 = nn.LayerNorm(d_model, eps=HEAD_NORM_EPS)
        self.norm2 = nn.LayerNorm(d_model, eps=HEAD_NORM_EPS)

    def forward(self, x: torch.Tensor, keep: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """`rows` (B, R): compute the layer's output at those positions only, (B, R, d)."""
        attended = self.self_attn(self.norm1(x), keep, rows)
        x = (x if rows is None else pick_rows(x, rows)) + attended
        return x + self.linear2(F.relu(self.linear1(self.norm2(x))))


class HeadStack(nn.Module):
    """Holds the head layers under `layers`, the attribute name the checkpoint keys use."""

    def __init__(self, d_model: int, nhead: int, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(HeadLayer(d_model, nhead) for _ in range(num_layers))

    def forward(self, x: torch.Tensor, keep: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The last layer's output at `rows` (B, R) only: nothing after the head reads the
        other positions, and every position but a query's own row enters it only as a key or
        value, so the last layer's attention queries, output projection and feed-forward run
        on R rows instead of T (the same numbers: each row is computed as before)."""
        for layer in self.layers[:-1]:
            x = layer(x, keep)
        return self.layers[-1](x, keep, rows)


def pick_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x[b, rows[b, r]]: (B, T, d) and (B, R) int64 positions -> (B, R, d)."""
    return torch.gather(x, 1, rows.unsqueeze(-1).expand(-1, -1, x.size(-1)))


def head_heads(d_model: int) -> int:
    """Number of attention heads in the decision head: one per 64 channels, at least one."""
    return max(1, d_model // 64)


# ---------------------------------------------------------------------------------- the model


class DecisionModel(nn.Module):
    """Encoder + typed decision head; `forward` returns `(logits, act_logits)`.

    `logits` are per marker column (float32, masked columns = -1e4); `act_logits` come from
    the act head, which reads the CLS state and four confidence features of the option
    distribution: top-1 probability, top-1 minus top-2, normalised entropy and k / 255.
    """

    def __init__(
        self, encoder: ModernBertModel, head_layers: int = 2, n_act: int = 2, *, empty: bool = False
    ):
        """`empty=True` leaves the head's parameters uninitialised (for a model about to be
        loaded): they are created on the meta device and materialised empty on CPU, so building
        the model neither spends time on initialisers nor draws from torch's global RNG."""
        super().__init__()
        d = int(encoder.config.hidden_size)
        self.encoder = encoder
        with torch.device("meta") if empty else nullcontext():
            self.head = HeadStack(d, head_heads(d), head_layers) if head_layers > 0 else None
            self.type_emb = nn.Embedding(len(QTYPES), d)
            self.scorer = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
            self.act_head = nn.Sequential(
                nn.Linear(d + 4, ACT_HIDDEN), nn.GELU(), nn.Linear(ACT_HIDDEN, n_act)
            )
        if empty:
            for module in (self.head, self.type_emb, self.scorer, self.act_head):
                if module is not None:
                    module.to_empty(device="cpu")
        self.register_buffer("temperature", torch.ones(len(QTYPES)))
        self.attention = "unfused"

    def use_attention(self, kind: str) -> None:
        """`"fused"`: masks built once per forward (finite minimum, float), every attention one
        `FusedAttention` node; `"unfused"`: transformers' SDPA path, traced op by op."""
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {kind!r}")
        if kind == "fused" and not register_fused_attention():
            raise ValueError(
                "fused attention needs transformers >= 5 (AttentionInterface); export with "
                "attention='unfused' on this transformers"
            )
        config: Any = self.encoder.config
        config._attn_implementation = FUSED_ATTN_IMPLEMENTATION if kind == "fused" else "sdpa"
        self.attention = kind

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        marker_pos: torch.Tensor,
        marker_mask: torch.Tensor,
        qtype: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.attention == "fused":
            config: Any = self.encoder.config
            keep, window = attention_masks(attention_mask, int(config.local_attention))
            masks = {"full_attention": (keep, None), "sliding_attention": (keep, window)}
            h = self.encoder(input_ids=input_ids, attention_mask=masks).last_hidden_state
        else:
            h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            keep = (attention_mask != 0)[:, None, None, :]
        h = h + self.type_emb(qtype)[:, None, :]
        # The positions read after the head: the CLS state (0), then each marker's; padded
        # marker columns read position 0 and are masked below. Negative positions (never
        # produced by the runtime) are clamped. Max, not clamp(min=0): an int64 Clip without an
        # upper bound reads INT64_MAX as its max, which OpenVINO's execution provider rounds
        # through a double and overflows (every position becomes 0; export/README.md, OpenVINO).
        markers = torch.maximum(marker_pos, marker_pos.new_zeros(()))
        rows = torch.cat([markers[:, :1] * 0, markers], dim=1)
        read = self.head(h, keep, rows) if self.head is not None else pick_rows(h, rows)
        cls, marked = read[:, 0], read[:, 1:]
        logits = self.scorer(marked).squeeze(-1).float()
        logits = logits.masked_fill(~marker_mask, MASKED_LOGIT)

        p = torch.softmax(logits, dim=-1)
        k = marker_mask.sum(-1).float().clamp(min=2.0)  # a float Clip, for the same reason
        ent = -(p * torch.log(p.clamp_min(1e-9))).sum(-1) / torch.log(k)
        # Always top-2: the graph needs >= 2 marker columns, which the runtime guarantees.
        top = p.topk(2, dim=-1).values
        feats = torch.stack([top[:, 0], top[:, 0] - top[:, 1], ent, k / 255.0], dim=-1)
        act_dtype = next(self.act_head.parameters()).dtype
        act_input = torch.cat([cls.float(), feats], dim=-1).to(act_dtype)
        return logits, self.act_head(act_input)


# ---------------------------------------------------------------------------- config helpers


def apply_rope_parameters(encoder_config: Any) -> None:
    """Mirror transformers-5 `rope_parameters` onto `global_rope_theta` / `local_rope_theta`.

    A config written by transformers 5 keeps RoPE bases per layer type
    (`{"full_attention": {"rope_theta": ..}, "sliding_attention": {..}}`); transformers 4.x reads
    only the two flat attributes and would silently fall back to its defaults (160000 / 10000),
    which is wrong for mmBERT-style encoders whose local base is 160000. Where the flat
    attributes exist, set them from `rope_parameters`; otherwise this changes nothing.
    """
    rope = getattr(encoder_config, "rope_parameters", None)
    if not isinstance(rope, dict):
        return
    flat = rope.get("rope_theta")
    for layer_type, attr in (
        ("full_attention", "global_rope_theta"),
        ("sliding_attention", "local_rope_theta"),
    ):
        params = rope.get(layer_type)
        theta = params.get("rope_theta") if isinstance(params, dict) else flat
        if theta is not None and hasattr(encoder_config, attr):
            setattr(encoder_config, attr, float(theta))


def n_actions(cfg: dict[str, Any]) -> int:
    """The act head's width: one column per entry of `act_costs`, plus "answer now"."""
    return len(cfg.get("act_costs") or {}) + 1


@contextmanager
def _skip_init():
    """transformers' `no_init_weights`, which moved between 4.x and 5.x."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x (looked up by name: the 5.x this is typed against lacks it)
        no_init_weights = importlib.import_module("transformers.modeling_utils").no_init_weights
    with no_init_weights():
        yield


def _sorted_members(iterable=()) -> list:
    return sorted(set(iterable))


@contextmanager
def ordered_rotary_tables():
    """While tracing: ModernBERT builds its rotary tables in the order of
    `set(config.layer_types)`, which follows the process's string hashes (PYTHONHASHSEED), and
    the tracer names them `rotary_emb` and `rotary_emb_1` in that order. So one checkpoint
    exported to two different graphs (and graph hashes), from one process to the next. Inside
    this block the modeling module's `set` yields the same members sorted, so every export of a
    checkpoint writes the same bytes. (A module global shadows the builtin for that module alone.)
    """
    namespace = vars(importlib.import_module("transformers.models.modernbert.modeling_modernbert"))
    shadowed = namespace.get("set")
    namespace["set"] = _sorted_members
    try:
        yield
    finally:
        if shadowed is None:
            del namespace["set"]
        else:
            namespace["set"] = shadowed


def load_encoder_config(encoder_dir: Path):
    from transformers import AutoConfig

    encoder_dir = Path(encoder_dir)
    if not (encoder_dir / "config.json").is_file():
        raise CheckpointError(f"checkpoint has no encoder config at {str(encoder_dir / 'config.json')!r}")
    ecfg = AutoConfig.from_pretrained(str(encoder_dir))
    apply_rope_parameters(ecfg)
    return ecfg


def build_decision_model(cfg: dict[str, Any], encoder_config: Any, *, device: str = "cpu") -> DecisionModel:
    """An uninitialised DecisionModel for `cfg` + `encoder_config` (every weight must be loaded).

    `device="meta"` builds shapes only (no memory), which is how the checkpoint writer and the
    shape checks enumerate the state dict of even the full-size model for free. Nothing here
    draws from torch's global RNG.
    """
    from transformers import AutoModel

    if device == "meta":
        with torch.device("meta"):
            encoder = AutoModel.from_config(encoder_config, attn_implementation="sdpa")
            return DecisionModel(encoder, int(cfg.get("head_layers", 2)), n_actions(cfg))
    if device != "cpu":
        raise ValueError(f"device must be 'cpu' or 'meta', got {device!r}")
    with _skip_init():
        encoder = AutoModel.from_config(encoder_config, attn_implementation="sdpa")
    return DecisionModel(encoder, int(cfg.get("head_layers", 2)), n_actions(cfg), empty=True)


# ------------------------------------------------------------------------------------ loading


def expected_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _listing(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... and {len(items) - limit} more" if len(items) > limit else "")


def check_state_dict_shapes(
    expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], where: str
) -> None:
    """Raise CheckpointError naming `where` and every missing / unexpected / mismatched key."""
    missing = sorted(k for k in expected if k not in found)
    unexpected = sorted(k for k in found if k not in expected)
    mismatched = sorted(
        f"{k} (checkpoint {list(found[k])}, model {list(expected[k])})"
        for k in expected
        if k in found and tuple(found[k]) != tuple(expected[k])
    )
    if not (missing or unexpected or mismatched):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key(s): {_listing(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s): {_listing(unexpected)}")
    if mismatched:
        parts.append(f"{len(mismatched)} shape mismatch(es): {_listing(mismatched)}")
    raise CheckpointError(
        f"checkpoint {where!r} does not match the decision model its configs describe: "
        + "; ".join(parts)
        + ". Is this a Laya checkpoint, and do rl_agent_config.json / encoder/config.json belong to these weights?"
    )


def read_checkpoint_config(checkpoint_dir: Path) -> dict[str, Any]:
    path = Path(checkpoint_dir) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {str(checkpoint_dir)!r} has no {CONFIG_FILE}; is it a Laya checkpoint?"
        )
    cfg = read_json_object(path, f"checkpoint {str(checkpoint_dir)!r}", CheckpointError)
    try:
        check_option_layout(cfg, f"checkpoint {str(checkpoint_dir)!r}")
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    head_layers = cfg.get("head_layers", 2)
    if isinstance(head_layers, bool) or not isinstance(head_layers, int) or head_layers < 0:
        raise CheckpointError(
            f"checkpoint {str(checkpoint_dir)!r}: head_layers must be a non-negative integer, "
            f"got {head_layers!r}"
        )
    return cfg


def load_decision_model(checkpoint_dir: Path) -> tuple[DecisionModel, dict[str, Any]]:
    """Build the model a checkpoint's configs describe and load its weights, strictly.

    Keys and shapes are compared before any tensor is copied: a wrong or partial checkpoint
    raises a CheckpointError that names the checkpoint and the offending keys. Weights stored in
    reduced precision (the release writes fp16) are widened to float32.
    """
    from safetensors import safe_open

    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise CheckpointError(f"checkpoint {str(checkpoint_dir)!r} is not a directory")
    cfg = read_checkpoint_config(checkpoint_dir)
    weights = checkpoint_dir / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"checkpoint {str(checkpoint_dir)!r} has no {WEIGHTS_FILE}")
    ecfg = load_encoder_config(checkpoint_dir / ENCODER_DIR)

    shapes = expected_shapes(build_decision_model(cfg, ecfg, device="meta"))
    try:
        handle = safe_open(str(weights), framework="pt")
    except Exception as exc:  # safetensors raises its own error types for a damaged header
        raise CheckpointError(
            f"checkpoint {str(checkpoint_dir)!r}: {WEIGHTS_FILE} is not a readable safetensors file ({exc})"
        ) from None
    with handle as f:
        found = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        check_state_dict_shapes(shapes, found, str(checkpoint_dir))
        model = build_decision_model(cfg, ecfg)
        with torch.no_grad():
            own = model.state_dict(keep_vars=True)
            for key in shapes:
                tensor = f.get_tensor(key)
                if not tensor.is_floating_point():
                    raise CheckpointError(
                        f"checkpoint {str(checkpoint_dir)!r}: tensor {key!r} has dtype "
                        f"{tensor.dtype}, expected a floating-point tensor"
                    )
                own[key].copy_(tensor.to(torch.float32))
    model.float().eval()
    try:  # ModernBERT may otherwise torch.compile its own forward ("auto")
        model.encoder.config.reference_compile = False
    except Exception:
        pass
    return model, cfg


__all__ = [
    "ATTENTION_KINDS",
    "DecisionModel",
    "FusedAttention",
    "HeadAttention",
    "HeadLayer",
    "HeadStack",
    "QTYPES",
    "apply_rope_parameters",
    "build_decision_model",
    "check_state_dict_shapes",
    "load_decision_model",
    "load_encoder_config",
    "n_actions",
    "ordered_rotary_tables",
    "read_checkpoint_config",
    "head_heads",
]
