"""The falcon_h1 test model (see tests/specs/__init__.py): 2 parallel hybrid layers, each attention (GQA, 4 heads
over 2 KV heads, full RoPE at theta 5e5) beside a Mamba2 mixer (8 heads x 16 over 2 groups, state 16, conv 4,
chunks of 8: the 28-token sequences run three chunks and a partial fourth) with Falcon-H1's gated norm, then
SwiGLU; every muP multiplier away from 1 and from powers of two (the five of the mixer's muP vector each its own,
so a part multiplied by the wrong one shows), and every bias on. transformers' `mup_vector` is a non-persistent
buffer computed from `ssm_multipliers` (never stored, never perturbed: the config is what varies it). dt is left
unclamped (see specs/mamba2.py)."""

from __future__ import annotations

from specs import GgufNaming, Spec

MIXER = dict(mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4,
             mamba_chunk_size=8)
MUP = dict(embedding_multiplier=2.3, lm_head_multiplier=0.37, attention_in_multiplier=1.3,
           attention_out_multiplier=0.85, key_multiplier=0.6, ssm_out_multiplier=0.45, ssm_in_multiplier=1.7,
           ssm_multipliers=[0.7, 1.3, 0.45, 1.9, 0.35], mlp_multipliers=[0.9, 0.55])
THETA = {"rope_type": "default", "rope_theta": 5e5}
SPEC = Spec(
    "falcon_h1", dict(MIXER, **MUP, mamba_rms_norm=True, mamba_norm_before_gate=True, mamba_proj_bias=True,
                      projectors_bias=True, attention_bias=True, mlp_bias=True, eos_token_id=1,
                      rope_parameters=THETA),
    old_style={"rope_theta": 5e5},
    # what llama.cpp's falcon-h1 runs: the gate before the norm, no attention biases (its graph adds no o_proj bias),
    # no in_proj or out_proj biases (it loads none); the multipliers stay, folded into the weights
    gguf=dict(mamba_norm_before_gate=False, attention_bias=False, mamba_proj_bias=False, projectors_bias=False),
    # Mamba2Model renames dt_bias; gguf's TensorNameMap maps the whole of pre_ff_layernorm.weight, no `.weight` added
    gguf_naming=GgufNaming(converter_names={("mamba.dt_bias", "mixer"): "ssm_dt.bias",
                                            ("pre_ff_layernorm.weight", "mlp_norm"): "ffn_norm"}),
    card=("mixer: Mamba2 (SSD), 8 heads x 16, 2 group(s), state 16, conv 4, chunk 8",
          "layer schedule: attention and mamba2 side by side (outputs summed) on 2 (0-1)", "layer pattern: AMF AMF",
          "muP multipliers: attention input x 1.3, attention output x 0.85, k x 0.6, mixer output x 0.45, "
          "FFN gate x 0.9, FFN output x 0.55",
          "Mamba2 muP: input x 1.7, [z|x|B|C|dt] x [0.7, 1.3, 0.45, 1.9, 0.35]", "weight in fp32, gate after the norm",
          "embedding scale: 2.3 (a float multiply)", "logit scale: 0.37", "biases: in_proj, conv, out_proj",
          "decoding state: 128 entries per token (KV cache, 2 layers of attention) + 5,632 entries per sequence"),
    tp_refusal="the mamba2 mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(MIXER),
        dict(MIXER, **MUP, num_hidden_layers=3, mamba_rms_norm=True, mamba_norm_before_gate=False,
             mamba_proj_bias=True, mamba_conv_bias=False, projectors_bias=True, time_step_limit=[0.01, 3.0],
             mamba_n_groups=4, rms_norm_eps=1e-6, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
             head_dim=8, rope_parameters=THETA),
    ),  # a null mamba_d_ssm (the width from mamba_expand) is read as transformers reads it: test_config_table's nulls
)
