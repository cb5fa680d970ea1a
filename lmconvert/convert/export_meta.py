"""A checkpoint (canonical, or any format in one step: exports.export_source) as Meta's original
LLaMA layout, planned as every export is (`plan_tensors`): the llama family's export plan to HF
names, then the inverses of Meta's tensor table (mappings/meta.py), the exact inverses of the import
transforms, so Meta -> canonical -> Meta gives back every tensor bit for bit. Ranks are written one
at a time: memory holds one rank's share plus one whole tensor, at the cost of reading the source
once per rank, each read checked against lmconvert.json's digests (in one step, where nothing
recorded them, against the first rank's reads). formats/meta_export.py writes the files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from math import prod
from pathlib import Path
from typing import Any

import torch

from lmconvert.arch import ArchConfig
from lmconvert.formats.atomic import atomic_directory, check_output
from lmconvert.formats.canonical import CanonicalMeta
from lmconvert.formats.checkpoint import Checkpoint, opened
from lmconvert.formats.digest import HASH, check_tensor, tensor_digest
from lmconvert.formats.errors import InputError
from lmconvert.formats.meta import TOKENIZER
from lmconvert.formats.meta_export import write_meta_files
from lmconvert.formats.source import TensorReader
from lmconvert.mappings import Family, MappingError, family_named
from lmconvert.mappings.meta import Layout, MetaLayoutError
from lmconvert.mappings.meta_params import hf_config, model_params, params_for

from .exports import Export, export_source
from .plan import plan_tensors


def _describes(previous: dict[str, Any], config: dict[str, Any], llama: Family, arch: ArchConfig) -> bool:
    """Whether the source's own params.json still describes the model (tying aside: Meta's format
    always stores output.weight), so it can be written back unchanged."""
    try:
        cfg = hf_config(model_params(previous), config["vocab_size"])
        cfg["max_position_embeddings"] = config["max_position_embeddings"]
        return replace(llama.arch_config(cfg), tie_embeddings=arch.tie_embeddings) == arch
    except (MetaLayoutError, MappingError, KeyError, TypeError):
        return False


def _params_and_layout(checkpoint: Checkpoint, meta: CanonicalMeta, shards: int) -> tuple[dict[str, Any], Layout]:
    """params.json (the source's own where it still describes the model) and Meta's tensor layout."""
    llama = family_named("llama")
    try:
        config = llama.hf_config(meta.arch, meta.family, meta.hf_extras)
        params = params_for(config)
    except (MappingError, MetaLayoutError) as exc:
        raise InputError(f"{checkpoint.path}: Meta's format holds plain LLaMA models only: {exc}") from None
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
    return params, layout


class _Hashing:
    """A reader that notes the digest of each tensor it reads: a one-step export's first rank, whose
    reads the next ranks' are checked against, as a canonical source's are against lmconvert.json."""

    def __init__(self, reader: TensorReader, digests: dict[str, str]) -> None:
        self.reader, self.digests = reader, digests

    def get(self, name: str) -> torch.Tensor:
        t = self.reader.get(name)
        self.digests.setdefault(name, tensor_digest(t))
        return t

    def __getattr__(self, attr: str) -> Any:  # noqa: ANN401 - names, shape, where... are the reader's
        return getattr(self.reader, attr)


def to_meta(src: Path | Checkpoint, out: Path, shards: int = 1, dtype: str | None = None, force: bool = False,
            progress: Callable[[int, int], None] | None = None, max_shard_bytes: int | None = None,
            allow_nonfinite: bool = False) -> dict[str, Any]:
    """Write a checkpoint (canonical, or any format in one step: `export_source`) as a Meta
    checkpoint with `shards` model-parallel ranks; returns params.json. `max_shard_bytes` is
    accepted and unused: Meta's files are one per rank, whatever their size."""
    with opened(src) as checkpoint:
        return _to_meta(export_source(checkpoint, "meta"), out, shards, dtype, force, progress, allow_nonfinite)


def _to_meta(export: Export, out: Path, shards: int, dtype: str | None, force: bool,
             progress: Callable[[int, int], None] | None, allow_nonfinite: bool) -> dict[str, Any]:
    checkpoint, meta = export.checkpoint, export.meta
    src = checkpoint.path
    params, layout = _params_and_layout(checkpoint, meta, shards)
    plan = family_named("llama").tensors.plan_export(export.tensors.names())  # {hf name: (canonical, transform)}
    if meta.arch.tie_embeddings:  # Meta's code always has its own output matrix
        plan.setdefault("lm_head.weight", plan["model.embed_tokens.weight"])
    entries = layout.entries()
    wanted = {hf for _, hf, _ in entries}
    if set(plan) != wanted:
        odd = sorted(set(plan) ^ wanted)
        raise InputError(f"{src}: its tensors do not fit Meta's layout ({', '.join(odd[:5])}); "
                         "export it with --to hf instead")
    check_output(out, force, (src,))
    items = [(hf, canonical, transform.inverse) for hf, (canonical, transform) in plan.items()]
    done = total = 0  # bytes
    first_reads: dict[str, str] = {}  # a one-step export's: what the first rank read

    def ranks() -> Iterator[dict[str, torch.Tensor]]:
        nonlocal done, total
        for rank in range(shards):
            # planned anew per rank: every read checked against lmconvert.json's digests (one step: against
            # the first rank's reads), and for NaN/Inf
            if export.digests is not None:
                reader, digests, algorithm = export.tensors, export.digests, meta.hash
            elif rank == 0:
                reader = _Hashing(export.tensors, first_reads) if shards > 1 else export.tensors
                digests, algorithm = None, HASH
            else:
                reader, digests, algorithm = export.tensors, first_reads, HASH
            planned = {p.name: p for p in plan_tensors(reader, items, dtype, allow_nonfinite, digests, algorithm,
                                                       read_before=export.direct)}
            if rank == 0:  # every rank writes a piece of each tensor (a norm: all of it) in the planned dtype
                total = shards * sum(planned[hf].nbytes // max(1, prod(layout.full_shape(rule)))
                                     * prod(layout.shard_shape(rule)) for _, hf, rule in entries)
            state: dict[str, torch.Tensor] = {}
            for meta_name, hf_name, rule in entries:
                item = planned[hf_name]
                tensor = item.produce()  # its source checked against its digest, and for NaN/Inf
                if item.raw is None and item.check is not None:  # a cast a finite source may not fit: pickled,
                    check_tensor(tensor, item.check)  # the Inf would stay
                piece = layout.transform(rule).inverse(tensor)[rank]
                state[meta_name] = piece.clone(memory_format=torch.contiguous_format)  # a view would save it all
                done += state[meta_name].nbytes
                if progress is not None:
                    progress(done, total)
            yield state

    with atomic_directory(out, force) as tmp, export.side_files(out) as side:
        write_meta_files(tmp, params, (side, meta) if TOKENIZER in meta.files else None, ranks())
    return params
