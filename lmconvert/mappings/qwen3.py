"""Qwen3 (dense).

Same as qwen2, except: a per-head QK norm (`q_norm` / `k_norm` over head_dim, llama-style RMSNorm
with the weight applied after the cast, before RoPE), `attention_bias` (default false) switching
the q, k, v and o biases together, and head_dim 128 when config.json does not state it.
"""

from __future__ import annotations

from . import llama, qwen2
from .config_table import fixed
from .family import Family
from .table import TensorTable

TENSORS = TensorTable(llama.TENSORS.rules + llama.QK_NORM_RULES)

CONFIG = qwen2.CONFIG.but(
    drop=("q, k, v biases",),
    add=(fixed("QK norm", qk_norm="head"), llama.ATTENTION_BIAS),
    defaults={"head_dim": 128},
)

FAMILY = Family("qwen3", ("qwen3",), "Qwen3ForCausalLM", TENSORS, CONFIG)
