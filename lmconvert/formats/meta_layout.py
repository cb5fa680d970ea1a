"""Meta's original LLaMA layout as data and pure functions (no file I/O): `params.json` <-> an HF
llama config, Meta tensor names <-> HF names, and model-parallel shards <-> whole tensors.

Read from Meta's llama-models (`models/llama3/model.py`, `args.py`, `models/checkpoint.py`) and
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
from typing import Any

import torch

# Meta's apply_scaling (llama-models models/llama3/model.py): use_scaled_rope means llama3 scaling
# with these constants; later llama-models versions read the factors from params.json.
SCALED_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
PER_CHECKPOINT = -1  # tok_embeddings: the split dim depends on the LLaMA generation


class LayoutError(ValueError):
    """A params.json or shard layout that cannot describe the model; callers add the file name."""


@dataclass(frozen=True)
class Kind:
    meta: str  # Meta's name; {} is the layer index
    hf: str  # transformers' name
    shape: tuple[str, ...]  # symbolic sizes, see Layout.sizes
    split: int | None  # the dim model-parallel ranks split; None: replicated
    rope: str = ""  # "q" or "kv": rows rotate per head, in heads of this size
    kv: bool = False  # rows are KV heads, repeated on consecutive ranks when ranks outnumber them


def _layer(meta: str, hf: str, shape: tuple[str, ...], split: int | None, **kw: Any) -> Kind:
    return Kind(f"layers.{{}}.{meta}.weight", f"model.layers.{{}}.{hf}.weight", shape, split, **kw)


EMBEDDING = Kind("tok_embeddings.weight", "model.embed_tokens.weight", ("vocab", "dim"), PER_CHECKPOINT)
LAYER_KINDS = (  # Meta's module order: attention, feed_forward, the two norms
    _layer("attention.wq", "self_attn.q_proj", ("q", "dim"), 0, rope="q"),
    _layer("attention.wk", "self_attn.k_proj", ("kv", "dim"), 0, rope="kv", kv=True),
    _layer("attention.wv", "self_attn.v_proj", ("kv", "dim"), 0, kv=True),
    _layer("attention.wo", "self_attn.o_proj", ("dim", "q"), 1),
    _layer("feed_forward.w1", "mlp.gate_proj", ("ffn", "dim"), 0),
    _layer("feed_forward.w2", "mlp.down_proj", ("dim", "ffn"), 1),
    _layer("feed_forward.w3", "mlp.up_proj", ("ffn", "dim"), 0),
    _layer("attention_norm", "input_layernorm", ("dim",), None),
    _layer("ffn_norm", "post_attention_layernorm", ("dim",), None),
)
FINAL_KINDS = (
    Kind("norm.weight", "model.norm.weight", ("dim",), None),
    Kind("output.weight", "lm_head.weight", ("vocab", "dim"), 0),
)
IGNORED = ("rope.freqs",)  # LLaMA 1/2 save their RoPE table; it is derived from params.json


def rope_to_hf(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Interleaved pairs -> halves, per head: convert_llama_weights_to_hf.py's `permute`."""
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def rope_to_meta(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of rope_to_hf."""
    rows, cols = w.shape
    return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


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
                raise LayoutError(what)

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
    def kv_replicas(self) -> int:
        return max(1, self.shards // self.n_kv_heads)

    @property
    def sizes(self) -> dict[str, int]:
        return {"dim": self.dim, "vocab": self.vocab_size, "ffn": self.hidden_dim,
                "q": self.n_heads * self.head_dim, "kv": self.n_kv_heads * self.head_dim}

    def split_dim(self, kind: Kind) -> int | None:
        return self.embed_split if kind.split == PER_CHECKPOINT else kind.split

    def entries(self) -> list[tuple[str, str, Kind]]:
        """(Meta name, HF name, kind) of every tensor, in Meta's module order."""
        out = [(EMBEDDING.meta, EMBEDDING.hf, EMBEDDING)]
        for i in range(self.n_layers):
            out += [(k.meta.format(i), k.hf.format(i), k) for k in LAYER_KINDS]
        return out + [(k.meta, k.hf, k) for k in FINAL_KINDS]

    def full_shape(self, kind: Kind) -> tuple[int, ...]:
        return tuple(self.sizes[s] for s in kind.shape)

    def _parts(self, kind: Kind) -> int:
        """How many distinct pieces the ranks hold."""
        return self.shards // self.kv_replicas if kind.kv else self.shards

    def shard_shape(self, kind: Kind) -> tuple[int, ...]:
        shape, dim = list(self.full_shape(kind)), self.split_dim(kind)
        if dim is not None:
            shape[dim] //= self._parts(kind)
        return tuple(shape)

    def to_hf(self, name: str, kind: Kind, pieces: list[torch.Tensor]) -> torch.Tensor:
        """One whole HF tensor from the ranks' pieces; copies that should agree are checked."""
        dim, step = self.split_dim(kind), self.kv_replicas if kind.kv else 1
        if dim is None:
            step = self.shards
        for i, piece in enumerate(pieces):
            if i % step and not torch.equal(piece, pieces[i - i % step]):
                raise LayoutError(f"{name} on rank {i} differs from rank {i - i % step}, which should hold "
                                  "the same copy")
        pieces = pieces[::step]
        w = torch.cat(pieces, dim) if dim is not None and len(pieces) > 1 else pieces[0]
        if kind.rope:
            w = rope_to_hf(w, self.sizes[kind.rope] // self.head_dim)
        return w

    def to_meta(self, kind: Kind, w: torch.Tensor) -> list[torch.Tensor]:
        """The ranks' pieces of one HF tensor (views: clone before saving)."""
        if kind.rope:
            w = rope_to_meta(w, self.sizes[kind.rope] // self.head_dim)
        dim = self.split_dim(kind)
        if dim is None:
            return [w] * self.shards
        parts = list(w.split(w.shape[dim] // self._parts(kind), dim))
        repeat = self.kv_replicas if kind.kv else 1
        return [p for p in parts for _ in range(repeat)]


# ---- params.json <-> HF llama config


def _value(params: dict[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    if key not in params or params[key] is None:
        if default is ...:
            raise LayoutError(f"params.json lacks {key!r}")
        return default
    value = params[key]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, (int, float) if kind is float else kind):
        raise LayoutError(f"params.json: {key}={value!r} should be of type {kind.__name__}")
    return float(value) if kind is float else value


def intermediate_size(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """Meta's FeedForward: int(2 * 4 * dim / 3), times ffn_dim_multiplier, rounded up to multiple_of
    (transformers' compute_intermediate_size gives the same)."""
    hidden = int(8 * dim / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def model_params(params: dict[str, Any]) -> dict[str, Any]:
    """Some releases nest the model's params under "model" (as transformers' script accepts)."""
    return params["model"] if isinstance(params.get("model"), dict) else params


def max_positions(params: dict[str, Any], vocab_size: int) -> int:
    """params.json's max_seq_len when present (Meta sets it at run time). Otherwise the context
    transformers' conversion script assigns each LLaMA generation, recognised by its params:
    3.1+ (use_scaled_rope) 131072, 3 (128k vocab) 8192, Code Llama (theta > 1e4) 16384,
    2 (norm_eps 1e-5) 4096, 1 2048."""
    if params.get("max_seq_len") is not None:
        return _value(params, "max_seq_len", int)
    theta = _value(params, "rope_theta", float, 10000.0)
    if params.get("use_scaled_rope"):
        return 131072
    if vocab_size >= 128000:
        return 8192
    if theta > 10000.0:
        return 16384
    return 4096 if _value(params, "norm_eps", float, 1e-5) >= 1e-5 else 2048


def hf_config(params: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The transformers llama config.json that computes what Meta's code computes with `params`."""
    dim, heads = _value(params, "dim", int), _value(params, "n_heads", int)
    multiple_of = _value(params, "multiple_of", int, 256)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": _value(params, "rope_theta", float, 10000.0)}
    if _value(params, "use_scaled_rope", bool, False):
        rope.update(rope_type="llama3", **SCALED_ROPE)
        rope["factor"] = _value(params, "rope_scaling_factor", float, SCALED_ROPE["factor"])
        rope["high_freq_factor"] = _value(params, "rope_high_freq_factor", float, SCALED_ROPE["high_freq_factor"])
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": dim, "num_attention_heads": heads, "head_dim": dim // heads,
        "num_key_value_heads": _value(params, "n_kv_heads", int, heads),
        "num_hidden_layers": _value(params, "n_layers", int),
        "intermediate_size": intermediate_size(dim, multiple_of, _value(params, "ffn_dim_multiplier", float, None)),
        "vocab_size": vocab_size, "rms_norm_eps": _value(params, "norm_eps", float, 1e-5),
        "rope_parameters": rope, "max_position_embeddings": max_positions(params, vocab_size),
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
    }


def ffn_params(dim: int, d_ff: int) -> tuple[int, float | None]:
    """A (multiple_of, ffn_dim_multiplier) for which Meta's formula gives d_ff: a plain power-of-two
    multiple_of when one does, else the shortest multiplier with the largest multiple_of dividing
    d_ff (LLaMA 3 8B: 14336 -> 1024, 1.3)."""
    powers = [2**k for k in range(10, -1, -1)]
    for m in powers[2:]:  # 256 first: LLaMA 1/2's value
        if intermediate_size(dim, m, None) == d_ff:
            return m, None
    base = int(8 * dim / 3)
    for m in (p for p in powers if d_ff % p == 0):
        for digits in range(1, 7):
            multiplier = round(d_ff / base, digits)
            if intermediate_size(dim, m, multiplier) == d_ff:
                return m, multiplier
    return 1, (d_ff + 0.5) / base  # int() of this times base is d_ff exactly


def params_for(config: dict[str, Any]) -> dict[str, Any]:
    """params.json for an HF llama config; LayoutError names what Meta's format cannot hold."""
    dim, heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise LayoutError("Meta's format has no biases, and this model has attention or MLP biases")
    if config.get("hidden_act") != "silu":
        raise LayoutError(f"Meta's format uses SiLU, and this model uses {config.get('hidden_act')!r}")
    if dim % heads or config.get("head_dim", dim // heads) != dim // heads:
        raise LayoutError(f"Meta's format needs head_dim = dim / n_heads = {dim}/{heads}, and this model has "
                          f"head_dim={config.get('head_dim')}")
    rope = config["rope_parameters"]
    kind = rope.get("rope_type", "default")
    fixed = {k: rope.get(k) for k in ("low_freq_factor", "original_max_position_embeddings")}
    if kind not in ("default", "llama3") or kind == "llama3" and any(
            fixed[k] != SCALED_ROPE[k] for k in fixed):
        raise LayoutError(f"Meta's format has RoPE scaling only as use_scaled_rope (llama3 with low_freq_factor 1 "
                          f"and original_max_position_embeddings 8192), and this model uses {rope}")
    multiple_of, multiplier = ffn_params(dim, config["intermediate_size"])
    params: dict[str, Any] = {
        "dim": dim, "n_layers": config["num_hidden_layers"], "n_heads": heads,
        "n_kv_heads": config["num_key_value_heads"], "vocab_size": config["vocab_size"], "multiple_of": multiple_of,
        "ffn_dim_multiplier": multiplier, "norm_eps": config["rms_norm_eps"], "rope_theta": rope["rope_theta"],
    }
    if multiplier is None:
        del params["ffn_dim_multiplier"]
    if kind == "llama3":
        params["use_scaled_rope"] = True
        for key, name in (("factor", "rope_scaling_factor"), ("high_freq_factor", "rope_high_freq_factor")):
            if rope[key] != SCALED_ROPE[key]:
                params[name] = rope[key]
    return params
