"""Gemma (1).

Same as gemma2, except: pre-norm blocks (`input_layernorm` before attention,
`post_attention_layernorm` before the MLP, llama's names and places); the MLP activation is read
from `hidden_act`, where transformers rewrites a legacy "gelu" to the tanh approximation; scores
scale by head_dim ** -0.5; no soft-caps, no sliding window; its own config defaults (head_dim 256,
16 heads, 16 KV heads).
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import plain
from ..tables.gguf import (
    ATTENTION_BIAS_FLAG,
    NO_ROPE_BASE,
    written,
)
from . import gemma2, llama

# GemmaConfig.__post_init__ turns hidden_act "gelu" into "gelu_pytorch_tanh": every Gemma (1) runs tanh GELU
ACTIVATIONS_FROM_HF = {**llama.ACTIVATIONS_FROM_HF, "gelu": "gelu_tanh"}

TENSORS = llama.TENSORS

CONFIG = gemma2.CONFIG.but(
    drop=("sandwich norms", "query_pre_attn_scalar", "layer kinds", "attn_logit_softcapping",
          "final_logit_softcapping"),
    add=(plain("hidden_act", "activation", str, "gelu_pytorch_tanh", name="activation",
               choices=ACTIVATIONS_FROM_HF, read=ACTIVATIONS_FROM_HF.__getitem__,
               write=llama.activation_to_hf),),
    defaults={"hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 16},
    nullable={"attention_dropout": False},
)


# -- llama.cpp (GGUF)
GGUF_GEMMA = written("gemma", arch="gemma", omitted=NO_ROPE_BASE, defaults={"hidden_activation": "gelu_pytorch_tanh"},
                     bias_flags=ATTENTION_BIAS_FLAG,
                          norm_offset=1.0, output=False)  # llama.cpp's Gemma always ties its output


FAMILY = Family("gemma", ("gemma",), "GemmaForCausalLM", TENSORS, CONFIG, gguf=(GGUF_GEMMA,))
