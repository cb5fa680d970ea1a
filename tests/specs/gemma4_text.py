"""The gemma4_text test model (see tests/specs/__init__.py): gemma4_unified_text's (per-layer geometry, K = V,
proportional RoPE, KV sharing with double-wide MLPs, layer scalars), with per-layer embeddings 8 wide per layer
(`hidden_size_per_layer_input`, the table as wide as the vocabulary: Gemma 4 reads every id in it), without the
MoE block, which lmconvert refuses by name."""

from __future__ import annotations

from specs import F, S, Spec
from specs.gemma4_unified_text import KWARGS, NAMING
from specs.gemma4_unified_text import SPEC as UNIFIED

SPEC = Spec(
    "gemma4_text", {**KWARGS, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 128},
    old_style=UNIFIED.old_style, old_drop=UNIFIED.old_drop,
    card=(*UNIFIED.card, "per-layer embeddings: 8 per layer from a 128-row table", "gated into the residual"),
    not_on_card=UNIFIED.not_on_card,
    config_variants=(
        {"head_dim": 16, "global_head_dim": 32},
        dict(num_hidden_layers=4, head_dim=16, global_head_dim=16, layer_types=[S, F, S, F], sliding_window=5,
             attention_bias=True, rms_norm_eps=1e-5, tie_word_embeddings=False, num_kv_shared_layers=2,
             use_double_wide_mlp=True, final_logit_softcapping=5.0, hidden_activation="gelu",
             hidden_size_per_layer_input=0,
             rope_parameters={S: {"rope_type": "default", "rope_theta": 20000.0},
                              F: {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 5e5}}),
        # the MoE block (tests/specs/gemma4_text_moe.py has its test model)
        dict(num_hidden_layers=2, head_dim=16, global_head_dim=32, hidden_size_per_layer_input=0,
             enable_moe_block=True, num_experts=3, top_k_experts=1, moe_intermediate_size=24),
    ),
    tp_refusal=UNIFIED.tp_refusal,
    gguf={},  # llama.cpp's gemma4 holds it whole (its per-layer table as long as the vocabulary, as here)
    gguf_naming=NAMING,
)
