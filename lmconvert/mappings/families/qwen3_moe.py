"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B).

Same as qwen3, except: the FFN of every layer `i` with `(i + 1) % decoder_sparse_step == 0` and not
in `mlp_only_layers` is a mixture of `num_local_experts` (the Hub's files spell it `num_experts`)
SwiGLU experts, each `moe_intermediate_size` wide, with a router (`mlp.gate`) whose softmax is in
fp32 and whose top `num_experts_per_tok` weights are renormalised only if `norm_topk_prob`, then
cast to the activation dtype; the other layers keep the dense MLP of `intermediate_size`. The
sliding window applies to every layer when `use_sliding_window` is true (there is no
`max_window_layers` or `layer_types`), and head_dim is hidden/heads unless config.json states it.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import (
    ATTENTION_BIAS_FLAG,
    QWEN_MOE_KEYS,
    GgufArch,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import SLIDING_WINDOW_KEY, window_fields
from ..tables.hf_moe import expert_rules, experts
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import TensorTable
from . import qwen3

TENSORS = TensorTable(qwen3.TENSORS.rules + expert_rules("mlp", ("gate_proj", "up_proj", "down_proj"), "gate"))

# the expert keys Qwen2-MoE shares
SPARSE_STEP = Key("decoder_sparse_step", int, 1)
MLP_ONLY_LAYERS = Key("mlp_only_layers", list, None, nullable=True)
NORM_TOPK = Key("norm_topk_prob", bool, False)


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    return window_fields(("global" if window is None else "local",) * fields["n_layers"], window)


def window_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window}


CONFIG = qwen3.CONFIG.but(
    add=(Entry("layer kinds", (Key("use_sliding_window", bool, False), SLIDING_WINDOW_KEY), window_from_hf,
               window_to_hf),
         experts(Key("num_local_experts", int, 128), Key("num_experts_per_tok", int, 8),
                 width=Key("moe_intermediate_size", int, 768), norm_key=NORM_TOPK, sparse_step=SPARSE_STEP,
                 dense_list=MLP_ONLY_LAYERS, count_legacy=Key("num_experts", int, 128, legacy=True),
                 aux_default=0.001)),
    defaults={"head_dim": None, "intermediate_size": 6144, "num_key_value_heads": 4, "num_attention_heads": 32,
              "hidden_size": 2048, "num_hidden_layers": 24},
    nullable={"head_dim": True, "num_key_value_heads": False},
)


# -- llama.cpp (GGUF)
# llama.cpp's qwen3moe graph (no dense layers, no window) always renormalises the top-k weights
GGUF_QWEN3MOE = GgufArch("qwen3_moe", arch="qwen3moe", keys=QWEN_MOE_KEYS,
                            defaults={"hidden_act": "silu", "use_sliding_window": False, "norm_topk_prob": True},
                            bias_flags=ATTENTION_BIAS_FLAG, experts=True)


# as qwen3
REFERENCE_LAYOUTS = QK_NORM_PER_HEAD

FAMILY = Family("qwen3_moe", ("qwen3_moe",), "Qwen3MoeForCausalLM", TENSORS, CONFIG, gguf=(GGUF_QWEN3MOE,),
                reference_layouts=REFERENCE_LAYOUTS)
