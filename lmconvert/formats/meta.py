"""Reading Meta's original LLaMA checkpoints: `params.json`, `consolidated.NN.pth` (one per
model-parallel rank) and `tokenizer.model`, presented in transformers' layout.

Every shard is opened with `torch.load(weights_only=True, mmap=True)`, so a tensor is read from
disk only when the conversion asks for it, merged across ranks and rotated to transformers' RoPE
layout then, by Meta's tensor table (mappings/meta.py has the rules and where they come from;
mappings/meta_params.py translates params.json). params.json is checked against every shard
before anything is converted.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lmconvert.mappings.meta import EMBEDDING, TENSORS, Layout, MetaLayoutError
from lmconvert.mappings.meta_params import hf_config, model_params
from lmconvert.mappings.tables.table import Rule
from lmconvert.mappings.tables.transforms import PiecesDiffer

from . import schema
from .checkpoint_files import within
from .claims import check_layer_claim, layers_held
from .errors import InputError
from .jsonfile import read_json_object
from .source import CANNOT_LOAD_META, Loadable, Source
from .torch_bin import load_weights

PARAMS = "params.json"
TOKENIZER = "tokenizer.model"
_SHARD = re.compile(r"consolidated\.(\d+)\.pth")


def is_meta(path: Path) -> bool:
    return path.is_dir() and (path / PARAMS).is_file() and any(path.glob("consolidated.*.pth"))


def shard_files(directory: Path) -> list[Path]:
    """consolidated.00.pth ... in rank order; a gap in the numbering is an error, not a smaller model."""
    found = {int(m.group(1)): p for p in directory.iterdir() if (m := _SHARD.fullmatch(p.name))}
    ranks = sorted(found)
    if ranks != list(range(len(ranks))):
        missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
        names = ", ".join(f"consolidated.{r:02d}.pth" for r in missing)
        raise InputError(f"{directory}: model-parallel shard(s) {names} are missing; download them all")
    return [found[r] for r in ranks]


# params.json's model keys as Meta's ModelArgs reads them: a zero or a wrong type is refused here,
# not met later as a ZeroDivisionError (n_heads, multiple_of) or a mis-sized model.
PARAMS_SCHEMA = schema.Object(
    required={"dim": schema.POSITIVE_INT, "n_layers": schema.POSITIVE_INT, "n_heads": schema.POSITIVE_INT},
    optional={"n_kv_heads": schema.Nullable(schema.POSITIVE_INT), "multiple_of": schema.Nullable(schema.POSITIVE_INT),
              "vocab_size": schema.Nullable(schema.Integer(minimum=-1)),  # LLaMA 1/2: -1, from the tokenizer
              "ffn_dim_multiplier": schema.Nullable(schema.POSITIVE), "norm_eps": schema.Nullable(schema.POSITIVE),
              "rope_theta": schema.Nullable(schema.POSITIVE), "use_scaled_rope": schema.Nullable(schema.Boolean()),
              "rope_scaling_factor": schema.Nullable(schema.POSITIVE),
              "rope_high_freq_factor": schema.Nullable(schema.POSITIVE),
              "max_seq_len": schema.Nullable(schema.POSITIVE_INT)})


def read_params(directory: Path) -> dict[str, Any]:
    path = directory / PARAMS
    params = read_json_object(path, PARAMS)
    schema.validate(model_params(params), PARAMS_SCHEMA, str(path), "fix or re-download it")
    return params


def _embed_split(layout: Layout, shape: tuple[int, ...]) -> int:
    """Which dim the ranks split tok_embeddings along, from rank 0's piece."""
    for split in (0, 1):
        try:
            if replace(layout, embed_split=split).shard_shape(EMBEDDING) == shape:
                return split
        except MetaLayoutError:
            continue
    return 0  # neither fits: the shape check names both shapes


class MetaTensors:
    """Tensors of a Meta checkpoint under HF names, each merged across ranks when asked for."""

    def __init__(self, files: list[Path], shards: list[dict[str, torch.Tensor]], layout: Layout) -> None:
        self.files, self._shards, self.layout = files, shards, layout
        self._by_hf: dict[str, tuple[str, Rule]] = {hf: (meta, rule) for meta, hf, rule in layout.entries()}

    def names(self) -> list[str]:
        return list(self._by_hf)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.layout.full_shape(self._by_hf[name][1])

    def dtype(self, name: str) -> torch.dtype:
        return self._shards[0][self._by_hf[name][0]].dtype

    def get(self, name: str) -> torch.Tensor:
        meta, rule = self._by_hf[name]
        try:
            return self.layout.transform(rule).forward([shard[meta] for shard in self._shards])
        except PiecesDiffer as exc:
            raise InputError(f"{self.files[0].parent}: {meta} on rank {exc.piece} differs from rank {exc.copy_of}, "
                             "which should hold the same copy; re-download the shards") from None

    def where(self, name: str) -> Path:
        return self.files[0] if len(self.files) == 1 else self.files[0].parent  # every rank holds a piece

    def close(self) -> None:
        self._shards = []


