"""Writing tensors as sharded safetensors, streamed: each tensor is produced, written and dropped.

The safetensors library has no incremental writer, so the header is written first from the
planned shapes and dtypes (the format is an 8-byte length, a JSON header and the raw bytes) and
each tensor's bytes follow as it is produced. Tests read every output back through safetensors.
Peak memory is the largest tensor, not the shard.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from pathlib import Path

import torch

from .errors import InputError
from .safetensors_dir import DTYPE_NAMES

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)?\s*", text.upper())
    if not match:
        raise InputError(f"--max-shard-size {text!r}: expected a size such as 5GB or 500MB")
    return int(float(match.group(1)) * _UNITS[match.group(2) or "B"])


def tensor_sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(_bytes(t)).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())


@dataclass(frozen=True)
class Planned:
    """A tensor to be written: its name, shape and dtype up front, its data on demand."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    produce: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def _group(planned: Sequence[Planned], max_bytes: int) -> list[list[Planned]]:
    groups: list[list[Planned]] = [[]]
    size = 0
    for p in planned:
        if groups[-1] and size + p.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += p.nbytes
    return groups


def write_safetensors(path: Path, planned: Sequence[Planned], metadata: dict[str, str] | None = None) -> dict[str, str]:
    """Write one safetensors file; returns {name: sha256 of the tensor's bytes}."""
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for p in planned:
        header[p.name] = {"dtype": DTYPE_NAMES[p.dtype], "shape": list(p.shape),
                          "data_offsets": [offset, offset + p.nbytes]}
        offset += p.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # safetensors aligns the data start to 8 bytes
    hashes = {}
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for p in planned:
            t = p.produce()
            if tuple(t.shape) != p.shape or t.dtype != p.dtype:
                raise RuntimeError(f"{p.name}: produced {t.dtype} {list(t.shape)}, planned {p.dtype} {list(p.shape)}")
            data = _bytes(t)
            hashes[p.name] = hashlib.sha256(data).hexdigest()
            f.write(data)
            del t, data
    return hashes


def write_shards(planned: Sequence[Planned], directory: Path, max_shard_bytes: int,
                 stem: str = "model") -> dict[str, str]:
    """Shards of at most max_shard_bytes (a larger tensor gets a shard of its own), named and
    indexed as transformers names them. Returns {tensor name: sha256}."""
    groups = _group(planned, max_shard_bytes)
    if len(groups) == 1:
        return write_safetensors(directory / f"{stem}.safetensors", groups[0])
    hashes, weight_map = {}, {}
    for i, group in enumerate(groups, start=1):
        file = f"{stem}-{i:05d}-of-{len(groups):05d}.safetensors"
        hashes.update(write_safetensors(directory / file, group))
        weight_map.update({p.name: file for p in group})
    total = sum(p.nbytes for p in planned)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return hashes
