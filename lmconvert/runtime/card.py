"""The architecture card printed by `lmconvert inspect`."""

from __future__ import annotations

from math import prod
from pathlib import Path
from typing import Any

from lmconvert.arch.describe import variants
from lmconvert.arch.shapes import parameter_shapes
from lmconvert.formats.checkpoint import Checkpoint, open_checkpoint
from lmconvert.formats.dtypes import BY_TORCH_NAME
from lmconvert.formats.quantized import quantization_line


def card(path: Path) -> dict[str, Any]:
    """From lmconvert.json, or from any input format without reading its weights."""
    with open_checkpoint(path) as checkpoint:
        return card_of(checkpoint)


def card_of(checkpoint: Checkpoint) -> dict[str, Any]:
    """From a checkpoint's config and its tensors' shapes and dtypes: no tensor is read, so a
    checkpoint known only from its config.json and safetensors headers (`inspect REPO_ID`) has one."""
    arch, family, dtype, note = checkpoint.arch, checkpoint.family.name, checkpoint.dtype(), checkpoint.note
    element = BY_TORCH_NAME[dtype].itemsize
    params = sum(prod(shape) for shape in parameter_shapes(arch).values())
    return {
        "family": family, "parameters": params, "dtype": dtype,
        "d_model": arch.d_model, "n_layers": arch.n_layers, "d_ff": arch.d_ff, "vocab_size": arch.vocab_size,
        "heads": arch.n_heads, "kv_heads": arch.n_kv_heads, "head_dim": arch.head_dim,
        "d_ff/d_model": round(arch.d_ff / arch.d_model, 3), "d_model/n_layers": round(arch.d_model / arch.n_layers, 3),
        "kv_cache_bytes_per_token": arch.kv_cache_bytes_per_token(element),
        # a mixer's fixed state (mixer_kinds), and what decoding one sequence of max_positions tokens holds
        "state_bytes_per_sequence": arch.state_bytes_per_sequence(element),
        "cache_bytes_at_max_positions": arch.cache_bytes(arch.max_positions, element),
        "max_positions": arch.max_positions,
        "variants": variants(arch), "note": note,
        "quantization": quantization_line(checkpoint.source.tensors),
    }


def format_card(info: dict[str, Any]) -> str:
    lines = [f"family            {info['family']}",
             f"parameters        {info['parameters']:,} ({info['dtype']})",
             f"shape             d_model {info['d_model']}, {info['n_layers']} layers, d_ff {info['d_ff']}, "
             f"vocab {info['vocab_size']}",
             f"ratios            d_ff/d_model {info['d_ff/d_model']}, d_model/n_layers {info['d_model/n_layers']}",
             f"heads             {info['heads']} q / {info['kv_heads']} kv, head_dim {info['head_dim']}",
             f"KV cache          {info['kv_cache_bytes_per_token']:,} bytes per token ({info['dtype']})"]
    if info.get("state_bytes_per_sequence"):  # a hybrid's, or a stack of mixers'
        at = f"at {info['max_positions']:,} tokens"
        lines += [f"mixer state       {info['state_bytes_per_sequence']:,} bytes per sequence ({info['dtype']})",
                  f"{at:<17} {info['cache_bytes_at_max_positions']:,} bytes per sequence, KV cache and state"]
    lines.append("variants")
    lines += [f"  - {v}" for v in info["variants"]]
    lines += [f"note              {info['note']}"] if info["note"] else []
    lines += [f"quantization      {info['quantization']}"] if info.get("quantization") else []
    return "\n".join(lines)
