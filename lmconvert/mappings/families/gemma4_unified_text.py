"""Gemma 4 unified text decoders: Gemma4UnifiedForCausalLM checkpoints (model_type gemma4_unified_text) and the
text half of Gemma4UnifiedForConditionalGeneration ones (model_type gemma4_unified).

Same as gemma3, except: the RMSNorm multiplies by its weight as stored (no `1 + w`), in fp32 before the cast,
and takes 1/sqrt as `torch.pow(mean + eps, -0.5)`; scores are not scaled (scale 1) nor soft-capped; v is
normalised per head by a weightless RMSNorm (`v_norm`); each block's output is multiplied by a learned scalar
(`layer_scalar`, a [1] buffer stored in the checkpoint); the global (full_attention) layers have their own
geometry (`per_layer_config` {layer: {"head_dim", "num_key_value_heads"}}, or in the Hub's spelling
`global_head_dim`, default 512, and `num_global_key_value_heads`, read only with `attention_k_eq_v`); with
`attention_k_eq_v` the global layers have no v_proj and v is k_proj's output (before k_norm); the last
`num_kv_shared_layers` layers have no k_proj, v_proj or k_norm and attend over the K/V (cached ones too) of the
last earlier layer of their kind, their MLP twice `intermediate_size` wide with `use_double_wide_mlp`; the full
layers' RoPE is "proportional" (rope_type proportional: the whole head rotated in halves, the frequencies past
the first `partial_rotary_factor` of the angles 0), the sliding layers' the default over their head_dim;
`layer_types` defaults to every sixth layer full, and the last layer is always full (transformers forces it);
`final_logit_softcapping` defaults to None; `use_bidirectional_attention` "vision" (the default) is causal for
text, "all" is refused.

Gemma4UnifiedForConditionalGeneration nests the text config under `text_config` and keeps
`tie_word_embeddings` at the top level; its text weights sit under `model.language_model.`, its vision and
audio embedders are dropped. Export writes the text-only Gemma4UnifiedForCausalLM layout.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables import hf_rope
from ..tables.config_table import Entry, fixed, unsupported
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import LAYER_TYPES_KEY, SLIDING_WINDOW_KEY, layer_kinds_from_hf, window_fields
from ..tables.hf_layers import layers_and_window_to_hf as _layers_to_hf
from ..tables.hf_wrapper import nested_text_config, wrapped
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import Rule, TensorTable
from . import gemma2, gemma3, llama

ATTN = "model.layers.{}.self_attn"
LAYER_RULES = (Rule("model.layers.{}.layer_scalar", "layers.{}.scalar"),)
TEXT_TENSORS = TensorTable(gemma2.TENSORS.rules + llama.QK_NORM_RULES + LAYER_RULES)
TOWERS = ("embed_vision", "vision_embedder", "embed_audio", "vision_tower", "audio_tower")
TENSORS = wrapped(TEXT_TENSORS, *TOWERS, legacy=False)


# -- layers: kinds (the last one always full), global geometry, K = V, KV sharing
PER_LAYER = Key("per_layer_config", dict, None, nullable=True)
GLOBAL_HEAD_DIM = Key("global_head_dim", int, 512, legacy=True)  # the Hub's spelling, read when per_layer_config
GLOBAL_KV_HEADS = Key("num_global_key_value_heads", int, None, nullable=True, legacy=True)  # is absent
K_EQ_V = Key("attention_k_eq_v", bool, False)
SHARED = Key("num_kv_shared_layers", int, 0, bound="non_negative")
DOUBLE_WIDE = Key("use_double_wide_mlp", bool, False)
OVERRIDES = ("head_dim", "num_key_value_heads")  # what per_layer_config may set, on full layers only


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    kinds = list(layer_kinds_from_hf(hf, n, lambda i: (i + 1) % 6 != 0))
    kinds[-1] = "global"  # Gemma4TextConfig forces the last layer to full_attention
    out = window_fields(tuple(kinds), hf.get("sliding_window"))
    out |= _geometry(hf, fields, kinds)
    shared = hf.get("num_kv_shared_layers")
    if shared >= n:
        raise MappingError(f"config.json: num_kv_shared_layers={shared} leaves no layer with K/V of its own "
                           f"(num_hidden_layers={n}); such a model (a Gemma 4 drafter) needs another's K/V")
    out.update(k_eq_v="global" if hf.get("attention_k_eq_v") else "none", kv_shared_layers=shared,
               shared_ffn_factor=2 if hf.get("use_double_wide_mlp") and shared else 1)
    return out


def _geometry(hf: HfConfig, fields: dict[str, Any], kinds: list[str]) -> dict[str, Any]:
    """The full layers' head_dim and KV heads: from per_layer_config where stated (the same overrides on every
    full layer and none on a sliding one, else refused), else from global_head_dim / num_global_key_value_heads."""
    stated = hf.get("per_layer_config")
    if stated is None:
        kv = hf.get("num_global_key_value_heads") if hf.get("attention_k_eq_v") else None
        return {"global_head_dim": hf.get("global_head_dim"), "global_kv_heads": kv}
    where = f"config.json: per_layer_config={show(stated)}"
    overrides: list[dict[str, Any]] = []
    by_layer: dict[int, dict[str, Any]] = {}
    for key, value in stated.items():  # transformers writes the indices zero-padded ("05")
        if not (isinstance(key, str) and key.isdigit() and int(key) < len(kinds)) or not isinstance(value, dict) \
                or set(value) - set(OVERRIDES):
            raise MappingError(f"{where}: lmconvert reads only {' and '.join(OVERRIDES)} per layer index below "
                               f"num_hidden_layers; remove the other entries")
        if kinds[int(key)] != "global" and value:
            raise MappingError(f"{where}: layer {key} is sliding; lmconvert reads other head geometry on full "
                               "layers only")
        by_layer[int(key)] = value
    for i, kind in enumerate(kinds):
        if kind == "global":
            overrides.append(by_layer.get(i, {}))
    if any(o != overrides[0] for o in overrides):
        raise MappingError(f"{where}: the full layers differ from each other; lmconvert reads one geometry for "
                           "all full layers")
    geometry = overrides[0] if overrides else {}
    for key, value in geometry.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise MappingError(f"{where}: {key}={show(value)} should be a positive integer")
    return {"global_head_dim": geometry.get("head_dim", fields["head_dim"]),
            "global_kv_heads": geometry.get("num_key_value_heads", fields["n_kv_heads"])}


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    out = _layers_to_hf(cfg)
    per_layer, width = {}, len(str(cfg.n_layers - 1))  # transformers pads the indices to one width ("05")
    for i, kind in enumerate(cfg.layer_kinds):
        if kind == "global":
            layer = cfg.layer_config(i)  # what differs from the sliding layers only, as transformers writes it
            overrides = ({"head_dim": layer.head_dim} if cfg.global_head_dim is not None else {}) | (
                {"num_key_value_heads": layer.n_kv_heads} if cfg.global_kv_heads is not None else {})
            if overrides:
                per_layer[str(i).zfill(width)] = overrides
    return out | {"per_layer_config": per_layer,
                  "attention_k_eq_v": cfg.k_eq_v == "global", "num_kv_shared_layers": cfg.kv_shared_layers,
                  "use_double_wide_mlp": cfg.shared_ffn_factor == 2}


def rope_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Full layers use `rope`, sliding ones `rope_local`, from `rope_parameters` nested by layer type."""
    nested = hf.get("rope_parameters") or {}
    defaults = {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
    ropes = {}
    for kind, default in defaults.items():
        params = nested.get(kind) if nested else default  # absent or null: transformers' defaults
        if not isinstance(params, dict):
            raise MappingError(f"config.json: rope_parameters.{kind}={show(params)} should be a JSON object")
        theta = params.get("rope_theta", 10_000.0)
        ropes[kind] = hf_rope.rope_from_hf(hf, params, f"rope_parameters.{kind}.", theta=theta)
    return hf_rope.rope_by_kind(ropes["full_attention"], ropes["sliding_attention"], fields["layer_kinds"])


CONFIG = gemma3.CONFIG.but(
    drop=("query_pre_attn_scalar", "layer kinds", "rope by layer type",
          "use_bidirectional_attention"),
    add=(
        llama.norm(1e-6, dtype_order="scale_then_cast", power=True),
        fixed("QK norm", qk_norm="head", v_norm=True, attn_scale=1.0, layer_scalar=True),
        Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY, PER_LAYER, GLOBAL_HEAD_DIM, GLOBAL_KV_HEADS,
                              K_EQ_V, SHARED, DOUBLE_WIDE), layers_from_hf, layers_to_hf),
        Entry("rope by layer type", hf_rope.KEYS, rope_from_hf,
              hf_rope.rope_by_layer_type_to_hf),
        unsupported("use_bidirectional_attention", str, "vision", "bidirectional attention over every token",
                    "causal Gemma 4", nullable=True),
    ),
    defaults={"vocab_size": 262_144, "max_position_embeddings": 262_144, "sliding_window": 1024,
              "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 256},
    nullable={"sliding_window": False},
    decoder=lambda data: nested_text_config(data, "gemma4_unified", ("gemma4_unified_text",),
                                            {"model_type": "gemma4_unified_text"}),
)


# q_proj(x).view(B, T, -1, D), then q_norm, before the heads are moved first
REFERENCE_LAYOUTS = QK_NORM_PER_HEAD

FAMILY = Family("gemma4_unified_text", ("gemma4_unified_text", "gemma4_unified"), "Gemma4UnifiedForCausalLM",
                TENSORS, CONFIG,
                notes={"gemma4_unified": "Gemma4UnifiedForConditionalGeneration (model_type gemma4_unified): only "
                                         "the text decoder is read; the vision and audio embedders are left out"},
                reference_layouts=REFERENCE_LAYOUTS)
