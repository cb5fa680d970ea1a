"""LLaMA 1, 2, 3, 3.1 and 3.2: the base that most other families are described against.

Pre-norm RMSNorm (weight applied after the cast back), gated SiLU MLP, half-rotation RoPE with any
of the scaling types, optional biases via `attention_bias` / `mlp_bias`, head_dim free of
hidden/heads, and an `lm_head` that is absent from the files when the embeddings are tied.

The rules and helpers here are the shared vocabulary of the llama-style families: they import
them and state only how they differ.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from .family import Family
from .hf_config import ACTIVATIONS_TO_HF, HfConfig, activation_from_hf, rope_from_hf, rope_parameters, rope_to_hf
from .table import Rule, TensorTable

DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "rope_theta": 10000.0,
}

ATTENTION_RULES = tuple(
    Rule(f"model.layers.{{}}.self_attn.{hf}_proj.{p}", f"layers.{{}}.attn.{c}.{p}")
    for hf, c in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "o")) for p in ("weight", "bias")
)
MLP_RULES = tuple(
    Rule(f"model.layers.{{}}.mlp.{n}_proj.{p}", f"layers.{{}}.mlp.{n}.{p}")
    for n in ("gate", "up", "down") for p in ("weight", "bias")
)
EDGE_RULES = (
    Rule("model.embed_tokens.weight", "embed.weight"),
    Rule("model.norm.weight", "final_norm.weight"),
    Rule("lm_head.weight", "lm_head.weight"),
)
PRE_NORM_RULES = (
    Rule("model.layers.{}.input_layernorm.weight", "layers.{}.attn_norm.weight"),
    Rule("model.layers.{}.post_attention_layernorm.weight", "layers.{}.mlp_norm.weight"),
)
# not llama's own: the QK-norm names every family with one uses (per head or over the projection)
QK_NORM_RULES = (
    Rule("model.layers.{}.self_attn.q_norm.weight", "layers.{}.attn.q_norm.weight"),
    Rule("model.layers.{}.self_attn.k_norm.weight", "layers.{}.attn.k_norm.weight"),
)
TENSORS = TensorTable(EDGE_RULES + ATTENTION_RULES + MLP_RULES + PRE_NORM_RULES)


def base_fields(hf: HfConfig) -> dict[str, Any]:
    """The ArchConfig fields every llama-style config.json states the same way. Absent
    `num_key_value_heads` and `head_dim` take the family's DEFAULTS, else MHA and hidden/heads."""
    d, heads = hf.get("hidden_size", int), hf.get("num_attention_heads", int)
    return dict(
        vocab_size=hf.get("vocab_size", int), d_model=d, n_layers=hf.get("num_hidden_layers", int),
        n_heads=heads, n_kv_heads=hf.get("num_key_value_heads", int, hf.defaults.get("num_key_value_heads")) or heads,
        head_dim=hf.get("head_dim", int, hf.defaults.get("head_dim")) or d // heads,
        d_ff=hf.get("intermediate_size", int), max_positions=hf.get("max_position_embeddings", int),
        tie_embeddings=hf.get("tie_word_embeddings", bool),
        attn_dropout=hf.get("attention_dropout", float, 0.0) or 0.0,
    )


def base_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_positions, "rms_norm_eps": cfg.norm.eps,
        "tie_word_embeddings": cfg.tie_embeddings, "rope_parameters": rope_to_hf(cfg.rope),
        "attention_dropout": cfg.attn_dropout,
    }


def llama_fields(hf: HfConfig) -> dict[str, Any]:
    """base_fields plus llama's norm, `hidden_act` and single RoPE: what llama-style families share."""
    return {**base_fields(hf), "norm": NormConfig(eps=hf.get("rms_norm_eps", float)),
            "activation": activation_from_hf(hf, "hidden_act"), "rope": rope_from_hf(hf, rope_parameters(hf))}


def llama_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {**base_to_hf(cfg), "hidden_act": ACTIVATIONS_TO_HF[cfg.activation]}


def attention_biases(flag: bool) -> dict[str, bool]:
    """`attention_bias` switches the q, k, v and o biases together."""
    return {"q_bias": flag, "k_bias": flag, "v_bias": flag, "o_bias": flag}


def attention_bias_of(cfg: ArchConfig) -> bool:
    """`attention_bias` for export: True only when all four biases are there, so a partial set is
    reported as the biases the target cannot express."""
    return cfg.q_bias and cfg.k_bias and cfg.v_bias and cfg.o_bias


def from_hf(data: dict[str, Any]) -> ArchConfig:
    hf = HfConfig(data, DEFAULTS)
    return ArchConfig(**llama_fields(hf), **attention_biases(hf.get("attention_bias", bool)),
                      mlp_bias=hf.get("mlp_bias", bool))


def to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {**llama_to_hf(cfg), "attention_bias": attention_bias_of(cfg), "mlp_bias": cfg.mlp_bias}


FAMILY = Family("llama", ("llama",), "LlamaForCausalLM", TENSORS, from_hf, to_hf)
