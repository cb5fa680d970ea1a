"""MiMo-V2-Flash (MiMoV2FlashForCausalLM: Xiaomi's MiMo-V2-Flash).

Same as llama, except: the values are `v_head_dim` wide (default 128) where queries and keys are
`head_dim` (default 192), so `o_proj` reads heads x v_head_dim, and v is multiplied by
`attention_value_scale` (a Python float, default 0.707; null: 1) after its projection; `layer_types`
(absent: full on layer 0 and every sixth layer, sliding elsewhere) picks the layers that attend within
`sliding_window` (default 129; the Hub's `sliding_window_size` is one less, and wins), and the sliding
layers have twice `num_key_value_heads` KV heads and a learned sink per head (`self_attn.sinks`, the
Hub's `attention_sink_bias`, not kept in fp32) joining each softmax as one more column; every layer
subtracts its rows' max in the scores' dtype and takes the softmax in that dtype (eager only, as
transformers); `rope_parameters` is keyed by layer type (absent: full theta 5e6, sliding 1e4), each
rotating int(head_dim x `partial_rotary_factor`) dims (absent from a default rope type: 0.334);
`attention_bias` switches the q, k and v biases (o never has one); `mlp_layer_types` (absent: the first
layer dense) picks the mixtures: DeepSeek-V3's router (`mlp.gate`, fp32 logits from its fp32 weight,
sigmoid scores plus the fp32 `e_score_correction_bias` for choosing within the best `topk_group` of
`n_group` groups, renormalised (+1e-20) when `norm_topk_prob`, times `routed_scaling_factor` (null: 1),
in fp32), `n_routed_experts` experts `moe_intermediate_size` wide, no shared experts; eps 1e-5; untied;
no `mlp_bias`; the multi-token-prediction head (`model.mtp.*`) left out, as transformers leaves it.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed, plain
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import LAYER_TYPES_KEY, layer_kinds_from_hf, layer_types_to_hf, window_fields
from ..tables.hf_moe import dense_layers, expert_rules, grouped_router_to_hf, mlp_layer_types_to_hf
from ..tables.hf_rope import TYPED_KEYS, ropes_by_layer_type, ropes_by_layer_type_to_hf
from ..tables.table import Rule, TensorTable
from . import llama
from .gpt_oss import SINK_RULES
from .seed_oss import qkv_bias

ROPE_DEFAULTS = {"full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
                 "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334}}
DEFAULT_FRACTION = 0.334  # MiMoV2FlashRotaryEmbedding's, where a default rope type states none
WINDOW_KEYS = (Key("sliding_window", int, 129), Key("sliding_window_size", int, None, nullable=True, legacy=True),
               Key("num_key_value_heads", int, 4), LAYER_TYPES_KEY, *TYPED_KEYS)


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """The layer kinds, the window, each kind's RoPE, and the sliding layers' own KV heads and sinks."""
    n = fields["n_layers"]
    kinds = layer_kinds_from_hf(hf, n, lambda i: i != 0 and bool((i + 1) % 6))
    size = hf.get("sliding_window_size")  # MiMoV2FlashConfig: the reference's window size, plus the query
    window = hf.get("sliding_window") if size is None else size + 1
    kv = hf.get("num_key_value_heads")
    heads = {"n_kv_heads": 2 * kv, "global_kv_heads": kv} if "local" in kinds else {"n_kv_heads": kv}
    return {**window_fields(kinds, window), **heads, **ropes_by_layer_type(hf, kinds, ROPE_DEFAULTS, DEFAULT_FRACTION)}


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The layers by name, the window, each type's RoPE, the full layers' KV heads; sliding layers with other
    than twice as many read back otherwise, so export refuses them by name."""
    local = "local" in cfg.layer_kinds
    kv = (cfg.global_kv_heads or cfg.n_kv_heads // 2) if local else cfg.n_kv_heads
    return {"layer_types": layer_types_to_hf(cfg.layer_kinds), "num_key_value_heads": max(kv, 1),
            "sliding_window": DEFAULT if cfg.sliding_window is None else cfg.sliding_window,
            **ropes_by_layer_type_to_hf(cfg)}


VALUE_SCALE = Key("attention_value_scale", float, 0.707, nullable=True)


def value_scale_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    scale = hf.get("attention_value_scale")
    return {"attn_value_scale": 1.0 if scale is None else scale}


KEYS = (Key("n_routed_experts", int, 256), Key("num_experts_per_tok", int, 8), Key("moe_intermediate_size", int, 2048),
        Key("norm_topk_prob", bool, True), Key("n_group", int, 1), Key("topk_group", int, 1),
        Key("routed_scaling_factor", float, 1.0, nullable=True), Key("mlp_layer_types", list, None, nullable=True))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    dense = dense_layers(hf, n, 1)
    if len(dense) == n:
        return {}
    scale = hf.get("routed_scaling_factor")
    try:
        return {"moe": MoeConfig(n_experts=hf.get("n_routed_experts"), top_k=hf.get("num_experts_per_tok"),
                                 d_expert=hf.get("moe_intermediate_size"), router="sigmoid",
                                 norm_topk=hf.get("norm_topk_prob"), weights_fp32=True, dense_layers=dense,
                                 n_group=hf.get("n_group"), topk_group=hf.get("topk_group"), selection_bias=True,
                                 scale=1.0 if scale is None else scale, router_fp32=True)}
    except ValueError as exc:  # ConfigError: groups that do not divide the experts, a top-k above them
        raise MappingError(f"config.json: n_routed_experts, num_experts_per_tok, n_group, topk_group: {exc}") from None


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The dense layers by name; any other router reads back otherwise and is refused by name."""
    return mlp_layer_types_to_hf(cfg, KEYS, grouped_router_to_hf("n_routed_experts"))


CONFIG = llama.CONFIG.but(
    drop=("mlp_bias", "rope", "num_key_value_heads"),
    add=(plain("head_dim", "head_dim", int, 192),
         Entry("v_head_dim", (Key("v_head_dim", int, 128),), lambda hf, _: {"v_head_dim": hf.get("v_head_dim")},
               lambda cfg: {"v_head_dim": cfg.value_dim}),
         llama.norm(1e-5), qkv_bias(False),
         fixed("MiMo's attention", attn_sinks=True, sink_layers="local"),
         # no scale is written as null, as transformers reads it (absent would mean 0.707)
         Entry("value scale", (VALUE_SCALE,), value_scale_from_hf, lambda cfg: {
             "attention_value_scale": None if cfg.attn_value_scale == 1.0 else cfg.attn_value_scale}),
         Entry("layer kinds", WINDOW_KEYS, layers_from_hf, layers_to_hf),
         Entry("experts", KEYS, experts_from_hf, experts_to_hf)),
    defaults={"vocab_size": 152576, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 48,
              "num_attention_heads": 64, "max_position_embeddings": 131072},
    nullable={"attention_dropout": False},
)

TENSORS = TensorTable(
    llama.EDGE_RULES + (Rule("model.layers.{}.self_attn.attention_sink_bias", "layers.{}.attn.sinks"), *SINK_RULES)
    + llama.ATTENTION_RULES + llama.MLP_RULES + llama.PRE_NORM_RULES
    + (Rule("model.layers.{}.mlp.gate.e_score_correction_bias", "layers.{}.mlp.router.selection_bias"),)
    + expert_rules("mlp", ("gate_proj", "up_proj", "down_proj"), "gate")
    + (Rule("model.mtp.*", None),))  # the multi-token-prediction head, which transformers does not load

FAMILY = Family("mimo_v2_flash", ("mimo_v2_flash",), "MiMoV2FlashForCausalLM", TENSORS, CONFIG,
                no_gguf="lmconvert does not write llama.cpp's mimo2 architecture yet: its value width, value scale, "
                        "sliding-only sinks and per-type partial RoPE are not mapped to llama.cpp's metadata")
