"""Seeded random weights for a DecisionModel, streamed straight into a safetensors file.

Each tensor is drawn from its own `torch.Generator` (CPU), seeded from the run seed, the
preset and the tensor's name, so a tensor's values do not depend on which other tensors exist
or the order they are produced in. Tensors are stored in float16 like the released
checkpoints (laya's `save_checkpoint` writes `.half()`).

The file is written one tensor at a time from shapes computed on the meta device, so even the
full-size preset never holds more than one tensor in memory. The safetensors layout is the
public one: an 8-byte little-endian header length, a JSON header (padded with spaces to a
multiple of 8) mapping names to dtype / shape / data_offsets, then the raw little-endian data.

Init scales are chosen for *spread*, not for training: attention is made sharp enough that the
[MASK] markers (all the same token) pick up different context, and the scorer's output layer
is scaled so option logits differ by whole units. With standard small inits every option gets
nearly the same logit, and decision-parity tests between runtimes turn into coin flips.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path

import torch

from laya_onnx.checkpoints.presets import InitScales


def tensor_seed(seed: int, preset: str, name: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(preset.encode()) * 7919 + zlib.crc32(name.encode())) % (2**63)


def _is_norm(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and ("norm" in parts[-2] or name.startswith("scorer.0."))


def init_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator, scales: InitScales) -> torch.Tensor:
    """Float32 values for one state-dict entry, chosen by its name."""

    def normal(std: float) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float32).mul_(std)

    if name == "temperature":
        return torch.ones(shape)
    if name.endswith("tok_embeddings.weight"):
        return normal(scales.embedding_std)
    if name == "type_emb.weight":
        return normal(scales.type_std)
    if _is_norm(name):
        if name.endswith(".weight"):
            return normal(scales.norm_noise).add_(1.0)
        return normal(scales.bias_std)
    if len(shape) == 1:  # linear and projection biases
        return normal(scales.bias_std)
    fan_in = shape[1]
    gain = 1.0
    if name.endswith(("attn.Wqkv.weight", "self_attn.in_proj_weight")):
        gain = scales.qk_gain
    elif name.endswith(("attn.Wo.weight", "self_attn.out_proj.weight")):
        gain = scales.out_gain
    elif name == "scorer.3.weight":
        gain = scales.scorer_gain
    elif name.startswith("act_head."):
        gain = scales.act_gain
    return normal(gain / math.sqrt(fan_in))


_DTYPES = {torch.float16: "F16", torch.float32: "F32", torch.bfloat16: "BF16"}


def write_random_safetensors(
    path: Path,
    shapes: dict[str, tuple[int, ...]],
    *,
    seed: int,
    preset: str,
    scales: InitScales,
    dtype: torch.dtype = torch.float16,
) -> None:
    """Write every tensor of `shapes` (name -> shape) with seeded random values to `path`."""
    names = sorted(shapes)
    item = torch.empty((), dtype=dtype).element_size()
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        nbytes = math.prod(shapes[name]) * item
        header[name] = {
            "dtype": _DTYPES[dtype],
            "shape": list(shapes[name]),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":"), sort_keys=False).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    gen = torch.Generator(device="cpu")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in names:
            gen.manual_seed(tensor_seed(seed, preset, name))
            values = init_tensor(name, tuple(shapes[name]), gen, scales).to(dtype).contiguous()
            if dtype == torch.bfloat16:
                values = values.view(torch.int16)
            array = values.numpy()
            f.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
            del values
