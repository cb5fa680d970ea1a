"""Reading a directory of safetensors weights, single file or sharded with an index, lazily.

`safetensors` validates every file (header, offsets, dtypes). Tensor bytes are then read with
plain positioned reads rather than through its memory map: mapped pages stay resident while a
file is open, so a conversion's memory would grow with the shard instead of the largest tensor.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from safetensors import SafetensorError, safe_open

from .checkpoint_files import checkpoint_file
from .dtypes import DTYPES, torch_dtype
from .errors import InputError
from .jsonfile import shard_files
from .quant_bands import pread_into, stored_rows

if TYPE_CHECKING:
    import torch

    from .quant_bands import Banded

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def data_offsets(path: Path) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """{name: (dtype, shape, absolute start, end)} from a header that safetensors has validated."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    start = 8 + length
    return {name: (e["dtype"], tuple(e["shape"]), start + e["data_offsets"][0], start + e["data_offsets"][1])
            for name, e in header.items() if name != "__metadata__"}


def shard_map(directory: Path) -> dict[str, Path]:
    """{tensor name: shard file} from the index, or from the single file."""
    index = directory / INDEX
    if index.exists():
        return shard_files(checkpoint_file(directory, INDEX))
    single = directory / SINGLE
    if single.is_file():
        checkpoint_file(directory, SINGLE)
        with _open(single) as f:
            return {name: single for name in f.keys()}
    raise InputError(f"{directory}: no {SINGLE} or {INDEX}; point at a directory with safetensors weights")


def _open(path: Path):  # noqa: ANN202 - safetensors' handle type is private
    try:
        return safe_open(str(path), framework="numpy")  # only validates and lists: needs no torch
    except (SafetensorError, OSError) as exc:
        reason = " ".join(str(exc).split()).removeprefix("Error while deserializing header: ")
        raise InputError(f"{path}: not a valid safetensors file ({reason}); re-download or re-export it") from None


class TensorSource:
    """Tensors of a safetensors directory by name, each read only when asked for."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files = shard_map(directory)
        self._stack = ExitStack()
        self._readers: dict[Path, BinaryIO] = {}
        self._entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        by_file: dict[Path, set[str]] = {}
        for name, file in self.files.items():
            by_file.setdefault(file, set()).add(name)
        for file, names in by_file.items():
            with _open(file) as handle:
                present = set(handle.keys())
            missing = sorted(names - present)
            if missing:
                raise InputError(f"{file}: lacks tensor(s) the index lists: {', '.join(missing[:5])}")
            unlisted = sorted(present - names) if len(by_file) > 1 or (directory / INDEX).exists() else []
            if unlisted:
                raise InputError(f"{file}: holds tensor(s) the index does not list: {', '.join(unlisted[:5])}")
            self._entries.update({n: e for n, e in data_offsets(file).items() if n in names})

    def names(self) -> list[str]:
        return list(self.files)

    def where(self, name: str) -> Path:
        return self.files[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def dtype_name(self, name: str) -> str:
        """The dtype as the file names it (BF16, F32, ...)."""
        kind = self._entries[name][0]
        if kind not in DTYPES:
            raise InputError(f"{self.files[name]}: tensor {name!r} has dtype {kind}, which lmconvert does not handle")
        return kind

    def dtype(self, name: str) -> torch.dtype:
        return torch_dtype(self.dtype_name(name))

    def raw_location(self, name: str) -> tuple[Path, int, int]:
        """The file and byte range holding the tensor, for byte-for-byte copies."""
        _, _, start, end = self._entries[name]
        return self.files[name], start, end

    def _read_into(self, name: str, offset: int, view: memoryview) -> None:
        """The tensor's bytes from byte `offset` into `view` (positioned reads: threads may share a file)."""
        _, _, start, _ = self._entries[name]
        file = self.files[name]
        if file not in self._readers:
            self._readers[file] = self._stack.enter_context(open(file, "rb", buffering=0))
        short = lambda: InputError(f"{file}: tensor {name!r} is cut short; re-download the file")  # noqa: E731
        pread_into(self._readers[file].fileno(), view, start + offset, short)

    def get(self, name: str) -> torch.Tensor:
        import torch

        _, shape, start, end = self._entries[name]
        data = torch.empty(end - start, dtype=torch.uint8)
        self._read_into(name, 0, memoryview(data.numpy()))
        return data.view(self.dtype(name)).reshape(shape)

    def banded(self, name: str) -> Banded:
        """`get(name)` as bands of rows read on demand (quant_bands.stored_rows)."""
        return stored_rows(self.shape(name), self.dtype(name), partial(self._read_into, name))

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name in self.files:
            yield name, self.get(name)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> TensorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
