"""The olmo_hybrid test model (see tests/specs/__init__.py): gated delta-net layers (two value heads
per key head, beta doubled: negative eigenvalues allowed, as OLMo-hybrid's default) before and after
an attention layer with OLMo 2's output norms and projection QK norms; the gated delta-net layers
pre-norm."""

from __future__ import annotations

from specs import F, Spec

L = "linear_attention"
GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=16,
           linear_conv_kernel_dim=4)
THETA = {"rope_type": "default", "rope_theta": 5e5}
SPEC = Spec(
    "olmo_hybrid", dict(num_hidden_layers=4, layer_types=[L, F, L, L], attention_bias=True, eos_token_id=1,
                        rope_parameters=THETA, **GDN),
    old_style={"rope_theta": 5e5},
    card=("mixer: gated delta-net, 2 q/k heads x 8, 4 value heads x 16 (2 value heads per key head), conv 4",
          "beta 2 sigmoid(b) (negative eigenvalues allowed)", "eps=1e-05) times SiLU(z)",
          "placement: norm on sublayer output only (gated_deltanet layers: pre-norm)",
          "layer schedule: attention on 1 (1); gated_deltanet on 3 (0, 2-3); FFN on all layers",
          "QK norm: over the whole projection", "biases: q, k, v, o"),
    tp_refusal="the gated_deltanet mixer layers have no tensor-parallel plan",
    config_variants=(
        dict(layer_types=[L, F]),  # the sizes OlmoHybridConfig derives: 4 heads of 12 and 24
        dict(num_hidden_layers=3, layer_types=[L, F, L], rms_norm_eps=1e-5, linear_allow_neg_eigval=False,
             attention_bias=True, tie_word_embeddings=True, rope_parameters=THETA, **GDN),
        dict(num_hidden_layers=4, **GDN),  # every fourth layer attends
    ),
)
