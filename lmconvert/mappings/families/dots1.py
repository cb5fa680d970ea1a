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

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
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

FAMILY = Family("dots1", ("dots1",), "Dots1ForCausalLM", TENSORS, CONFIG, reference_layouts=REFERENCE_LAYOUTS)
