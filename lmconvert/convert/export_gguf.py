"""The canonical checkpoint -> one llama.cpp GGUF file (`convert --to gguf`), streamed into an
atomic output.

The metadata and the tensor names come from the same tables GGUF import reads, run backwards
(mappings/gguf_export.py, mappings/gguf.py). Before anything is written, the metadata is read back
the way import reads it, and the model it describes must be the checkpoint's, field for field:
what llama.cpp's architecture cannot hold is refused by name rather than written wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmconvert.arch.shapes import parameter_shapes
from lmconvert.formats.atomic import atomic_directory, atomic_file, check_output
from lmconvert.formats.checkpoint import Checkpoint, opened
from lmconvert.formats.digest import FiniteCheck
from lmconvert.formats.errors import InputError
from lmconvert.formats.gguf_tokenizer import tokenizer_values
from lmconvert.formats.gguf_writer import (
    DEFAULT_QUANT,
    FILE_TYPES,
    HUB_SCHEME,
    SOURCE_KEY,
    WRITTEN_BY,
    GgufTensor,
    parse_quant,
    tensor_type,
    write_gguf,
    written_by_lmconvert,
)
from lmconvert.mappings import MappingError, family_for, family_named
from lmconvert.mappings.gguf.export import GgufModel, for_tensors, lost, metadata, read_back
from lmconvert.mappings.gguf.loaders import forced_type, refused_tensors
from lmconvert.mappings.tables.gguf import tensor_sizes
from lmconvert.mappings.tables.table import out_shape

from .exports import canonical_meta
from .plan import Progress, plan_tensors


def _checked_metadata(model: GgufModel, ckpt: Checkpoint, shapes: dict[str, tuple[int, ...]]) -> GgufModel:
    """The metadata, once import reads it back as this very model."""
    back_config, _ = read_back(model, shapes)
    back = family_for(back_config["model_type"]).arch_config(back_config)
    missing = lost(ckpt.arch, back)
    if missing:
        raise MappingError(f"llama.cpp's {model.arch} metadata cannot express this model's "
                           f"{', '.join(missing)}; export it as HF safetensors instead")
    return model


def model_name(source: dict[str, Any], path: Path) -> str:
    """`general.name`: a pulled model's repo name (its folder in the HF cache is a commit sha), else
    the name of the folder it was converted from."""
    if isinstance(source.get("repo"), str):
        return source["repo"].rstrip("/").rsplit("/", 1)[-1]
    return Path(source.get("path") or path).name


def source_record(source: dict[str, Any], local: bool) -> str | None:
    """What a GGUF export says of its source: `hf://REPO@SHA` for a pulled one, which names nothing
    of this machine; the absolute local path only when asked (`--record-source`); else nothing."""
    if isinstance(source.get("repo"), str) and isinstance(source.get("revision"), str):
        return f"{HUB_SCHEME}{source['repo']}@{source['revision']}"
    if local and source.get("path"):
        return str(Path(source["path"]).resolve())
    return None


def to_gguf(src: Path | Checkpoint, out: Path, family: str | None = None, quant: str = DEFAULT_QUANT,
            gguf_pre: str | None = None, force: bool = False, progress: Progress | None = None,
            allow_nonfinite: bool = False, max_shard_bytes: int | None = None, record_source: bool = False,
            **_: Any) -> dict[str, Any]:
    """Write a canonical checkpoint as one GGUF file, its tokenizer in the metadata; returns the
    metadata written. `gguf_pre` names llama.cpp's pre-tokenizer for a BPE tokenizer it does
    not recognise. With `max_shard_bytes`, OUT is a directory of llama.cpp's split files
    (`OUT/NAME-00001-of-0000N.gguf`, NAME being OUT's), appearing whole as every output does. The
    source is recorded (`lmconvert.source`, for `verify OUT.gguf`) as its Hub repo and revision when
    it was pulled; a local path only with `record_source`: users share these files."""
    kind = parse_quant(quant)
    with opened(src) as ckpt:
        meta = canonical_meta(ckpt, "gguf")
        target = family_named(family or meta.family)
        try:
            config = target.hf_config(meta.arch, meta.family, meta.hf_extras)
            name = model_name(meta.source, ckpt.path)
            model = for_tensors(metadata(config, name), ckpt.source.tensors.names())
            table = model.entry.tensors
            canonical = parameter_shapes(meta.arch)
            arch = meta.arch
            sizes = {**tensor_sizes({"num_attention_heads": arch.n_heads, "num_key_value_heads": arch.n_kv_heads,
                                     "head_dim": arch.head_dim, "hidden_size": arch.d_model,
                                     "intermediate_size": arch.d_ff, "vocab_size": arch.vocab_size}),
                     "rows": meta.arch.vocab_size}
            homeless = [n for n in ckpt.source.tensors.names() if not table.stored_names(n)]
            if homeless:  # a dense layer in a mixture llama.cpp makes all experts, say
                raise MappingError(f"llama.cpp's {model.arch} architecture has no tensor for "
                                   f"{', '.join(homeless[:3])}{' ...' if len(homeless) > 3 else ''}; "
                                   "export it as HF safetensors instead")
            plan = table.plan_export(ckpt.source.tensors.names(), sizes)
            shapes = {name: out_shape(t.inverse, [canonical[s] for s in src_name] if isinstance(src_name, tuple)
                                      else canonical[src_name]) for name, (src_name, t) in plan.items()}
            refusal = refused_tensors(model.arch, shapes)
            if refusal:
                raise MappingError(f"llama.cpp's {model.arch} architecture {refusal}; "
                                   "export it as HF safetensors instead")
            model = _checked_metadata(model, ckpt, shapes)
        except MappingError as exc:
            raise InputError(f"--to gguf: {exc}") from None
        check_output(out, force, (ckpt.path,), ours=None if max_shard_bytes else written_by_lmconvert)
        tokenizer = tokenizer_values(ckpt.tokenizer.where if ckpt.tokenizer else None, meta.arch.vocab_size, gguf_pre)
        items = [(name, src_name, t.inverse) for name, (src_name, t) in plan.items()]
        planned = plan_tensors(ckpt.source.tensors, items, None, allow_nonfinite, meta.tensors, meta.hash)
        tensors = []
        for p in planned:
            written_as = tensor_type(p.shape, forced_type(p.name, kind) or kind)
            src_name = plan[p.name][0]
            first = src_name[0] if isinstance(src_name, tuple) else src_name
            check = None if allow_nonfinite else FiniteCheck(first, ckpt.source.tensors.where(first), written_as,
                                                                 "choose another --quant (f32, bf16)")
            tensors.append(GgufTensor(p.name, p.shape, written_as, p.produce, check))
        tensors += [GgufTensor(name, tuple(t.shape), "F32", lambda t=t: t) for name, t in model.extra.items()]
        values = {**model.values, **tokenizer, "general.file_type": FILE_TYPES[kind],
                  "general.quantization_version": 2, WRITTEN_BY: "lmconvert"}
        recorded = source_record(meta.source, record_source)
        if recorded:
            values[SOURCE_KEY] = recorded
        if max_shard_bytes:
            with atomic_directory(out, force) as tmp:
                write_gguf(tmp / f"{out.name}.gguf", model.arch, values, tensors, progress, max_shard_bytes)
        else:
            with atomic_file(out, force, written_by_lmconvert) as tmp:
                write_gguf(tmp, model.arch, values, tensors, progress)
    return values
