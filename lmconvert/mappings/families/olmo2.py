"""OLMo 2.

Same as llama, except: no input norms; each sublayer's output is normalised before the residual
add (`post_attention_layernorm` after attention, `post_feedforward_layernorm` after the MLP); the
RMSNorm weight multiplies in fp32 before the cast back; q_norm / k_norm normalise the whole q and k
projections (all heads together) before the head split; RoPE cos/sin stay in fp32; rms_norm_eps
defaults to 1e-5; `attention_bias` switches the q, k, v and o biases; the MLP has no bias.
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import fixed
from ..tables.gguf import (
                          ATTENTION_BIAS_FLAG,
                          GgufArch,
)
from ..tables.hf_rope import rope
from ..tables.points import QK_NORM_PROJECTION
from ..tables.table import Rule, TensorTable
from . import llama

OUTPUT_NORM_RULES = (
    Rule("model.layers.{}.post_attention_layernorm.weight", "layers.{}.attn_post_norm.weight"),
    Rule("model.layers.{}.post_feedforward_layernorm.weight", "layers.{}.mlp_post_norm.weight"),
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + OUTPUT_NORM_RULES
                      + llama.QK_NORM_RULES)

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(llama.norm(1e-5, dtype_order="scale_then_cast"), rope(fp32_tables=True),
         fixed("output norms", norm_placement="output", qk_norm="projection")),
    defaults={"vocab_size": 50304},
    nullable={"head_dim": False, "attention_dropout": False},  # head_dim: not an Olmo2Config key, read if stated
)


# -- llama.cpp (GGUF)
GGUF_OLMO2 = GgufArch("olmo2", arch="olmo2", defaults={"hidden_act": "silu"}, bias_flags=ATTENTION_BIAS_FLAG,
                      head_dim_stated=False)  # Olmo2Config and Olmo3Config keep no head_dim


# q_norm(q_proj(x)) over the whole projection, viewed afterwards
REFERENCE_LAYOUTS = QK_NORM_PROJECTION

# (llama.cpp's olmo2 architecture is registered by olmo3.py, whose entry tells OLMo 2's files, without
# a sliding window, apart from OLMo 3's)
FAMILY = Family("olmo2", ("olmo2",), "Olmo2ForCausalLM", TENSORS, CONFIG,
                reference_layouts=REFERENCE_LAYOUTS)
