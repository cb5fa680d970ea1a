"""PyTorch pickles (`pytorch_model.bin`, sharded with `pytorch_model.bin.index.json`; Meta's `.pth`),
read without ever running code from the file.

A pickle can name any Python callable and have the loader call it. `torch.load(weights_only=True)`
unpickles with an allow-list of tensor and container types only, so a file that needs anything
else (a custom class, `os.system`) is refused before any of it runs; there is no fallback to
`weights_only=False`. `mmap=True` maps the zip-format file instead of reading it into memory, so
tensors are paged in only when a conversion touches them.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch

from .checkpoint_files import checkpoint_file
from .errors import InputError
from .hf import read_config
from .jsonfile import read_weight_map, shard_files
from .quantized import quantized_view, reference_of
from .source import Source

INDEX = "pytorch_model.bin.index.json"
SINGLE = "pytorch_model.bin"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """{name: tensor} from a pickled state dict, loaded only with weights_only=True."""
    try:
        try:
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            data = torch.load(path, map_location="cpu", weights_only=True)  # the legacy (non-zip) format
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if found:
            raise InputError(f"{path}: refusing to load: the pickle needs weights_only=False to build "
                             f"{found.group(1)}, which would run code from the file; re-save its tensors as "
                             "safetensors where you trust the file") from None
        raise InputError(f"{path}: not a readable PyTorch checkpoint ({_first_line(exc)}); re-download it") from None
    except Exception as exc:  # a corrupt pickle fails with whatever the unpickler trips on
        raise InputError(f"{path}: not a readable PyTorch checkpoint ({_first_line(exc)}); re-download it") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: holds a {type(data).__name__}, not a {{name: tensor}} state dict")
    odd = [str(k) for k, v in data.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if odd:
        raise InputError(f"{path}: entries {', '.join(odd[:5])} are not tensors; expected a flat {{name: tensor}} "
                         "state dict (a training checkpoint needs its model state extracted first)")
    return data


def bin_files(directory: Path) -> list[Path]:
    """The weight files: the index's shards, or the single file."""
    index = directory / INDEX
    if not index.is_file():
        return [checkpoint_file(directory, SINGLE)]
    return list(dict.fromkeys(shard_files(checkpoint_file(directory, INDEX)).values()))


class BinTensors:
    """Tensors of a `.bin` directory by name. Every shard is mapped at open, so the index is checked
    against what the files hold before anything is converted."""

    def __init__(self, directory: Path) -> None:
        self.files: dict[str, Path] = {}
        self._tensors: dict[str, torch.Tensor] = {}
        files = bin_files(directory)
        listed = self._listed(directory)
        for file in files:
            for name, tensor in load_weights(file).items():
                if name in self.files:
                    raise InputError(f"{file}: tensor {name!r} is also in {self.files[name].name}; keep one copy")
                if listed is not None and listed.get(name) != file.name:
                    raise InputError(f"{file}: holds tensor {name!r}, which {INDEX} does not list in this file")
                self.files[name], self._tensors[name] = file, tensor
        missing = sorted(set(listed or ()) - set(self.files))
        if missing:
            raise InputError(f"{directory / INDEX}: lists tensor(s) no shard holds: {', '.join(missing[:5])}")

    @staticmethod
    def _listed(directory: Path) -> dict[str, str] | None:
        index = directory / INDEX
        return read_weight_map(checkpoint_file(directory, INDEX)) if index.is_file() else None

    def names(self) -> list[str]:
        return list(self.files)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self._tensors[name].dtype

    def get(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def where(self, name: str) -> Path:
        return self.files[name]

    def close(self) -> None:
        self._tensors.clear()


def is_hf_bin(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and \
        ((path / SINGLE).is_file() or (path / INDEX).is_file())


def open_hf_bin(path: Path) -> Source:
    config = read_config(path)
    tensors, info = quantized_view(config, path / "config.json", BinTensors(path))
    return Source(path, "hf-bin", config, tensors, info=info, reference=reference_of(path, tensors))
