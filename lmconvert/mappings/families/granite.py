"""Granite (3.0 and later dense models).

Same as llama, except for four multipliers: the embedding output is multiplied by
`embedding_multiplier` (a Python float, not rounded to the weight dtype first: exact in bf16 for
the values Granite uses, e.g. 12); scores are scaled by `attention_multiplier` instead of
head_dim ** -0.5 (its default is 1.0); each sublayer's output is multiplied by
`residual_multiplier` before the residual add; the logits are divided by `logits_scaling` (kept as
its reciprocal, exact for the powers of two Granite uses).
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import Entry, plain
from ..tables.gguf import (
    ATTENTION_BIAS_FLAG,
    STATES_VOCAB_AND_ROPE,
    written,
)
from ..tables.hf_config import HfConfig, Key
from . import llama


def attn_scale_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """None when the multiplier is head_dim's own scale, so the two spellings are one ArchConfig."""
    scale, head_dim = hf.get("attention_multiplier"), fields["head_dim"] or fields["d_model"] // fields["n_heads"]
    return {"attn_scale": None if scale == head_dim ** -0.5 else float(scale)}


def embed_scale_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """`inputs_embeds * self.embedding_multiplier`: a Python float, multiplied unrounded (12, the
    published value, is exact in bf16; 10.3 is not)."""
    scale = hf.get("embedding_multiplier")
    return {"embed_scale": None if scale == 1.0 else float(scale), "embed_scale_unrounded": scale != 1.0}


def embed_scale_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"embedding_multiplier": 1.0 if cfg.embed_scale is None else cfg.embed_scale}


CONFIG = llama.CONFIG.but(
    add=(Entry("attention_multiplier", (Key("attention_multiplier", float, 1.0),), attn_scale_from_hf,
               lambda cfg: {"attention_multiplier": cfg.score_scale}),
         Entry("embedding_multiplier", (Key("embedding_multiplier", float, 1.0),), embed_scale_from_hf,
               embed_scale_to_hf),
         plain("residual_multiplier", "residual_scale", float, 1.0, read=float),
         plain("logits_scaling", "logit_scale", float, 1.0, read=lambda s: 1.0 / s, write=lambda s: 1.0 / s)),
    nullable={"attention_dropout": False, "head_dim": False},  # head_dim: not a GraniteConfig key, read if stated
)


# -- llama.cpp (GGUF)
GGUF_GRANITE = written("granite", arch="granite", keys={"attention.scale": "attention_multiplier",
                                             "embedding_scale": "embedding_multiplier",
                                             "residual_scale": "residual_multiplier", "logit_scale": "logits_scaling"},
                       stated=STATES_VOCAB_AND_ROPE,
                            defaults={"hidden_act": "silu"},
                            bias_flags={**ATTENTION_BIAS_FLAG, "mlp_bias": "blk.0.ffn_up.bias"}, permute_qk=True,
                       head_dim_stated=False)


FAMILY = Family("granite", ("granite",), "GraniteForCausalLM", llama.TENSORS, CONFIG, gguf=(GGUF_GRANITE,))
