"""The gemma3n_text test model (see tests/specs/__init__.py): 6 layers, sliding (window 4) and full as [S, S, F, S,
S, F]; the last two share the K/V of layers 3 (sliding) and 2 (full); each layer its own FFN width and gate
sparsity (three layers sparse, at three levels); four AltUp streams with the second one active; per-layer
embeddings 8 wide from a table narrower than the vocabulary (ids past it read row 0); LAuReL of rank 8."""

from __future__ import annotations

from specs import FINAL_CAP, WINDOW, F, S, Spec

TYPES = [S, S, F, S, S, F]
KWARGS = dict(num_hidden_layers=6, head_dim=16, sliding_window=WINDOW, layer_types=TYPES,
              final_logit_softcapping=FINAL_CAP, num_kv_shared_layers=2, intermediate_size=[96, 80, 96, 64, 96, 48],
              activation_sparsity_pattern=[0.95, 0.6, 0.0, 0.3, 0.0, 0.0], altup_active_idx=1, altup_coef_clip=50.0,
              vocab_size_per_layer_input=100, hidden_size_per_layer_input=8, laurel_rank=8,
              rope_parameters={S: {"rope_type": "default", "rope_theta": 20000.0},
                               F: {"rope_type": "default", "rope_theta": 5e5}})
SPEC = Spec(
    "gemma3n_text", KWARGS,
    old_style={"rope_theta": 5e5, "rope_local_base_freq": 20000.0},
    card=("sandwich", "QK norm: per head", "sliding window 4 on local layers; pattern LLGLLG",
          "V norm: each head of v normalised, no weight",
          "KV sharing: the last 2 layers reuse the K/V of the last earlier layer of their kind",
          "AltUp: 4 residual streams, stream 1 active", "per-layer embeddings: 8 per layer",
          "LAuReL: rank 8",
          "gate sparsity: g -> relu(g - mean - std x icdf_N(s)) on layers 0 (s=0.95), 1 (s=0.6), 3 (s=0.3)",
          "FFN width per layer: 96, 80, 96, 64, 96, 48",
          "final-logit soft-cap: 3"),
    not_on_card=("attention soft-cap",),
    config_variants=(
        {"num_hidden_layers": 5, "num_kv_shared_layers": 0, "head_dim": 16},
        dict(KWARGS, attention_bias=True, rms_norm_eps=1e-5, tie_word_embeddings=False, altup_num_inputs=3,
             altup_active_idx=0, altup_correct_scale=False, intermediate_size=72, activation_sparsity_pattern=None,
             hidden_activation="gelu", laurel_rank=4, num_kv_shared_layers=3,
             layer_types=[S, F, S, F, S, F], sliding_window=5),
    ),
    tp_refusal="cross-layer KV sharing has no tensor-parallel plan",  # the first of its refusals (AltUp, PLE, ...)
)
