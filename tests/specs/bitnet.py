"""The bitnet test model (see tests/specs/__init__.py): unquantized, as BitNetForCausalLM saves it."""

from __future__ import annotations

from specs import GgufNaming, Spec

SPEC = Spec(
    "bitnet", dict(attention_bias=True, rope_parameters={"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0}),
    old_style={"rope_theta": 5e5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    card=("sub-norms: before the output projection and before the MLP's down projection", "gated squared ReLU",
          "biases: q, k, v, o", "eps=1e-05", "linear x2"),
    config_variants=({}, dict(attention_bias=True, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=True,
                              num_key_value_heads=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # llama.cpp's bitnet graph: gated SiLU, the head tied to the embeddings, no biases
    gguf=dict(attention_bias=False, hidden_act="silu", tie_word_embeddings=True,
              rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
    tp_refusal="the sub-norms (BitNet's) normalise over every head and the whole MLP width",
    # gguf maps BitNet's sub-norms from the original 1bitLLM files' names, not transformers'
    gguf_naming=GgufNaming(aliases=((".self_attn.attn_sub_norm", ".self_attn.inner_attn_ln"),
                                    (".mlp.ffn_sub_norm", ".mlp.ffn_layernorm"))),
)
