"""Meta's original LLaMA files on disk: one consolidated.NN.pth per model-parallel rank (a torch
pickle), params.json, and tokenizer.model when the source had one. What goes into them is planned
by convert/export_meta.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import torch

from .canonical import CanonicalMeta, copy_listed
from .meta import PARAMS, TOKENIZER


class _Writes:
    """A file torch.save writes through, keeping the first OSError: torch turns a failed write (a
    full disk) into a RuntimeError that names neither the file nor the cause."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self.file.flush()


def save_pickle(state: dict[str, torch.Tensor], path: Path) -> None:
    """torch.save, whose failed writes raise the OSError behind them (the output is then rolled
    back and the run exits 2); any other failure stays what it is, a bug."""
    with open(path, "wb") as file:
        writes = _Writes(file)
        try:
            torch.save(state, writes)
        except RuntimeError:
            if writes.error is not None:
                raise writes.error from None
            raise


def write_meta_files(directory: Path, params: dict[str, Any], tokenizer_from: tuple[Path, CanonicalMeta] | None,
                     ranks: Iterator[dict[str, torch.Tensor]]) -> None:
    """Each rank's state as it comes (one rank in memory at a time), then params.json and the tokenizer."""
    for rank, state in enumerate(ranks):
        save_pickle(state, directory / f"consolidated.{rank:02d}.pth")
        del state
    (directory / PARAMS).write_text(json.dumps(params, indent=2) + "\n")
    if tokenizer_from is not None:
        copy_listed(tokenizer_from[0], tokenizer_from[1], TOKENIZER, directory)
