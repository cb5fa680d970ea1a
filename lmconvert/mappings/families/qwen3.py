"""Qwen3 (dense).

Same as qwen2, except: a per-head QK norm (`q_norm` / `k_norm` over head_dim, llama-style RMSNorm
with the weight applied after the cast, before RoPE), `attention_bias` (default false) switching
the q, k, v and o biases together, and head_dim 128 when config.json does not state it.
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import fixed
from ..tables.gguf import (
                          ATTENTION_BIAS_FLAG,
                          GgufArch,
)
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import TensorTable
from . import llama, qwen2

TENSORS = TensorTable(llama.TENSORS.rules + llama.QK_NORM_RULES)

CONFIG = qwen2.CONFIG.but(
    drop=("q, k, v biases",),
    add=(fixed("QK norm", qk_norm="head"), llama.ATTENTION_BIAS),
    defaults={"head_dim": 128},
)


# -- llama.cpp (GGUF)
GGUF_QWEN3 = GgufArch("qwen3", arch="qwen3", defaults={"hidden_act": "silu", "use_sliding_window": False},
                         bias_flags=ATTENTION_BIAS_FLAG)


# q_norm(q_proj(x).view(B, T, -1, D)), transposed afterwards
REFERENCE_LAYOUTS = QK_NORM_PER_HEAD

FAMILY = Family("qwen3", ("qwen3",), "Qwen3ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_QWEN3,),
                reference_layouts=REFERENCE_LAYOUTS)
