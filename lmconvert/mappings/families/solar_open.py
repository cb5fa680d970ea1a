"""Solar Open (SolarOpenForCausalLM: Solar-Open-100B).

Same as glm4_moe, except: there is no QK norm (no `use_qk_norm`); `attention_bias` defaults to
false; RoPE rotates the whole head (theta default 1e6: a `partial_rotary_factor` below 1 makes
tables transformers' attention cannot apply, refused); every layer is a mixture of experts (no
`first_k_dense_replace`, no dense FFN, no `intermediate_size`): `n_routed_experts` (alias
`num_local_experts`) experts `moe_intermediate_size` wide and `n_shared_experts` ungated shared
experts (0: none), with DeepSeek-V3's router op for op (weight and `e_score_correction_bias` fp32,
fp32 logits, sigmoid scores, the choice on scores plus the bias within the best `topk_group` of
`n_group` groups, renormalised plus 1e-20 when `norm_topk_prob`, times `routed_scaling_factor`, each
expert's output weighted in fp32). `output_router_logits` adds no loss in transformers' Solar Open
and is not read.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_rope import FRACTION, rope_from_hf, rope_parameters, rope_to_hf
from ..tables.hf_rope import KEYS as KEYS_ROPE
from ..tables.points import SHARED_UNFLATTENED
from ..tables.table import TensorTable
from . import deepseek_v3, glm, llama

KEYS = (Key("n_routed_experts", int, 128), Key("num_local_experts", int, None, legacy=True),
        Key("num_experts_per_tok", int, 8), Key("moe_intermediate_size", int, 1280),
        Key("n_shared_experts", int, 1, bound="non_negative"), Key("routed_scaling_factor", float, 1.0),
        Key("n_group", int, 1), Key("topk_group", int, 1), Key("norm_topk_prob", bool, True))


def rope_from_solar(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    params, where = rope_parameters(hf)
    fraction = params.get(FRACTION.name, hf.get(FRACTION.name))
    if fraction not in (None, 1.0):
        raise MappingError(f"config.json: partial_rotary_factor={fraction}: Solar Open's tables then cover part of "
                           "each head, which its attention rotates whole; transformers cannot run it")
    return {"rope": rope_from_hf(hf, params, where)}


ROPE = Entry("rope", KEYS_ROPE, rope_from_solar, lambda cfg: {"rope_parameters": rope_to_hf(cfg.rope)})


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Every layer DeepSeek-V3's mixture of experts; the experts' width is the model's d_ff."""
    count = hf.get("num_local_experts") if not hf.stated("n_routed_experts") and hf.stated("num_local_experts") \
        else hf.get("n_routed_experts")
    width, shared = hf.get("moe_intermediate_size"), hf.get("n_shared_experts")
    moe = MoeConfig(n_experts=count, top_k=hf.get("num_experts_per_tok"), d_expert=width, router="sigmoid",
                    norm_topk=hf.get("norm_topk_prob"), weights_fp32=True, shared="plain" if shared else "none",
                    d_shared=shared * width if shared else None, n_group=hf.get("n_group"),
                    topk_group=hf.get("topk_group"), selection_bias=True, scale=hf.get("routed_scaling_factor"),
                    router_fp32=True)
    return {"d_ff": width, "moe": moe}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    if moe is None or moe.dense_layers:  # read back, a different model: reported as this mixture of experts
        return {k.name: DEFAULT for k in KEYS if not k.legacy}
    return {**deepseek_v3.v3_to_hf(moe), "n_shared_experts": 0 if moe.d_shared is None else
            deepseek_v3.shared_count(moe)}


CONFIG = llama.CONFIG.but(
    drop=("mlp_bias", "intermediate_size"),
    add=(ROPE, glm.QKV_BIAS, Entry("experts", KEYS, experts_from_hf, experts_to_hf)),
    defaults={"vocab_size": 196608, "hidden_size": 4096, "num_hidden_layers": 48, "num_attention_heads": 64,
              "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "attention_bias": False, "rope_theta": 1e6},
    nullable={"num_key_value_heads": False, "head_dim": False, "attention_dropout": False},
)

TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.PRE_NORM_RULES + deepseek_v3.MOE_RULES)

# SolarOpenMoE runs the shared experts on the unflattened input, as DeepSeek's
REFERENCE_LAYOUTS = SHARED_UNFLATTENED

FAMILY = Family("solar_open", ("solar_open",), "SolarOpenForCausalLM", TENSORS, CONFIG,
                reference_layouts=REFERENCE_LAYOUTS)
