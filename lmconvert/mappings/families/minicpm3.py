"""MiniCPM3.

Same as deepseek_v2, except: every layer is dense (no mixture-of-experts keys); RoPE uses the half
layout (rotate-half on the rotary part of each query and key) with any of the scaling types, the
released checkpoint's `longrope` included; the embeddings are multiplied by `scale_emb` (rounded to
the weight dtype first, as Gemma's normaliser); each sublayer's output is multiplied by
`scale_depth / sqrt(num_hidden_layers)` before the residual add (a null `scale_depth` means
sqrt(num_hidden_layers), so no scaling); the final hidden state is divided by
`hidden_size / dim_model_base` before the LM head (a null `dim_model_base` means hidden_size); a
null `v_head_dim` means hidden_size / heads; embeddings are tied by default; `rms_norm_eps`
defaults to 1e-5 (the MLA-internal norms keep 1e-6).
"""

from __future__ import annotations

import math
from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import NO_ROPE_BASE, written
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_rope import KEYS as ROPE_KEYS
from ..tables.hf_rope import rope_from_hf, rope_parameters, rope_to_hf
from ..tables.points import LATENT
from ..tables.table import TensorTable
from . import deepseek_v2, deepseek_v3


def residual_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    depth = hf.get("scale_depth")
    root = math.sqrt(fields["n_layers"])
    return {"residual_scale": 1.0 if depth is None else depth / root}  # transformers: sqrt(n) / sqrt(n) = 1.0


def residual_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The shortest `scale_depth` that transformers turns back into exactly this residual scale:
    1.4 rather than the 1.4000000000000001 that `residual_scale * sqrt(n)` may round to."""
    root = math.sqrt(cfg.n_layers)
    depth = candidate = cfg.residual_scale * root
    below = above = candidate
    for _ in range(4):
        below, above = math.nextafter(below, -math.inf), math.nextafter(above, math.inf)
        for value in (below, above):
            if value / root == cfg.residual_scale and len(repr(value)) < len(repr(depth)):
                depth = value
    return {"scale_depth": depth}


def rope_to_minicpm3(cfg: ArchConfig) -> dict[str, Any]:
    """As every family writes RoPE, but a longrope `factor` that is what an absent one means
    (max_position_embeddings / original) is left out, as MiniCPM3's own files leave it."""
    params = rope_to_hf(cfg.rope)
    if cfg.rope.scaling == "longrope" and cfg.rope.factor == cfg.max_positions / cfg.rope.original_max_positions:
        params.pop("factor", None)
    return {"rope_parameters": params}


def head_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    base = hf.get("dim_model_base")
    return {"head_divisor": 1.0 if base is None else fields["d_model"] / base}


def head_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """An integer where one gives the divisor back (transformers declares `int`); read back, any
    other divisor is a different model and export names it."""
    base = cfg.d_model / cfg.head_divisor
    return {"dim_model_base": round(base) if cfg.d_model / round(base) == cfg.head_divisor else base}


CONFIG = deepseek_v2.CONFIG.but(
    drop=("experts",),
    add=(
        Entry("rope", ROPE_KEYS, lambda hf, _: {"rope": rope_from_hf(hf, *rope_parameters(hf))}, rope_to_minicpm3),
        deepseek_v3.latent("minicpm3", deinterleave=True, v_head_dim_nullable=True,
                           null_v_head_dim=lambda fields: fields["d_model"] // fields["n_heads"]),
        Entry("scale_emb", (Key("scale_emb", float, 12.0),),
              lambda hf, _: {"embed_scale": None if hf.get("scale_emb") == 1.0 else hf.get("scale_emb")},
              lambda cfg: {"scale_emb": 1.0 if cfg.embed_scale is None else cfg.embed_scale}),
        Entry("scale_depth", (Key("scale_depth", float, 1.4, nullable=True),), residual_from_hf, residual_to_hf),
        Entry("dim_model_base", (Key("dim_model_base", int, 256, nullable=True),), head_from_hf, head_to_hf),
    ),
    defaults={"vocab_size": 73448, "hidden_size": 2560, "intermediate_size": 6400, "num_hidden_layers": 62,
              "num_attention_heads": 40, "num_key_value_heads": 40, "max_position_embeddings": 32768,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "q_lora_rank": 768, "kv_lora_rank": 256,
              "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": None},
)

# MiniCPM3Attention: DeepseekV2Attention's modules
REFERENCE_LAYOUTS = LATENT


# -- llama.cpp (GGUF)
# llama.cpp's minicpm3 (MiniCPM3Model in its converter): deepseek2's MLA layout without absorption (kv_b
# whole), always with a q LoRA, dense SwiGLU layers, RoPE on the halves (NeoX-style); its graph hard-codes
# the embedding scale 12, scale_depth 1.4 and dim_model_base 256
ABSORBED = ("blk.{}.attn_k_b.weight", "blk.{}.attn_v_b.weight")  # deepseek2's kv_b split, which it never reads
MLA_KEYS = ("attention.q_lora_rank", "attention.kv_lora_rank", "attention.value_length", "rope.dimension_count")
GGUF_MINICPM3 = written("minicpm3", arch="minicpm3", keys={k: deepseek_v3.DEEPSEEK2_KEYS[k] for k in MLA_KEYS},
                        defaults={"hidden_act": "silu", "q_lora_rank": None, "scale_emb": 12.0, "scale_depth": 1.4,
                                  "dim_model_base": 256},
                        latent=True, derived=deepseek_v3.mla_sizes, omitted=NO_ROPE_BASE,
                        table=TensorTable(tuple(r for r in deepseek_v3.DEEPSEEK_V3.tensors.rules
                                                if r.canonical and "layers.{}.attn.q." not in r.canonical
                                                and r.stored not in ABSORBED
                                                and not r.canonical.startswith(("layers.{}.mlp.router",
                                                                                "layers.{}.mlp.experts",
                                                                                "layers.{}.mlp.shared")))))

FAMILY = Family("minicpm3", ("minicpm3",), "MiniCPM3ForCausalLM", deepseek_v3.TENSORS, CONFIG, gguf=(GGUF_MINICPM3,),
                reference_layouts=REFERENCE_LAYOUTS)
