"""Gemma 4 text decoders: Gemma4ForCausalLM checkpoints (model_type gemma4_text) and the text half of
Gemma4ForConditionalGeneration ones (model_type gemma4).

Same as gemma4_unified_text, except: `max_position_embeddings` defaults to 131072 and `sliding_window` to 512;
`use_bidirectional_attention` defaults to null (causal; "vision" is causal for text too, "all" is refused); the
per-layer embeddings (`hidden_size_per_layer_input`, default 256, 0 for none; `vocab_size_per_layer_input`): a
second embedding table, projected and gated into every layer as gemma3n_text's (their tensors named as there),
added to the residual before the layer scalar, the constants multiplied as Python floats and no id clamped.
With `enable_moe_block` every layer runs a mixture of `num_experts` experts (each `moe_intermediate_size` wide, top
`top_k_experts`) beside its dense MLP (moe.BesideDense): the router (`router.proj`) reads the block's input stream
normalised without a weight, times `router.scale` and hidden_size**-0.5, softmaxes in fp32, takes the top-k,
renormalises them and multiplies them by `router.per_expert_scale`, in fp32; the experts (stored fused,
`experts.gate_up_proj` [experts, 2 * width, hidden], `experts.down_proj` [experts, hidden, width]) read that stream
normalised by `pre_feedforward_layernorm_2`; the dense MLP's output is normalised by `post_feedforward_layernorm_1`,
the experts' by `post_feedforward_layernorm_2`, and their sum by `post_feedforward_layernorm`.

Gemma4ForConditionalGeneration nests the text config under `text_config` and keeps `tie_word_embeddings` at the
top level; its text weights sit under `model.language_model.`, its vision and audio towers and embedders are
dropped. Export writes the text-only Gemma4ForCausalLM layout.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, unsupported
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import FUSED_RULES
from ..tables.hf_wrapper import nested_text_config, wrapped
from ..tables.table import Rule, TensorTable
from . import gemma4_unified_text as unified
from .gemma3n_text import PLE_LAYER_RULES, PLE_RULES, ple_entry

LAYER = "model.layers.{}"
MOE_RULES = (
    Rule(f"{LAYER}.router.proj.weight", "layers.{}.mlp.router.weight"),
    Rule(f"{LAYER}.router.scale", "layers.{}.mlp.router.scale"),
    Rule(f"{LAYER}.router.per_expert_scale", "layers.{}.mlp.router.expert_scale"),
    # the fused experts sit on the layer, not under `mlp`: transformers 5's fused names less the `mlp.`
    *(Rule(rule.stored.replace(".mlp.experts.", ".experts."), rule.canonical, rule.transform) for rule in FUSED_RULES),
    Rule(f"{LAYER}.pre_feedforward_layernorm_2.weight", "layers.{}.mlp.input_norm.weight"),
    Rule(f"{LAYER}.post_feedforward_layernorm_1.weight", "layers.{}.mlp.dense_norm.weight"),
    Rule(f"{LAYER}.post_feedforward_layernorm_2.weight", "layers.{}.mlp.norm.weight"),
)
TEXT_TENSORS = TensorTable(PLE_RULES + unified.TEXT_TENSORS.rules + MOE_RULES + PLE_LAYER_RULES)
TOWERS = ("vision_tower", "audio_tower", "embed_vision", "embed_audio")
TENSORS = wrapped(TEXT_TENSORS, *TOWERS, legacy=False)

# the MoE block: off by default, its three counts null (no default) unless it is on
ENABLE = Key("enable_moe_block", bool, False)
COUNTS = (Key("num_experts", int, None, nullable=True), Key("top_k_experts", int, None, nullable=True),
          Key("moe_intermediate_size", int, None, nullable=True))
# Gemma4TextRouter and Gemma4TextDecoderLayer: what config.json never states
GEMMA4_MOE = dict(router="softmax", norm_topk=True, weights_fp32=True, router_norm=True, expert_scale=True,
                  beside_dense=True, output_norm=True)


def moe_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    if not hf.get("enable_moe_block"):
        return {}
    counts = [hf.get(key.name) for key in COUNTS]
    for key, value in zip(COUNTS, counts, strict=True):
        if value is None:
            raise MappingError(f"config.json: enable_moe_block=true needs {key.name} (a positive integer), "
                               "which is absent or null; state it")
    n_experts, top_k, width = counts
    if top_k > n_experts:
        raise MappingError(f"config.json: top_k_experts={top_k} exceeds num_experts={n_experts}; lower it")
    return {"moe": MoeConfig(n_experts=n_experts, top_k=top_k, d_expert=width, **GEMMA4_MOE)}


def moe_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    if moe is None:
        return {"enable_moe_block": False} | {key.name: DEFAULT for key in COUNTS}
    return {"enable_moe_block": True, "num_experts": moe.n_experts, "top_k_experts": moe.top_k,
            "moe_intermediate_size": moe.d_expert}


CONFIG = unified.CONFIG.but(
    add=(
        unsupported("use_bidirectional_attention", str, "vision", "bidirectional attention over every token",
                    "causal Gemma 4", default=None, nullable=True),
        ple_entry("python", bound="non_negative"),
        Entry("experts", (ENABLE, *COUNTS), moe_from_hf, moe_to_hf),
    ),
    defaults={"max_position_embeddings": 131_072, "sliding_window": 512},
    decoder=lambda data: nested_text_config(data, "gemma4", ("gemma4_text",), {"model_type": "gemma4_text"}),
)

FAMILY = Family("gemma4_text", ("gemma4_text", "gemma4"), "Gemma4ForCausalLM", TENSORS, CONFIG,
                notes={"gemma4": "Gemma4ForConditionalGeneration (model_type gemma4): only the text decoder is read; "
                                 "the vision and audio towers and embedders are left out"},
                no_gguf=unified.FAMILY.no_gguf.replace("layers and layer scalars", "layers, layer scalars and MoE "
                                                       "block (the router's input and per-expert scales)"),
                reference_layouts=unified.REFERENCE_LAYOUTS)
