"""A checkpoint -> one llama.cpp GGUF file (`convert --to gguf`, or OUT.gguf), streamed into an
atomic output: from a canonical checkpoint, or from any other format in one step, through the
canonical plan without the canonical copy (exports.export_source).

The metadata and the tensor names come from the same tables GGUF import reads, run backwards
(mappings/gguf_export.py, mappings/gguf.py). Before anything is written, the metadata is read back
the way import reads it, and the model it describes must be the checkpoint's, field for field:
what llama.cpp's architecture cannot hold is refused by name rather than written wrong.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import fields
from functools import partial
from math import prod
from pathlib import Path
from typing import Any

from lmconvert.arch.shapes import parameter_shapes
from lmconvert.formats import mxfp4
from lmconvert.formats.atomic import atomic_directory, atomic_file, check_output
from lmconvert.formats.checkpoint import Checkpoint, opened
from lmconvert.formats.digest import FiniteCheck
from lmconvert.formats.errors import InputError
from lmconvert.formats.gguf_quant_mix import MIXES, QuantModel, file_type, mix_types, pure_types
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
from lmconvert.formats.kquants import ENCODERS as K_TYPES
from lmconvert.formats.quantized import KeptWeight, kept_digests, kept_weights
from lmconvert.mappings import MappingError, family_for, family_named
from lmconvert.mappings.family import tensor_sizes as family_tensor_sizes
from lmconvert.mappings.gguf.export import (
    EXPORTS,
    GgufModel,
    family_tokens,
    for_tensors,
    lost,
    metadata,
    named,
    read_back,
)
from lmconvert.mappings.gguf.loaders import forced_type, refused_tensors
from lmconvert.mappings.tables.gguf import tensor_sizes
from lmconvert.mappings.tables.table import IDENTITY, out_shape

from .exports import Export, export_source
from .plan import Progress, plan_tensors


def _checked_metadata(model: GgufModel, ckpt: Checkpoint, shapes: dict[str, tuple[int, ...]],
                      config: dict[str, Any]) -> GgufModel:
    """The metadata, once import reads it back as this very model (`config`, its HF config), but for the
    multipliers folded into the weights (GgufArch.folded), read back as the values folding leaves."""
    back_config, _ = read_back(model, shapes)
    family = family_for(back_config["model_type"])
    ours = family.arch_config({**config, **model.entry.folded}) if model.entry.folded else ckpt.arch
    missing = lost(ours, family.arch_config(back_config))
    if missing:
        raise MappingError(f"llama.cpp's {model.arch} metadata cannot express this model's "
                           f"{', '.join(missing)}; export it as HF safetensors instead")
    return model


def model_name(source: dict[str, Any], path: Path) -> str:
    """A pulled model's repo name (its folder in the HF cache is a commit sha), else the name of the
    folder it was converted from."""
    if isinstance(source.get("repo"), str):
        return source["repo"].rstrip("/").rsplit("/", 1)[-1]
    return Path(source.get("path") or path).name


def parameter_count(shapes: dict[str, tuple[int, ...]]) -> tuple[int, int, int, int]:
    """gguf's own count of the tensors written (total, shared, per expert, experts), as llama.cpp's
    converter counts them for `general.size_label`."""
    import gguf
    import numpy as np

    scratch = gguf.GGUFWriter(None, "scratch")
    for name, shape in shapes.items():
        scratch.add_tensor_info(name, shape, np.dtype(np.float32), prod(shape) * 4)
    return scratch.get_total_parameter_count()


def general_values(source: dict[str, Any], path: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The `general.` keys llama.cpp's converter writes, by gguf's own `Metadata`: what the source
    folder's model card (README.md), config.json and generation_config.json say, else what its name
    says (the name, in title case, the base name, size label, fine-tune, version), the size label
    counted from the tensors, `general.type` "model". A pulled model is named by its repo id (its
    folder is a commit sha), as llama.cpp's converter names a model it fetches; a source folder gone
    since its conversion leaves its name and the canonical copy of its generation_config.json."""
    import gguf

    from lmconvert.formats.gguf_tokenizer import typed_values

    total, shared, expert, experts = parameter_count(shapes)
    folder = Path(source.get("path") or path)
    meta = gguf.Metadata.load(None, folder, None, total)
    if not folder.is_dir():
        copy = gguf.Metadata.load(None, path, None, total)
        for f in fields(meta):
            if f.name.startswith("sampling_"):
                setattr(meta, f.name, getattr(copy, f.name))
    if isinstance(source.get("repo"), str):
        by_id = gguf.Metadata.apply_metadata_heuristic(gguf.Metadata(), None, {"_name_or_path": source["repo"]},
                                                       None, total)
        for key in ("name", "organization", "basename", "finetune", "version", "size_label"):
            setattr(meta, key, getattr(by_id, key) or getattr(meta, key))
    meta.name = meta.name or model_name(source, path)
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, experts)

    def fill(writer: Any) -> None:  # noqa: ANN401 - gguf's writer
        writer.add_type(gguf.GGUFType.MODEL)
        meta.set_gguf_meta_model(writer)
    return typed_values(fill)


