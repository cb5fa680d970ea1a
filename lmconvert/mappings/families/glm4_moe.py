"""GLM-4.5 and GLM-4.6 (Glm4MoeForCausalLM: GLM-4.5, GLM-4.5-Air, GLM-4.6).

Same as llama, except: `attention_bias` switches the q, k and v biases, never the output
projection's; `use_qk_norm` adds a per-head QK norm (`q_norm` / `k_norm` over head_dim on the (B, T,
H, D) view, llama-style RMSNorm with the weight after the cast, before RoPE); RoPE rotates only
`partial_rotary_factor` (default 0.5, for every rope type) of each head, in halves as llama's; the
MLP has no bias; `rms_norm_eps` defaults to 1e-5. Layers from `first_k_dense_replace` (default 1)
on are deepseek_v3's mixture of experts: `n_routed_experts` experts (`moe_intermediate_size` wide)
and `n_shared_experts` ungated shared experts (one FFN of their summed width, run on the
unflattened input and added last); the router (`mlp.gate`, weight and `e_score_correction_bias`
kept in fp32 by transformers) takes fp32 logits from the fp32 input, scores experts by their
sigmoid, chooses `num_experts_per_tok` on those scores plus the correction bias within the best
`topk_group` of `n_group` groups, renormalises the chosen scores (plus 1e-20) when `norm_topk_prob`
(default true), multiplies them by `routed_scaling_factor`, all in fp32, and weights each expert's
output in fp32 before the cast back. The multi-token-prediction layers (`num_mtp_layers`), which
transformers does not load, are not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import ATTENTION_BIAS_FLAG, tensor_table, written
from ..tables.hf_config import Key
from ..tables.hf_rope import rope
from ..tables.points import QK_NORM_PER_HEAD, SHARED_UNFLATTENED
from ..tables.table import Rule, TensorTable
from . import deepseek_v3, glm, llama

QK_NORM = Entry("use_qk_norm", (Key("use_qk_norm", bool, False),),
                lambda hf, _: {"qk_norm": "head" if hf.get("use_qk_norm") else "none"},
                lambda cfg: {"use_qk_norm": cfg.qk_norm == "head"})

# Glm4MoeAttention: getattr(config, "head_dim", hidden_size // num_attention_heads), rounded down
HEAD_DIM = Entry("head_dim", (Key("head_dim", int, None),),
                 lambda hf, fields: {"head_dim": hf.get("head_dim") or fields["d_model"] // fields["n_heads"]},
                 lambda cfg: {"head_dim": cfg.head_dim})

FIRST_DENSE = Key("first_k_dense_replace", int, 1, bound="non_negative")
KEYS = (Key("n_routed_experts", int, 128), Key("num_experts_per_tok", int, 8), Key("moe_intermediate_size", int, 1408),
        Key("n_shared_experts", int, 1), Key("routed_scaling_factor", float, 1.0), Key("n_group", int, 1),
        Key("topk_group", int, 1), Key("norm_topk_prob", bool, True))

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(HEAD_DIM, llama.norm(1e-5), rope(partial=True), glm.QKV_BIAS, QK_NORM,
         deepseek_v3.experts_row("experts", FIRST_DENSE, KEYS, deepseek_v3.v3_moe, deepseek_v3.v3_to_hf)),
    defaults={"vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
              "num_attention_heads": 96, "num_key_value_heads": 8, "max_position_embeddings": 131072,
              "attention_bias": False, "partial_rotary_factor": 0.5},
    nullable={"num_key_value_heads": False, "attention_dropout": False},
)

TENSORS = TensorTable(llama.TENSORS.rules + llama.QK_NORM_RULES + deepseek_v3.MOE_RULES)

# q_norm(q_proj(x).view(B, T, -1, D)), transposed afterwards, as Qwen3's; Glm4MoeMoE runs the shared
# experts on the unflattened input, as DeepSeek's
REFERENCE_LAYOUTS = {**QK_NORM_PER_HEAD, **SHARED_UNFLATTENED}


# -- llama.cpp (GGUF)
def _glm4moe_table() -> TensorTable:
    """llama.cpp's glm4moe: the MLP's pre-norm (HF's post_attention_layernorm) stored as
    `post_attention_norm`, no `ffn_norm`; q/k unpermuted (NeoX-style rotation); dense SwiGLU layers
    first, then stacked experts with shared ones and the selection bias (`exp_probs_b`)."""
    mlp_norm, rules = "blk.{}.post_attention_norm.weight", tensor_table(False, 0.0, True).rules
    return TensorTable(tuple(Rule(r.stored, "layers.{}.mlp_norm.weight", r.transform) if r.stored == mlp_norm else r
                             for r in rules if r.stored != "blk.{}.ffn_norm.weight") + deepseek_v3.V3_ROUTER_RULES)


def _glm4moe(config: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3's router (llama.cpp's glm4moe takes a file stating no gating function as
    sigmoid); per-head q/k norms when the file holds them."""
    deepseek_v3.v3_router({"expert_gating_func": deepseek_v3.SIGMOID, **config}, "glm4moe")
    return {}


# GLM-4.5's special tokens as llama.cpp's converter states them (_set_vocab_glm) where the files name none
GLM45_TOKENS = {"tokenizer.ggml.bos_token_id": "[gMASK]", "tokenizer.ggml.eot_token_id": "<|user|>",
                "tokenizer.ggml.unknown_token_id": "<|endoftext|>", "tokenizer.ggml.eom_token_id": "<|observation|>"}
# its loader reads the q, k and v biases only; the rotated part of a head is `rope.dimension_count`
GGUF_GLM4_MOE = written("glm4_moe", arch="glm4moe", keys=deepseek_v3.V3_ROUTER_KEYS,
                        defaults={"hidden_act": "silu", **deepseek_v3.V3_ROUTER_DEFAULTS},
                        constants={"expert_gating_func": deepseek_v3.SIGMOID},
                        bias_flags={**ATTENTION_BIAS_FLAG, "use_qk_norm": "blk.0.attn_q_norm.weight"},
                        partial_rotary=True, derived=_glm4moe, table=_glm4moe_table(), token_texts=GLM45_TOKENS)

FAMILY = Family("glm4_moe", ("glm4_moe",), "Glm4MoeForCausalLM", TENSORS, CONFIG, gguf=(GGUF_GLM4_MOE,),
                reference_layouts=REFERENCE_LAYOUTS)
