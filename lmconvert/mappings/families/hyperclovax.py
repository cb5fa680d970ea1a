"""HyperCLOVA X (HyperCLOVAX-SEED).

Same as granite, except: `logits_scaling` multiplies the logits (Granite divides by it);
`embedding_multiplier` multiplies as the Python float it is, unrounded (`embed_scale_unrounded`);
`attention_multiplier` may be null (or absent), meaning head_dim ** -0.5; `use_post_norm` (default
true) adds an RMSNorm on each sublayer's output before it is scaled by `residual_multiplier` and
added to the residual (`post_norm1` after attention, `post_norm2` after the MLP: sandwich norms);
`rms_norm_eps` defaults to 1e-6 and `head_dim` may be null.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import Entry, plain
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from . import granite, llama

TENSORS = TensorTable(llama.TENSORS.rules + (
    Rule("model.layers.{}.post_norm1.weight", "layers.{}.attn_post_norm.weight"),
    Rule("model.layers.{}.post_norm2.weight", "layers.{}.mlp_post_norm.weight"),
))

PLACEMENTS = {True: "sandwich", False: "pre"}


def attn_scale_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Null means head_dim ** -0.5 (HyperCLOVAXConfig's own default), which is also what None means here."""
    if hf.get("attention_multiplier") is None:
        return {"attn_scale": None}
    return granite.attn_scale_from_hf(hf, fields)


def post_norm_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # another placement reads back as pre-norm, so export refuses it by name
    return {"use_post_norm": cfg.norm_placement == "sandwich"}


CONFIG = granite.CONFIG.but(
    add=(Entry("attention_multiplier", (Key("attention_multiplier", float, None, nullable=True),), attn_scale_from_hf,
               lambda cfg: {"attention_multiplier": cfg.score_scale}),
         Entry("embedding_multiplier", (Key("embedding_multiplier", float, 1.0),), granite.embed_scale_from_hf,
               granite.embed_scale_to_hf),
         plain("logits_scaling", "logit_scale", float, 1.0, read=float),
         Entry("use_post_norm", (Key("use_post_norm", bool, True),),
               lambda hf, _: {"norm_placement": PLACEMENTS[hf.get("use_post_norm")]}, post_norm_to_hf)),
    nullable={"head_dim": True},
)


FAMILY = Family("hyperclovax", ("hyperclovax",), "HyperCLOVAXForCausalLM", TENSORS, CONFIG)
