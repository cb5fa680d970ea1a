"""`lmconvert.load`: the canonical Decoder for a checkpoint in any format."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from lmconvert.arch import ArchConfig, Decoder
from lmconvert.arch.moe import kept_in_fp32
from lmconvert.arch.shapes import parameter_shapes
from lmconvert.formats.checkpoint import Checkpoint, open_checkpoint
from lmconvert.formats.dtypes import parse_dtype
from lmconvert.formats.errors import InputError


def build(arch: ArchConfig, tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None,
          device: str | torch.device, attention: str = "sdpa") -> Decoder:
    with torch.device("meta"):
        model = Decoder(arch)
    fp32 = kept_in_fp32(model)
    state = {name: t.to(device=device, dtype=torch.float32 if name in fp32 else dtype or t.dtype)
             for name, t in tensors}
    missing = sorted(set(parameter_shapes(arch)) - set(state))
    if missing:
        raise InputError(f"checkpoint lacks tensor(s): {', '.join(missing[:5])}")
    model.load_state_dict(state, strict=True, assign=True)
    return model.set_attention(attention).eval()


def arch_of(path: Path) -> tuple[ArchConfig, str]:
    """The ArchConfig and family of a checkpoint, without reading any weights."""
    with open_checkpoint(path) as checkpoint:
        return checkpoint.arch, checkpoint.family.name


def load_checkpoint(checkpoint: Checkpoint, dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
                    attention: str = "sdpa") -> Decoder:
    return build(checkpoint.arch, checkpoint.tensors(), dtype, device, attention)


def load(path: str | Path, dtype: torch.dtype | str | None = None, device: str | torch.device = "cpu",
         attention: str = "sdpa", tp: int | bool | None = None) -> Decoder:
    """The canonical Decoder for a checkpoint in any format (an HF directory is converted in
    memory). `attention` is "sdpa" (fast, transformers' default) or "eager" (transformers' eager order).

    `tp`: this rank's share of the model split tensor-parallel over every rank of the launch
    (`torchrun --nproc-per-node N`; True, or N to check the count), each rank reading only its
    slices (`runtime/tensor_parallel.py`). Every rank calls it; the device is the rank's GPU, or the
    CPU with gloo, and `device` is not used."""
    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    with open_checkpoint(Path(path)) as checkpoint:
        if tp:
            from .tensor_parallel import device_mesh, load_parallel

            mesh = device_mesh(None if tp is True else int(tp))
            return load_parallel(checkpoint, mesh, dtype, attention)
        return load_checkpoint(checkpoint, dtype, device, attention)
