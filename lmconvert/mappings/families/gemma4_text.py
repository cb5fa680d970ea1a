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

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, unsupported
from ..tables.gguf import GEMMA_KEYS, tensor_table, written
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import FUSED_RULES
from ..tables.hf_wrapper import nested_text_config, wrapped
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Unstack
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


# -- llama.cpp (GGUF): its gemma4 architecture, as its converter's Gemma4Model writes it. Each layer kind's head size
# (`attention.key_length` the full layers', `_swa` the sliding ones') and rotated width (the full layers' whole head:
# the proportional RoPE's still frequencies are 1e30 in a `rope_freqs` tensor), the KV heads and FFN widths per layer
# where they differ, the sliding layers as one flag each, `attention.shared_kv_layers`; norms as stored (no `1 + w`),
# q/k unpermuted; the K = V layers are those without `attn_v`, the layer scalar `layer_output_scale`, the per-layer
# embeddings under gemma3n's names, the router's scale and the per-expert scales as the `scale` of `ffn_gate_inp` and
# `ffn_down_exps`, the experts' gate and up fused as transformers 5 stores them (`ffn_gate_up_exps`).
NORMS = (("pre_ffw_norm_2", "mlp.input_norm"), ("post_ffw_norm_1", "mlp.dense_norm"),
         ("post_ffw_norm_2", "mlp.norm"), ("post_norm", "ple.norm"))
GGUF_TABLE = TensorTable((
    *tensor_table(False, 0.0, True).rules,
    Rule("blk.{}.layer_output_scale.weight", "layers.{}.scalar"),
    Rule("per_layer_token_embd.weight", "ple.embed.weight"), Rule("per_layer_model_proj.weight", "ple.project.weight"),
    Rule("per_layer_proj_norm.weight", "ple.norm.weight"),
    Rule("blk.{}.inp_gate.weight", "layers.{}.ple.gate.weight"),
    Rule("blk.{}.proj.weight", "layers.{}.ple.proj.weight"),
    *(Rule(f"blk.{{}}.{theirs}.weight", f"layers.{{}}.{ours}.weight") for theirs, ours in NORMS),
    Rule("blk.{}.ffn_gate_inp.weight", "layers.{}.mlp.router.weight"),
    Rule("blk.{}.ffn_gate_inp.scale", "layers.{}.mlp.router.scale"),
    Rule("blk.{}.ffn_down_exps.scale", "layers.{}.mlp.router.expert_scale"),
    Rule("blk.{}.ffn_gate_up_exps.weight", "layers.{}.mlp.experts.{}.gate.weight", Unstack(part=0, parts=2)),
    Rule("blk.{}.ffn_gate_up_exps.weight", "layers.{}.mlp.experts.{}.up.weight", Unstack(part=1, parts=2)),
    Rule("blk.{}.ffn_down_exps.weight", "layers.{}.mlp.experts.{}.down.weight", Unstack()),
))
GGUF_KEYS = {**GEMMA_KEYS, "attention.shared_kv_layers": "num_kv_shared_layers",
             "embedding_length_per_layer_input": "hidden_size_per_layer_input", "expert_count": "num_experts",
             "expert_used_count": "top_k_experts", "expert_feed_forward_length": "moe_intermediate_size",
             "attention.key_length": "head_dim_full", "attention.key_length_swa": "head_dim",
             "rope.freq_base_swa": "rope_local_base_freq",
             "attention.value_length_swa": "head_dim", "rope.dimension_count_swa": "rotated_swa"}
STILL = 1e30  # a frequency factor that leaves its pair still (theta / 1e30 at any position of a context: ~0)
FULL, SLIDING = "full_attention", "sliding_attention"


def _full_geometry(config: Mapping[str, Any]) -> tuple[int, int | None]:
    """The full layers' head size and KV heads (None: the sliding layers'), as transformers' config states them."""
    types = config.get("layer_types") or []
    stated = next((v for i, v in (config.get("per_layer_config") or {}).items() if types[int(i)] == FULL), {})
    return (stated.get("head_dim", config.get("global_head_dim") or config["head_dim"]),
            stated.get("num_key_value_heads", config.get("num_global_key_value_heads")))


