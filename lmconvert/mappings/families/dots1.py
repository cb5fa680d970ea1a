"""dots.llm1 (dots.llm1.base, dots.llm1.inst).

Same as qwen3, except: head_dim is hidden/heads unless config.json states it; without
`layer_types`, a non-null `sliding_window` applies to the layers i >= `max_window_layers` (there is
no `use_sliding_window`); the MLP has no bias; and layers from `first_k_dense_replace` (default 0)
on are deepseek_v3's mixture of experts: `n_routed_experts` experts (`moe_intermediate_size` wide)
with `n_shared_experts` ungated shared experts (one FFN of their summed width, run on the
unflattened input and added last); the router (`mlp.gate`, weight and `e_score_correction_bias`
kept in fp32 by transformers) takes fp32 logits from the fp32 input, scores experts by their
sigmoid, chooses `num_experts_per_tok` of them on those scores plus the correction bias within the
best `topk_group` of `n_group` groups (default 1: no grouping), renormalises the chosen scores
(plus 1e-20) when `norm_topk_prob`, multiplies them by `routed_scaling_factor` (default 1.0), all
in fp32, and each expert's output is weighted in fp32 before the cast back. The expert counts have
no defaults: a mixture-of-experts layer needs them stated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.gguf import ATTENTION_BIAS_FLAG, tensor_table, written
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layer_types_to_hf,
    window_fields,
)
from ..tables.points import QK_NORM_PER_HEAD, SHARED_UNFLATTENED
from ..tables.table import TensorTable
from . import deepseek_v3, llama


def sliding_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    window, first = hf.get("sliding_window"), hf.get("max_window_layers")
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: window is not None and i >= first)
    return window_fields(kinds, window)


def sliding_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    local = [i for i, kind in enumerate(cfg.layer_kinds) if kind == "local"]
    return {"sliding_window": cfg.sliding_window if local else DEFAULT,
            "max_window_layers": local[0] if local else DEFAULT, "layer_types": layer_types_to_hf(cfg.layer_kinds)}


SLIDING = Entry("layer kinds", (SLIDING_WINDOW_KEY, Key("max_window_layers", int, 62, bound="non_negative"),
                                LAYER_TYPES_KEY), sliding_from_hf, sliding_to_hf)

FIRST_DENSE = Key("first_k_dense_replace", int, 0, nullable=True, bound="non_negative")
KEYS = (Key("n_routed_experts", int, None, nullable=True), Key("num_experts_per_tok", int, None, nullable=True),
        Key("moe_intermediate_size", int, 1408), Key("n_shared_experts", int, None, nullable=True),
        Key("routed_scaling_factor", float, 1.0), Key("n_group", int, 1, nullable=True),
        Key("topk_group", int, 1, nullable=True), Key("norm_topk_prob", bool, False, nullable=True))


def dots1_moe(hf: HfConfig, first: int, n: int) -> MoeConfig:
    """Dots1TopkRouter is DeepseekV3TopkRouter; the counts it needs have no defaults."""
    deepseek_v3.required(hf, ("n_routed_experts", "n_shared_experts"), first, n)
    return deepseek_v3.v3_moe(hf, first, n)


CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(fixed("QK norm", qk_norm="head"), SLIDING,
         deepseek_v3.experts_row("experts", FIRST_DENSE, KEYS, dots1_moe, deepseek_v3.v3_to_hf)),
    defaults={"vocab_size": 152064, "hidden_size": 4608, "intermediate_size": 10944, "num_hidden_layers": 62,
              "num_key_value_heads": 32},
    nullable={"head_dim": False},  # head_dim: not a Dots1Config key, read if stated
)

TENSORS = TensorTable(llama.TENSORS.rules + llama.QK_NORM_RULES + deepseek_v3.MOE_RULES)

# q_norm(q_proj(x).view(B, T, -1, D)), transposed afterwards, as Qwen3's; Dots1MoE runs the shared
# experts on the unflattened input, as DeepSeek's
REFERENCE_LAYOUTS = {**QK_NORM_PER_HEAD, **SHARED_UNFLATTENED}


# -- llama.cpp (GGUF)
def _dots1(config: Mapping[str, Any]) -> dict[str, Any]:
    """What llama.cpp's dots1 runs: DeepSeek-V3's router (its converter states the sigmoid from
    `scoring_func`), no window, as many K/V heads as heads (its loader sizes k and v so)."""
    deepseek_v3.v3_router(config, "dots1")
    if config["num_key_value_heads"] != config["num_attention_heads"]:
        raise MappingError(f"llama.cpp's dots1 sizes k and v as q ({config['num_attention_heads']} heads), and this "
                           f"file has {config['num_key_value_heads']} K/V heads")
    return {}


# dense SwiGLU layers first, then stacked experts with shared ones and the selection bias (`exp_probs_b`)
GGUF_DOTS1 = written("dots1", arch="dots1", keys=deepseek_v3.V3_ROUTER_KEYS,
                     defaults={"hidden_act": "silu", **deepseek_v3.V3_ROUTER_DEFAULTS},
                     constants={"expert_gating_func": deepseek_v3.SIGMOID}, bias_flags=ATTENTION_BIAS_FLAG,
                     derived=_dots1, table=TensorTable(tensor_table(False, 0.0, True).rules
                                                       + deepseek_v3.V3_ROUTER_RULES))

FAMILY = Family("dots1", ("dots1",), "Dots1ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_DOTS1,),
                reference_layouts=REFERENCE_LAYOUTS)
