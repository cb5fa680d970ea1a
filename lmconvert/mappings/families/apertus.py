"""Apertus (swiss-ai/Apertus-8B/70B, model_type `apertus`).

Same as llama, except: the MLP is ungated, `down(act(up(x)))`, with no bias (there is no `mlp_bias`
key), and its activation is by default xIELU (`hidden_act` "xielu", transformers' XIELUActivation):
each layer holds its own learned `alpha_p` and `alpha_n` ([1]) and the constants `beta` and `eps`
(0-dim) as tensors of the checkpoint (`mlp.act_fn.*`), all in the model's dtype, and computes
where(x > 0, softplus(alpha_p) x^2 + beta x, (expm1(min(x, eps)) - x)(beta + softplus(alpha_n)) + beta x);
another `hidden_act` is the plain activation; q and k are normalised per head before RoPE
(`q_norm` / `k_norm`, llama-style RMSNorm); the block norms are `attention_layernorm` and
`feedforward_layernorm`; without `rope_parameters` (absent or null) and `rope_scaling` the RoPE is
Apertus' own llama3 scaling (theta 12e6, factor 8, low/high frequency factors 1 and 4, original
8192 positions), and a `rope_theta` missing from the parameters is 12e6 (ApertusConfig's
default_theta); `rms_norm_eps` defaults to 1e-5; its own defaults (131072 tokens, 4096 wide, 14336
MLP, 65536 positions); `head_dim` is not an ApertusConfig key (read if stated).
"""

from __future__ import annotations

from typing import Any

from ..family import Family
from ..tables.config_table import Entry, fixed, plain
from ..tables.hf_config import HfConfig
from ..tables.hf_rope import KEYS, rope_from_hf, rope_parameters, rope_to_hf
from ..tables.points import QK_NORM_HEADS_FIRST
from ..tables.table import Rule, TensorTable
from . import llama

# ApertusConfig's RoPE when config.json states neither rope_parameters nor rope_scaling
DEFAULT_ROPE = {"rope_type": "llama3", "rope_theta": 12_000_000.0, "factor": 8.0,
                "original_max_position_embeddings": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
DEFAULT_THETA = 12_000_000.0

NORM_RULES = (
    Rule("model.layers.{}.attention_layernorm.weight", "layers.{}.attn_norm.weight"),
    Rule("model.layers.{}.feedforward_layernorm.weight", "layers.{}.mlp_norm.weight"),
)
XIELU_RULES = tuple(Rule(f"model.layers.{{}}.mlp.act_fn.{p}", f"layers.{{}}.mlp.act.{p}")
                    for p in ("alpha_p", "alpha_n", "beta", "eps"))
MLP_RULES = tuple(Rule(f"model.layers.{{}}.mlp.{n}_proj.weight", f"layers.{{}}.mlp.{n}.weight") for n in ("up", "down"))
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + MLP_RULES + XIELU_RULES + NORM_RULES
                      + llama.QK_NORM_RULES)

ACTIVATIONS_FROM_HF = {**llama.ACTIVATIONS_FROM_HF, "xielu": "xielu"}


def activation_to_hf(activation: str) -> Any:  # noqa: ANN401 - a config value
    return "xielu" if activation == "xielu" else llama.activation_to_hf(activation)


ACTIVATION = plain("hidden_act", "activation", str, "xielu", name="activation", choices=ACTIVATIONS_FROM_HF,
                   read=ACTIVATIONS_FROM_HF.__getitem__, write=activation_to_hf)


def rope_from_apertus(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    if not hf.get("rope_scaling") and hf.get("rope_parameters") is None:
        params, where = dict(DEFAULT_ROPE), "rope_parameters."
    else:
        params, where = rope_parameters(hf)
    return {"rope": rope_from_hf(hf, params, where)}


ROPE = Entry("rope", KEYS, rope_from_apertus, lambda cfg: {"rope_parameters": rope_to_hf(cfg.rope)})

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(llama.norm(1e-5), ACTIVATION, ROPE, fixed("apertus", gated=False, qk_norm="head")),
    defaults={"vocab_size": 131072, "intermediate_size": 14336, "max_position_embeddings": 65536,
              "rope_theta": DEFAULT_THETA},
    nullable={"head_dim": False, "attention_dropout": False},  # head_dim: not an ApertusConfig key, read if stated
)

# q_norm(q_proj(x).view(B, T, -1, D).transpose(1, 2)): per head, heads first
REFERENCE_LAYOUTS = QK_NORM_HEADS_FIRST

FAMILY = Family("apertus", ("apertus",), "ApertusForCausalLM", TENSORS, CONFIG, reference_layouts=REFERENCE_LAYOUTS)
