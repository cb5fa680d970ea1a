"""Sarvam-30B (SarvamMoEConfig, run by transformers' Glm4MoeForCausalLM).

Same as glm4_moe, except: its own defaults (RoPE over the whole head: `partial_rotary_factor`
1.0 when absent; `use_qk_norm` true; 6 of 128 experts 1024 wide, `routed_scaling_factor` 2.5,
`rms_norm_eps` 1e-6, head_dim 64, theta 8e6); config.json may spell the expert count
`num_experts` or `num_local_experts`, the shared count `num_shared_experts` and `attention_bias`
`use_qkv_bias` (SarvamMoEConfig's attribute_map), read where the own key is absent; the Hub's
original tensor names (`word_embeddings`, a fused `attention.query_key_value` [q | k | v],
`attention.dense`, `query_layernorm` / `key_layernorm`, `mlp.gate.expert_bias`), which
transformers' conversion mapping reads and its save_pretrained writes, are read and written; its
in-memory names (glm4_moe's) are read too.
"""

from __future__ import annotations

from typing import Any

from ..family import Family
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Piece
from . import glm4_moe, phi3

ALIASES = {"num_experts": "n_routed_experts", "num_local_experts": "n_routed_experts",
           "num_shared_experts": "n_shared_experts", "use_qkv_bias": "attention_bias"}


def with_own_names(data: dict[str, Any]) -> dict[str, Any]:
    """SarvamMoEConfig's attribute_map: an alias stands for its key where the key is absent."""
    out = dict(data)
    for alias, own in ALIASES.items():
        if alias in out and own not in out:
            out[own] = out[alias]
        out.pop(alias, None)
    return out


CONFIG = glm4_moe.CONFIG.but(
    defaults={"vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 8192, "num_hidden_layers": 19,
              "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-6,
              "moe_intermediate_size": 1024, "num_experts_per_tok": 6, "routed_scaling_factor": 2.5,
              "use_qk_norm": True, "rope_theta": 8e6, "partial_rotary_factor": 1.0},
    decoder=with_own_names,
)

ORIGINAL_RULES = (
    Rule("model.word_embeddings.weight", "embed.weight"),
    *(Rule(f"model.layers.{{}}.attention.query_key_value.{p}", f"layers.{{}}.attn.{name}.{p}", Piece(phi3.QKV, i))
      for p in ("weight", "bias") for i, name in enumerate("qkv")),
    Rule("model.layers.{}.attention.dense.weight", "layers.{}.attn.o.weight"),
    Rule("model.layers.{}.attention.query_layernorm.weight", "layers.{}.attn.q_norm.weight"),
    Rule("model.layers.{}.attention.key_layernorm.weight", "layers.{}.attn.k_norm.weight"),
    Rule("model.layers.{}.mlp.gate.expert_bias", "layers.{}.mlp.router.selection_bias"),
)
# transformers' save_pretrained writes the original names (its conversion mapping reversed): export writes them
# too; the names transformers 5 holds in memory (save_original_format=False) are read as well
TENSORS = TensorTable(ORIGINAL_RULES + glm4_moe.TENSORS.rules)

FAMILY = Family("sarvam_moe", ("sarvam_moe",), "Glm4MoeForCausalLM", TENSORS, CONFIG,
                reference_layouts=glm4_moe.REFERENCE_LAYOUTS)
