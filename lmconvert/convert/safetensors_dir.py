"""Reading a directory of safetensors weights, single file or sharded with an index, lazily."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .errors import InputError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); re-download or fix the file") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


def shard_map(directory: Path) -> dict[str, Path]:
    """{tensor name: shard file} from the index, or from the single file."""
    index = directory / INDEX
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise InputError(f"{index}: has no 'weight_map' object")
        out = {}
        for name, file in weight_map.items():
            if not isinstance(file, str) or Path(file).is_absolute() or ".." in Path(file).parts or "/" in file:
                raise InputError(f"{index}: weight_map entry {name!r} -> {file!r} is not a plain file name; "
                                 "refusing to follow it")
            shard = directory / file
            if not shard.is_file():
                raise InputError(f"{index}: tensor {name!r} is listed in {file}, which does not exist")
            out[name] = shard
        return out
    single = directory / SINGLE
    if single.is_file():
        with _open(single) as f:
            return {name: single for name in f.keys()}
    raise InputError(f"{directory}: no {SINGLE} or {INDEX}; point at a directory with safetensors weights")


def _open(path: Path):  # noqa: ANN202 - safetensors' handle type is private
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as exc:
        raise InputError(f"{path}: not a readable safetensors file ({exc})") from None


class TensorSource:
    """Tensors of a safetensors directory by name, each read only when asked for."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files = shard_map(directory)
        self._stack = ExitStack()
        self._handles: dict[Path, object] = {}
        by_file: dict[Path, set[str]] = {}
        for name, file in self.files.items():
            by_file.setdefault(file, set()).add(name)
        for file, names in by_file.items():
            present = set(self._handle(file).keys())
            missing = sorted(names - present)
            if missing:
                raise InputError(f"{file}: lacks tensor(s) the index lists: {', '.join(missing[:5])}")
            unlisted = sorted(present - names) if len(by_file) > 1 or (directory / INDEX).exists() else []
            if unlisted:
                raise InputError(f"{file}: holds tensor(s) the index does not list: {', '.join(unlisted[:5])}")

    def _handle(self, file: Path):  # noqa: ANN202
        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(_open(file))
        return self._handles[file]

    def names(self) -> list[str]:
        return list(self.files)

    def where(self, name: str) -> Path:
        return self.files[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self.files[name]).get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        try:
            return self._handle(self.files[name]).get_tensor(name)
        except SafetensorError as exc:
            raise InputError(f"{self.files[name]}: tensor {name!r} cannot be read ({exc})") from None

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name in self.files:
            yield name, self.get(name)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> TensorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
