"""The vaultgemma test model (see tests/specs/__init__.py)."""

from __future__ import annotations

from specs import ATTN_CAP, FINAL_CAP, WINDOW, F, S, Spec

SPEC = Spec(
    "vaultgemma", dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24, attention_bias=True,
                       attn_logit_softcapping=ATTN_CAP, final_logit_softcapping=FINAL_CAP),
    old_style={"rope_theta": 10000.0}, old_drop=("layer_types",),
    card=("pre-norm", "scale (w + 1)", "weight in fp32", "attention soft-cap: 2", "final-logit soft-cap: 3",
          "sliding window 4 on local layers; pattern LG", "GeGLU (tanh)", "embedding scale: 8",
          "score scale: 0.204124", "biases: q, k, v, o", "embeddings: tied"),
    not_on_card=("sandwich",),
    sdpa=False,  # VaultGemmaForCausalLM refuses SDPA (soft-capped scores), as Gemma 2
    layer_types=([F, S], ("global", "local")),
    config_variants=({}, dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24, attention_bias=True,
                              attn_logit_softcapping=2.0, final_logit_softcapping=3.0, rms_norm_eps=1e-5,
                              tie_word_embeddings=False, hidden_activation="gelu",
                              rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}),
                     dict(head_dim=16, sliding_window=WINDOW, attn_logit_softcapping=None, final_logit_softcapping=None,
                          layer_types=[F, S])))