def source_record(source: dict[str, Any], local: bool) -> str | None:
    """What a GGUF export says of its source: `hf://REPO@SHA` for a pulled one, which names nothing
    of this machine; the absolute local path only when asked (`--record-source`); else nothing."""
    if isinstance(source.get("repo"), str) and isinstance(source.get("revision"), str):
        return f"{HUB_SCHEME}{source['repo']}@{source['revision']}"
    if local and source.get("path"):
        return str(Path(source["path"]).resolve())
    return None


def _tokenizer(export: Export, side: Path, pre: str | None, own: str) -> dict[str, Any]:
    """The tokenizer's GGUF metadata (`own`: the architecture's own writer); from a one-step export's side files,
    whose errors name the source (they were rebuilt in a temporary) rather than the temporary."""
    ckpt = export.checkpoint
    if not export.direct:
        return tokenizer_values(ckpt.tokenizer.where if ckpt.tokenizer else None, export.meta.arch.vocab_size, pre,
                                own)
    try:
        return tokenizer_values(side, export.meta.arch.vocab_size, pre, own)
    except InputError as exc:
        raise InputError(str(exc).replace(f"{side}{os.sep}", f"{ckpt.path}: its tokenizer as converted, ")) from None


def _kept_mxfp4(export: Export, plan: dict[str, Any], kind: str) -> tuple[Any, list[Any], dict[str, KeptWeight]]:
    """The plan's (GGUF name, source, function) items and the reader they read; with --quant mxfp4,
    an MXFP4 source's weights (gpt-oss's experts) are kept as they are, each as two items, its blocks
    and its scales stacked as GGUF stacks the experts (keyed by the blocks' item, in `whole`), and
    written as GGML's MXFP4 bit for bit (`mxfp4.ggml_blocks`). Any other weight is dequantized, then
    quantized as the rest."""
    items = [(name, src, t) for name, (src, t) in plan.items()]
    if kind != "MXFP4":
        return export.tensors, [(name, src, t.inverse) for name, src, t in items], {}

    def refusal(name: str) -> str:
        return (f"--quant mxfp4: tensor {name!r} is MXFP4, but llama.cpp's layout moves its inputs, so its blocks "
                "cannot be kept as they are; choose another --quant to requantize it")

    reader, grouped = kept_weights(export.tensors, items, "inverse", False, refusal,
                                   keep=lambda scheme: scheme is mxfp4.MXFP4)
    flat, whole = [], {}
    for one in grouped:
        if isinstance(one, KeptWeight):
            whole[one.parts["blocks"]] = one
            flat += [(key, key, IDENTITY.forward) for key in (one.parts["blocks"], one.parts["scales"])]
        else:
            flat.append(one)
    return reader, flat, whole


def _shape(blocks: tuple[int, ...]) -> tuple[int, ...]:
    """A kept MXFP4 weight's shape, [..., rows, inputs], from its blocks' [..., rows, groups, 16]."""
    return (*blocks[:-2], blocks[-2] * 2 * mxfp4.GROUP_BYTES)


