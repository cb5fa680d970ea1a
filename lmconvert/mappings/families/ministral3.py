"""Ministral 3 (Ministral-3-3B/8B/14B, Devstral-2, Magistral-2 text decoders: model_type `ministral3`).

Same as mistral, except: every query is scaled by its position after RoPE (the attention
temperature of Llama 4, `llama_4_scaling_beta` in `rope_parameters`: q x (1 + beta log(1 +
floor(pos / original_max_position_embeddings))), ArchConfig.attn_temperature); an absent
`rope_parameters` means Ministral3Config's default (YaRN x16 over 16384 positions, theta 1e6,
beta 0.1), and a stated one must give the beta (transformers multiplies by it: without one it
cannot run), and, for a type that has none of its own, `original_max_position_embeddings` (the
period). A beta of 0 scales by exactly 1, so it is read as no temperature, and a model without one
is exported with beta 0. `sliding_window` defaults to null and, when set, applies to every layer:
Ministral3Config ignores `layer_types` (with a warning), and so does the import; head_dim defaults
to 128 (null refused, as Ministral3Config refuses it).

Mistral3ForConditionalGeneration (model_type `mistral3`) around a ministral3 text decoder, as
Ministral 3 is published, is read as that text decoder (`text_config.model_type` chooses between
this family and mistral), its vision tower and projector dropped, as mistral does; export writes
the text-only Ministral3ForCausalLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import STATES_VOCAB_AND_ROPE, written
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import window_fields
from ..tables.hf_rope import KEYS, SCALED, rope_from_hf, rope_parameters, rope_to_hf
from ..tables.hf_wrapper import nested_text_config
from . import mistral

BETA = "llama_4_scaling_beta"
# Ministral3Config's rope_parameters when config.json has none (`max_position_embeddings` added there)
DEFAULT_ROPE = {"type": "yarn", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 16384,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, BETA: 0.1}


def rope_from_hf_with_temperature(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    params, where = rope_parameters(hf)
    if not params:  # the class's own (a top-level rope_theta alone is ignored, as transformers ignores it)
        params = dict(DEFAULT_ROPE)
    rope = rope_from_hf(hf, params, where)
    beta = params.get(BETA)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)):
        raise MappingError(f"config.json: {where}{BETA}={beta!r}: Ministral 3 scales every query by it, and "
                           "transformers cannot run without a number there")
    floor = params.get("original_max_position_embeddings")
    if floor is None and rope.scaling in SCALED:
        floor = rope.original_max_positions  # transformers fills it in from max_position_embeddings
    if isinstance(floor, bool) or not isinstance(floor, int) or floor <= 0:
        raise MappingError(f"config.json: {where}original_max_position_embeddings={floor!r}: the period of "
                           "Ministral 3's query scale; transformers cannot run without a positive integer there")
    if beta == 0:  # scales by exactly 1
        return {"rope": rope}
    return {"rope": rope, "attn_temperature": float(beta), "attn_temperature_floor": floor}


def rope_to_hf_with_temperature(cfg: ArchConfig) -> dict[str, Any]:
    out = rope_to_hf(cfg.rope)
    floor = cfg.attn_temperature_floor or cfg.rope.original_max_positions or cfg.max_positions
    out.setdefault("original_max_position_embeddings", floor)  # a scaled RoPE's own, if it has one
    out[BETA] = 0.0 if cfg.attn_temperature is None else cfg.attn_temperature
    return {"rope_parameters": out}


WINDOW = Key("sliding_window", int, None, nullable=True)  # null: no window; else every layer's


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    window = hf.get("sliding_window")
    return window_fields(("global" if window is None else "local",) * fields["n_layers"], window)


def window_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"sliding_window": None if set(cfg.layer_kinds) == {"global"} else cfg.sliding_window}


CONFIG = mistral.CONFIG.but(
    add=(Entry("rope", KEYS, rope_from_hf_with_temperature, rope_to_hf_with_temperature),
         Entry("layer kinds", (WINDOW,), window_from_hf, window_to_hf)),
    defaults={"vocab_size": 131072, "intermediate_size": 14336, "num_hidden_layers": 34, "head_dim": 128,
              "max_position_embeddings": 262144, "rms_norm_eps": 1e-5},
    nullable={"head_dim": False},  # Ministral3Config takes an int only
    decoder=lambda data: nested_text_config(data, "mistral3", ("ministral3",), mistral.MISTRAL3_TEXT),
)


# -- llama.cpp (GGUF): its converter writes Ministral3ForCausalLM (and any Mistral3 wrapper) as `mistral3`, with
# the beta as `attention.temperature_scale` (its period is llama.cpp's n_ctx_orig_yarn: the YaRN original length,
# else the context length) and mscale_all_dim as `rope.scaling.yarn_log_multiplier`, mscale taken as 1
def from_gguf(config: Mapping[str, Any]) -> dict[str, Any]:
    """The rope dict the metadata means, with the beta and mscale_all_dim the `keys` left aside."""
    stated = dict(config.get("rope_parameters") or {})
    extra = {BETA: stated.get(BETA, 0.0)}
    if "mscale_all_dim" in stated:
        extra.update(mscale_all_dim=stated["mscale_all_dim"], mscale=1.0)
    scaled = config.get("rope_scaling")
    if scaled:
        return {"rope_scaling": {**scaled, **extra}, "rope_parameters": None}
    return {"rope_parameters": {"rope_type": "default", "rope_theta": config.get("rope_theta", 10000.0), **extra,
                                "original_max_position_embeddings": config["max_position_embeddings"]}}


GGUF_MINISTRAL3 = written("ministral3", arch="mistral3", defaults={"hidden_act": "silu", "sliding_window": None},
                          keys={"attention.temperature_scale": f"rope_parameters.{BETA}",
                                "rope.scaling.yarn_log_multiplier": "rope_parameters.mscale_all_dim"},
                          derived=from_gguf, permute_qk=True, stated=STATES_VOCAB_AND_ROPE)


FAMILY = Family("ministral3", ("ministral3",), "Ministral3ForCausalLM", mistral.TENSORS, CONFIG,
                gguf=(GGUF_MINISTRAL3,),
                wraps={"mistral3": ("ministral3",)},
                notes={"mistral3": "Mistral3ForConditionalGeneration (model_type mistral3): only the text decoder "
                                   "is read; the vision tower and multi-modal projector are left out"})
