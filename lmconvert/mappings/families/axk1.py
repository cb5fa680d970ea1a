"""A.X K1 (AXK1ForCausalLM).

Same as deepseek_v3, except: its own size defaults (192 experts, 64 KV heads, 32768 positions); q is
always low-rank (`q_lora_rank` cannot be null);
`mlp_layer_types` ("dense" or "sparse" per layer) picks the mixture-of-experts layers, and without
it `first_k_dense_replace` (default 1) and `moe_layer_freq` (default 1), which AXK1Config reads but
does not keep, make layer i sparse when i >= first_k_dense_replace and i % moe_layer_freq == 0; each
mixture's output (routed plus shared experts) is normalised by an RMSNorm (`post_mlp_layernorm`,
rms_norm_eps, llama's dtype order), on the sparse layers only. The Hub's files hold that norm at the
layer (`model.layers.{i}.post_mlp_layernorm`), as transformers' save_pretrained writes it; its
in-memory name (`mlp.post_mlp_layernorm`) is read too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import dense_layers
from ..tables.points import LATENT, SHARED_UNFLATTENED
from ..tables.table import Rule, TensorTable
from . import deepseek_v3

MLP_LAYER_TYPES = Key("mlp_layer_types", list, None, nullable=True)
# read by AXK1Config only to make mlp_layer_types, then dropped: never written
DERIVING = (Key("first_k_dense_replace", int, 1, bound="non_negative", legacy=True),
            Key("moe_layer_freq", int, 1, legacy=True))
KEYS = (Key("n_routed_experts", int, 192), Key("num_local_experts", int, None, legacy=True),
        Key("num_experts_per_tok", int, 8), Key("moe_intermediate_size", int, 2048), Key("n_shared_experts", int, 1),
        Key("routed_scaling_factor", float, 2.5), Key("n_group", int, 8), Key("topk_group", int, 4),
        Key("norm_topk_prob", bool, True, nullable=True))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    if hf.get("mlp_layer_types") is None:
        first, freq = hf.get("first_k_dense_replace"), hf.get("moe_layer_freq")
        dense = tuple(i for i in range(n) if not (i >= first and i % freq == 0))
    else:
        dense = dense_layers(hf, n, 1)
    if len(dense) == n:
        return {}
    moe = replace(deepseek_v3.v3_moe(hf, 0, n), dense_layers=dense, output_norm=True)
    if not hf.stated("n_routed_experts") and hf.stated("num_local_experts"):  # AXK1Config's attribute_map
        moe = replace(moe, n_experts=hf.get("num_local_experts"))
    return {"moe": moe}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    dense = range(cfg.n_layers) if moe is None else moe.dense_layers
    types = ["dense" if i in dense else "sparse" for i in range(cfg.n_layers)]
    if moe is None or not moe.output_norm:  # read back, another model: reported as it
        return {"mlp_layer_types": types, **{k.name: DEFAULT for k in KEYS if not k.legacy}}
    return {"mlp_layer_types": types, **deepseek_v3.v3_to_hf(moe)}


CONFIG = deepseek_v3.CONFIG.but(
    add=(deepseek_v3.latent("axk1", deinterleave=True, v_head_dim_nullable=False),
         Entry("experts", (MLP_LAYER_TYPES, *DERIVING, *KEYS), experts_from_hf, experts_to_hf)),
    defaults={"vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
              "num_attention_heads": 64, "num_key_value_heads": 64, "max_position_embeddings": 32768},
    nullable={"num_key_value_heads": False, "q_lora_rank": False},
)

OUTPUT_NORM_RULES = (Rule("model.layers.{}.post_mlp_layernorm.weight", "layers.{}.mlp.norm.weight"),
                     Rule("model.layers.{}.mlp.post_mlp_layernorm.weight", "layers.{}.mlp.norm.weight"))
TENSORS = TensorTable(deepseek_v3.TENSORS.rules + OUTPUT_NORM_RULES)

# DeepseekV3Attention's layout; AXK1MoE runs the shared experts on the unflattened input
REFERENCE_LAYOUTS = {**LATENT, **SHARED_UNFLATTENED}

FAMILY = Family("axk1", ("axk1",), "AXK1ForCausalLM", TENSORS, CONFIG, reference_layouts=REFERENCE_LAYOUTS)
