"""A checkpoint's tokenizer through transformers: tokenizer files in a directory, or the one
embedded in a GGUF file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "tokenizer.tiktoken")


def has_tokenizer(path: Path) -> bool:
    from .formats.gguf import gguf_file_of

    if path.is_dir() and any((path / name).is_file() for name in TOKENIZER_FILES):
        return True
    return gguf_file_of(path) is not None


def load_tokenizer(path: Path) -> Any:  # noqa: ANN401 - transformers' tokenizer classes
    from transformers import AutoTokenizer

    from .formats.gguf import gguf_file_of

    gguf = gguf_file_of(path)
    if gguf is not None:
        return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return AutoTokenizer.from_pretrained(str(path))
