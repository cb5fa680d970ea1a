"""What the integer-packed checkpoint formats (GPTQ, AWQ, compressed-tensors) share: a quantized
linear's tensors as the file headers describe them, checked before a byte of them is read, and
`quantization_config`'s options checked by name.

A quantized linear `X` is a set of tensors `X.<part>` (`X.qweight`, `X.scales`...) standing for
`X.weight`. Each format says which parts a linear of `out_features` x `in_features` has, with their
shapes and dtypes (`Part`); `check_parts` holds the headers to that before anything is read or
allocated, so a size the file claims is never trusted. Headers come through `Headers`: a file's
reader (`ReaderHeaders`) or tensors in memory (`TensorHeaders`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .dtypes import DTYPES, of_torch
from .errors import InputError
from .source import TensorReader, dtype_name

if TYPE_CHECKING:
    import torch

FLOATS = ("F32", "F16", "BF16")  # the dtypes scales are stored in


class Headers(Protocol):
    """What the headers say of a checkpoint's tensors, by full name."""

    def __contains__(self, name: object) -> bool: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def dtype(self, name: str) -> str: ...  # safetensors' name: "I32", "F16"...

    def where(self, name: str) -> str: ...  # the file, for messages


class ReaderHeaders:
    """A reader's headers (nothing is read)."""

    def __init__(self, reader: TensorReader) -> None:
        self.reader = reader
        self._names = set(reader.names())

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.reader.shape(name))

    def dtype(self, name: str) -> str:
        return dtype_name(self.reader, name)

    def where(self, name: str) -> str:
        return str(self.reader.where(name))


