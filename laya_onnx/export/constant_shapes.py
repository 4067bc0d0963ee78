"""While tracing a fused-attention graph: ModernBERT's layers written with constant shapes.

transformers' ModernBERT layer is written for eager torch: it reshapes by `input_shape` and
`x.shape[-1] // 2`, transposes q/k/v to [B, heads, T, dim] and back, and splits the MLP's
input with `chunk`. Traced, each of those becomes a chain of Shape -> Gather -> Div -> Cast ->
Unsqueeze -> Concat nodes feeding a Reshape or a Slice that ONNX Runtime cannot fold (the batch
and sequence dims are dynamic): on tiny-english 436 nodes after ONNX Runtime's own
optimizations, 229 with these layers.

`constant_shape_layers()` replaces, for the time of the trace, `ModernBertAttention.forward`
and `ModernBertMLP.forward` with the same arithmetic in the packed [B, T, heads * dim] layout
that `MultiHeadAttention` takes: one `Split` of the q/k/v projection, RoPE through
`SwapHalves` (a Reshape to heads with a constant shape, a Split of each head into halves,
a Concat of them swapped, a Reshape back; cos and sin tiled across the heads once per forward,
rotate_half's negation moved into sin's tile, where it is made once), and one
`Split` of the MLP's projection. Every product and sum is the one transformers computes, in
the same order: ONNX Runtime's outputs are bit-identical to the graph traced from
transformers' forwards, and the export validates them against the unpatched torch model
(computed before the trace) like any graph. With `rotary_op` (int8 graphs) RoPE is one
`com.microsoft.RotaryEmbedding` instead (`Rotary`): faster, not bit for bit the formula.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from laya_onnx.export.model import FusedAttention

#: The export record's `layers`: which forwards the encoder layers were traced with.
CONSTANT_SHAPE_LAYERS = "constant-shape"
ROTARY_OP_LAYERS = "constant-shape, RoPE as com.microsoft.RotaryEmbedding"
TRANSFORMERS_LAYERS = "transformers"


class SwapHalves(torch.autograd.Function):
    """The halves of each head of packed [B, T, heads * dim] `x` swapped: cat(x[..., dim/2:],
    x[..., :dim/2]). rotate_half(x) * sin is swap(x) * cat(-sin[:dim/2], sin[dim/2:]), bit for
    bit (IEEE negation is exact and (-a) * b == a * (-b)), so RoPE negates the table once per
    forward instead of q and k in every layer.

    Traced, it is one Reshape to [B, T, heads, dim] with a constant shape (`0` keeps a
    dimension, `-1` is inferred: torch's shape inference wants one with a `0`), a Split into
    halves, a Concat and a Reshape back: no node reads a shape at run time."""

    @staticmethod
    def forward(ctx, x, heads: int, dim: int):
        first, second = x.unflatten(-1, (heads, dim)).split(dim // 2, dim=-1)
        return torch.cat((second, first), dim=-1).flatten(-2)

    @staticmethod
    def symbolic(g, x, heads: int, dim: int):
        def constant(values: list[int]):
            return g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))

        parts = g.op("Reshape", x, constant([0, 0, heads, -1]))
        first, second = g.op("Split", parts, constant([dim // 2, dim // 2]), axis_i=-1, outputs=2)
        rotated = g.op("Concat", second, first, axis_i=-1)
        packed = g.op("Reshape", rotated, constant([0, 0, -1]))
        packed.setType(x.type())
        return packed


class Rotary(torch.autograd.Function):
    """RoPE of packed [B, T, heads * dim] `x`, per head: x * cos + rotate_half(x) * sin, where
    rotate_half(x) = cat(-x[..., dim/2:], x[..., :dim/2]) and `cos_half`, `sin_half` are
    [T, dim/2]: transformers' cos and sin are the same half twice (cat(freqs, freqs)).

    Traced, it is one `com.microsoft.RotaryEmbedding` (non-interleaved, positions from 0), which
    onnxruntime computes in one pass (RoPE's kernel time on random-english-large, one question:
    9.0 -> 2.3 ms) and not bit for bit as the formula: on that checkpoint the graph's logits moved
    up to 5.1e-5 from the formula's. So only int8 graphs take it
    (`ExportOptions.rotary_op`), where int8 moves answers far more; and OpenVINO reads this op
    wrongly (bf16 bundles keep transformers' layers anyway)."""

    @staticmethod
    def forward(ctx, x, cos_half, sin_half, heads: int, dim: int):
        cos = torch.cat((cos_half, cos_half), dim=-1).repeat(1, heads)
        signed_sin = torch.cat((-sin_half, sin_half), dim=-1).repeat(1, heads)  # as `_Trace.tables`
        return x * cos + SwapHalves.apply(x, heads, dim) * signed_sin

    @staticmethod
    def symbolic(g, x, cos_half, sin_half, heads: int, dim: int):
        start = g.op("Constant", value_t=torch.tensor([0], dtype=torch.int64))
        out = g.op(
            "com.microsoft::RotaryEmbedding", x, start, cos_half, sin_half, num_heads_i=heads, interleaved_i=0
        )
        out.setType(x.type())
        return out


class _Trace:
    """What a trace shares between layers. Per rotary table, made once per forward: cos and sin
    tiled to [B, T, heads * dim], sin's first half of each head negated (for the formula with
    `SwapHalves`), or their first halves, [T, dim/2] (for
    `Rotary`; transformers' cos and sin are [1, T, dim], the same half twice, the positions the
    same for every row).

    transformers hands every layer of one attention type the same (cos, sin) pair, so keyed by
    that pair each is traced once per table and every layer reads it (with the tiles, RoPE
    multiplies same-shape tensors: a broadcast over the heads axis costs onnxruntime an inner
    loop of `dim` floats)."""

    def __init__(self) -> None:
        #: RoPE as one `Rotary` op (set by `constant_shape_layers` for the time of a trace)
        self.rotary_op = False
        self.made: dict[tuple[int, int, str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def tables(self, cos: torch.Tensor, sin: torch.Tensor, heads: int, dim: int, kind: str):
        key = (id(cos), id(sin), kind)
        if key not in self.made:
            # the tensors are kept with what is made of them, so their ids cannot be reused
            if kind == "tiles":  # a Concat of `heads` copies is one node (`repeat` reads the shape)
                # times -1 and 1, exact; a constant rather than slices of the table
                sign = torch.tensor([-1.0] * (dim // 2) + [1.0] * (dim - dim // 2))
                signed = _float32(sin) * sign
                made = torch.cat([_float32(cos)] * heads, dim=-1), torch.cat([signed] * heads, dim=-1)
            else:
                made = _float32(cos)[0, :, : dim // 2], _float32(sin)[0, :, : dim // 2]
            self.made[key] = (cos, *made)
        kept = self.made[key]
        return kept[1], kept[2]


_TRACE = _Trace()


def _float32(x: torch.Tensor) -> torch.Tensor:
    """`x.float()` without a Cast node in the trace when `x` is float32 already."""
    return x if x.dtype == torch.float32 else x.float()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """RoPE as transformers computes it (in float32, cast back): x * cos + rotate_half(x) * sin
    with the tables tiled (rotate_half's sign in sin's tile), or one `Rotary` op when the trace
    asks for it (the tables' halves)."""
    x32 = _float32(x)
    if _TRACE.rotary_op:
        cos_half, sin_half = _TRACE.tables(cos, sin, heads, dim, "halves")
        out = Rotary.apply(x32, cos_half, sin_half, heads, dim)
    else:
        cos_t, sin_t = _TRACE.tables(cos, sin, heads, dim, "tiles")
        out = x32 * cos_t + SwapHalves.apply(x32, heads, dim) * sin_t
    return out if out.dtype == x.dtype else out.to(x.dtype)


def constant_shape_attention_forward(
    self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs
):
    """ModernBertAttention.forward for the fused graph: `attention_mask` is the
    (key_mask, window_bias) pair of `model.attention_masks`."""
    heads, dim = int(self.config.num_attention_heads), int(self.head_dim)
    q, k, v = self.Wqkv(hidden_states).split(heads * dim, dim=-1)
    cos, sin = position_embeddings
    q, k = _rope(q, cos, sin, heads, dim), _rope(k, cos, sin, heads, dim)
    key_mask, window_bias = attention_mask
    out = FusedAttention.apply(q, k, v, key_mask, window_bias, heads, dim**-0.5)
    return self.out_drop(self.Wo(out)), None


def constant_shape_mlp_forward(self, hidden_states):
    """ModernBertMLP.forward with the gated halves split at a constant width."""
    values, gate = self.Wi(hidden_states).split(int(self.Wo.in_features), dim=-1)
    return self.Wo(self.drop(self.act(values) * gate))


def _has_layout(model: nn.Module) -> bool:
    """True when every ModernBERT attention and MLP has the parts these forwards use."""
    from transformers.models.modernbert import modeling_modernbert as mb

    found = False
    for module in model.modules():
        if isinstance(module, mb.ModernBertAttention):
            found = True
            parts = ("Wqkv", "Wo", "out_drop", "head_dim", "config")
            if not all(hasattr(module, p) for p in parts):
                return False
            width = int(module.config.num_attention_heads) * int(module.head_dim)
            if module.Wqkv.out_features != 3 * width or module.head_dim % 2:
                return False
        elif isinstance(module, mb.ModernBertMLP):
            if not all(hasattr(module, p) for p in ("Wi", "Wo", "act", "drop")):
                return False
            if module.Wi.out_features != 2 * module.Wo.in_features:
                return False
    return found


@contextmanager
def constant_shape_layers(model: Any, *, enabled: bool = True, rotary_op: bool = False) -> Iterator[bool]:
    """Inside this block ModernBERT's attention and MLP trace with constant shapes; yields
    whether they do (False, and transformers' forwards kept, when not `enabled` or when the
    model's layers lack the layout). `rotary_op`: RoPE as one `com.microsoft.RotaryEmbedding`
    (`Rotary`) instead of the formula's ops."""
    from transformers.models.modernbert import modeling_modernbert as mb

    if not enabled or not _has_layout(model):
        yield False
        return
    patched = {
        mb.ModernBertAttention: constant_shape_attention_forward,
        mb.ModernBertMLP: constant_shape_mlp_forward,
    }
    saved = {cls: vars(cls)["forward"] for cls in patched}
    for cls, forward in patched.items():
        setattr(cls, "forward", forward)  # noqa: B010 (a method assignment mypy refuses)
    _TRACE.rotary_op = rotary_op
    try:
        yield True
    finally:
        for cls, forward in saved.items():
            setattr(cls, "forward", forward)  # noqa: B010
        _TRACE.made.clear()
        _TRACE.rotary_op = False
