"""Sarvam-105B (SarvamMLAConfig, run by transformers' DeepseekV3ForCausalLM).

Same as deepseek_v3, except: its own size defaults (no q LoRA, `n_group` and `topk_group` 1: every
expert in one group, one dense layer first, one KV head per head when `num_key_value_heads` is
absent or null); an older `rope_scaling` whose `type` or `rope_type` is "deepseek_yarn" is YaRN
with the same parameters; a stated `q_head_dim` or `head_dim` is dropped unread. The router is
DeepSeek-V3's, op for op (weight and `e_score_correction_bias` kept in fp32, fp32 logits from the
fp32 input, sigmoid scores, the choice on scores plus the correction bias within the best
`topk_group` of `n_group` groups, renormalised (plus 1e-20) when `norm_topk_prob`, times
`routed_scaling_factor`, all in fp32, each expert's output weighted in fp32 before the cast back),
with the shared experts run on the unflattened input.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import Entry
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_rope import KEYS as ROPE_KEYS
from ..tables.hf_rope import rope_from_hf, rope_parameters
from ..tables.points import LATENT, SHARED_UNFLATTENED
from . import deepseek_v3

LEGACY_YARN = "deepseek_yarn"


def rope_from_sarvam(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """SarvamMLAConfig reads a `rope_scaling` of type "deepseek_yarn" as YaRN's parameters."""
    params, where = rope_parameters(hf)
    if hf.get("rope_scaling") and LEGACY_YARN in (params.get("type"), params.get("rope_type")):
        params = {k: v for k, v in params.items() if k != "type"} | {"rope_type": "yarn"}
    layout = "interleaved" if hf.get("rope_interleave") else "half"
    return {"rope": rope_from_hf(hf, params, where, layout=layout)}


def rope_to_sarvam(cfg: ArchConfig) -> dict[str, Any]:
    return deepseek_v3.rope_to_deepseek(cfg)


CONFIG = deepseek_v3.CONFIG.but(
    add=(Entry("rope", (*ROPE_KEYS, deepseek_v3.INTERLEAVE), rope_from_sarvam, rope_to_sarvam),
         deepseek_v3.latent("sarvam_mla", deinterleave=True, v_head_dim_nullable=True),
         # dropped by SarvamMLAConfig: checked as a count, never read, never written
         Entry("q_head_dim", (Key("q_head_dim", int, None, nullable=True, legacy=True),), lambda hf, _: {},
               lambda cfg: {})),
    defaults={"vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 32,
              "num_attention_heads": 64, "num_key_value_heads": None, "n_routed_experts": 128, "q_lora_rank": None,
              "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1},
)

# DeepseekV3Attention: kv_b_proj on the latent viewed as (B, 1, T, C), as ours; DeepseekV3MoE runs
# the shared experts on the unflattened input
REFERENCE_LAYOUTS = {**LATENT, **SHARED_UNFLATTENED}

# -- llama.cpp (GGUF)
# llama.cpp's deepseek2 runs it as DeepSeek-V3 (its converter's DeepseekV2Model)
GGUF_SARVAM_MLA = deepseek_v3.runs_as_v3("sarvam_mla", "sarvam")

FAMILY = Family("sarvam_mla", ("sarvam_mla",), "DeepseekV3ForCausalLM", deepseek_v3.TENSORS, CONFIG,
                gguf=(GGUF_SARVAM_MLA,), reference_layouts=REFERENCE_LAYOUTS)
