"""Beam (BeamForCausalLM: Reflection AI's Beam-1.0).

Same as afmoe, except: no embedding scale; its own size defaults (151936 tokens, 52 layers, 48 heads of
128, 8 KV heads, window 512, 8192 positions, RMSNorm eps 1e-6); `layer_types` (absent: every sixth layer
and the last full) with `rope_parameters` keyed by layer type, null for a type that has no positions (the
default: the full layers), whose queries, after their q_norm, are multiplied in fp32 by exp(0.1 * log1p((p +
1) / 2048)) of their position id and cast back (`compute_attention_scaling`, constants in transformers'
code); cos/sin stay fp32 and q, k rotate in fp32 (`BeamRotaryEmbedding`); the output gate's projection has a
bias per head (`gate_bias`, [heads]) added over each head's head_dim before the sigmoid; each residual add is
depth-scaled (`depth_scaled_residual_add`: the k-th add, k = 2(layer + 1) after attention and one more after
the FFN, is out / sqrt(k) + h * sqrt((k - 1) / k)); every SwiGLU (dense and routed experts) takes act(gate)
* up from fp32 copies and casts back; `mlp_layer_types` (absent: the first three dense) picks the mixtures,
whose router is DeepSeek-V3's (fp32 logits from its fp32 weight, sigmoid scores plus the fp32
`e_score_correction_bias` for choosing within the best `topk_group` of `n_group` groups, renormalised when
`norm_topk_prob`, guarded by 1e-20) but with a sorted top-k, its weights in fp32 and `routed_scaling_factor`
multiplying the experts' weighted sum (in the activation dtype), not the weights; no shared experts; the
logits soft-capped by `final_logit_softcapping` (default 30) on an fp32 copy, which stays fp32.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables import hf_rope
from ..tables.config_table import DEFAULT, Entry, fixed, plain
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import LAYER_TYPES_KEY, layer_kinds_from_hf, layer_types_to_hf, window_fields
from ..tables.hf_moe import FUSED_RULES, dense_layers, grouped_router_to_hf, mlp_layer_types_to_hf
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import Rule, TensorTable
from . import afmoe, llama

LAYER_TYPES = ("full_attention", "sliding_attention")
KIND_OF = {"full_attention": "global", "sliding_attention": "local"}
TEMPERATURE, TEMPERATURE_FLOOR = 0.1, 2048  # compute_attention_scaling's constants
WINDOW_KEY = Key("sliding_window", int, 512, nullable=True)
DEFAULT_THETA = 10000.0  # PreTrainedConfig.default_theta


def rope_by_type(hf: HfConfig) -> dict[str, dict[str, Any] | None]:
    """BeamConfig's rope_parameters: absent or null, RoPE (default, theta 10000) on the sliding layers and
    none on the full ones; else one dict, or null for no positions, per layer type."""
    params = hf.get("rope_parameters")
    if params is None:
        return {"sliding_attention": {"rope_type": "default"}, "full_attention": None}
    if any(k not in params for k in LAYER_TYPES) or any(not isinstance(params[k], dict | None) for k in LAYER_TYPES):
        raise MappingError(f"config.json: rope_parameters={show(params)} should hold full_attention and "
                           "sliding_attention, each a JSON object or null (no positions)")
    return params


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    kinds = layer_kinds_from_hf(hf, n, lambda i: bool((i + 1) % 6) and i != n - 1)
    params = rope_by_type(hf)
    ropes = {k: None if p is None else hf_rope.rope_from_hf(hf, p, f"rope_parameters.{k}.", theta=DEFAULT_THETA,
                                                               fp32_tables=True)
             for k, p in params.items()}
    positions = tuple("none" if ropes[t] is None else "rope" for t in layer_types_to_hf(kinds))
    full, sliding = ropes["full_attention"], ropes["sliding_attention"]
    rope = hf_rope.rope_by_kind(full or sliding, sliding or full, kinds) if full or sliding else {}
    temperature = {"attn_temperature": TEMPERATURE, "attn_temperature_floor": TEMPERATURE_FLOOR,
                   "attn_temperature_form": "beam"} if "none" in positions else {}
    return {**window_fields(kinds, hf.get("sliding_window")), "layer_positions": positions, **rope, **temperature}


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The layers by name, each type's RoPE or null; positions that differ within a type, another rope on
    the NoPE layers or another temperature read back otherwise, so export refuses them by name."""
    types = layer_types_to_hf(cfg.layer_kinds)
    nope = {t for t, p in zip(types, cfg.layer_positions, strict=True) if p == "none"}
    full = cfg.rope if "global" in cfg.layer_kinds else None
    sliding = (cfg.rope_local or cfg.rope) if "local" in cfg.layer_kinds else None
    params = {"full_attention": None if "full_attention" in nope else hf_rope.rope_to_hf(full or cfg.rope),
              "sliding_attention": None if "sliding_attention" in nope else hf_rope.rope_to_hf(sliding or cfg.rope)}
    return {"layer_types": types, "rope_parameters": params,
            "sliding_window": DEFAULT if cfg.sliding_window is None else cfg.sliding_window}


