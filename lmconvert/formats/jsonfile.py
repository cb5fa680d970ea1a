"""Sharded-checkpoint indexes (`*.index.json`): one reader for safetensors, `.bin` and downloads.

An index is untrusted input that names files, so every entry must be a plain file name in the
same directory: `../`, absolute and nested paths are refused, never followed, and so is a shard
that is a symlink out of the checkpoint (checkpoint_files.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .checkpoint_files import inside, plain_name
from .errors import InputError


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"key(s) listed twice: {', '.join(repeated[:5])}")
    return dict(pairs)


def read_json_object(path: Path, what: str = "file") -> dict[str, Any]:
    """A JSON object from `path`, refusing keys listed twice (json would keep the last)."""
    try:
        data = json.loads(path.read_text(), object_pairs_hook=_no_duplicates)
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise InputError(f"{path}: not valid JSON ({exc}); re-download or fix the file") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def read_weight_map(index: Path) -> dict[str, str]:
    """{tensor name: shard file name}, every file name checked to be plain."""
    weight_map = read_json_object(index, "index").get("weight_map")
    if not isinstance(weight_map, dict):
        raise InputError(f"{index}: has no 'weight_map' object")
    for name, file in weight_map.items():
        if not plain_name(file):
            raise InputError(f"{index}: weight_map entry {name!r} -> {file!r} is not a plain file name; "
                             "refusing to follow it")
    return weight_map


def shard_files(index: Path) -> dict[str, Path]:
    """{tensor name: existing shard path} for an index on disk."""
    out = {}
    for name, file in read_weight_map(index).items():
        shard = inside(index.parent, index.parent / file)
        if not shard.is_file():
            raise InputError(f"{index}: tensor {name!r} is listed in {file}, which does not exist")
        out[name] = shard
    return out
