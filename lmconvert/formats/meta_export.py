"""Writing a canonical checkpoint in Meta's original LLaMA layout: params.json, one
consolidated.NN.pth per model-parallel rank, and tokenizer.model when the source had one.

Tensors take the llama family's export plan to HF names, then the inverses of Meta's tensor table
(mappings/meta.py), the exact inverses of the import transforms, so Meta -> canonical -> Meta
gives back every tensor bit for bit.
Ranks are written one at a time: memory holds one rank's share plus one whole tensor, at the cost
of reading the canonical shards once per rank.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

import torch

from lmconvert.arch import ArchConfig
from lmconvert.mappings import Family, MappingError, family_named
from lmconvert.mappings.meta import Layout, MetaLayoutError
from lmconvert.mappings.meta_params import hf_config, model_params, params_for

from .atomic import atomic_directory, check_output
from .canonical import CanonicalMeta, copy_listed
from .checkpoint import Checkpoint
from .digest import DigestCheck, FiniteCheck, check_tensor
from .dtypes import torch_dtype
from .errors import InputError
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


def _describes(previous: dict[str, Any], config: dict[str, Any], llama: Family, arch: ArchConfig) -> bool:
    """Whether the source's own params.json still describes the model (tying aside: Meta's format
    always stores output.weight), so it can be written back unchanged."""
    try:
        cfg = hf_config(model_params(previous), config["vocab_size"])
        cfg["max_position_embeddings"] = config["max_position_embeddings"]
        return replace(llama.arch_config(cfg), tie_embeddings=arch.tie_embeddings) == arch
    except (MetaLayoutError, MappingError, KeyError, TypeError):
        return False


def to_meta(checkpoint: Checkpoint, meta: CanonicalMeta, out: Path, shards: int = 1, dtype: str | None = None,
            force: bool = False, progress: Callable[[int, int], None] | None = None, max_shard_bytes: int | None = None,
            allow_nonfinite: bool = False) -> dict[str, Any]:
    """Write a canonical checkpoint as a Meta checkpoint with `shards` model-parallel ranks; returns params.json.
    `max_shard_bytes` is accepted and unused: Meta's files are one per rank, whatever their size."""
    src = checkpoint.path
    llama = family_named("llama")
    try:
        config = llama.hf_config(meta.arch, meta.family, meta.hf_extras)
        params = params_for(config)
    except (MappingError, MetaLayoutError) as exc:
        raise InputError(f"{src}: Meta's format holds plain LLaMA models only: {exc}") from None
    from_meta = meta.source.get("format") == "meta"
    previous = meta.source.get("meta_params") if from_meta else None
    if isinstance(previous, dict) and _describes(previous, config, llama, meta.arch):
        params = previous
    try:
        layout = Layout(dim=config["hidden_size"], n_layers=config["num_hidden_layers"],
                        n_heads=config["num_attention_heads"], n_kv_heads=config["num_key_value_heads"],
                        vocab_size=config["vocab_size"], hidden_dim=config["intermediate_size"], shards=shards,
                        embed_split=meta.source.get("meta_embedding_split", 0) if from_meta else 0)
    except MetaLayoutError as exc:
        raise InputError(f"--shards {shards}: {exc}; choose a shard count that divides the heads") from None
    plan = llama.tensors.plan_export(meta.tensors)  # {hf name: (canonical name, transform)}
    if meta.arch.tie_embeddings:  # Meta's code always has its own output matrix
        plan.setdefault("lm_head.weight", plan["model.embed_tokens.weight"])
    wanted = {hf for _, hf, _ in layout.entries()}
    if set(plan) != wanted:
        odd = sorted(set(plan) ^ wanted)
        raise InputError(f"{src}: its tensors do not fit Meta's layout ({', '.join(odd[:5])}); "
                         "export it with --to hf instead")
    check_output(out, force, (src,))
    total, done = len(wanted) * shards, 0
    source = checkpoint.source.tensors
    with atomic_directory(out, force) as tmp:
        for rank in range(shards):
            state: dict[str, torch.Tensor] = {}
            for meta_name, hf_name, rule in layout.entries():
                canonical, transform = plan[hf_name]
                raw = source.get(canonical)  # every read checked against lmconvert.json, NaN/Inf once
                where = source.where(canonical)
                finite = None if allow_nonfinite or rank > 0 else FiniteCheck(canonical, where)
                check_tensor(raw, finite, DigestCheck(canonical, where, meta.tensors[canonical], meta.hash))
                t = transform.inverse(raw)
                if dtype is not None:
                    t = t.to(torch_dtype(dtype))
                    if finite is not None:  # a finite source may not fit the type: torch.save would keep the Inf
                        check_tensor(t, replace(finite, written_as=dtype, remedy="choose --dtype float32 (or keep)"))
                piece = layout.transform(rule).inverse(t)[rank]
                state[meta_name] = piece.clone(memory_format=torch.contiguous_format)  # a view would save it all
                done += 1
                if progress is not None:
                    progress(done, total)
            save_pickle(state, tmp / f"consolidated.{rank:02d}.pth")
            del state
        (tmp / PARAMS).write_text(json.dumps(params, indent=2) + "\n")
        if TOKENIZER in meta.files:
            copy_listed(src, meta, TOKENIZER, tmp)
    return params
