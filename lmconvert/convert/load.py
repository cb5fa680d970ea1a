"""`lmconvert.load`: a canonical Decoder from a canonical directory or an HF directory."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from lmconvert.arch import ArchConfig, Decoder
from lmconvert.arch.shapes import parameter_shapes

from .canonical import is_canonical, read_meta
from .errors import InputError
from .hf_source import HfCheckpoint, parse_dtype
from .pipeline import canonical_tensors


def build(arch: ArchConfig, tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None,
          device: str | torch.device, attention: str = "sdpa") -> Decoder:
    with torch.device("meta"):
        model = Decoder(arch)
    state = {name: t.to(device=device, dtype=dtype or t.dtype) for name, t in tensors}
    missing = sorted(set(parameter_shapes(arch)) - set(state))
    if missing:
        raise InputError(f"checkpoint lacks tensor(s): {', '.join(missing[:5])}")
    model.load_state_dict(state, strict=True, assign=True)
    return model.set_attention(attention).eval()


def arch_of(path: Path) -> tuple[ArchConfig, str]:
    """The ArchConfig and family of a checkpoint, without reading any weights."""
    if is_canonical(path):
        meta = read_meta(path)
        return meta.arch, meta.family
    with HfCheckpoint.open(path) as ckpt:
        return ckpt.arch, ckpt.family.name


def load(path: str | Path, dtype: torch.dtype | str | None = None, device: str | torch.device = "cpu",
         attention: str = "sdpa") -> Decoder:
    """The canonical Decoder for a checkpoint; an HF directory is converted in memory.
    `attention` is "sdpa" (fast, transformers' default) or "eager" (transformers' eager order)."""
    path = Path(path)
    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    if is_canonical(path):
        meta = read_meta(path)
        return build(meta.arch, canonical_tensors(path), dtype, device, attention)
    with HfCheckpoint.open(path) as ckpt:
        return build(ckpt.arch, ckpt.tensors(), dtype, device, attention)
