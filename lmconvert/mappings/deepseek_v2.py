"""DeepSeek-V2 (and V2-Lite), dense layers only.

Same as deepseek_v3, except: RoPE always reads the rotary dims in pairs and rotates them in place
(a complex multiplication in transformers' `apply_rotary_emb`; there is no `rope_interleave` key);
the MLP has `mlp_bias`; `first_k_dense_replace` defaults to 0 (every layer mixture-of-experts, so a
config must state it) and `v_head_dim` is never null; LLaMA's sizes are the defaults.
"""

from __future__ import annotations

from . import deepseek_v3
from .config_table import plain
from .family import Family
from .hf_rope import rope

CONFIG = deepseek_v3.CONFIG.but(
    add=(
        rope(layout="interleaved"),
        deepseek_v3.latent("deepseek_v2", deinterleave=False, v_head_dim_nullable=False),
        deepseek_v3.dense_only(0, nullable=False),
        plain("mlp_bias", "mlp_bias", bool, False),
    ),
    defaults={"vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": None, "max_position_embeddings": 2048},
)

FAMILY = Family("deepseek_v2", ("deepseek_v2",), "DeepseekV2ForCausalLM", deepseek_v3.TENSORS, CONFIG)


