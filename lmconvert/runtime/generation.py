"""Greedy text generation with the checkpoint's own tokenizer.

What is asked is checked before the model is loaded: the prompt's tokens must fit the model's
positions (max_positions) with room for --max-new-tokens, and their KV cache must fit in memory.
An empty prompt starts from the tokenizer's BOS token, as transformers' generate does with no
input; a tokenizer without one cannot start, and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lmconvert.arch import ArchConfig
from lmconvert.formats import schema
from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.formats.dtypes import parse_dtype
from lmconvert.formats.errors import InputError
from lmconvert.formats.jsonfile import read_json_object

from .load import load_checkpoint
from .memory import available_memory, size_text
from .tokenizer import load_tokenizer

TOKEN_ID = schema.Nullable(schema.Either((schema.COUNT, schema.Array(schema.COUNT))))
GENERATION_CONFIG = schema.Object(optional={"eos_token_id": TOKEN_ID, "bos_token_id": TOKEN_ID})


def _eos_ids(path: Path, tokenizer: Any) -> list[int]:  # noqa: ANN401 - transformers' tokenizer classes
    """Every EOS id the generation config names (transformers stops on any of them), else the tokenizer's."""
    gen = path / "generation_config.json" if path.is_dir() else path.parent / "generation_config.json"
    if gen.is_file():
        config = read_json_object(gen, "generation config")
        schema.validate(config, GENERATION_CONFIG, str(gen), "fix or delete it")
        eos = config.get("eos_token_id")
        if eos is not None and eos != []:
            return eos if isinstance(eos, list) else [eos]
    eos = getattr(tokenizer, "eos_token_id", None)
    return [] if eos is None else [eos]


def prompt_ids(tokenizer: Any, prompt: str, arch: ArchConfig, max_new_tokens: int,  # noqa: ANN401
               itemsize: int) -> list[int]:
    """The prompt's token ids, once they and the tokens to come fit the model and the memory."""
    ids = list(tokenizer.encode(prompt))
    if not ids:
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is None:
            raise InputError(f"--prompt {prompt!r}: gives no tokens, and the tokenizer has no BOS token to start "
                             "from; give a prompt")
        ids = [bos]
    if max(ids) >= arch.vocab_size:
        raise InputError(f"--prompt: the tokenizer gives token id {max(ids)}, outside the model's vocabulary of "
                         f"{arch.vocab_size}; the tokenizer belongs to another model")
    if len(ids) > arch.max_positions:
        raise InputError(f"--prompt: {len(ids)} tokens, more than the model's max_positions {arch.max_positions}; "
                         "shorten it")
    room = arch.max_positions - len(ids)
    if max_new_tokens > room:
        raise InputError(f"--max-new-tokens {max_new_tokens}: the prompt's {len(ids)} tokens leave room for at most "
                         f"{room} within the model's max_positions {arch.max_positions}; lower it")
    cache = (len(ids) + max_new_tokens) * arch.kv_cache_bytes_per_token(itemsize)
    available = available_memory()
    if available is not None and cache > available:
        raise InputError(f"--max-new-tokens {max_new_tokens}: the KV cache for {len(ids) + max_new_tokens} tokens "
                         f"needs {size_text(cache)}, more than the {size_text(available)} available; lower it")
    return ids


def generate(path: Path, prompt: str, max_new_tokens: int, dtype: str | None = None, device: str = "cpu") -> str:
    with open_checkpoint(path) as checkpoint:
        if checkpoint.tokenizer is None:
            raise InputError(f"{path}: has no tokenizer files; convert from a source that has them")
        tokenizer = load_tokenizer(checkpoint.tokenizer)
        eos = _eos_ids(path, tokenizer)
        torch_dtype = parse_dtype(dtype)
        itemsize = torch.empty((), dtype=torch_dtype).element_size() if torch_dtype else 4
        ids = torch.tensor([prompt_ids(tokenizer, prompt, checkpoint.arch, max_new_tokens, itemsize)], device=device)
        model = load_checkpoint(checkpoint, torch_dtype, device)
    out = model.generate(ids, max_new_tokens, eos_token_id=eos)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
