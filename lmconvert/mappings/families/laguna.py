"""Laguna (LagunaForCausalLM: Poolside's Laguna).

Same as llama, except: each layer has its own number of query heads (`num_attention_heads_per_layer`;
absent or null: `num_attention_heads` everywhere) over `num_key_value_heads` KV heads of `head_dim`
(default 128); q_norm / k_norm on each head of the (B, T, H, D) view before RoPE; the attention output is
gated before `o_proj` by softplus(`g_proj`(x)) taken on an fp32 copy and cast back, one gate per head
(`gating` true or "per-head", the default) or per element (any other value: false, "per-element");
`layer_types` (absent: every layer full) picks the layers that attend within `sliding_window` (default
512); `rope_parameters` is keyed by layer type (absent: full layers theta 5e5 rotating half of each head,
sliding layers theta 1e4 rotating all of it), each type's `partial_rotary_factor` (absent: 1);
`attention_bias` switches the q, k, v and o biases (the gate has none); `mlp_layer_types` (absent: the
first layer dense) picks the mixtures: the router's logits (`mlp.gate`) in the activation dtype then fp32,
soft-capped as tanh(l / c) * c where `moe_router_logit_softcapping` c > 0, their sigmoid chosen on with
the selection bias (`e_score_correction_bias`, a parameter in the model's dtype) by a sorted top-k of
`num_experts_per_tok` among `num_experts`, renormalised by the plain sum, cast to the activation dtype;
the experts' weighted sum times `moe_routed_scaling_factor`, then one plain shared expert
(`shared_expert_intermediate_size` wide) added; `moe_apply_router_weight_on_input` true refused (as
transformers refuses it); eps 1e-6; untied; no `mlp_bias`; `output_router_logits` adds
`router_aux_loss_coef` times the load-balancing loss in training.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed, plain
from ..tables.gguf import MOE_RULES, tensor_table, written
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import LAYER_TYPES_KEY, layer_kinds_from_hf, layer_types_to_hf, window_fields
from ..tables.hf_moe import dense_layers, expert_rules, mlp_layer_types_to_hf
from ..tables.hf_rope import TYPED_KEYS, ropes_by_layer_type, ropes_by_layer_type_to_hf
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import Rule, TensorTable
from . import llama

ROPE_DEFAULTS = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}
LAYER_KEYS = (Key("sliding_window", int, 512), LAYER_TYPES_KEY, *TYPED_KEYS)


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: False)
    return {**window_fields(kinds, hf.get("sliding_window")), **ropes_by_layer_type(hf, kinds, ROPE_DEFAULTS, 1.0)}


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"layer_types": layer_types_to_hf(cfg.layer_kinds),
            "sliding_window": DEFAULT if cfg.sliding_window is None else cfg.sliding_window,
            **ropes_by_layer_type_to_hf(cfg)}


HEADS_KEY = Key("num_attention_heads_per_layer", list, None, nullable=True)


def heads_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    heads = hf.get("num_attention_heads_per_layer")
    if heads is None:
        return {}
    if len(heads) != fields["n_layers"] or any(isinstance(h, bool) or not isinstance(h, int) or h <= 0 for h in heads):
        raise MappingError(f"config.json: num_attention_heads_per_layer={show(heads)} should give a positive head "
                           f"count for each of the num_hidden_layers={fields['n_layers']} layers")
    return {"layer_heads": tuple(heads)}


def heads_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"num_attention_heads_per_layer": list(cfg.layer_heads or (cfg.n_heads,) * cfg.n_layers)}


GATING_KEY = Key("gating", bool | str, True)


def gate_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """LagunaAttention: a gate per head where `gating` is true or "per-head", per element otherwise."""
    gating = hf.get("gating")
    per_head = gating is True or gating == "per-head"
    return {"attn_output_gate": "projection_head" if per_head else "projection",
            "attn_gate_activation": "softplus_fp32"}


def gate_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # true: per head; false: per element. Another gate, or another activation, reads back otherwise: refused by name
    return {"gating": cfg.attn_output_gate == "projection_head"}


KEYS = (Key("num_experts", int, 256), Key("num_experts_per_tok", int, 8), Key("moe_intermediate_size", int, 512),
        Key("shared_expert_intermediate_size", int, 512), Key("moe_routed_scaling_factor", float, 1.0),
        Key("moe_router_logit_softcapping", float, 0.0, bound="non_negative"),
        Key("moe_apply_router_weight_on_input", bool, False), Key("output_router_logits", bool, False),
        Key("router_aux_loss_coef", float, 0.001, bound="non_negative"),
        Key("mlp_layer_types", list, None, nullable=True))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    if hf.get("moe_apply_router_weight_on_input"):
        raise MappingError("config.json: moe_apply_router_weight_on_input=true: transformers' Laguna refuses it "
                           "(NotImplementedError), and so does lmconvert; set it to false")
    n = fields["n_layers"]
    dense = dense_layers(hf, n, 1)
    if len(dense) == n:
        return {}
    cap = hf.get("moe_router_logit_softcapping")
    return {"moe": MoeConfig(n_experts=hf.get("num_experts"), top_k=hf.get("num_experts_per_tok"),
                             d_expert=hf.get("moe_intermediate_size"), router="sigmoid_fp32_sorted", norm_topk=True,
                             norm_eps=0.0, weights_fp32=False, shared="plain",
                             d_shared=hf.get("shared_expert_intermediate_size"), dense_layers=dense,
                             selection_bias=True, scale=hf.get("moe_routed_scaling_factor"), scale_after_sum=True,
                             router_softcap=cap or None,
                             aux_loss=hf.get("router_aux_loss_coef") if hf.get("output_router_logits") else 0.0)}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return mlp_layer_types_to_hf(cfg, KEYS, lambda moe: {
        "num_experts": moe.n_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.d_expert,
        "shared_expert_intermediate_size": DEFAULT if moe.d_shared is None else moe.d_shared,
        "moe_routed_scaling_factor": moe.scale, "moe_router_logit_softcapping": moe.router_softcap or 0.0,
        "moe_apply_router_weight_on_input": False, "output_router_logits": bool(moe.aux_loss),
        "router_aux_loss_coef": moe.aux_loss or DEFAULT})


CONFIG = llama.CONFIG.but(
    drop=("mlp_bias", "rope"),
    add=(plain("head_dim", "head_dim", int, 128), plain("num_key_value_heads", "n_kv_heads", int, 8),
         llama.norm(1e-6), fixed("Laguna's attention", qk_norm="head"),
         Entry("heads per layer", (HEADS_KEY,), heads_from_hf, heads_to_hf),
         Entry("gate", (GATING_KEY,), gate_from_hf, gate_to_hf),
         Entry("layer kinds", LAYER_KEYS, layers_from_hf, layers_to_hf),
         Entry("experts", KEYS, experts_from_hf, experts_to_hf)),
    defaults={"vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40,
              "num_attention_heads": 48, "max_position_embeddings": 131072},
    nullable={"attention_dropout": False},
)

SHARED = tuple(Rule(f"model.layers.{{}}.mlp.{stored}.{n}_proj.weight", f"layers.{{}}.mlp.shared.{n}.weight")
               for stored in ("shared_expert", "shared_experts") for n in ("gate", "up", "down"))
TENSORS = TensorTable(
    llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + llama.PRE_NORM_RULES + llama.QK_NORM_RULES
    + (Rule("model.layers.{}.self_attn.g_proj.weight", "layers.{}.attn.out_gate.weight"),
       Rule("model.layers.{}.mlp.experts.e_score_correction_bias", "layers.{}.mlp.router.selection_bias"),
       Rule("model.layers.{}.mlp.gate.e_score_correction_bias", "layers.{}.mlp.router.selection_bias"))
    + expert_rules("mlp", ("gate_proj", "up_proj", "down_proj"), "gate") + SHARED)


def reference_layouts(arch: ArchConfig) -> dict[str, str]:
    """q_proj(x).view(B, T, -1, D), then q_norm, then the transpose; the per-head gate's g_proj is H wide."""
    gate = {"attn.out_gate": "B T H"} if arch.attn_output_gate == "projection_head" else {}
    return {**QK_NORM_PER_HEAD, **gate}



