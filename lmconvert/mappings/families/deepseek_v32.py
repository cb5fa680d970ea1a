"""DeepSeek-V3.2 (DeepSeek-V3.2-Exp).

Same as deepseek_v3, except: attention is DeepSeek Sparse Attention (the "sparse" kind), MLA with
a lightning indexer per layer (`self_attn.indexer.wq_b`, `wk`, `k_norm` with weight and bias,
`weights_proj`) of `index_n_heads` heads of `index_head_dim` that keeps each query's top
`index_topk` keys; the q LoRA is always there (`q_lora_rank` is never null) and RoPE always
interleaved (there is no `rope_interleave` key); which layers are mixtures of experts is
`mlp_layer_types` ("dense" or "sparse" per layer), which `first_k_dense_replace` only defaults;
`layer_types` ("indexed_attention") and `mlp_bias` change nothing in transformers' model (its MLPs
have no biases), so they are checked, not kept; `max_position_embeddings` defaults to 163840.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from lmconvert.arch import ArchConfig
from lmconvert.arch.attention_kinds import SparseSettings

from ..errors import Inexpressible
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import dense_layers
from ..tables.hf_rope import rope
from ..tables.points import SHARED_UNFLATTENED, SPARSE
from ..tables.table import Rule, TensorTable
from . import deepseek_v3

INDEXER_RULES = tuple(
    Rule(f"model.layers.{{}}.self_attn.indexer.{hf}.{p}", f"layers.{{}}.attn.{c}.{p}")
    for hf, c, params in (("wq_b", "index_q", ("weight",)), ("wk", "index_k", ("weight",)),
                          ("k_norm", "index_k_norm", ("weight", "bias")),
                          ("weights_proj", "index_weights", ("weight",)))
    for p in params
)

LATENT = deepseek_v3.latent("deepseek_v32", deinterleave=True, v_head_dim_nullable=False)
INDEX_KEYS = (Key("index_n_heads", int, 64), Key("index_head_dim", int, 128), Key("index_topk", int, 2048))


def sparse_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    read = LATENT.read(hf, fields)
    settings = SparseSettings(**asdict(read["attention_settings"]), **{k.name: hf.get(k.name) for k in INDEX_KEYS})
    return {**read, "attention": "sparse", "attention_settings": settings}


def sparse_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    if cfg.attention != "sparse":
        raise Inexpressible(f"deepseek_v32 always has sparse attention (DSA), which this model lacks "
                            f"(attention={cfg.attention!r}); export to the source family instead")
    s = cfg.attention_settings
    return {**deepseek_v3.latent_to_hf(cfg), **{k.name: getattr(s, k.name) for k in INDEX_KEYS}}


MLP_LAYER_TYPES = Key("mlp_layer_types", list, None, nullable=True)
FIRST_DENSE = Key("first_k_dense_replace", int, 3, bound="non_negative", legacy=True)  # only defaults the types


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """transformers makes layer i a mixture of experts where mlp_layer_types[i] is "sparse"; absent,
    the types are first_k_dense_replace dense layers, then sparse ones."""
    n = fields["n_layers"]
    dense = dense_layers(hf, n, hf.get("first_k_dense_replace"))
    if len(dense) == n:
        return {}
    moe = deepseek_v3.v3_moe(hf, len(dense), n)
    return {"moe": replace(moe, dense_layers=dense)}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    dense = range(cfg.n_layers) if cfg.moe is None else cfg.moe.dense_layers
    types = ["dense" if i in dense else "sparse" for i in range(cfg.n_layers)]
    keys = {k.name: DEFAULT for k in deepseek_v3.V3_KEYS} if cfg.moe is None else deepseek_v3.v3_to_hf(cfg.moe)
    return {"mlp_layer_types": types, **keys}


INERT = (  # read by transformers' config class, never by its model
    Entry("layer_types", (Key("layer_types", list, None, nullable=True),), lambda hf, _: {},
          lambda cfg: {"layer_types": ["indexed_attention"] * cfg.n_layers}),
    Entry("mlp_bias", (Key("mlp_bias", bool, False),), lambda hf, _: {}, lambda cfg: {"mlp_bias": DEFAULT}),
)

CONFIG = deepseek_v3.CONFIG.but(
    add=(
        rope(layout="interleaved"),
        Entry("latent attention", (*LATENT.keys, *INDEX_KEYS), sparse_from_hf, sparse_to_hf),
        Entry("experts", (FIRST_DENSE, MLP_LAYER_TYPES, *deepseek_v3.V3_KEYS), experts_from_hf, experts_to_hf),
        *INERT,
    ),
    defaults={"max_position_embeddings": 163840},
    nullable={"q_lora_rank": False, "v_head_dim": False, "num_key_value_heads": False, "num_experts_per_tok": False,
              "n_group": False, "topk_group": False, "norm_topk_prob": False, "attention_dropout": False},
)

TENSORS = TensorTable(deepseek_v3.TENSORS.rules + INDEXER_RULES)

# DeepseekV32Attention: V3's, and its Indexer's wq_b, wk, k_norm and weights_proj on (B, T, features)
REFERENCE_LAYOUTS = {**SPARSE, **SHARED_UNFLATTENED}

FAMILY = Family("deepseek_v32", ("deepseek_v32",), "DeepseekV32ForCausalLM", TENSORS, CONFIG,
                reference_layouts=REFERENCE_LAYOUTS)
