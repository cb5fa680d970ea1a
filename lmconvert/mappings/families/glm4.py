"""GLM-4-0414 (Glm4ForCausalLM: GLM-4-9B-0414, GLM-4-32B-0414, GLM-Z1).

Same as glm, except: sandwich norms, each an RMSNorm as llama's (statistics in fp32, the weight
multiplied after the cast back): `input_layernorm` before attention, `post_self_attn_layernorm` on
the attention output before the residual add, `post_attention_layernorm` before the MLP and
`post_mlp_layernorm` on its output; Glm4Config refuses null for `head_dim`, `num_key_value_heads`
and `attention_dropout`.
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import fixed
from ..tables.gguf import ATTENTION_BIAS_FLAG, written
from ..tables.table import Rule, TensorTable
from . import glm, llama

SANDWICH_NORM_RULES = (
    Rule("model.layers.{}.input_layernorm.weight", "layers.{}.attn_norm.weight"),
    Rule("model.layers.{}.post_self_attn_layernorm.weight", "layers.{}.attn_post_norm.weight"),
    Rule("model.layers.{}.post_attention_layernorm.weight", "layers.{}.mlp_norm.weight"),
    Rule("model.layers.{}.post_mlp_layernorm.weight", "layers.{}.mlp_post_norm.weight"),
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + glm.FUSED_MLP_RULES + SANDWICH_NORM_RULES)

CONFIG = glm.CONFIG.but(
    add=(fixed("sandwich norms", norm_placement="sandwich"),),
    nullable={"head_dim": False, "num_key_value_heads": False, "attention_dropout": False},
)



# -- llama.cpp (GGUF)
# its loader reads the q, k and v biases only; the rotated part of a head is `rope.dimension_count`
GGUF_GLM4 = written("glm4", arch="glm4", defaults={"hidden_act": "silu"}, bias_flags=ATTENTION_BIAS_FLAG,
                    partial_rotary=True, table=glm.gguf_table(),
                    token_texts={**glm.END_OF_TURN, "tokenizer.ggml.bos_token_id": "<|endoftext|>"})

FAMILY = Family("glm4", ("glm4",), "Glm4ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_GLM4,),
                reference_layouts=glm.REFERENCE_LAYOUTS)
