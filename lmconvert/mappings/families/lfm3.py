"""LFM3 (Liquid AI's LFM3-1.7B).

Same as lfm2, except: `layer_types` names each layer "conv" (the gated short convolution),
"sliding_attention" (attention within `sliding_window`, default 256) or "full_attention" (absent:
full on every layer i with i % 4 == 2, sliding on the other multiples of 4 but the first, conv
elsewhere); no `full_attn_idxs` or `block_*` keys: the FFN is `intermediate_size` wide as stated
(default 7680); `rope_parameters` is keyed by layer type (absent: sliding layers "default" at theta
1e4, full layers "proportional" at 1e6 rotating half of each head), and cos/sin stay fp32, q and k
rotated in fp32 and cast back (`Olmo3RotaryEmbedding`, olmo's rotation: `fp32_tables`); the
attention is Qwen3's (`q_norm` / `k_norm` per head before RoPE, `o_proj`, `attention_bias`
switching the q, k, v and o biases) with, when `use_attention_gate` (default true), each head's
output times the sigmoid of its own row of `g_proj` applied to the layer's normed input
(`attn_output_gate="projection_head"`; the files call it `gate_proj`, transformers renames it on
load); when `use_sandwich_norm` (default true), every layer, conv ones too, normalises its mixer's
and its FFN's outputs before the residual add (`post_operator_norm`, `post_ffn_norm`:
`norm_placement="sandwich"`); `conv_L_cache` defaults to 7; `tie_word_embeddings` is the only
spelling of the tying (default true).
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables import hf_rope
from ..tables.config_table import DEFAULT, Entry, plain
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import layer_mixers_from_types, window_fields
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import Rule, TensorTable
from . import lfm2, llama

C, S, F = "conv", "sliding_attention", "full_attention"
LAYER = "model.layers.{}"
GATE = "layers.{}.attn.out_gate.weight"
TENSORS = TensorTable((
    *(r for r in lfm2.TENSORS.rules if ".self_attn." not in r.stored), *llama.ATTENTION_RULES, *llama.QK_NORM_RULES,
    Rule(f"{LAYER}.post_operator_norm.weight", "layers.{}.attn_post_norm.weight"),
    Rule(f"{LAYER}.post_ffn_norm.weight", "layers.{}.mlp_post_norm.weight"),
    # the files' name first (what export writes), then transformers' in-memory one (what verify finds the module by)
    Rule(f"{LAYER}.self_attn.gate_proj.weight", GATE), Rule(f"{LAYER}.self_attn.g_proj.weight", GATE),
))

TYPES = {C: "mixer", S: "attention", F: "attention"}
SCHEDULE_KEYS = (Key("layer_types", list, None, nullable=True), Key("sliding_window", int, 256, nullable=True),
                 Key("conv_L_cache", int, 7), Key("conv_bias", bool, False))


def default_types(n: int) -> list[str]:
    """Lfm3Config.__post_init__ without layer_types."""
    return [F if i % 4 == 2 else S if i % 4 == 0 and i > 0 else C for i in range(n)]


def schedule_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Each layer's kind: the short convolution, sliding or full attention."""
    n = fields["n_layers"]
    types = hf.get("layer_types")
    types = default_types(n) if types is None else types
    mixers = layer_mixers_from_types(types, n, TYPES)
    out = window_fields(tuple("local" if t == S else "global" for t in types), hf.get("sliding_window"))
    if "mixer" in mixers:
        out.update(mixer="short_conv", layer_mixers=mixers,
                   mixer_settings={"kernel": hf.get("conv_L_cache"), "bias": hf.get("conv_bias")})
    return out


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """A mixer other than the short convolution is written as attention, so export names it lost."""
    conv = cfg.mixer == "short_conv"
    types = [C if conv and m == "mixer" else S if k == "local" else F
             for m, k in zip(cfg.layer_mixers, cfg.layer_kinds, strict=True)]
    settings = cfg.mixer_settings if conv else None
    return {"layer_types": types, "sliding_window": DEFAULT if cfg.sliding_window is None else cfg.sliding_window,
            "conv_L_cache": settings.kernel if settings else DEFAULT,
            "conv_bias": settings.bias if settings else DEFAULT}


DEFAULT_ROPE = {S: {"rope_type": "default", "rope_theta": 10_000.0},
                F: {"rope_type": "proportional", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5}}


def rope_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """`rope` for the full layers and `rope_local` for the sliding ones, each from its own entry of
    `rope_parameters` (absent or null: Lfm3Config's defaults); an entry no attention layer uses is not read."""
    nested = hf.get("rope_parameters") or DEFAULT_ROPE
    mixers = fields.get("layer_mixers") or ("attention",) * fields["n_layers"]
    kinds = tuple(k for k, m in zip(fields["layer_kinds"], mixers, strict=True) if m == "attention")
    ropes = {}
    for kind, layer_type in (("global", F), ("local", S)):
        if kind not in kinds:
            continue
        params = nested.get(layer_type)
        if not isinstance(params, dict):
            raise MappingError(f"config.json: rope_parameters.{layer_type}={show(params)} should be a JSON object "
                               f"(the {layer_type} layers' RoPE)")
        ropes[kind] = hf_rope.rope_from_hf(hf, params, f"rope_parameters.{layer_type}.",
                                           theta=params.get("rope_theta", 1_000_000.0), fp32_tables=True)
    if not ropes:  # no attention layer: the default tables, unused
        return {}
    return hf_rope.rope_by_kind(ropes.get("global", ropes.get("local")), ropes.get("local", ropes.get("global")),
                                kinds)


def gate_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    return {"attn_output_gate": "projection_head" if hf.get("use_attention_gate") else "none"}


def sandwich_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    return {"norm_placement": "sandwich" if hf.get("use_sandwich_norm") else "pre"}


DROPOUT = next(e for e in llama.CONFIG.entries if e.name == "attention_dropout")
CONFIG = lfm2.CONFIG.but(
    drop=("rope",),
    add=(plain("tie_word_embeddings", "tie_embeddings", bool, True, name="tied embeddings"),
         plain("intermediate_size", "d_ff", int, 7680, name="FFN width"),
         Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf),
         Entry("rope by layer type", hf_rope.KEYS, rope_from_hf, hf_rope.rope_by_layer_type_to_hf),
         llama.ATTENTION_BIAS, DROPOUT,
         Entry("attention gate", (Key("use_attention_gate", bool, True),), gate_from_hf,
               lambda cfg: {"use_attention_gate": cfg.attn_output_gate == "projection_head"}),
         Entry("sandwich norms", (Key("use_sandwich_norm", bool, True),), sandwich_from_hf,
               lambda cfg: {"use_sandwich_norm": cfg.norm_placement == "sandwich"})),
    defaults={"vocab_size": 128_000, "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
              "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 128_000},
    nullable={"attention_dropout": False},
)

# q_norm(q_proj(x).view(B, T, -1, D)), transposed afterwards; g_proj(x) is one gate per head, (B, T, H)
REFERENCE_LAYOUTS = {**QK_NORM_PER_HEAD, "attn.out_gate": "B T H"}

FAMILY = Family("lfm3", ("lfm3",), "Lfm3ForCausalLM", TENSORS, CONFIG,
                no_gguf="llama.cpp's converter has no LFM3 architecture (its sliding attention, per-head attention "
                        "gate and sandwich norms beside lfm2's convolution); export to safetensors instead",
                reference_layouts=REFERENCE_LAYOUTS)
