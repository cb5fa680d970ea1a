"""The falcon test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import GgufNaming, Spec

SPEC = Spec(  # Falcon-40B/180B's layout; the 7B, RW and sequential ones are in test_parallel_alibi.py
    "falcon", dict(new_decoder_architecture=True, num_kv_heads=2, eos_token_id=1,
                   rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
    old_style={"rope_theta": 2e4},
    card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, separate norms",
          "parallel sum: mlp+attn+h", "GQA (2 q heads per kv head)", "RoPE half, theta=20000",
          "FFN: GeLU (erf), d_ff 256", "biases: none", "embeddings: tied"),
    own_spelling={"rms_norm_eps": "layer_norm_epsilon"},
    not_a_key=("num_key_value_heads", "head_dim", "intermediate_size"),
    gguf_spelling={"intermediate_size": "ffn_hidden_size"},
    # Falcon-40B's two norms, which GgufArch's `falcon` variant names: the stored names of that layout
    gguf_naming=GgufNaming(variant_layouts={"blk.0.attn_norm_2.weight": dict(
        new_decoder_architecture=True, num_kv_heads=2, num_attention_heads=4, hidden_size=64)}))
