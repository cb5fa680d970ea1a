"""The dbrx test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import GgufNaming, Spec

_ATTN = {"kv_n_heads": 2, "clip_qkv": 1.5, "rope_theta": 5e5}
_FFN = {"ffn_hidden_size": 96, "moe_num_experts": 4, "moe_top_k": 3, "moe_normalize_expert_weights": 1.0}

SPEC = Spec(  # bf16 bit-exact: transformers' DBRX has only its own eager experts (no grouped_mm)
    "dbrx",
    # d_model stated: DbrxConfig sets ffn_config's hidden size from it before the hidden_size alias applies
    kwargs=dict(d_model=64, attn_config=_ATTN, ffn_config=_FFN,
                rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
    old_style={"rope_theta": 5e5},
    card=("mixture of experts: 4 experts, top-3, d_expert 96 (all layers)",
          "router: softmax then top-k, renormalised, weights in activation dtype, softmax in activation dtype, "
          "renormalised by the 1-norm", "q, k, v clamped to +-1.5", "LayerNorm, eps=1e-05, weight in fp32"),
    config_variants=({"attn_config": {"rope_theta": 1e4}},
                     dict(attn_config=_ATTN, rope_parameters={"rope_type": "default", "rope_theta": 5e5},
                          ffn_config={**_FFN, "moe_normalize_expert_weights": 2.0, "ffn_act_fn": {"name": "gelu"}},
                          resid_pdrop=0.1, output_router_logits=True)),
    gguf=dict(ffn_config={**_FFN, "moe_normalize_expert_weights": 1.0}),
    own_spelling={"hidden_size": "d_model", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers",
                  "max_position_embeddings": "max_seq_len"},
    not_a_key=("num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "attention_dropout"),
    hub_experts_only=True,
    # DbrxModel (llama.cpp's converter) adds `.weight` to the experts' w1, v1, w2
    gguf_naming=GgufNaming(converter_names={("ffn.experts.mlp.w1", "gate"): "ffn_gate_exps.weight",
                                            ("ffn.experts.mlp.v1", "up"): "ffn_up_exps.weight",
                                            ("ffn.experts.mlp.w2", "down"): "ffn_down_exps.weight"}))