# -- llama.cpp (GGUF): its laguna architecture (LagunaModel in its converter; gguf 0.19.0 has no MODEL_ARCH for it, and
# none is needed: the file names it by its string, its tensors by the generic names). The query heads as one count per
# layer (`attention.head_count`), the gate as `attn_gate` (one row per head, or per element: llama.cpp tells them by
# its width), the selection bias as `exp_probs_b`, the leading dense layers as `leading_dense_block_count`, the
# sliding layers' RoPE base and rotated width as `rope.freq_base_swa` and `rope.dimension_count_swa`. What its
# laguna graph computes otherwise than transformers is refused by name (`_to_gguf`).
GGUF_KEYS = {"attention.sliding_window": "sliding_window",
             "expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
             "expert_feed_forward_length": "moe_intermediate_size",
             "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
             "expert_weights_scale": "moe_routed_scaling_factor", "rope.freq_base_swa": "swa_rope_theta",
             "rope.dimension_count_swa": "rotated_swa"}
SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, which LagunaModel always writes
SWA_PERIOD = 4  # src/models/laguna.cpp: load_swa_pattern(ml, 4, /*dense_first=*/true): full where il % 4 == 0


def _gguf_table() -> TensorTable:
    return TensorTable((*tensor_table(False, 0.0, True).rules, *MOE_RULES[:4], *MOE_RULES[4:7],
                        Rule("blk.{}.exp_probs_b.bias", "layers.{}.mlp.router.selection_bias"),
                        Rule("blk.{}.attn_gate.weight", "layers.{}.attn.out_gate.weight")))


