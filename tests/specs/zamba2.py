"""The zamba2 test model (see tests/specs/__init__.py): 5 layers, the first Mamba2's alone and the other four
hybrid, calling two shared blocks in turn (blocks 0, 1, 0, 1: each block tied across two calls, each call its own
adapters on q, k, v and gate_up, and its own KV cache); the shared attention reads 2 x 64, 4 heads of 32 (so 4 KV
heads: the k and v adapters are 128 wide, as q's), RoPE on (use_mem_rope). The mixer: 8 heads x 16 over 2 groups,
state 16, conv 4, chunks of 8 (the 28-token sequences run three chunks and a partial fourth). dt's lower clamp
`time_step_min` is 1e-9 (it cannot be 0: Zamba2's init takes its log): transformers clamps dt in the chunked
prefill only, so a clamp that bites makes its own cached decoding differ from its full forward (specs/mamba2.py)."""

from __future__ import annotations

from specs import Spec

MIXER = dict(n_mamba_heads=8, mamba_expand=2, mamba_d_state=16, mamba_ngroups=2, mamba_d_conv=4, chunk_size=8,
             time_step_min=1e-9)
TYPES = ["mamba", "hybrid", "hybrid", "hybrid", "hybrid"]
SHARED = dict(layers_block_type=TYPES, num_hidden_layers=5, num_mem_blocks=2, use_shared_attention_adapter=True,
              adapter_rank=8, num_key_value_heads=4)
THETA = {"rope_type": "default", "rope_theta": 5e5}
SPEC = Spec(
    "zamba2", dict(MIXER, **SHARED, use_mem_rope=True, eos_token_id=1, rope_parameters=THETA),
    old_style={"rope_theta": 5e5},
    card=("mixer: Mamba2 (SSD), 8 heads x 16, 2 group(s), state 16, conv 4, chunk 8",
          "shared blocks: 2, called by layers 1-4 (block 0, 1, 0, 1)",
          "adapters of rank 8 on q, k, v and gate_up", "layer pattern: M M M M M"),
    not_a_key=("head_dim",),  # Zamba2Config maps it to attention_head_dim, which it sets to 2 x hidden_size / heads
    null_is_default=("intermediate_size",),  # null: 4 x hidden_size
    tp_refusal="the shared transformer blocks (Zamba's, each called by several layers) have no tensor-parallel plan, "
               "nor its mamba2 layers",
    # the first variant is transformers' default schedule (54 layers, layers_block_type unstated): there null is
    # transformers' default, which it refuses for any other number of layers
    config_variants=(
        dict(MIXER, num_hidden_layers=54, num_mem_blocks=2, use_shared_attention_adapter=True, adapter_rank=8,
             num_key_value_heads=4),
        dict(MIXER, **SHARED),
        dict(MIXER, layers_block_type=["hybrid", "linear_attention", "hybrid"], num_hidden_layers=3, num_mem_blocks=1,
             use_shared_attention_adapter=False, adapter_rank=4, use_mem_rope=True, add_bias_linear=True,
             rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu", intermediate_size=80,
             time_step_min=0.01, rope_parameters=THETA),
    ),
)