def _ggml_mxfp4(blocks: Any, scales: Any) -> Any:  # noqa: ANN401 - tensors
    return mxfp4.ggml_blocks(blocks(), scales())


def _bands(reader: Any, src: str | tuple[str, ...], fn: Any, digests: Any) -> Any:  # noqa: ANN401
    """What reads a planned tensor as bands of rows (`GgufTensor.bands`): a source tensor written
    unchanged, whose reader reads it a band at a time (an F32 GGUF's, a safetensors file's), unless
    its digest is to be checked (a canonical checkpoint's: hashed whole, as read); else None."""
    banded = getattr(reader, "banded", None)
    if banded is None or not isinstance(src, str) or fn is not IDENTITY.forward or (digests and src in digests):
        return None
    return partial(banded, src)


def _written_types(kind: str, mix: str | None, model: GgufModel,
                   written: list[tuple[str, tuple[int, ...]]]) -> dict[str, str]:
    """Each tensor's GGML type. A mix, or a K type (which only llama-quantize writes, with --pure),
    as llama-quantize chooses them from the float32 file of these tensors and metadata (every tensor
    counts: its extras too); any other type as llama.cpp's converter writes it (`forced_type`, 1-D
    tensors in F32, a row the blocks do not divide in F16)."""
    if mix is None and kind not in K_TYPES:
        return {name: tensor_type(shape, forced_type(name, kind) or kind) for name, shape in written}
    extra = [(name, tuple(t.shape)) for name, t in model.extra.items()]
    listing = [(name, shape, "F32") for name, shape in [*written, *extra]]
    quant = QuantModel.from_metadata(model.arch, model.values)
    chosen = mix_types(mix, quant, listing) if mix else pure_types(kind, quant, listing)
    return {name: chosen_type for (name, _, _), chosen_type in zip(listing, chosen, strict=True)}


