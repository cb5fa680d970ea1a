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
from ..tables.gguf import MOE_RULES, tensor_table, written
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


# -- llama.cpp (GGUF): its mimo2 architecture (MimoV2Model in its converter, which reads the Hub's config.json
# spellings: hybrid_layer_pattern, swa_num_key_value_heads, rope_theta / swa_rope_theta / partial_rotary_factor,
# layernorm_epsilon). The layer kinds as one int flag per layer (1: sliding), the KV heads as one count per layer,
# the value width as `attention.value_length`, the value scale as `attention.value_scale` (absent: none), the
# sliding layers' RoPE base as `rope.freq_base_swa`, the sinks (sliding layers only) as `attn_sinks`, the expert
# layers told by their router (`ffn_gate_inp`), the selection bias as `exp_probs_b`. llama.cpp scales the
# attention's output after o_proj, which has no bias: the values' scale, by linearity. What its mimo2 graph
# computes otherwise than transformers is refused by name (`_to_gguf`).
GGUF_KEYS = {"attention.value_length": "v_head_dim", "attention.value_scale": "attention_value_scale",
             "attention.sliding_window": "sliding_window", "attention.sliding_window_pattern": "layer_types",
             "rope.freq_base_swa": "swa_rope_theta", "expert_count": "n_routed_experts",
             "expert_used_count": "num_experts_per_tok", "expert_feed_forward_length": "moe_intermediate_size",
             "expert_group_count": "n_group", "expert_group_used_count": "topk_group"}
# the partial rotary factors as config.json states them, which the rotated width alone does not give back
GGUF_OWN = {f"rope.{kind}.partial_rotary_factor": f"rope_parameters.{kind}.partial_rotary_factor"
            for kind in ("full_attention", "sliding_attention")}
SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, which MimoV2Model writes from the Hub's scoring_func


def _gguf_table() -> TensorTable:
    return TensorTable((*tensor_table(False, 0.0, True).rules, *MOE_RULES[:4],
                        Rule("blk.{}.exp_probs_b.bias", "layers.{}.mlp.router.selection_bias"),
                        Rule("blk.{}.attn_sinks.weight", "layers.{}.attn.sinks")))


def _rotated(config: dict[str, Any], kind: str) -> int:
    """The rotated width of a layer type's heads, as MiMoV2FlashRotaryEmbedding computes it."""
    params = config["rope_parameters"][kind]
    fraction = params.get("partial_rotary_factor")
    if fraction is None:
        fraction = DEFAULT_FRACTION if params.get("rope_type", "default") == "default" else 1.0
    return int(config["head_dim"] * fraction)


def _to_gguf(config: dict[str, Any]) -> dict[str, Any]:
    kinds = config["layer_types"]
    if config.get("attention_bias"):
        raise MappingError("llama.cpp's mimo2 graph never adds the q, k and v biases its loader reads "
                           "(src/models/mimo2.cpp: `Qcur = build_lora_mm(model.layers[il].wq, cur)`), and this "
                           "model has them (attention_bias true)")
    if not config.get("norm_topk_prob", True):
        raise MappingError("llama.cpp's mimo2 graph always renormalises the chosen experts' weights "
                           "(src/models/mimo2.cpp: build_moe_ffn(..., LLM_FFN_SILU, true, ...)), and this model does "
                           "not (norm_topk_prob false)")
    if config.get("routed_scaling_factor") not in (None, 1.0):
        raise MappingError("llama.cpp's mimo2 reads no expert_weights_scale (src/models/mimo2.cpp's "
                           "load_arch_hparams), so its build_moe_ffn leaves the experts' weights unscaled, where this "
                           f"model scales them by routed_scaling_factor={config['routed_scaling_factor']}")
    used = sorted(set(kinds))
    scaled = [k for k in used if config["rope_parameters"][k].get("rope_type", "default") != "default"]
    if scaled:
        raise MappingError("llama.cpp's mimo2 rotates the sliding layers unscaled (hparams.rope_freq_scale_train_swa "
                           "is 1, read from no key) and scales every layer alike otherwise; lmconvert writes MiMo "
                           f"with its default RoPE only, and this model's {scaled[0]} layers scale theirs")
    widths = {_rotated(config, kind) for kind in used}
    if len(widths) > 1:
        raise MappingError(f"llama.cpp's mimo2 graph rotates every layer's heads by layer 0's width (n_rot, "
                           f"src/llama-graph.cpp: `n_rot(hparams.n_rot())`), where this model rotates "
                           f"{sorted(widths)} dims on its full and sliding layers")
    kv = config["num_key_value_heads"]
    return {"attention.value_length": config["v_head_dim"], "rope.dimension_count": widths.pop(),
            "attention.head_count_kv": [2 * kv if kind == "sliding_attention" else kv for kind in kinds],
            "attention.sliding_window_pattern": [int(kind == "sliding_attention") for kind in kinds]}


def _from_gguf(config: dict[str, Any]) -> dict[str, Any]:
    """The layer kinds from their flags, the full layers' KV heads (the sliding ones must have twice as many),
    each kind's RoPE, the mixtures from their routers."""
    n = config["num_hidden_layers"]
    kinds = ["sliding_attention" if flag else "full_attention" for flag in config["layer_types"]]
    counts = config["num_key_value_heads"]
    counts = counts if isinstance(counts, list) else [counts] * n
    full = {c for c, kind in zip(counts, kinds, strict=True) if kind == "full_attention"}
    sliding = {c // 2 for c, kind in zip(counts, kinds, strict=True) if kind == "sliding_attention"}
    if len(full | sliding) != 1 or any(c % 2 for c, kind in zip(counts, kinds, strict=True)
                                       if kind == "sliding_attention"):
        raise MappingError(f"mimo2.attention.head_count_kv={counts}: transformers' MiMo-V2-Flash has twice the full "
                           "layers' KV heads on every sliding layer, and one count on the full ones")
    stated = config.get("rope_parameters") or {}
    thetas = {"full_attention": config["rope_theta"], "sliding_attention": config["swa_rope_theta"]}
    rope = {kind: {"rope_type": "default", "rope_theta": thetas[kind], "partial_rotary_factor":
                   stated.get(kind, {}).get("partial_rotary_factor", config["partial_rotary_factor"])}
            for kind in sorted(set(kinds))}
    return {"layer_types": kinds, "num_key_value_heads": (full | sliding).pop(), "rope_parameters": rope,
            "mlp_layer_types": ["sparse" if i in config["expert_layers"] else "dense" for i in range(n)]}


GGUF_MIMO2 = written("mimo_v2_flash", arch="mimo2", keys=GGUF_KEYS, own=GGUF_OWN, table=_gguf_table(),
                     defaults={"hidden_act": "silu", "attention_value_scale": None, "norm_topk_prob": True,
                               "routed_scaling_factor": 1.0, "swa_rope_theta": 10_000.0, "attention_bias": False},
                     constants={"expert_gating_func": SIGMOID}, partial_rotary=True,
                     layer_tensors={"expert_layers": "blk.{}.ffn_gate_inp.weight"}, derived=_from_gguf,
                     exported=_to_gguf)

FAMILY = Family("mimo_v2_flash", ("mimo_v2_flash",), "MiMoV2FlashForCausalLM", TENSORS, CONFIG, gguf=(GGUF_MIMO2,))
