"""The zamba test model (see tests/specs/__init__.py): 5 layers, layers 1, 3 and 4 hybrid, all three calling the one
shared block (tied across three calls, each its own linear and its own KV cache); the shared attention reads 2 x 64,
4 heads of 32 over 2 KV heads, no positions. The mixer: Zamba's multi-head Mamba, 2 heads x 64, state 8, dt rank 6,
conv 4 (the 28-token sequences run past the conv width)."""

from __future__ import annotations

from specs import Spec

MIXER = dict(n_mamba_heads=2, mamba_d_state=8, mamba_dt_rank=6, mamba_d_conv=4)
TYPES = ["mamba", "hybrid", "mamba", "hybrid", "hybrid"]
SPEC = Spec(
    "zamba", dict(MIXER, layers_block_type=TYPES, num_hidden_layers=5, eos_token_id=1),
    old_style={}, rope=False,
    card=("mixer: multi-head Mamba (Zamba's), 2 heads x 64, state 8, dt rank 6, conv 4",
          "shared blocks: 1, called by layers 1, 3-4 (block 0, 0, 0)",
          "no adapters: every call runs its block as it is",
          "layer pattern: M M M M M"),
    not_a_key=("rope_parameters",),  # no RoPE: ZambaConfig reads none
    null_is_default=("head_dim",),  # ZambaConfig takes a null attention_head_dim (its head_dim) as 2 x hidden / heads
    tp_refusal="the shared transformer blocks (Zamba's, each called by several layers) have no tensor-parallel plan, "
               "nor its mamba_heads layers",
    # the first variant is transformers' default schedule (layers_block_type unstated: attn_layer_period 6, offset 4)
    config_variants=(
        dict(MIXER, num_hidden_layers=12),
        dict(MIXER, layers_block_type=["hybrid", "linear_attention", "hybrid"], num_hidden_layers=3,
             mamba_conv_bias=False, mamba_proj_bias=True, rms_norm_eps=1e-6, tie_word_embeddings=False,
             hidden_act="silu", attention_head_dim=24, mamba_expand=3, n_mamba_heads=4),
    ),
)
