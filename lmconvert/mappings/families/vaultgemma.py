"""VaultGemma (VaultGemmaForCausalLM: google/vaultgemma-1b).

Same as gemma2, except: pre-norm only; `input_layernorm` before attention and
`pre_feedforward_layernorm` before the MLP (the same `1 + w` RMSNorm, computed in fp32 and cast
back last), with no norms on the sublayer outputs (transformers deletes Gemma 2's
`post_attention_layernorm` and `post_feedforward_layernorm`); there is no
`use_bidirectional_attention` key. The rest is Gemma 2's: the embedding multiplied by
sqrt(hidden_size) rounded to the weight dtype, the GeGLU MLP, scores scaled by
`query_pre_attn_scalar ** -0.5` and soft-capped, final logits soft-capped, alternating sliding and
full layers (`layer_types`), tied embeddings.
"""

from __future__ import annotations

from ..family import Family
from ..tables.table import Rule, TensorTable
from . import gemma2, llama

PRE_NORM_RULES = (
    Rule("model.layers.{}.input_layernorm.weight", "layers.{}.attn_norm.weight"),
    Rule("model.layers.{}.pre_feedforward_layernorm.weight", "layers.{}.mlp_norm.weight"),
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + PRE_NORM_RULES)

# without the "sandwich norms" row the blocks are pre-norm, ArchConfig's default
CONFIG = gemma2.CONFIG.but(drop=("sandwich norms", "use_bidirectional_attention"))


FAMILY = Family("vaultgemma", ("vaultgemma",), "VaultGemmaForCausalLM", TENSORS, CONFIG)
