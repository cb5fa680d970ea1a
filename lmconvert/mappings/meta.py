"""Meta's original LLaMA layout as a tensor table: Meta names <-> HF llama names, and how
model-parallel ranks hold each tensor. Data and pure functions; formats/meta.py reads the files
and convert/export_meta.py writes them (formats/meta_export.py the files), both through this table.

Read from Meta's llama-models (`models/llama3/model.py`, `models/checkpoint.py`) and
transformers' `models/llama/convert_llama_weights_to_hf.py` (in transformers' source tree; the
wheel does not ship it):

- ColumnParallelLinear weights (wq, wk, wv, w1, w3, output) are split by output rows: dim 0.
- RowParallelLinear weights (wo, w2) are split by input columns: dim 1.
- tok_embeddings: LLaMA 1/2's ParallelEmbedding splits the embedding dim (dim 1); LLaMA 3's
  VocabParallelEmbedding splits the vocabulary (dim 0). A checkpoint's shard shapes say which.
- RMSNorm weights are replicated: every rank holds the same copy.
- With more ranks than KV heads (405B at MP16), a KV head's wk/wv rows are repeated on
  consecutive ranks (checkpoint.py's `repeat_qk_qv`).
- Meta rotates q/k as complex pairs (dims 2i, 2i+1); transformers rotates halves (i, i + d/2), so
  wq/wk rows are permuted per head, exactly as convert_llama_weights_to_hf.py's `permute`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from .errors import MappingError
from .tables.table import Rule, TensorTable
from .tables.transforms import Chain, Fuse, Permute, Step, Transform


class MetaLayoutError(MappingError):
    """A params.json or shard layout that cannot describe the model; callers add the file name."""


COLUMNS = Fuse(0)  # ColumnParallelLinear: ranks hold slices of the output rows
ROWS = Fuse(1)  # RowParallelLinear: ranks hold slices of the input columns
KV_COLUMNS = Fuse(0, copies="kv_replicas")  # KV heads repeated on consecutive ranks when ranks outnumber them
REPLICATED = Fuse(None)  # every rank holds the whole tensor
EMBEDDING_SPLIT = Fuse("embed_split")  # the dim depends on the LLaMA generation


def _layer(meta: str, hf: str, shape: tuple[str, ...], *steps: Step) -> Rule:
    return Rule(f"layers.{{}}.{meta}.weight", f"model.layers.{{}}.{hf}.weight", Chain(*steps), shape)


EMBEDDING = Rule("tok_embeddings.weight", "model.embed_tokens.weight", EMBEDDING_SPLIT, ("vocab", "dim"))
TENSORS = TensorTable((  # Meta's module order: embedding; per layer attention, feed_forward, the two norms; head
    EMBEDDING,
    _layer("attention.wq", "self_attn.q_proj", ("q", "dim"), COLUMNS, Permute("heads")),
    _layer("attention.wk", "self_attn.k_proj", ("kv", "dim"), KV_COLUMNS, Permute("kv_heads")),
    _layer("attention.wv", "self_attn.v_proj", ("kv", "dim"), KV_COLUMNS),
    _layer("attention.wo", "self_attn.o_proj", ("dim", "q"), ROWS),
    _layer("feed_forward.w1", "mlp.gate_proj", ("ffn", "dim"), COLUMNS),
    _layer("feed_forward.w2", "mlp.down_proj", ("dim", "ffn"), ROWS),
    _layer("feed_forward.w3", "mlp.up_proj", ("ffn", "dim"), COLUMNS),
    _layer("attention_norm", "input_layernorm", ("dim",), REPLICATED),
    _layer("ffn_norm", "post_attention_layernorm", ("dim",), REPLICATED),
    Rule("norm.weight", "model.norm.weight", REPLICATED, ("dim",)),
    Rule("output.weight", "lm_head.weight", COLUMNS, ("vocab", "dim")),
    Rule("rope.freqs", None),  # LLaMA 1/2 save their RoPE table; it is derived from params.json
))


@dataclass(frozen=True)
class Layout:
    """The sizes that shape every tensor, and how `shards` model-parallel ranks split them."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    hidden_dim: int
    shards: int = 1
    embed_split: int = 0  # 1: LLaMA 1/2's ParallelEmbedding; 0: LLaMA 3's VocabParallelEmbedding

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise MetaLayoutError(what)

        need(self.shards >= 1, f"shards={self.shards} must be at least 1")
        need(self.dim % self.n_heads == 0, f"dim={self.dim} is not divisible by n_heads={self.n_heads}")
        need(self.n_heads % self.n_kv_heads == 0,
             f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        need(self.n_heads % self.shards == 0, f"n_heads={self.n_heads} cannot be split over {self.shards} shards")
        need(self.n_kv_heads % self.shards == 0 or self.shards % self.n_kv_heads == 0,
             f"n_kv_heads={self.n_kv_heads} cannot be split over (or repeated on) {self.shards} shards")
        need(self.hidden_dim % self.shards == 0,
             f"the FFN size {self.hidden_dim} cannot be split over {self.shards} shards")
        need(self.vocab_size % self.shards == 0,
             f"vocab_size={self.vocab_size} cannot be split over {self.shards} shards")
        need(self.embed_split in (0, 1), f"embed_split={self.embed_split} must be 0 or 1")
        need(self.embed_split == 0 or self.dim % self.shards == 0,
             f"dim={self.dim} cannot be split over {self.shards} shards")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def sizes(self) -> dict[str, int]:
        """What the table's shapes and transforms are written in."""
        return {"dim": self.dim, "vocab": self.vocab_size, "ffn": self.hidden_dim,
                "q": self.n_heads * self.head_dim, "kv": self.n_kv_heads * self.head_dim,
                "heads": self.n_heads, "kv_heads": self.n_kv_heads, "shards": self.shards,
                "kv_replicas": max(1, self.shards // self.n_kv_heads), "embed_split": self.embed_split}

    def entries(self) -> list[tuple[str, str, Rule]]:
        """(Meta name, HF name, rule) of every tensor, in Meta's module order."""
        return list(TENSORS.expand(self.n_layers))

    def full_shape(self, rule: Rule) -> tuple[int, ...]:
        sizes = self.sizes
        return tuple(sizes[s] for s in rule.shape or ())

    def transform(self, rule: Rule) -> Transform:
        """forward: the ranks' pieces -> the whole HF tensor; inverse: the other way (views:
        clone before saving)."""
        return _bound(self, rule)

    def shard_shape(self, rule: Rule) -> tuple[int, ...]:
        """The shape of one rank's piece, from the transform itself on the meta device."""
        return _shard_shape(self, rule)


@cache
def _bound(layout: Layout, rule: Rule) -> Transform:
    return rule.transform.bind(layout.sizes)


@cache
def _shard_shape(layout: Layout, rule: Rule) -> tuple[int, ...]:
    import torch

    pieces = layout.transform(rule).inverse(torch.empty(layout.full_shape(rule), device="meta"))
    return tuple(pieces[0].shape)
