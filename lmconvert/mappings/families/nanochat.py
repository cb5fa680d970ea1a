"""nanochat (karpathy/nanochat, model_type `nanochat`).

Same as llama, except: every RMSNorm has no weight (the statistics in fp32, cast back), including
one on the embeddings before the first block (the final norm, the same module in transformers,
normalises once more after the last block); q and k are normalised per head by a weightless RMSNorm
AFTER RoPE, and the keys are cached normalised; RoPE turns the other way (`rotate_half` is
[x2, -x1]); the MLP is ungated, `fc2(act(fc1(x)))` with `hidden_act` (default relu2, squared
ReLU) and no bias (there is no `mlp_bias` key); the logits are soft-capped at
`final_logit_softcapping` (default 15, null: none); its own defaults (50304 tokens, 768 wide,
8192 MLP, 12 layers, 6 heads); `head_dim` is not a NanoChatConfig key (read if stated).
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import fixed, plain
from ..tables.hf_rope import rope
from ..tables.points import QK_NORM_HEADS_FIRST
from ..tables.table import Rule, TensorTable
from . import llama

MLP_RULES = (
    Rule("model.layers.{}.mlp.fc1.weight", "layers.{}.mlp.up.weight"),
    Rule("model.layers.{}.mlp.fc2.weight", "layers.{}.mlp.down.weight"),
)
TENSORS = TensorTable((
    Rule("model.embed_tokens.weight", "embed.weight"),
    Rule("lm_head.weight", "lm_head.weight"),
    *llama.ATTENTION_RULES,
    *MLP_RULES,
))

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(llama.norm(1e-6, weight=False), llama.activation("hidden_act", "relu2"), rope(reverse=True),
         plain("final_logit_softcapping", "final_softcap", float, 15.0, nullable=True),
         fixed("nanochat", gated=False, embed_norm=True, qk_norm="head", qk_norm_after_rope=True)),
    defaults={"vocab_size": 50304, "hidden_size": 768, "intermediate_size": 8192, "num_hidden_layers": 12,
              "num_attention_heads": 6},
    nullable={"head_dim": False, "attention_dropout": False},  # head_dim: not a NanoChatConfig key, read if stated
)

# q_norm(q rotated, (B, H, T, D)); the embedding norm is transformers' final norm module, called first
REFERENCE_LAYOUTS = QK_NORM_HEADS_FIRST

FAMILY = Family("nanochat", ("nanochat",), "NanoChatForCausalLM", TENSORS, CONFIG,
                reference_layouts=REFERENCE_LAYOUTS)
