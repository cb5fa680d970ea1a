"""Greedy text generation with the checkpoint's own tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .errors import InputError
from .load import load
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
    try:
        tokenizer = load_tokenizer(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: no usable tokenizer files ({exc}); convert from a source that has them") from None
    model = load(path, dtype=dtype, device=device)
    ids = torch.tensor([tokenizer.encode(prompt)], device=device)
    out = model.generate(ids, max_new_tokens, eos_token_id=_eos_id(path, tokenizer))
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
