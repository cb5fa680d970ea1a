"""Hugging Face's own layout: config.json beside safetensors shards (and their index)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .checkpoint_files import checkpoint_file
from .errors import InputError
from .jsonfile import read_json_object
from .quantized import quantized_view, reference_of
from .safetensors_dir import TensorSource
from .source import Source


def read_config(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory; point at a checkpoint directory")
    if not (directory / "config.json").is_file():
        raise InputError(f"{directory}: no config.json; point at an HF checkpoint or a canonical directory")
    return read_json_object(checkpoint_file(directory, "config.json"))


def is_hf_safetensors(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors*"))


def open_hf_safetensors(path: Path) -> Source:
    """A block-wise FP8 checkpoint's (weight, scale) pairs are read as one float tensor each (`fp8.py`)."""
    config = read_config(path)
    tensors = TensorSource(path)
    try:
        read, info = quantized_view(config, path / "config.json", tensors)
    except BaseException:
        tensors.close()
        raise
    return Source(path, "hf-safetensors", config, read, info=info, reference=reference_of(path, read))
