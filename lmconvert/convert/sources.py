"""Checkpoint formats on the way in.

Every format presents itself in transformers' layout: an HF config dict and tensors under HF
names. The family mapping takes it from there, so a new format is one reader registered in
FORMATS, and never a new code path through the families.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .canonical import copy_sidecars
from .errors import InputError

if TYPE_CHECKING:
    import torch


class TensorReader(Protocol):
    """Tensors by HF name, each read only when asked for."""

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def get(self, name: str) -> torch.Tensor: ...

    def where(self, name: str) -> Path: ...  # the file that holds the tensor, for error messages

    def close(self) -> None: ...


@dataclass
class Source:
    path: Path
    format: str
    config: dict[str, Any]
    tensors: TensorReader
    info: dict[str, Any] = field(default_factory=dict)  # recorded in lmconvert.json's "source"
    sidecars: Callable[[Path], list[str]] | None = None  # writes tokenizer/generation files into a dir

    def write_sidecars(self, directory: Path) -> list[str]:
        if self.sidecars is not None:
            return self.sidecars(directory)
        return copy_sidecars(self.path if self.path.is_dir() else self.path.parent, directory)

    def close(self) -> None:
        self.tensors.close()


def dtype_name(reader: TensorReader, name: str) -> str:
    """A tensor's dtype as safetensors names it: from the file where the reader knows it (no torch
    needed), else from the reader's torch dtype."""
    if hasattr(reader, "dtype_name"):
        return reader.dtype_name(name)
    from .dtypes import of_torch

    dtype = getattr(reader, "dtype", None)
    return of_torch(dtype(name) if dtype is not None else reader.get(name).dtype).name


def _is_hf_safetensors(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors*"))


def _open_hf_safetensors(path: Path) -> Source:
    from .hf_source import read_config
    from .safetensors_dir import TensorSource

    config = read_config(path)
    return Source(path, "hf-safetensors", config, TensorSource(path))


def _late(module: str, name: str) -> Callable[[Path], Any]:
    """A format module's function, imported on first call: those modules load torch (or gguf),
    which an HF safetensors conversion never needs."""
    def call(path: Path) -> Any:
        return getattr(import_module(f".formats.{module}", __package__), name)(path)
    return call


# (format name, detector, opener): the first detector that accepts the path wins
FORMATS: list[tuple[str, Callable[[Path], bool], Callable[[Path], Source]]] = [
    ("hf-safetensors", _is_hf_safetensors, _open_hf_safetensors),
    # after safetensors: preferred when a directory has both
    ("hf-bin", _late("torch_bin", "is_hf_bin"), _late("torch_bin", "open_hf_bin")),
    ("meta", _late("meta", "is_meta"), _late("meta", "open_meta")),
    ("gguf", _late("gguf", "is_gguf"), _late("gguf", "open_gguf")),  # a .gguf file, or a directory holding one
]


def open_source(path: Path) -> Source:
    if not path.exists():
        raise InputError(f"{path}: does not exist")
    for _, detect, opener in FORMATS:
        if detect(path):
            return opener(path)
    if path.is_dir() and (path / "config.json").is_file():
        raise InputError(f"{path}: has config.json but no weights in a supported format "
                         f"({', '.join(name for name, _, _ in FORMATS)})")
    raise InputError(f"{path}: not a checkpoint in a supported format ({', '.join(name for name, _, _ in FORMATS)}); "
                     "point at an HF directory with config.json and weights")
