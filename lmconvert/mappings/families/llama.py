"""LLaMA 1, 2, 3, 3.1 and 3.2: the base that most other families are described against.

Pre-norm RMSNorm (weight applied after the cast back), gated SiLU MLP, half-rotation RoPE with any
of the scaling types, optional biases via `attention_bias` / `mlp_bias`, head_dim free of
hidden/heads, and an `lm_head` that is absent from the files when the embeddings are tied.

The rules, rows and config table here are the shared vocabulary of the llama-style families: they
import them and state only how they differ (`CONFIG.but(...)`).
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from ..family import Family
from ..tables.config_table import DEFAULT, ConfigTable, Entry, plain
from ..tables.gguf import (
    ATTENTION_BIAS_FLAG,
    STATES_VOCAB_AND_ROPE,
    GgufArch,
)
from ..tables.hf_config import Key
from ..tables.hf_rope import rope
from ..tables.table import Rule, TensorTable

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


ACTIVATIONS_FROM_HF = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                       "relu": "relu", "relu2": "relu2", "gelu_new": "gelu_new"}
ACTIVATIONS_TO_HF = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu",
                     "relu2": "relu2", "gelu_new": "gelu_new"}


def activation(key: str, default: str) -> Entry:
    """The MLP activation, under the key the family reads it from."""
    return plain(key, "activation", str, default, name="activation", choices=ACTIVATIONS_FROM_HF,
                 read=ACTIVATIONS_FROM_HF.__getitem__, write=activation_to_hf)


def activation_to_hf(activation: str) -> Any:
    """The `hidden_act` name; one transformers has no name for (BLOOM's own GeLU) is written as the
    family's default, so export refuses it by name."""
    return ACTIVATIONS_TO_HF.get(activation, DEFAULT)


def norm(eps: float, **constants: Any) -> Entry:
    """`rms_norm_eps` <-> norm.eps; `constants` are the NormConfig fields the family fixes."""
    return Entry("norm", (Key("rms_norm_eps", float, eps),),
                 lambda hf, _: {"norm": NormConfig(eps=hf.get("rms_norm_eps"), **constants)},
                 lambda cfg: {"rms_norm_eps": cfg.norm.eps})


def attention_biases(flag: bool) -> dict[str, bool]:
    """`attention_bias` switches the q, k, v and o biases together."""
    return {"q_bias": flag, "k_bias": flag, "v_bias": flag, "o_bias": flag}


def attention_bias_of(cfg: ArchConfig) -> bool:
    """`attention_bias` for export: True only when all four biases are there, so a partial set is
    reported as the biases the target cannot express."""
    return cfg.q_bias and cfg.k_bias and cfg.v_bias and cfg.o_bias


ATTENTION_BIAS = Entry("attention_bias", (Key("attention_bias", bool, False),),
                       lambda hf, _: attention_biases(hf.get("attention_bias")),
                       lambda cfg: {"attention_bias": attention_bias_of(cfg)})

# config.json key, ArchConfig field, JSON type, what an absent key means (transformers' default)
CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 32000),
    plain("hidden_size", "d_model", int, 4096),
    plain("intermediate_size", "d_ff", int, 11008),
    plain("num_hidden_layers", "n_layers", int, 32),
    plain("num_attention_heads", "n_heads", int, 32),
    plain("num_key_value_heads", "n_kv_heads", int, None, nullable=True),  # absent or null: one per head
    plain("head_dim", "head_dim", int, None, nullable=True),  # absent or null: hidden_size / heads
    plain("max_position_embeddings", "max_positions", int, 2048),
    plain("tie_word_embeddings", "tie_embeddings", bool, False),
    plain("attention_dropout", "attn_dropout", float, 0.0, nullable=True, bound="probability",
          read=lambda p: 0.0 if p is None else p),
    norm(1e-6),
    activation("hidden_act", "silu"),
    rope(),
    ATTENTION_BIAS,
    plain("mlp_bias", "mlp_bias", bool, False),
))


# -- llama.cpp (GGUF)
GGUF_LLAMA = GgufArch("llama", arch="llama", stated=STATES_VOCAB_AND_ROPE, defaults={"hidden_act": "silu"},
                         bias_flags={**ATTENTION_BIAS_FLAG, "mlp_bias": "blk.0.ffn_up.bias"}, permute_qk=True)


FAMILY = Family("llama", ("llama",), "LlamaForCausalLM", TENSORS, CONFIG, gguf=(GGUF_LLAMA,))
