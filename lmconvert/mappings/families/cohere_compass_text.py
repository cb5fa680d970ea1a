"""CohereCompass's text decoder (CohereCompassForCausalLM, model_type `cohere_compass_text`: the
language model of CohereLabs' North / Compass vision models).

Same as cohere2, except: RoPE rotates halves (llama's `rotate_half`, cos/sin in the activation
dtype), not interleaved pairs in fp32; it is Qwen3-VL's multimodal RoPE, whose three position axes
are one for text, so its `mrope_section` / `mrope_interleaved` change nothing here and are not read;
`rope_parameters` is nested by layer type ({"full_attention": ..., "sliding_attention": ...}), a
layer type's entry null meaning no position encoding on those layers (NoPE), and transformers
needs an entry for every layer type in use (there is no flat or older spelling; each entry states its
rope_theta); `layer_types`
defaults to every layer full (no `sliding_window_pattern`), `sliding_window` to 4096 (null: none);
head_dim is always hidden_size / heads (CohereCompassTextConfig overwrites a stated one);
`logit_scale` defaults to null, which means 1; there is no `use_qk_norm`. Export writes the entry of
each layer type in use, null where the layers of a type have no RoPE.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables import hf_rope
from ..tables.config_table import Entry
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import LAYER_TYPES_KEY, layer_kinds_from_hf, layer_types_to_hf, window_fields
from . import cohere

KINDS = {"full_attention": "global", "sliding_attention": "local"}


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Layer kinds and window, then each kind's RoPE (or none), as CohereCompassRotaryEmbedding builds it."""
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: False)
    nested = hf.get("rope_parameters") or {}
    ropes = {}
    for name, kind in KINDS.items():
        if kind not in kinds:
            continue
        if name not in nested:
            raise MappingError(f"config.json: rope_parameters={show(nested)} has no {name!r} entry, which "
                               f"transformers' CohereCompass needs for its {name} layers (null: no RoPE)")
        params = nested[name]
        if params is not None and not isinstance(params, dict):
            raise MappingError(f"config.json: rope_parameters.{name}={show(params)} should be a JSON object or null")
        ropes[kind] = None if params is None else hf_rope.rope_from_hf(hf, params, f"rope_parameters.{name}.",
                                                                        theta=params.get("rope_theta"))
    full, sliding = ropes.get("global"), ropes.get("local")
    positions = tuple("none" if ropes[k] is None else "rope" for k in kinds)
    if full is None or sliding is None:
        rope = {"rope": full or sliding} if (full or sliding) is not None else {}
    else:
        rope = hf_rope.rope_by_kind(full, sliding, kinds)
    return {**window_fields(kinds, hf.get("sliding_window")), **rope, "layer_positions": positions}


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The RoPE of each layer type in use, null where its first layer has none (any other pattern reads back
    otherwise, so export refuses it by name)."""
    params = {}
    for name, kind in KINDS.items():
        first = next((i for i, k in enumerate(cfg.layer_kinds) if k == kind), None)
        if first is not None:
            rope = cfg.rope_for(first)
            params[name] = None if rope is None else hf_rope.rope_to_hf(rope)
    return {"layer_types": layer_types_to_hf(cfg.layer_kinds), "sliding_window": cfg.sliding_window,
            "rope_parameters": params}


LAYERS = Entry("layers", (Key("sliding_window", int, 4096, nullable=True), LAYER_TYPES_KEY,
                          Key("rope_parameters", dict, None, nullable=True), hf_rope.FRACTION), layers_from_hf,
               layers_to_hf)
# CohereCompassTextConfig sets head_dim to hidden_size // heads whatever config.json says
HEAD_DIM = Entry("head_dim", (Key("head_dim", int, None, nullable=True),),
                 lambda hf, fields: {"head_dim": fields["d_model"] // fields["n_heads"]},
                 lambda cfg: {"head_dim": cfg.head_dim})
LOGIT_SCALE = Entry("logit_scale", (Key("logit_scale", float, None, nullable=True),),
                    lambda hf, _: {"logit_scale": 1.0 if hf.get("logit_scale") is None else hf.get("logit_scale")},
                    lambda cfg: {"logit_scale": None if cfg.logit_scale == 1.0 else cfg.logit_scale})
NORM = Entry("norm", (Key("layer_norm_eps", float, 1e-5),), cohere.NORM.read, cohere.NORM.write)

CONFIG = cohere.BASE.but(
    drop=("rope",),
    add=(NORM, LOGIT_SCALE, HEAD_DIM, LAYERS),
    defaults={"max_position_embeddings": 8192},
    nullable={"attention_dropout": False},
)


FAMILY = Family("cohere_compass_text", ("cohere_compass_text",), "CohereCompassForCausalLM", cohere.TENSORS, CONFIG)