def to_gguf(src: Path | Checkpoint, out: Path, family: str | None = None, quant: str = DEFAULT_QUANT,
            gguf_pre: str | None = None, force: bool = False, progress: Progress | None = None,
            allow_nonfinite: bool = False, max_shard_bytes: int | None = None, record_source: bool = False,
            **_: Any) -> dict[str, Any]:
    """Write a checkpoint (canonical, or any format: `export_source`) as one GGUF file, its tokenizer
    in the metadata (a one-step export's as the canonical copy would hold it); returns the
    metadata written. `gguf_pre` names llama.cpp's pre-tokenizer for a BPE tokenizer it does
    not recognise. With `max_shard_bytes`, OUT is a directory of llama.cpp's split files
    (`OUT/NAME-00001-of-0000N.gguf`, NAME being OUT's), appearing whole as every output does. The
    source is recorded (`lmconvert.source`, for `verify OUT.gguf`) as its Hub repo and revision when
    it was pulled; a local path only with `record_source`: users share these files."""
    kind = parse_quant(quant)
    mix = quant.lower() if quant.lower() in MIXES else None
    with opened(src) as ckpt, ExitStack() as stack:
        export = export_source(ckpt, "gguf")
        meta, names = export.meta, export.tensors.names()
        target = family_named(family or meta.family)
        if export.direct:  # the side files first (the tokenizer as the canonical copy would hold it): checked first
            check_output(out, force, (ckpt.path,), ours=None if max_shard_bytes else written_by_lmconvert)
        side = stack.enter_context(export.side_files(out))
        try:
            config = target.hf_config(meta.arch, meta.family, meta.hf_extras)
            own = EXPORTS[config["model_type"]][1].tokenizer if config.get("model_type") in EXPORTS else ""
            tokenizer = _tokenizer(export, side, gguf_pre, own)
            name = model_name(meta.source, ckpt.path)
            model = for_tensors(metadata(config, name, "tokenizer.ggml.tokens" in tokenizer), names)
            table = model.entry.tensors_for(config)
            canonical = parameter_shapes(meta.arch)
            arch = meta.arch
            latent = arch.attention_settings if arch.attention == "latent" else None
            sizes = {**tensor_sizes({"num_attention_heads": arch.n_heads, "num_key_value_heads": arch.n_kv_heads,
                                     "head_dim": arch.head_dim, "hidden_size": arch.d_model,
                                     "intermediate_size": arch.d_ff, "vocab_size": arch.vocab_size,
                                     "shared_intermediate_size": arch.moe and arch.moe.d_shared,
                                     # MLA's per-head kv_b parts, where a layout splits kv_b (Kimi's attn_k_b, attn_v_b)
                                     **({"qk_nope_head_dim": latent.qk_nope_head_dim, "v_head_dim": latent.v_head_dim}
                                        if latent is not None else {})}),
                     **{k: v for k, v in family_tensor_sizes(arch).items() if k.startswith("mixer.")},  # a mixer's
                     "rows": meta.arch.vocab_size}
            homeless = [n for n in names if not table.stored_names(n)]
            if homeless:  # a dense layer in a mixture llama.cpp makes all experts, say
                raise MappingError(f"llama.cpp's {model.arch} architecture has no tensor for "
                                   f"{', '.join(homeless[:3])}{' ...' if len(homeless) > 3 else ''}; "
                                   "export it as HF safetensors instead")
            plan = table.plan_export(names, sizes)
            shapes = {name: out_shape(t.inverse, [canonical[s] for s in src_name] if isinstance(src_name, tuple)
                                      else canonical[src_name]) for name, (src_name, t) in plan.items()}
            refusal = refused_tensors(model.arch, shapes)
            if refusal:
                raise MappingError(f"llama.cpp's {model.arch} architecture {refusal}; "
                                   "export it as HF safetensors instead")
            general = general_values(meta.source, side, {**shapes, **{n: tuple(t.shape)
                                                                           for n, t in model.extra.items()}})
            general["general.name"] = named(model.entry, model.arch, general["general.name"].value)
            model.values.update(general)
            model = _checked_metadata(model, ckpt, shapes, config)
        except MappingError as exc:
            raise InputError(f"--to gguf: {exc}") from None
        if not export.direct:
            check_output(out, force, (ckpt.path,), ours=None if max_shard_bytes else written_by_lmconvert)
        reader, items, whole = _kept_mxfp4(export, plan, kind)
        skipped = {w.parts["scales"] for w in whole.values()}
        digests = (export.digests if reader is export.tensors
                   else kept_digests(None if export.direct else meta.tensors, reader, meta.hash))
        planned = plan_tensors(reader, items, None, allow_nonfinite, digests, meta.hash)
        by_name = {p.name: p for p in planned}
        items_fn = {name: fn for name, _, fn in items}
        types = _written_types(kind, mix, model, [(p.name, p.shape) for p in planned
                                                  if p.name not in whole and p.name not in skipped])
        tensors = []
        for p in planned:
            if p.name in whole:  # an MXFP4 weight's blocks, its scales beside them
                weight = whole[p.name]
                tensors.append(GgufTensor(weight.name, _shape(p.shape), "MXFP4",
                                          partial(_ggml_mxfp4, by_name[weight.parts["blocks"]].produce,
                                                  by_name[weight.parts["scales"]].produce), encoded=True))
                continue
            if p.name in skipped:
                continue
            written_as = types[p.name]
            src_name = plan[p.name][0]
            first = src_name[0] if isinstance(src_name, tuple) else src_name
            check = None if allow_nonfinite else FiniteCheck(first, export.tensors.where(first), written_as,
                                                                 "choose another --quant (f32, bf16)")
            bands = _bands(reader, src_name, items_fn[p.name], digests)
            source_check = None if allow_nonfinite else FiniteCheck(first, reader.where(first))
            tensors.append(GgufTensor(p.name, p.shape, written_as, p.produce, check, bands=bands,
                                      source_check=source_check))
        tensors += [GgufTensor(name, tuple(t.shape), "F32", lambda t=t: t) for name, t in model.extra.items()]
        tokens = tokenizer["tokenizer.ggml.tokens"].value if "tokenizer.ggml.tokens" in tokenizer else []
        values = {**model.values, **tokenizer, **family_tokens(model.entry, config, tokens, tokenizer),
                  "general.file_type": file_type(mix) if mix else FILE_TYPES[kind],
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
