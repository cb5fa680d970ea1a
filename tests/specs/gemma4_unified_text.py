"""The gemma4_unified_text test model (see tests/specs/__init__.py): 6 layers, sliding (window 4) and full in
turn; the full layers have their own geometry (head_dim 32, one KV head, where the sliding ones have head_dim 16
and two), K = V (no v_proj) and proportional RoPE (a quarter of the angles); the last two layers share the K/V
of layers 2 (sliding) and 3 (full) and have MLPs twice as wide; every block's output is scaled by its
`layer_scalar` (a buffer, so perturbed by the family tests through `buffers`)."""

from __future__ import annotations

from specs import FINAL_CAP, WINDOW, F, GgufNaming, S, Spec

TYPES = [S, F, S, F, S, F]
# llama.cpp's Gemma4Model names the layer scalar, the router's scale and the per-expert scales itself (the last two
# the `scale` of the router and of the experts' down stack), and the fused experts with `.weight` added
NAMING = GgufNaming(converter_names={
    ("layer_scalar", "1"): "layer_output_scale.weight", ("router.scale", "router"): "ffn_gate_inp.scale",
    ("router.per_expert_scale", "router"): "ffn_down_exps.scale", ("experts.down_proj", "down"): "ffn_down_exps.weight",
    **{("experts.gate_up_proj", part): "ffn_gate_up_exps.weight" for part in ("gate", "up")},
})
KWARGS = dict(num_hidden_layers=6, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
              attention_k_eq_v=True, num_kv_shared_layers=2, use_double_wide_mlp=True, sliding_window=WINDOW,
              layer_types=TYPES, final_logit_softcapping=FINAL_CAP)
SPEC = Spec(
    "gemma4_unified_text", KWARGS,
    # the Hub's spelling of the full layers' geometry, which transformers 5.25 writes as per_layer_config; Gemma 4
    # has no older RoPE keys, so the test model keeps transformers' default rope_parameters
    old_style={"global_head_dim": 32, "num_global_key_value_heads": 1},
    old_drop=("per_layer_config",),
    card=("sandwich", "QK norm: per head", "sliding window 4 on local layers; pattern LGLGLG",
          "global layers: 4 heads / 1 kv heads, head_dim 32", "K = V on global layers",
          "V norm: each head of v normalised, no weight",
          "KV sharing: the last 2 layers reuse the K/V of the last earlier layer of their kind; FFN x2 there",
          "proportional", "layer scalar", "final-logit soft-cap: 3"),
    not_on_card=("attention soft-cap",),
    config_variants=(
        {"head_dim": 16, "global_head_dim": 32},
        dict(num_hidden_layers=4, head_dim=16, global_head_dim=16, layer_types=[S, F, S, F], sliding_window=5,
             attention_bias=True, rms_norm_eps=1e-5, tie_word_embeddings=False, num_kv_shared_layers=2,
             use_double_wide_mlp=True, final_logit_softcapping=5.0, hidden_activation="gelu",
             rope_parameters={S: {"rope_type": "default", "rope_theta": 20000.0},
                              F: {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 5e5}}),
        dict(KWARGS, num_kv_shared_layers=0, attention_k_eq_v=False, use_double_wide_mlp=False,
             rope_parameters={S: {"rope_type": "linear", "factor": 2.0, "rope_theta": 20000.0},
                              F: {"rope_type": "proportional", "partial_rotary_factor": 1.0, "factor": 2.0,
                                  "rope_theta": 5e5}}),
    ),
    tp_refusal="per-layer head geometry (the global layers' own head_dim and KV heads) has no tensor-parallel plan",
    gguf={},  # llama.cpp's gemma4 holds it whole
    gguf_naming=NAMING,
)
