"""The architecture card printed by `lmconvert inspect`."""

from __future__ import annotations

from math import prod
from pathlib import Path
from typing import Any

from lmconvert.arch import ArchConfig
from lmconvert.arch.describe import variants
from lmconvert.arch.shapes import parameter_shapes

from .canonical import is_canonical, read_meta
from .dtypes import BY_TORCH_NAME, DTYPES, dominant
from .hf_source import HfCheckpoint
from .sources import TensorReader, dtype_name


def _stored(tensors: TensorReader, name: str) -> tuple[str, int]:
    """A tensor's dtype (safetensors name) and size in bytes, as stored."""
    dtype = dtype_name(tensors, name)
    return dtype, prod(tensors.shape(name)) * DTYPES[dtype].itemsize


def _arch_family_dtype(path: Path) -> tuple[ArchConfig, str, str]:
    """From lmconvert.json, or from any input format without reading its weights: the dtype is
    that of the tensors as stored (for GGUF, what they dequantize to)."""
    if is_canonical(path):
        meta = read_meta(path)
        return meta.arch, meta.family, meta.dtype
    with HfCheckpoint.open(path) as ckpt:
        sized = [_stored(ckpt.source.tensors, hf_name) for hf_name, _ in ckpt.plan.values()]
        return ckpt.arch, ckpt.family.name, DTYPES[dominant(sized)].torch_name


def card(path: Path) -> dict[str, Any]:
    arch, family, dtype = _arch_family_dtype(path)
    element = BY_TORCH_NAME[dtype].itemsize
    params = sum(prod(shape) for shape in parameter_shapes(arch).values())
    return {
        "family": family, "parameters": params, "dtype": dtype,
        "d_model": arch.d_model, "n_layers": arch.n_layers, "d_ff": arch.d_ff, "vocab_size": arch.vocab_size,
        "heads": arch.n_heads, "kv_heads": arch.n_kv_heads, "head_dim": arch.head_dim,
        "d_ff/d_model": round(arch.d_ff / arch.d_model, 3), "d_model/n_layers": round(arch.d_model / arch.n_layers, 3),
        "kv_cache_bytes_per_token": arch.kv_cache_bytes_per_token(element),
        "variants": variants(arch),
    }


def format_card(info: dict[str, Any]) -> str:
    lines = [f"family            {info['family']}",
             f"parameters        {info['parameters']:,} ({info['dtype']})",
             f"shape             d_model {info['d_model']}, {info['n_layers']} layers, d_ff {info['d_ff']}, "
             f"vocab {info['vocab_size']}",
             f"ratios            d_ff/d_model {info['d_ff/d_model']}, d_model/n_layers {info['d_model/n_layers']}",
             f"heads             {info['heads']} q / {info['kv_heads']} kv, head_dim {info['head_dim']}",
             f"KV cache          {info['kv_cache_bytes_per_token']:,} bytes per token ({info['dtype']})",
             "variants"]
    lines += [f"  - {v}" for v in info["variants"]]
    return "\n".join(lines)