def _kind_rope(config: dict[str, Any], kind: str) -> dict[str, Any]:
    """A layer type's RoPE as LagunaConfig reads it: its defaults where rope_parameters leaves the type out, a stated
    type rotating the whole head unless it says otherwise (as LagunaModel's converter reads it too)."""
    stated = (config.get("rope_parameters") or {}).get(kind)
    return {"partial_rotary_factor": 1.0, **stated} if stated else dict(ROPE_DEFAULTS[kind])


def _to_gguf(config: dict[str, Any]) -> dict[str, Any]:
    n, head = config["num_hidden_layers"], config["head_dim"]
    if config.get("moe_router_logit_softcapping"):
        raise MappingError("llama.cpp's laguna graph does not soft-cap the router's logits (src/models/laguna.cpp: "
                           "`build_moe_ffn(cur, model.layers[il].ffn_gate_inp, ...)`, no cap), and this model caps "
                           f"them at moe_router_logit_softcapping={config['moe_router_logit_softcapping']}")
    if config.get("attention_bias"):
        raise MappingError("llama.cpp's laguna graph adds no o_proj bias (src/models/laguna.cpp: `cur = build_lora_mm("
                           "model.layers[il].wo, cur, model.layers[il].wo_s);`), and this model has one "
                           "(attention_bias true)")
    if config.get("gating", True) is not True and config.get("gating") != "per-head":
        raise MappingError("lmconvert writes Laguna for llama.cpp with its per-head gate only: llama.cpp tells the "
                           "per-element gate by the width of attn_gate (src/models/laguna.cpp: `n_gate_out = "
                           "gate_meta->ne[1];`), which no metadata key states for lmconvert's import to read back, and "
                           f"this model's gate is per element (gating={config.get('gating')!r})")
    kinds = config.get("layer_types") or ["full_attention"] * n
    periodic = ["full_attention" if i % SWA_PERIOD == 0 else "sliding_attention" for i in range(n)]
    if kinds != periodic:
        raise MappingError("llama.cpp's laguna attends within the window on every layer but each fourth from the "
                           "first (src/models/laguna.cpp: `load_swa_pattern(ml, 4, /*dense_first=*/true);`, its "
                           f"converter states no pattern), and this model's layer_types are {kinds}")
    scaled = [k for k in sorted(set(kinds)) if _kind_rope(config, k).get("rope_type", "default") != "default"]
    if scaled:
        raise MappingError("lmconvert writes Laguna for llama.cpp with its default RoPE only (llama.cpp runs YaRN "
                           "alone on the full layers and the sliding layers unscaled), and this model's "
                           f"{scaled[0]} layers scale theirs")
    mlp = config.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
    dense = next((i for i, t in enumerate(mlp) if t != "dense"), n)
    if any(t == "dense" for t in mlp[dense:]):
        raise MappingError("llama.cpp's laguna runs dense FFNs on the leading layers only (src/models/laguna.cpp: "
                           "`if ((uint32_t)i >= hparams.n_layer_dense_lead)`), and this model's mlp_layer_types are "
                           f"{mlp}")
    full, sliding = _kind_rope(config, "full_attention"), _kind_rope(config, "sliding_attention")
    return {"attention.head_count": list(config.get("num_attention_heads_per_layer")
                                         or [config["num_attention_heads"]] * n),
            "leading_dense_block_count": dense, "rope.freq_base": float(full["rope_theta"]),
            "rope.freq_base_swa": float(sliding["rope_theta"]),
            "rope.dimension_count": int(head * float(full.get("partial_rotary_factor") or 1.0)),
            "rope.dimension_count_swa": int(head * float(sliding.get("partial_rotary_factor") or 1.0))}


