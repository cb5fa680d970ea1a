"""Phi-3 (Phi-3-mini/small/medium, Phi-3.5-mini, Phi-4-mini).

Same as llama, except: q, k and v are one fused `qkv_proj` whose rows are [q | k | v], and gate and
up one fused `gate_up_proj` whose rows are [gate | up] (both split on import, joined on export,
bit for bit); no biases anywhere; `rms_norm_eps` defaults to 1e-5; `sliding_window` (default none)
covers every layer; RoPE is `default` or `longrope` only (older files' "su" and "yarn" mean
longrope), and reads `partial_rotary_factor` for both; longrope takes the top-level
`original_max_position_embeddings` (default 4096) over the one in the rope parameters, a missing
`factor` is max_position_embeddings / original, and its short or long factors are picked per
forward call by the sequence length; `resid_pdrop` drops each sublayer's output before the
residual add (training only); `embd_pdrop` is declared but never used by transformers: checked,
not kept.

Phi4MultimodalForCausalLM (model_type `phi4_multimodal`: Phi-4-multimodal as transformers 5 loads
it) runs this same decoder: its config.json is flat, as Phi-3's, with Phi4MultimodalConfig's own
defaults where they differ (vocabulary 200064, 8 KV heads, 131072 positions), and its text weights
are Phi-3's names; its image and audio embedders (`model.embed_tokens_extend.`) are dropped, and
touch no logits of a text-only input. Its vision and speech LoRA adapters are not in these
weights (transformers loads them, from their own folders, only on request); weights holding a
LoRA-wrapped projection (`base_layer`, `lora_A`, `lora_B`), as the original phi4mm remote code
saved them, are refused by name. Export writes the text-only Phi3ForCausalLM.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, plain
from ..tables.gguf import (
    GgufArch,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import SLIDING_WINDOW_KEY
from ..tables.hf_rope import KEYS, rope_from_hf, rope_parameters, rope_to_hf
from ..tables.hf_wrapper import dropped_towers
from ..tables.points import FUSED_QKV
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Piece
from . import llama, starcoder2

QKV, GATE_UP = ("q", "kv", "kv"), ("ffn", "ffn")  # the pieces' sizes, in the order they are stored
FUSED_RULES = (
    *(Rule("model.layers.{}.self_attn.qkv_proj.weight", f"layers.{{}}.attn.{name}.weight", Piece(QKV, i))
      for i, name in enumerate("qkv")),
    Rule("model.layers.{}.self_attn.o_proj.weight", "layers.{}.attn.o.weight"),
    *(Rule("model.layers.{}.mlp.gate_up_proj.weight", f"layers.{{}}.mlp.{name}.weight", Piece(GATE_UP, i))
      for i, name in enumerate(("gate", "up"))),
    Rule("model.layers.{}.mlp.down_proj.weight", "layers.{}.mlp.down.weight"),
)
TENSORS = TensorTable(llama.EDGE_RULES + FUSED_RULES + llama.PRE_NORM_RULES)
# Phi4MultimodalForCausalLM's image and audio embedders
WRAPPED = TensorTable(TENSORS.rules + dropped_towers("embed_tokens_extend", legacy=False),
                      refused=((r"\.(base_layer|lora_[AB])\.", "a LoRA-wrapped projection (base_layer, lora_A, "
                                "lora_B), which transformers' Phi-3 and Phi4Multimodal models do not load; merge or "
                                "remove the adapters first"),))
PHI4_MULTIMODAL = {"vocab_size": 200064, "num_key_value_heads": 8, "max_position_embeddings": 131072}


def phi4_multimodal(data: dict[str, Any]) -> dict[str, Any]:
    """A Phi4MultimodalForCausalLM config.json: Phi-3's keys, with Phi4MultimodalConfig's defaults."""
    if data.get("model_type") != "phi4_multimodal":
        return data
    return {**PHI4_MULTIMODAL, **data}

ORIGINAL = Key("original_max_position_embeddings", int, 4096)
LONGROPE_SPELLINGS = {"su": "longrope", "yarn": "longrope"}  # Phi3Config renames these
PHI3_TYPES = ("default", "longrope")


def rope_from_phi3(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    params, where = rope_parameters(hf)
    if "su" in (params.get("rope_type"), params.get("type")) and "original_max_position_embeddings" not in params:
        raise MappingError(f"config.json: {where}type='su' without original_max_position_embeddings is refused by "
                           "transformers; add it to the rope parameters, or spell the type 'longrope'")
    for key in ("rope_type", "type"):
        if params.get(key) in LONGROPE_SPELLINGS:
            params[key] = LONGROPE_SPELLINGS[params[key]]
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in PHI3_TYPES:
        raise MappingError(f"config.json: {where}rope_type={kind!r} is not supported by Phi-3 (transformers refuses "
                           f"it too); use one of {', '.join(PHI3_TYPES)}")
    if kind == "longrope":  # the top-level key always wins, its default included
        params["original_max_position_embeddings"] = hf.get(ORIGINAL.name)
    return {"rope": rope_from_hf(hf, params, where, partial=True)}


def rope_to_phi3(cfg: ArchConfig) -> dict[str, Any]:
    # another scaling is written as the default type, so export names the scaling it cannot express
    rope = cfg.rope if cfg.rope.scaling in ("none", "longrope") else replace(cfg.rope, scaling="none", alpha=None)
    original = rope.original_max_positions if rope.scaling == "longrope" else DEFAULT
    params = rope_to_hf(rope, partial=True)
    if rope.scaling == "longrope" and rope.factor == cfg.max_positions / rope.original_max_positions:
        params.pop("factor", None)  # what an absent factor means, as Phi-3's own files leave it
    return {"rope_parameters": params, ORIGINAL.name: original}


CONFIG = llama.CONFIG.but(
    drop=("attention_bias", "mlp_bias"),
    add=(llama.norm(1e-5),
         Entry("rope", (*KEYS, ORIGINAL), rope_from_phi3, rope_to_phi3),
         Entry("layer kinds", (SLIDING_WINDOW_KEY,), starcoder2.window_from_hf, starcoder2.window_to_hf),
         plain("resid_pdrop", "resid_dropout", float, 0.0, bound="probability"),
         Entry("embd_pdrop", (Key("embd_pdrop", float, 0.0, bound="probability"),), lambda hf, _: {},
               lambda cfg: {"embd_pdrop": DEFAULT})),
    defaults={"vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "sliding_window": None},
    nullable={"head_dim": False, "attention_dropout": False},  # head_dim: not a Phi3Config key, read if stated
    decoder=phi4_multimodal,
)


# -- llama.cpp (GGUF)
# transformers' GGUF loader reads no window; llama.cpp's converter writes one when config.json has it
GGUF_PHI3 = GgufArch("phi3", arch="phi3", keys={"attention.sliding_window": "sliding_window"},
                     stated=frozenset({"rope.dimension_count"}),
                     defaults={"hidden_act": "silu"},
                        fused=True, head_dim_stated=False)


# one qkv_proj output [q | k | v] and one gate_up_proj output [gate | up]
REFERENCE_LAYOUTS = {**FUSED_QKV, "mlp.gate": "B T [F]|F", "mlp.up": "B T F|[F]"}

FAMILY = Family("phi3", ("phi3", "phi4_multimodal"), "Phi3ForCausalLM", WRAPPED, CONFIG, gguf=(GGUF_PHI3,),
                notes={"phi4_multimodal": "Phi4MultimodalForCausalLM (model_type phi4_multimodal): only the text "
                                          "decoder is read; the image and audio embedders are left out"},
                reference_layouts=REFERENCE_LAYOUTS)
