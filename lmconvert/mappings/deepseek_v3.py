"""DeepSeek-V3, dense layers only.

Same as llama, except: attention is multi-head latent attention (the "latent" kind), with
`q_lora_rank` (null: a plain `q_proj`), `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim` (what
transformers also calls `head_dim`) and `v_head_dim`; `attention_bias` switches the biases of
`q_a_proj`, `kv_a_proj_with_mqa` and `o_proj` only; the MLA-internal RMSNorms use eps 1e-6
whatever `rms_norm_eps` says; `rope_interleave` (default true) reads the rotary dims in pairs; under
scaled RoPE with `mscale_all_dim` the score scale is multiplied by mscale squared; there is no
`mlp_bias`. Layers from `first_k_dense_replace` on are mixture-of-experts layers, which the canonical
decoder does not have yet: a checkpoint with any is refused, naming them.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig
from lmconvert.arch.attention_kinds import LatentSettings

from . import llama
from .config_table import Entry
from .errors import Inexpressible, MappingError
from .family import Family
from .hf_config import HfConfig, Key
from .hf_rope import KEYS as ROPE_KEYS
from .hf_rope import rope_from_hf, rope_parameters, rope_to_hf
from .table import Rule, TensorTable

MLA_RULES = tuple(
    Rule(f"model.layers.{{}}.self_attn.{hf}.{p}", f"layers.{{}}.attn.{c}.{p}")
    for hf, c, params in (
        ("q_proj", "q", ("weight",)),
        ("q_a_proj", "q_a", ("weight", "bias")),
        ("q_a_layernorm", "q_a_norm", ("weight",)),
        ("q_b_proj", "q_b", ("weight",)),
        ("kv_a_proj_with_mqa", "kv_a", ("weight", "bias")),
        ("kv_a_layernorm", "kv_a_norm", ("weight",)),
        ("kv_b_proj", "kv_b", ("weight",)),
        ("o_proj", "o", ("weight", "bias")),
    )
    for p in params
)
TENSORS = TensorTable(llama.EDGE_RULES + MLA_RULES + llama.MLP_RULES + llama.PRE_NORM_RULES)


def latent_keys(v_head_dim_nullable: bool) -> tuple[Key, ...]:
    return (
        Key("q_lora_rank", int, 1536, nullable=True),  # null: a plain q_proj
        Key("kv_lora_rank", int, 512),
        Key("qk_nope_head_dim", int, 128),
        Key("qk_rope_head_dim", int, 64),
        Key("v_head_dim", int, 128, nullable=v_head_dim_nullable),  # V3's class takes null; no model runs with it
        Key("attention_bias", bool, False),
        # transformers writes head_dim (= qk_rope_head_dim) and overwrites whatever a file states:
        # checked as a count on the way in, never read for a value, never written
        Key("head_dim", int, None, nullable=True, legacy=True),
    )


def latent(family: str, deinterleave: bool, v_head_dim_nullable: bool) -> Entry:
    """The MLA sizes <-> ArchConfig's latent attention; `deinterleave` is the family's constant."""

    def read(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
        if hf.get("v_head_dim") is None:  # transformers' config class accepts it; building the model then fails
            raise MappingError("config.json: v_head_dim=null: transformers cannot build this model; state the "
                               "value head size")
        settings = LatentSettings(kv_lora_rank=hf.get("kv_lora_rank"), qk_nope_head_dim=hf.get("qk_nope_head_dim"),
                                  v_head_dim=hf.get("v_head_dim"), q_lora_rank=hf.get("q_lora_rank"),
                                  bias=hf.get("attention_bias"), deinterleave=deinterleave)
        return {"attention": "latent", "attention_settings": settings, "head_dim": hf.get("qk_rope_head_dim")}

    def write(cfg: ArchConfig) -> dict[str, Any]:
        if cfg.attention != "latent":  # said here: read back, the defaults would fail on something else first
            raise Inexpressible(f"{family} always has latent attention (MLA), which this model lacks "
                                f"(attention={cfg.attention!r}); export to the source family instead")
        return latent_to_hf(cfg)

    return Entry("latent attention", latent_keys(v_head_dim_nullable), read, write)


def latent_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    s = cfg.attention_settings
    return {"q_lora_rank": s.q_lora_rank, "kv_lora_rank": s.kv_lora_rank, "qk_nope_head_dim": s.qk_nope_head_dim,
            "qk_rope_head_dim": cfg.head_dim, "v_head_dim": s.v_head_dim, "attention_bias": s.bias}


INTERLEAVE = Key("rope_interleave", bool, True, nullable=True)  # null: the half layout, as false


def rope_from_deepseek(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    layout = "interleaved" if hf.get("rope_interleave") else "half"
    return {"rope": rope_from_hf(hf, *rope_parameters(hf), layout=layout)}


def rope_to_deepseek(cfg: ArchConfig) -> dict[str, Any]:
    return {"rope_parameters": rope_to_hf(cfg.rope), "rope_interleave": cfg.rope.layout == "interleaved"}


def dense_only(default: int, nullable: bool) -> Entry:
    """`first_k_dense_replace`: transformers makes layer i a mixture-of-experts layer when
    i >= first_k_dense_replace; refused until the decoder has them. Export writes the layer count."""

    def read(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
        first, n = hf.get("first_k_dense_replace"), fields["n_layers"]
        if first is None:  # transformers' config class accepts it; building the model then fails
            raise MappingError("config.json: first_k_dense_replace=null: transformers cannot build this model; "
                               "set it to num_hidden_layers for a dense model")
        if first < n:
            layers = str(first) if first == n - 1 else f"{first}-{n - 1}"
            raise MappingError(f"config.json: first_k_dense_replace={first} makes layers {layers} of {n} "
                               f"mixture-of-experts layers, which lmconvert cannot convert yet; only DeepSeek "
                               f"checkpoints whose every layer is dense (first_k_dense_replace >= "
                               f"num_hidden_layers) are supported")
        return {}

    key = Key("first_k_dense_replace", int, default, nullable=nullable, bound="non_negative")
    return Entry("dense layers", (key,), read, lambda cfg: {"first_k_dense_replace": cfg.n_layers})


CONFIG = llama.CONFIG.but(
    drop=("mlp_bias", "head_dim", "attention_bias"),
    add=(
        Entry("rope", (*ROPE_KEYS, INTERLEAVE), rope_from_deepseek, rope_to_deepseek),
        latent("deepseek_v3", deinterleave=True, v_head_dim_nullable=True),
        dense_only(3, nullable=True),
    ),
    defaults={"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
              "num_attention_heads": 128, "num_key_value_heads": 128, "max_position_embeddings": 4096},
)

FAMILY = Family("deepseek_v3", ("deepseek_v3",), "DeepseekV3ForCausalLM", TENSORS, CONFIG)