def _from_gguf(config: dict[str, Any]) -> dict[str, Any]:
    """The query heads per layer (the config's own count from lmconvert's key, else the first layer's), the layer
    kinds and mixtures as llama.cpp's laguna lays them out, each kind's RoPE."""
    n, head, heads = config["num_hidden_layers"], config["head_dim"], config["num_attention_heads"]
    heads = heads if isinstance(heads, list) else [heads] * n
    dense = config["leading_dense_block_count"]
    rope = {"full_attention": {"rope_type": "default", "rope_theta": config["rope_theta"],
                               "partial_rotary_factor": config["rotated"] / head},
            "sliding_attention": {"rope_type": "default", "rope_theta": config["swa_rope_theta"],
                                  "partial_rotary_factor": config["rotated_swa"] / head}}
    return {"num_attention_heads_per_layer": heads, "num_attention_heads": config.get("query_heads") or heads[0],
            "layer_types": ["full_attention" if i % SWA_PERIOD == 0 else "sliding_attention" for i in range(n)],
            "mlp_layer_types": ["dense"] * dense + ["sparse"] * (n - dense), "rope_parameters": rope}


GGUF_LAGUNA = written("laguna", arch="laguna", keys={**GGUF_KEYS, "leading_dense_block_count":
                                                     "leading_dense_block_count", "rope.dimension_count": "rotated"},
                      own={"attention.head_count_config": "query_heads"}, table=_gguf_table(),
                      defaults={"gating": True, "attention_bias": False, "moe_router_logit_softcapping": 0.0},
                      constants={"expert_gating_func": SIGMOID, "expert_weights_norm": True},
                      transient=("leading_dense_block_count", "rotated", "rotated_swa", "swa_rope_theta",
                                 "query_heads"),
                      stated=frozenset({"vocab_size", "rope.dimension_count"}), derived=_from_gguf,
                      exported=_to_gguf)

FAMILY = Family("laguna", ("laguna",), "LagunaForCausalLM", TENSORS, CONFIG, reference_layouts=reference_layouts,
                gguf=(GGUF_LAGUNA,))