class TensorHeaders:
    """Tensors in memory seen as headers, `file` standing for where they came from."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], file: str | Path) -> None:
        self.tensors, self.file = tensors, str(file)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def dtype(self, name: str) -> str:
        return of_torch(self.tensors[name].dtype).name

    def where(self, name: str) -> str:
        return self.file


@dataclass(frozen=True)
class Part:
    """One tensor of a quantized linear: `module + "." + suffix`, its shape and accepted dtypes."""
    suffix: str
    shape: tuple[int, ...]
    dtypes: tuple[str, ...]
    optional: bool = False  # may be absent (GPTQ's g_idx without desc_act)


def _names(dtypes: Iterable[str]) -> str:
    return " or ".join(DTYPES[d].torch_name for d in dtypes)


def check_parts(module: str, parts: Iterable[Part], headers: Headers, why: str) -> None:
    """Each part present (unless optional) with the shape and a dtype `parts` says, from the headers
    alone; `why` names the recipe in messages ("GPTQ 4-bit, group_size 128")."""
    for part in parts:
        name = f"{module}.{part.suffix}"
        if name not in headers:
            if part.optional:
                continue
            raise InputError(f"quantized linear {module!r} has no {name!r}, which {why} needs; "
                             "the checkpoint is incomplete")
        where = headers.where(name)
        kind = headers.dtype(name)
        if kind not in part.dtypes:
            raise InputError(f"{where}: tensor {name!r} is {DTYPES[kind].torch_name if kind in DTYPES else kind}, "
                             f"but {why} stores it as {_names(part.dtypes)}; the checkpoint is inconsistent")
        shape = headers.shape(name)
        if shape != part.shape:
            raise InputError(f"{where}: tensor {name!r} has shape {list(shape)}, but {why} needs {list(part.shape)} "
                             "for this layer; the checkpoint is inconsistent")


def linears(headers: Headers, names: Iterable[str], markers: tuple[str, ...], parts: tuple[str, ...],
            format_name: str) -> list[str]:
    """The quantized linears among a checkpoint's tensor `names`: every `X` with an `X.<marker>`, in
    order of first appearance; a part (`X.qzeros`...) whose `X` has no marker is refused, as the
    checkpoint is incomplete."""
    names = list(names)
    found: dict[str, None] = {}
    for name in names:
        module, _, suffix = name.rpartition(".")
        if suffix in markers:
            found[module] = None
    for name in names:
        module, _, suffix = name.rpartition(".")
        if suffix in parts and module not in found:
            raise InputError(f"{headers.where(name)}: tensor {name!r} is a {format_name} part, but {module!r} has "
                             f"no {' or '.join(repr(module + '.' + m) for m in markers)}; the checkpoint is incomplete")
    return list(found)


def check_options(quant: Mapping[str, Any], where: str, handled: Mapping[str, tuple[Any, ...]],
                  inert: Iterable[str]) -> None:
    """Every key of a quantization config either handled (its value among `handled[key]`) or
    `inert` (calibration and kernel settings that do not change what the stored tensors mean);
    anything else is refused by name."""
    inert = set(inert)
    for key, value in quant.items():
        if key in handled:
            if not any(value == ok and type(value) is type(ok) for ok in handled[key]):
                options = ", ".join(repr(v) for v in handled[key])
                raise InputError(f"{where}.{key} {value!r} is not handled (only {options}); "
                                 "convert an unquantized copy of the model")
        elif key not in inert:
            raise InputError(f"{where}.{key} is an option lmconvert does not handle; "
                             "convert an unquantized copy of the model")


def count(value: Any, where: str, minus_one: bool = False) -> int:
    """A positive integer from a config (or -1 where `minus_one`: GPTQ's "one group per row")."""
    if (not isinstance(value, int) or isinstance(value, bool)
            or not (value > 0 or (minus_one and value == -1))):
        also = " or -1" if minus_one else ""
        raise InputError(f"{where} {value!r} is not a positive integer{also}; fix config.json")
    return value


def grouping(group_size: int) -> str:
    """How a recipe groups its scales, for messages: -1 is one group per row."""
    return "per row" if group_size == -1 else f"group_size {group_size}"


def flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{where} {value!r} is not true or false; fix config.json")
    return value


def finite(tensor: torch.Tensor, name: str, where: str) -> None:
    """Scales hold no NaN or Inf (they are small: one per group)."""
    import torch

    if not bool(torch.isfinite(tensor).all()):
        raise InputError(f"{where}: tensor {name!r} holds NaN or Inf scales; re-download or re-quantize the checkpoint")


def little_endian_bytes(words: torch.Tensor) -> torch.Tensor:
    """int32 words as their bytes, least significant first whatever the host's order: [..., 4]."""
    import sys

    import torch

    as_bytes = words.contiguous().view(torch.uint8).view(*words.shape, 4)
    return as_bytes.flip(-1) if sys.byteorder == "big" else as_bytes


def unpack_words(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The `32 // bits` fields of each int32 word, least significant first, as uint8: [..., 32 // bits].
    Field j of a word is `(word >> (bits * j)) & (2**bits - 1)`, which for 4 and 8 bits never
    straddles a byte, so bytes are split instead of shifting whole words."""
    import torch

    as_bytes = little_endian_bytes(words)
    if bits == 8:
        return as_bytes
    if bits == 4:
        return torch.stack((as_bytes & 0xF, as_bytes >> 4), dim=-1).flatten(-2)
    raise ValueError(f"unpack_words: {bits}-bit fields")  # the recipes refuse other widths first


_HEADERS: list[ReaderHeaders] = []  # the last reader's, so a checkpoint's names are listed once


def headers_of(reader: TensorReader) -> ReaderHeaders:
    """`ReaderHeaders(reader)`, the same one for each weight of a checkpoint checked in turn."""
    last = _HEADERS[0] if _HEADERS else None
    if last is None or last.reader is not reader:
        last = ReaderHeaders(reader)
        _HEADERS[:] = [last]
    return last


def module_of_weight(weight: str) -> str:
    """The linear `X` of a weight name `X.weight` (the table names a quantized linear by its weight)."""
    return weight.removesuffix(".weight")
