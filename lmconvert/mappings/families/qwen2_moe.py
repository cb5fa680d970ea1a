"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B).

Same as qwen2, except: the FFN of every layer `i` with `(i + 1) % decoder_sparse_step == 0` and not
in `mlp_only_layers` is a mixture of `num_experts` SwiGLU experts, each `moe_intermediate_size`
wide, with a router (`mlp.gate`) whose softmax is in fp32 and whose top `num_experts_per_tok`
weights are renormalised only if `norm_topk_prob`, then cast to the activation dtype, plus one
shared expert (`mlp.shared_expert`, `shared_expert_intermediate_size` wide) whose output is scaled
by sigmoid(`mlp.shared_expert_gate`) and added after the routed experts; the other layers keep the
dense MLP of `intermediate_size`. `qkv_bias` (default true) switches the q, k and v biases. Without
`layer_types`, the sliding window (when `use_sliding_window`) applies to the even layers below
`max_window_layers`; transformers writes `sliding_window` 0 when it is unused.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.gguf import (
    QWEN_MOE_KEYS,
    GgufArch,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import LAYER_TYPES_KEY, layer_kinds_from_hf, layer_types_to_hf, window_fields
from ..tables.hf_moe import expert_rules, experts
from ..tables.table import Rule, TensorTable
from . import llama, qwen2
from .qwen3_moe import MLP_ONLY_LAYERS, NORM_TOPK, SPARSE_STEP

SHARED_RULES = (
    *(Rule(f"model.layers.{{}}.mlp.shared_expert.{n}_proj.weight", f"layers.{{}}.mlp.shared.{n}.weight")
      for n in ("gate", "up", "down")),
    Rule("model.layers.{}.mlp.shared_expert_gate.weight", "layers.{}.mlp.shared_gate.weight"),
)
TENSORS = TensorTable(llama.TENSORS.rules + expert_rules("mlp", ("gate_proj", "up_proj", "down_proj"), "gate")
                      + SHARED_RULES)


def sliding_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    on, first = hf.get("use_sliding_window"), hf.get("max_window_layers")
    window = (hf.get("sliding_window") or None) if on else None  # 0: none
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: on and bool((i + 1) % 2) and i < first)
    return window_fields(kinds, window)


def sliding_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    local = [i for i, kind in enumerate(cfg.layer_kinds) if kind == "local"]
    return {"use_sliding_window": bool(local), "sliding_window": cfg.sliding_window if local else 0,
            "max_window_layers": local[-1] + 1 if local else DEFAULT, "layer_types": layer_types_to_hf(cfg.layer_kinds)}


SLIDING = Entry("layer kinds", (Key("use_sliding_window", bool, False),
                                Key("sliding_window", int, 4096, nullable=True, bound="non_negative"),
                                Key("max_window_layers", int, 28, bound="non_negative"), LAYER_TYPES_KEY),
                sliding_from_hf, sliding_to_hf)

CONFIG = qwen2.CONFIG.but(
    drop=("q, k, v biases",),
    add=(Entry("qkv_bias", (Key("qkv_bias", bool, True),),
               lambda hf, _: dict.fromkeys(("q_bias", "k_bias", "v_bias"), hf.get("qkv_bias")),
               lambda cfg: {"qkv_bias": cfg.q_bias and cfg.k_bias and cfg.v_bias}),
         SLIDING,
         experts(Key("num_experts", int, 60), Key("num_experts_per_tok", int, 4),
                 width=Key("moe_intermediate_size", int, 1408), norm_key=NORM_TOPK,
                 shared_width=Key("shared_expert_intermediate_size", int, 5632), sparse_step=SPARSE_STEP,
                 dense_list=MLP_ONLY_LAYERS, shared="gated", aux_default=0.001)),
    defaults={"intermediate_size": 5632, "num_key_value_heads": 16, "hidden_size": 2048, "num_hidden_layers": 24,
              "num_attention_heads": 16},
)


# -- llama.cpp (GGUF)
# llama.cpp's qwen2moe graph (no dense layers, no window) never renormalises the top-k weights
GGUF_QWEN2MOE = GgufArch("qwen2_moe", arch="qwen2moe", keys={**QWEN_MOE_KEYS,
                                               "expert_shared_feed_forward_length": "shared_expert_intermediate_size"},
                            defaults={"hidden_act": "silu", "use_sliding_window": False, "norm_topk_prob": False},
                            bias_flags={"qkv_bias": "blk.0.attn_q.bias"}, experts=True, head_dim_stated=False)


FAMILY = Family("qwen2_moe", ("qwen2_moe",), "Qwen2MoeForCausalLM", TENSORS, CONFIG, gguf=(GGUF_QWEN2MOE,))
