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
from ..tables.gguf import ATTENTION_BIAS_FLAG, tensor_table, written
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Piece
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
GATE_UP = ("blk.{}.ffn_gate.weight", "blk.{}.ffn_up.weight")


def _glm4_table() -> TensorTable:
    """llama.cpp's glm4: HF's gate_up_proj unchanged as `ffn_up` [gate | up], q/k unpermuted (its
    rotation reads adjacent pairs, as GLM's interleaved RoPE), the sandwich norms as
    `post_attention_norm` and `post_ffw_norm`."""
    fused = tuple(Rule("blk.{}.ffn_up.weight", f"layers.{{}}.mlp.{n}.weight", Piece(("ffn", "ffn"), i))
                  for i, n in enumerate(("gate", "up")))
    return TensorTable(tuple(r for r in tensor_table(False, 0.0, True).rules if r.stored not in GATE_UP) + fused)


# its loader reads the q, k and v biases only; the rotated part of a head is `rope.dimension_count`
GGUF_GLM4 = written("glm4", arch="glm4", defaults={"hidden_act": "silu"}, bias_flags=ATTENTION_BIAS_FLAG,
                    partial_rotary=True, table=_glm4_table())

FAMILY = Family("glm4", ("glm4",), "Glm4ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_GLM4,),
                reference_layouts=glm.REFERENCE_LAYOUTS)