def _rope_params(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    nested = config.get("rope_parameters") or {}
    return dict(nested.get(FULL) or {}), dict(nested.get(SLIDING) or {})


def _gguf_rope(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The bases, and the full layers' `rope_freqs` (Gemma4Model.generate_extra_tensors): 1 for each rotated
    frequency of the whole head, 1e30 for the others. Other RoPE than proportional (full) and default (sliding),
    or scaled, is refused: llama.cpp's gemma4 runs none."""
    import torch

    full, sliding = _rope_params(config)
    if full.get("rope_type") != "proportional" or sliding.get("rope_type", "default") != "default" \
            or (full.get("factor") or 1.0) != 1.0 or sliding.get("partial_rotary_factor", 1.0) != 1.0:
        raise MappingError(f"llama.cpp's gemma4 runs unscaled proportional RoPE on the full layers and the default "
                           f"RoPE over the whole head on the sliding ones, and this model's rope_parameters are "
                           f"{dict(config.get('rope_parameters') or {})}")
    head, _ = _full_geometry(config)
    rotated = int(head * full.get("partial_rotary_factor", 1.0) / 2)
    factors = torch.tensor([1.0] * rotated + [STILL] * (head // 2 - rotated), dtype=torch.float32)
    return ({"rope.freq_base": float(full.get("rope_theta", 1e6)), "rope.freq_base_swa":
             float(sliding.get("rope_theta", 1e4))}, {"rope_freqs.weight": factors})


def _rope_from_gguf(factors: Any, config: Mapping[str, Any]) -> dict[str, Any]:  # noqa: ANN401 - a tensor
    """rope_parameters from the bases and the full layers' `rope_freqs` (its 1s: the rotated frequencies)."""
    import torch

    values = factors.float().tolist()
    rotated = sum(v == 1.0 for v in values)
    if values != torch.tensor([1.0] * rotated + [STILL] * (len(values) - rotated), dtype=torch.float32).tolist():
        raise MappingError("its rope_freqs tensor is not Gemma 4's proportional RoPE (1 for each rotated frequency, "
                           "then 1e30 for each still one); lmconvert cannot express these RoPE factors")
    return {"rope_parameters": {
        FULL: {"rope_type": "proportional", "partial_rotary_factor": 2 * rotated / (2 * len(values)),
               "rope_theta": config["rope_theta"]},
        SLIDING: {"rope_type": "default", "rope_theta": config.get("rope_local_base_freq", 1e4)}}}


def _to_gguf(config: Mapping[str, Any]) -> dict[str, Any]:
    """What llama.cpp's Gemma4Model writes beyond the keys: each kind's head size and rotated width, the KV heads
    per layer where the full layers have their own, the FFN widths per layer with the double-wide MLP; and a soft-cap
    of 0 where the model has none (Gemma4Model writes none, which llama.cpp's runtime reads as 30). Refused by
    name: what llama.cpp's gemma4 runs otherwise (its per-layer embeddings as wide as the vocabulary, the KV-shared
    layers reading the K/V of the last layer before them (full) and of the one before that (sliding))."""
    types, n = list(config["layer_types"]), config["num_hidden_layers"]
    head, kv = _full_geometry(config)
    shared = config.get("num_kv_shared_layers") or 0
    own = types[:n - shared]
    if shared and (len(own) < 2 or own[-1] != FULL or own[-2] != SLIDING):
        raise MappingError(f"llama.cpp's gemma4 gives the KV-shared layers the K/V of layer {n - shared - 1} (the full "
                           f"ones) and {n - shared - 2} (the sliding ones), and this model's last layers with K/V of "
                           f"their own are {own[-2:]}")
    ple = config.get("hidden_size_per_layer_input") or 0
    if ple and config.get("vocab_size_per_layer_input", config["vocab_size"]) != config["vocab_size"]:
        raise MappingError(f"llama.cpp's gemma4 reads a per-layer embedding for every token id (vocab_size="
                           f"{config['vocab_size']}), and this model's table has vocab_size_per_layer_input="
                           f"{config['vocab_size_per_layer_input']} rows")
    # no soft-cap stated: llama.cpp's loader keeps its default of 30 (llama_hparams.f_final_logit_softcapping), which
    # its converter leaves for a model without one; 0 is none
    cap = config.get("final_logit_softcapping") or 0.0
    out: dict[str, Any] = {"final_logit_softcapping": float(cap), "attention.key_length": head,
                           "attention.value_length": head,
                           "rope.dimension_count": head, "rope.dimension_count_swa": config["head_dim"],
                           "embedding_length_per_layer_input": ple, "attention.shared_kv_layers": shared}
    if config.get("use_double_wide_mlp"):
        width = config["intermediate_size"]
        out["feed_forward_length"] = [width * (2 if i >= n - shared else 1) for i in range(n)]
    if kv is not None:
        out["attention.head_count_kv"] = [kv if t == FULL else config["num_key_value_heads"] for t in types]
    return out


def _from_gguf(config: Mapping[str, Any]) -> dict[str, Any]:
    """The HF keys of the per-layer facts: each kind's geometry as per_layer_config, K = V where a full layer with
    K/V of its own has no `attn_v`, the double-wide MLP from the widths, the MoE block from its expert count."""
    types, n = config["layer_types"], config["num_hidden_layers"]
    shared = config.get("num_kv_shared_layers") or 0
    kv, widths = config["num_key_value_heads"], config["intermediate_size"]
    kv, widths = (v if isinstance(v, list) else [v] * n for v in (kv, widths))
    full = [i for i, t in enumerate(types) if t == FULL]
    sliding_kv = next((kv[i] for i, t in enumerate(types) if t == SLIDING), kv[0])
    geometry = {str(i): {"head_dim": config["head_dim_full"], "num_key_value_heads": kv[i]} for i in full}
    own_full = [i for i in full if i < n - shared]
    if config.get("rotated_swa", config["head_dim"]) != config["head_dim"]:
        raise MappingError(f"gemma4.rope.dimension_count_swa={config['rotated_swa']} rotates part of the sliding "
                           f"layers' heads ({config['head_dim']}); Gemma 4 rotates them whole")
    experts = config.get("num_experts")
    ple = config["hidden_size_per_layer_input"]
    own = ({"enable_moe_block": bool(experts), "hidden_size_per_layer_input": ple,
            **({"vocab_size_per_layer_input": config["vocab_size"]} if ple else {})}
           if config["model_type"] == "gemma4_text" else {})  # a unified model has neither
    return {"per_layer_config": geometry, "final_logit_softcapping": config.get("final_logit_softcapping") or None,
            "head_dim": config["head_dim"], "num_key_value_heads": sliding_kv,
            "intermediate_size": widths[0], "use_double_wide_mlp": widths != [widths[0]] * n,
            "attention_k_eq_v": bool(own_full) and not any(i in config["v_layers"] for i in own_full), **own}


GGUF_GEMMA4 = written("gemma4_text", arch="gemma4", keys=GGUF_KEYS, table=GGUF_TABLE, per_kind_heads=True,
                      rope_out=_gguf_rope, rope_in=_rope_from_gguf, tokenizer="gemma4", swa_pattern=6,
                      # no soft-cap stated: llama.cpp's runtime caps at 30 (its converter states none for a model
                      # without one; lmconvert states 0, none)
                      defaults={"hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0,
                                "hidden_size_per_layer_input": 0},
                      layer_tensors={"v_layers": "blk.{}.attn_v.weight"}, derived=_from_gguf, exported=_to_gguf,
                      transient=("head_dim_full", "rope_local_base_freq", "rotated_swa"),
                      stated=frozenset({"attention.sliding_window_pattern", "rope.dimension_count"}))
# Gemma4UnifiedForCausalLM: the same decoder without per-layer embeddings or experts, told apart by its name
GGUF_GEMMA4_UNIFIED = replace(GGUF_GEMMA4, model_type="gemma4_unified_text", named="unified")

FAMILY = Family("gemma4_text", ("gemma4_text", "gemma4"), "Gemma4ForCausalLM", TENSORS, CONFIG,
                notes={"gemma4": "Gemma4ForConditionalGeneration (model_type gemma4): only the text decoder is read; "
                                 "the vision and audio towers and embedders are left out"},
                gguf=(GGUF_GEMMA4, GGUF_GEMMA4_UNIFIED),
                reference_layouts=unified.REFERENCE_LAYOUTS)
