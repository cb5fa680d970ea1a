"""GLM-4.7-Flash (Glm4MoeLiteForCausalLM).

Same as deepseek_v3, except: `mlp_layer_types` ("dense" or "sparse" per layer; absent, the first
layer dense and the others sparse) says which layers are mixtures of experts, and there is no
`first_k_dense_replace`; the router is GLM-4.5's, which is DeepSeek-V3's op for op (weight and
`e_score_correction_bias` kept in fp32, fp32 logits from the fp32 input, sigmoid scores, the choice
on scores plus the correction bias within the best `topk_group` of `n_group` groups, renormalised
(plus 1e-20) when `norm_topk_prob`, times `routed_scaling_factor`, all in fp32, each expert's output
weighted in fp32 before the cast back), with the shared experts run on the unflattened input;
`rms_norm_eps` defaults to 1e-5 (the MLA-internal norms keep 1e-6); `v_head_dim`,
`num_experts_per_tok`, `n_group`, `topk_group`, `norm_topk_prob`, `rope_interleave` and
`num_key_value_heads` are never null; its own size defaults. The multi-token-prediction layer,
which transformers does not load, is not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import dense_layers
from ..tables.points import LATENT, SHARED_UNFLATTENED
from . import deepseek_v3, glm4_moe, llama

MLP_LAYER_TYPES = Key("mlp_layer_types", list, None, nullable=True)
KEYS = (Key("n_routed_experts", int, 64), Key("num_experts_per_tok", int, 4), Key("moe_intermediate_size", int, 1536),
        Key("n_shared_experts", int, 1), Key("routed_scaling_factor", float, 1.8), Key("n_group", int, 1),
        Key("topk_group", int, 1), Key("norm_topk_prob", bool, True))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """transformers makes layer i a mixture of experts where mlp_layer_types[i] is "sparse"."""
    n = fields["n_layers"]
    dense = dense_layers(hf, n, 1)
    if len(dense) == n:
        return {}
    moe = deepseek_v3.v3_moe(hf, 0, n)
    return {"moe": replace(moe, dense_layers=dense)}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    dense = range(cfg.n_layers) if cfg.moe is None else cfg.moe.dense_layers
    types = ["dense" if i in dense else "sparse" for i in range(cfg.n_layers)]
    keys = {k.name: DEFAULT for k in KEYS} if cfg.moe is None else deepseek_v3.v3_to_hf(cfg.moe)
    return {"mlp_layer_types": types, **keys}


CONFIG = deepseek_v3.CONFIG.but(
    add=(llama.norm(1e-5), deepseek_v3.latent("glm4_moe_lite", deinterleave=True, v_head_dim_nullable=False),
         Entry("experts", (MLP_LAYER_TYPES, *KEYS), experts_from_hf, experts_to_hf)),
    defaults={"vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240, "num_hidden_layers": 47,
              "num_attention_heads": 20, "num_key_value_heads": 20, "max_position_embeddings": 202752,
              "q_lora_rank": 768, "qk_nope_head_dim": 192, "v_head_dim": 256},
    nullable={"num_key_value_heads": False, "attention_dropout": False, "rope_interleave": False},
)

# DeepseekV3Attention's layout: kv_b_proj on the latent viewed as (B, 1, T, C), as ours; Glm4MoeLiteMoE
# runs the shared experts on the unflattened input
REFERENCE_LAYOUTS = {**LATENT, **SHARED_UNFLATTENED}


# -- llama.cpp (GGUF)
def _leading_dense(config: Mapping[str, Any]) -> int:
    """The dense layers llama.cpp's deepseek2 can hold: the leading ones (`leading_dense_block_count`);
    others read back as experts, so that a model with them is refused."""
    types = config.get("mlp_layer_types") or ["dense"] + ["sparse"] * (config["num_hidden_layers"] - 1)
    return next((i for i, kind in enumerate(types) if kind != "dense"), len(types))


def _layer_types(config: Mapping[str, Any]) -> dict[str, Any]:
    """mlp_layer_types from llama.cpp's leading dense blocks, and DeepSeek-V3's MLA sizes and router."""
    first, n = config.get("first_k_dense_replace") or 0, config["num_hidden_layers"]
    return {**deepseek_v3.DEEPSEEK_V3.derived(config), "mlp_layer_types": ["dense"] * first + ["sparse"] * (n - first)}


# llama.cpp's deepseek2 runs it as DeepSeek-V3 (its converter: Glm4MoeLiteModel, a DeepseekV2Model)
GGUF_GLM4_MOE_LITE = deepseek_v3.runs_as_v3("glm4_moe_lite", "glm4_moe_lite", derived=_layer_types, unstated={
    **deepseek_v3.DEEPSEEK_V3.unstated, "first_k_dense_replace": _leading_dense}, token_texts=glm4_moe.GLM45_TOKENS)

FAMILY = Family("glm4_moe_lite", ("glm4_moe_lite",), "Glm4MoeLiteForCausalLM", deepseek_v3.TENSORS, CONFIG,
                gguf=(GGUF_GLM4_MOE_LITE,), reference_layouts=REFERENCE_LAYOUTS)
