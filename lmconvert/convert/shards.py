"""Writing tensors as sharded safetensors with an index, as transformers lays them out."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file

from .errors import InputError

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)?\s*", text.upper())
    if not match:
        raise InputError(f"--max-shard-size {text!r}: expected a size such as 5GB or 500MB")
    return int(float(match.group(1)) * _UNITS[match.group(2) or "B"])


def tensor_sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def write_shards(tensors: Iterable[tuple[str, torch.Tensor]], directory: Path, max_shard_bytes: int,
                 stem: str = "model") -> dict[str, str]:
    """Write shards of at most max_shard_bytes (a larger tensor gets a shard of its own) and,
    when there is more than one, the index. Returns {tensor name: sha256}."""
    hashes: dict[str, str] = {}
    written: list[tuple[Path, list[str]]] = []
    pending: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            path = directory / f".{stem}-part{len(written):05d}.safetensors"
            save_file(pending, str(path), metadata={"format": "pt"})
            written.append((path, list(pending)))
            pending, size = {}, 0

    for name, t in tensors:
        t = t.contiguous()
        hashes[name] = tensor_sha256(t)
        nbytes = tensor_bytes(t)
        if pending and size + nbytes > max_shard_bytes:
            flush()
        pending[name] = t
        size += nbytes
        total += nbytes
    flush()
    if len(written) == 1:
        os.replace(written[0][0], directory / f"{stem}.safetensors")
        return hashes
    weight_map = {}
    for i, (path, names) in enumerate(written, start=1):
        final = f"{stem}-{i:05d}-of-{len(written):05d}.safetensors"
        os.replace(path, directory / final)
        weight_map.update({name: final for name in names})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return hashes