def _check(directory: Path, files: list[Path], shards: list[dict[str, torch.Tensor]], layout: Layout,
           params: dict[str, Any]) -> None:
    """Every shard holds exactly the tensors params.json implies, each in the shape it implies."""
    expected = {meta: rule for meta, _, rule in layout.entries()}
    for file, shard in zip(files, shards, strict=True):
        names = {n for n in shard if not TENSORS.drops(n)}
        layers = {int(m.group(1)) for n in names if (m := re.match(r"layers\.(\d+)\.", n))}
        if layers and max(layers) + 1 != layout.n_layers:
            raise InputError(f"{file}: holds {max(layers) + 1} layers, but {PARAMS} says n_layers={layout.n_layers}; "
                             "check that they match")
        unknown, missing = sorted(names - set(expected)), sorted(set(expected) - names)
        if unknown:
            raise InputError(f"{file}: holds tensor(s) Meta's LLaMA layout does not have: {', '.join(unknown[:5])}; "
                             "this is not a plain LLaMA checkpoint")
        if missing:
            raise InputError(f"{file}: lacks tensor(s) {', '.join(missing[:5])}; re-download it")
        for name, rule in expected.items():
            got, want = tuple(shard[name].shape), layout.shard_shape(rule)
            if got != want:
                shown = {k: params[k] for k in ("dim", "n_heads", "n_kv_heads", "multiple_of", "ffn_dim_multiplier",
                                                "vocab_size") if k in params}
                raise InputError(f"{file}: tensor {name!r} has shape {list(got)}, but {PARAMS} ({shown}) over "
                                 f"{layout.shards} shard(s) implies {list(want)}; check that they match")


def _sentencepiece(path: Path) -> Any:
    """The SentencePiece model, or None for another kind of tokenizer.model (LLaMA 3's tiktoken file)."""
    import sentencepiece

    try:
        return sentencepiece.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError):
        return None


def write_tokenizer(directory: Path, out: Path) -> list[str]:
    """tokenizer.model unchanged plus, for a SentencePiece model, the HF tokenizer transformers
    builds from it (LlamaTokenizer, adding BOS as Meta's generation code does)."""
    model = directory / TOKENIZER
    if not model.is_file():
        return []
    written = []
    if _sentencepiece(model) is not None:
        from transformers import LlamaTokenizer

        with tempfile.TemporaryDirectory() as tmp:  # only tokenizer.model: nothing else steers the conversion
            shutil.copy2(model, Path(tmp) / TOKENIZER)
            tokenizer = LlamaTokenizer.from_pretrained(tmp, add_bos_token=True, add_eos_token=False)
        written = [Path(f).name for f in tokenizer.save_pretrained(str(out))]
    shutil.copy2(model, out / TOKENIZER)
    return sorted(set(written) | {TOKENIZER})


def open_meta(path: Path) -> Source:
    within(path, PARAMS, TOKENIZER, *(p.name for p in path.glob("consolidated.*.pth")))
    params = read_params(path)
    inner = model_params(params)
    files = shard_files(path)
    shards = [load_weights(f) for f in files]
    head = shards[0]
    check_layer_claim(inner["n_layers"], layers_held(head), files[0], PARAMS, "n_layers")  # before the per-layer tables
    if "output.weight" not in head or "tok_embeddings.weight" not in head:
        raise InputError(f"{files[0]}: lacks output.weight or tok_embeddings.weight; not a Meta LLaMA checkpoint")
    vocab = inner.get("vocab_size")
    if not isinstance(vocab, int) or vocab <= 0:  # LLaMA 1/2 write -1 and take it from the tokenizer
        vocab = head["output.weight"].shape[0] * len(files)
    try:
        config = hf_config(inner, vocab)
        layout = Layout(dim=config["hidden_size"], n_layers=config["num_hidden_layers"],
                        n_heads=config["num_attention_heads"], n_kv_heads=config["num_key_value_heads"],
                        vocab_size=vocab, hidden_dim=config["intermediate_size"], shards=len(files))
    except MetaLayoutError as exc:
        raise InputError(f"{path / PARAMS}: {str(exc).removeprefix('params.json: ')}") from None
    layout = replace(layout, embed_split=_embed_split(layout, tuple(head[EMBEDDING.stored].shape)))
    _check(path, files, shards, layout, inner)
    info: dict[str, Any] = {"meta_params": params, "meta_shards": len(files)}
    if len(files) > 1:
        info["meta_embedding_split"] = layout.embed_split
    ignored = sorted(n for n in head if TENSORS.drops(n))
    if ignored:
        info["meta_ignored_tensors"] = ignored
    sp = _sentencepiece(path / TOKENIZER) if (path / TOKENIZER).is_file() else None
    if sp is not None:
        config.update({k: i for k, i in (("bos_token_id", sp.bos_id()), ("eos_token_id", sp.eos_id())) if i >= 0})
    elif (path / TOKENIZER).is_file():
        info["tokenizer"] = f"{TOKENIZER} is not SentencePiece (LLaMA 3's is tiktoken): copied, no HF files built"
    return Source(path, "meta", config, MetaTensors(files, shards, layout), info,
                  sidecars=lambda out: write_tokenizer(path, out),
                  reference=Loadable(None, refusal=f"{path}: is in {CANNOT_LOAD_META}"))