KEYS = (Key("num_experts", int, 256), Key("num_experts_per_tok", int, 8), Key("moe_intermediate_size", int, 2560),
        Key("norm_topk_prob", bool, True), Key("n_group", int, 8, nullable=True),
        Key("topk_group", int, 4, nullable=True), Key("routed_scaling_factor", float, 2.5),
        Key("mlp_layer_types", list, None, nullable=True))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    dense = dense_layers(hf, n, 3)
    if len(dense) == n:
        return {}
    for name in ("n_group", "topk_group"):
        if hf.get(name) is None:  # BeamTopKRouter views the experts by n_group, takes the top topk_group
            raise MappingError(f"config.json: {name}=null: transformers' BeamTopKRouter cannot run with it; set it, "
                               f"or remove the key for the default ({hf.keys[name].default})")
    return {"moe": MoeConfig(n_experts=hf.get("num_experts"), top_k=hf.get("num_experts_per_tok"),
                             d_expert=hf.get("moe_intermediate_size"), router="sigmoid_grouped_sorted",
                             norm_topk=hf.get("norm_topk_prob"), weights_fp32=True, dense_layers=dense,
                             n_group=hf.get("n_group"), topk_group=hf.get("topk_group"), selection_bias=True,
                             scale=hf.get("routed_scaling_factor"), scale_after_sum=True, router_fp32=True)}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The dense layers by name; any other router reads back otherwise and is refused by name."""
    return mlp_layer_types_to_hf(cfg, KEYS, grouped_router_to_hf("num_experts"))


CONFIG = llama.CONFIG.but(
    drop=("mlp_bias", "rope"),
    add=(plain("head_dim", "head_dim", int, 128), plain("num_key_value_heads", "n_kv_heads", int, 8),
         plain("attention_dropout", "attn_dropout", float, 0.0, bound="probability"),
         llama.norm(1e-6, dtype_order="scale_then_cast"),
         fixed("Beam's block", norm_placement="sandwich", qk_norm="head", attn_output_gate="projection_head_bias",
               residual_form="depth_scaled", glu_fp32=True, softcap_fp32=True),
         Entry("layer kinds", (WINDOW_KEY, LAYER_TYPES_KEY, *hf_rope.KEYS), layers_from_hf, layers_to_hf),
         Entry("experts", KEYS, experts_from_hf, experts_to_hf),
         plain("final_logit_softcapping", "final_softcap", float, 30.0, nullable=True)),
    defaults={"vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 20480, "num_hidden_layers": 52,
              "num_attention_heads": 48, "max_position_embeddings": 8192},
)

TENSORS = TensorTable(
    llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + afmoe.SANDWICH_RULES[:2]
    + (Rule("model.layers.{}.pre_feedforward_layernorm.weight", "layers.{}.mlp_norm.weight"),
       Rule("model.layers.{}.post_feedforward_layernorm.weight", "layers.{}.mlp_post_norm.weight"))
    + llama.QK_NORM_RULES
    + (Rule("model.layers.{}.self_attn.gate_proj.weight", "layers.{}.attn.out_gate.weight"),
       Rule("model.layers.{}.self_attn.gate_bias", "layers.{}.attn.out_gate_bias"),
       Rule("model.layers.{}.mlp.gate.weight", "layers.{}.mlp.router.weight"),
       Rule("model.layers.{}.mlp.gate.e_score_correction_bias", "layers.{}.mlp.router.selection_bias"),
       *(Rule(f"model.layers.{{}}.mlp.experts.{{}}.{n}_proj.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight")
         for n in ("gate", "up", "down")))
    + FUSED_RULES)

FAMILY = Family("beam", ("beam",), "BeamForCausalLM", TENSORS, CONFIG, reference_layouts=QK_NORM_PER_HEAD)
