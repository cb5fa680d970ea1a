"""HunYuan dense (Hunyuan-0.5B/1.8B/4B/7B, model_type `hunyuan_v1_dense`).

Same as llama, except: each head's q and k go through an RMSNorm of their own (`query_layernorm`
/ `key_layernorm`, over head_dim, llama-style: weight after the cast) AFTER RoPE, not before, and
the normalised keys are what the cache holds; a `rope_parameters` (or `rope_scaling`) of type
"dynamic" with a non-zero `alpha` is NTK-alpha RoPE, as transformers' HunYuanDenseV1RotaryEmbedding
makes it: a static base theta * alpha ** (head_dim / (head_dim - 2)), whatever the sequence
length (the checkpoints call it "dynamic"; "dynamic" without alpha is transformers' ordinary dynamic
NTK); the MLP has no bias (there is no `mlp_bias` key); `rms_norm_eps` defaults to 1e-5; its own
defaults (290943 tokens, pad 0). transformers' attention needs `head_dim` stated (it fails on
None); absent or null it is read as hidden_size / heads, as llama.cpp's converter reads it.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import RopeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry, fixed
from ..tables.gguf import ATTENTION_BIAS_FLAG, written
from ..tables.hf_config import HfConfig
from ..tables.hf_rope import KEYS, rope_from_hf, rope_parameters, rope_to_hf
from ..tables.points import QK_NORM_HEADS_FIRST
from ..tables.table import Rule, TensorTable
from . import llama

QK_NORM_RULES = (
    Rule("model.layers.{}.self_attn.query_layernorm.weight", "layers.{}.attn.q_norm.weight"),
    Rule("model.layers.{}.self_attn.key_layernorm.weight", "layers.{}.attn.k_norm.weight"),
)
TENSORS = TensorTable(llama.TENSORS.rules + QK_NORM_RULES)


def alpha_of(params: dict[str, Any], where: str) -> float | None:
    """The NTK alpha of a "dynamic" rope dict, None where transformers reads none (absent, null or 0)."""
    kind = params.get("rope_type", params.get("type"))
    alpha = params.get("alpha")
    if kind != "dynamic" or not alpha:  # transformers: `rope_type == "dynamic" and rope_parameters.get("alpha")`
        return None
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < float("inf"):
        raise MappingError(f"config.json: {where}alpha={alpha!r} should be a positive number")
    return float(alpha)


def rope_from_hunyuan(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    params, where = rope_parameters(hf)
    alpha = alpha_of(params, where)
    if alpha is None:
        return {"rope": rope_from_hf(hf, params, where)}
    theta = params.get("rope_theta", hf.get("rope_theta"))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < float("inf"):
        raise MappingError(f"config.json: {where}rope_theta={theta!r} should be a positive number")
    return {"rope": RopeConfig(theta=float(theta), scaling="ntk_alpha", alpha=alpha)}


def rope_to_hunyuan(cfg: Any) -> dict[str, Any]:
    rope = cfg.rope
    if rope.scaling == "ntk_alpha":  # transformers' "dynamic" validation requires a factor; alpha wins
        return {"rope_parameters": {"rope_type": "dynamic", "rope_theta": rope.theta, "factor": 1.0,
                                    "alpha": rope.alpha}}
    return {"rope_parameters": rope_to_hf(rope)}


ROPE = Entry("rope", KEYS, rope_from_hunyuan, rope_to_hunyuan)

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(llama.norm(1e-5), ROPE, fixed("QK norm", qk_norm="head", qk_norm_after_rope=True)),
    defaults={"vocab_size": 290943},
    nullable={"attention_dropout": False},
)


# -- llama.cpp (GGUF): its converter writes the NTK-alpha base as rope.freq_base and no scaling
# and HunYuan's end of document as EOS ("incorrect in upstream configs")
GGUF_HUNYUAN_DENSE = written("hunyuan_v1_dense", arch="hunyuan-dense", defaults={"hidden_act": "silu"},
                             bias_flags=ATTENTION_BIAS_FLAG, token_keys={"tokenizer.ggml.eos_token_id": "eod_token_id"})

# query_layernorm(q rotated, (B, H, T, D)): per head, as transformers lays it out before the transpose back
REFERENCE_LAYOUTS = QK_NORM_HEADS_FIRST

FAMILY = Family("hunyuan_v1_dense", ("hunyuan_v1_dense",), "HunYuanDenseV1ForCausalLM", TENSORS, CONFIG,
                gguf=(GGUF_HUNYUAN_DENSE,), reference_layouts=REFERENCE_LAYOUTS)
