"""Element types as the files name them, without importing torch.

A conversion that only copies bytes never needs torch (importing it costs more than a second, as
long as copying a gigabyte), so shapes, sizes, headers and the NaN/Inf check work from these names;
torch's own dtypes are looked up only where a tensor is decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import InputError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Dtype:
    name: str  # safetensors' name, as in file headers
    torch_name: str  # torch's name, as users and config.json spell it
    itemsize: int
    nonfinite: int | None = None  # bits that are all set exactly in NaN and Inf (floats only)


DTYPES: dict[str, Dtype] = {d.name: d for d in (
    Dtype("F64", "float64", 8, 0x7FF0_0000_0000_0000),
    Dtype("F32", "float32", 4, 0x7F80_0000),
    Dtype("F16", "float16", 2, 0x7C00),
    Dtype("BF16", "bfloat16", 2, 0x7F80),
    Dtype("F8_E5M2", "float8_e5m2", 1, 0x7C),
    Dtype("F8_E4M3", "float8_e4m3fn", 1, 0x7F),  # no Inf; NaN is the one all-ones pattern
    Dtype("I64", "int64", 8), Dtype("I32", "int32", 4), Dtype("I16", "int16", 2), Dtype("I8", "int8", 1),
    Dtype("U8", "uint8", 1), Dtype("BOOL", "bool", 1),
)}
BY_TORCH_NAME = {d.torch_name: d for d in DTYPES.values()}
CASTS = ("float32", "bfloat16", "float16")  # what --dtype may ask for


def parse_cast(name: str | None) -> str | None:
    """A --dtype value: one of CASTS, or None for "keep the checkpoint's own"."""
    if name is None or name == "keep":
        return None
    if name not in CASTS:
        raise InputError(f"--dtype {name!r}: choose one of keep, {', '.join(CASTS)}")
    return name


def parse_dtype(name: str | None) -> torch.dtype | None:
    """A --dtype value as torch's dtype, or None for "keep"."""
    cast = parse_cast(name)
    return None if cast is None else torch_dtype(cast)


def dominant(sized: list[tuple[str, int]]) -> str:
    """The dtype (safetensors name) holding most of a model's bytes, floats before any other: what
    config.json's "dtype" means. A checkpoint may keep its norms in fp32 beside bf16 matrices, and
    whichever comes first in a file says nothing about which is the model's."""
    totals: dict[str, int] = {}
    for name, nbytes in sized:
        totals[name] = totals.get(name, 0) + nbytes
    return max(totals, key=lambda name: (DTYPES[name].nonfinite is not None, totals[name]))


def torch_dtype(name: str) -> torch.dtype:
    """torch's dtype for a safetensors or torch name."""
    import torch

    return getattr(torch, (DTYPES.get(name) or BY_TORCH_NAME[name]).torch_name)


def of_torch(dtype: torch.dtype) -> Dtype:
    return BY_TORCH_NAME[str(dtype).removeprefix("torch.")]
