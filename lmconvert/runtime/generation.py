"""Greedy text generation with the checkpoint's own tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.formats.dtypes import parse_dtype
from lmconvert.formats.errors import InputError

from .load import load_checkpoint
from .tokenizer import load_tokenizer


def _eos_id(path: Path, tokenizer: object) -> int | None:
    gen = path / "generation_config.json" if path.is_dir() else path.parent / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if isinstance(eos, int):
            return eos
    return getattr(tokenizer, "eos_token_id", None)


def generate(path: Path, prompt: str, max_new_tokens: int, dtype: str | None = None, device: str = "cpu") -> str:
    with open_checkpoint(path) as checkpoint:
        if checkpoint.tokenizer is None:
            raise InputError(f"{path}: has no tokenizer files; convert from a source that has them")
        try:
            tokenizer = load_tokenizer(checkpoint.tokenizer)
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: no usable tokenizer files ({exc}); convert from a source that has them") \
                from None
        model = load_checkpoint(checkpoint, parse_dtype(dtype), device)
    ids = torch.tensor([tokenizer.encode(prompt)], device=device)
    out = model.generate(ids, max_new_tokens, eos_token_id=_eos_id(path, tokenizer))
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
