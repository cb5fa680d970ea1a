"""Flint (FlintForCausalLM).

Same as qwen3_moe, except: every attention head has a learned sink (`self_attn.sinks` [heads], the
Hub's `self_attn.softmax_offset`; kept in fp32 in any dtype), a logit that joins each query's
softmax as one more column and is dropped after it; the scores are computed from fp32 copies of q
and k and softmaxed with the sink in fp32 before the cast to the activation dtype; `layer_types`
(default: full on layers 0 and 1, every layer i with i % 4 == 1 and the last, sliding elsewhere)
picks the layers that attend within `sliding_window` (default 513), and only the sliding layers
rotate (full layers have no positions); every norm (the QK norms too) multiplies its weight in fp32
before the cast back (`GptOssRMSNorm`); the router (`mlp.gate`, kept in fp32) computes its logits in
fp32, takes the sigmoid of the whole row and chooses the top `num_experts_per_tok` of `num_experts`
(default 256, top 6) of those sigmoids in decreasing order (a sorted top-k: the order each token's experts
are summed in; tied sigmoids, those rounded to 1, are chosen among as torch's top-k does, not by their
logits) and weights them by those sigmoids, renormalised to sum to 1 where `norm_topk_prob` (default true;
no guard), kept in fp32 as each expert's output is weighted; every sparse layer adds an ungated shared SwiGLU
expert (`mlp.shared_expert`, `shared_expert_intermediate_size` wide, default 1024) to the routed
experts; `mlp_only_layers` defaults to [0, 1] (null too), and the dense MLP is `intermediate_size`
wide (6144). The auxiliary-loss keys act in training only.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import Entry, fixed
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layers_and_window_to_hf,
    window_fields,
)
from ..tables.hf_moe import expert_rules, experts
from ..tables.table import Rule, TensorTable
from . import llama, qwen3, qwen3_moe
from .gpt_oss import SINK_RULES
from .qwen2_moe import SHARED_RULES

TENSORS = TensorTable((Rule("model.layers.{}.self_attn.softmax_offset", "layers.{}.attn.sinks"), *SINK_RULES)
                      + qwen3.TENSORS.rules + expert_rules("mlp", ("gate_proj", "up_proj", "down_proj"), "gate")
                      + SHARED_RULES[:3])

DENSE_DEFAULT = [0, 1]  # FlintConfig's mlp_only_layers when absent or null


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """The layer kinds and the window; the sliding layers rotate, the full ones have no positions."""
    n = fields["n_layers"]
    kinds = layer_kinds_from_hf(hf, n, lambda i: not (i < 2 or i % 4 == 1 or i == n - 1))
    return {**window_fields(kinds, hf.get("sliding_window")),
            "layer_positions": tuple("rope" if kind == "local" else "none" for kind in kinds)}


ROUTED = experts(Key("num_experts", int, 256), Key("num_experts_per_tok", int, 6),
                 width=Key("moe_intermediate_size", int, 512), norm_key=Key("norm_topk_prob", bool, True),
                 shared_width=Key("shared_expert_intermediate_size", int, 1024), sparse_step=qwen3_moe.SPARSE_STEP,
                 dense_list=qwen3_moe.MLP_ONLY_LAYERS, aux_default=0.0005, router="sigmoid_fp32_sorted",
                 router_fp32=True, norm_eps=0.0, weights_fp32=True, shared="plain")


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    if hf.get(qwen3_moe.MLP_ONLY_LAYERS.name) is None:
        hf = HfConfig({**hf.data, qwen3_moe.MLP_ONLY_LAYERS.name: DENSE_DEFAULT}, hf.keys, hf.where)
    return ROUTED.read(hf, fields)


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The default's dense layers as the default states them (step 1 and [0, 1], not the step that
    explains most of them)."""
    out = ROUTED.write(cfg)
    if cfg.moe is not None and cfg.moe.dense_layers == tuple(i for i in DENSE_DEFAULT if i < cfg.n_layers):
        out.update({qwen3_moe.SPARSE_STEP.name: 1, qwen3_moe.MLP_ONLY_LAYERS.name: DENSE_DEFAULT})
    return out


CONFIG = qwen3_moe.CONFIG.but(
    add=(llama.norm(1e-6, dtype_order="scale_then_cast"),
         Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY), layers_from_hf, layers_and_window_to_hf),
         Entry("experts", ROUTED.keys, experts_from_hf, experts_to_hf),
         fixed("sinks", attn_sinks=True, scores_fp32=True, sinks_fp32=True)),
    defaults={"vocab_size": 150144, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 49,
              "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
              "max_position_embeddings": 262144, "sliding_window": 513},
    nullable={"head_dim": False, "sliding_window": False},
)


REFERENCE_LAYOUTS = qwen3_moe.REFERENCE_LAYOUTS

FAMILY = Family("flint", ("flint",), "FlintForCausalLM", TENSORS, CONFIG, reference_layouts=REFERENCE_LAYOUTS)
