"""Kimi Linear (Moonshot AI, KimiLinearForCausalLM).

Same as deepseek_v3, except: a hybrid stack, `layer_types` naming each layer "linear_attention" (Kimi
delta attention, `mixer="kimi_delta"`, arch/kimi_delta.py: q, k, v projections each through its own
depthwise causal conv of width `linear_conv_kernel_dim` (one conv over q | k | v in ours), a
per-channel forget gate `f_b_proj(f_a_proj(x))` plus `dt_bias` times -exp(`A_log`) of its head, beta
= sigmoid(`b_proj`), the delta rule in fp32 over `linear_num_heads` heads of `linear_head_dim`, the
output RMSNorm per head times sigmoid(`g_b_proj(g_a_proj(x))`), `o_proj`) or "full_attention"
(DeepSeek's MLA with no positions at all: the key's `qk_rope_head_dim` part is shared by every head
unrotated; no RoPE keys); absent, transformers' default: layer i attends where i > 0 and i % 4 == 0,
or the original files' `linear_attn_config` (`full_attn_layers`, `kda_layers`, 1-indexed; its
`head_dim`, `num_heads`, `short_conv_kernel_size` win over the top-level keys, as in
KimiLinearConfig); which layers are mixtures of experts is `mlp_layer_types` (absent: the first
`first_k_dense_replace`, default 1, are dense); the config keys are spelled as KimiLinearConfig's
attribute_map writes them (`num_experts`, `num_experts_per_token`, `num_shared_experts`,
`num_expert_group`, `moe_renormalize`, `model_max_length`); `rms_norm_eps` defaults to 1e-5 and is
also the output norm's eps; `q_lora_rank` defaults to null (a plain q_proj); the mixtures are
`block_sparse_moe` on disk, every expert's `w1` (gate), `w3` (up), `w2` (down), and so are the dense
MLPs as transformers 5 writes them (`mlp` read too); `A_log` is stored [1, 1, heads, 1]; `dt_bias` is
kept in fp32 as transformers keeps it. The router is DeepSeek-V3's op for op. A stack without
linear-attention layers reads as plain (NoPE) latent attention.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, plain
from ..tables.gguf import PADDED, written
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_moe import dense_layers, expert_rules
from ..tables.points import LATENT, SHARED_UNFLATTENED
from ..tables.table import Rule, TensorTable
from ..tables.transforms import NEG_EXP, Chain, EqualPart, HeadPart, Shaped
from . import deepseek_v3, llama

LINEAR_ATTN_CONFIG = Key("linear_attn_config", dict, None, nullable=True, legacy=True)
SCHEDULE_KEYS = (Key("layer_types", list, None, nullable=True), Key("linear_head_dim", int, 128),
                 Key("linear_num_heads", int, 32), Key("linear_conv_kernel_dim", int, 4), LINEAR_ATTN_CONFIG)
LAYER_TYPES = {"linear_attention": "mixer", "full_attention": "attention"}


def _linear(hf: HfConfig) -> dict[str, Any]:
    linear = hf.get("linear_attn_config")
    return linear if isinstance(linear, dict) else {}


def schedule_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """KimiLinearConfig.__post_init__: layer_types, else linear_attn_config's 1-indexed full_attn_layers
    and kda_layers (both stated), else attention where i > 0 and i % 4 == 0; every layer without positions."""
    n, linear = fields["n_layers"], _linear(hf)
    types = hf.get("layer_types")
    if types is None and "full_attn_layers" in linear and "kda_layers" in linear:
        types = [None] * n
        for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            for layer in linear[key]:
                if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= n:
                    raise MappingError(f"config.json: linear_attn_config.{key}={show(linear[key])} should list "
                                       f"layers 1 to num_hidden_layers={n}")
                types[layer - 1] = kind
    if types is None:
        types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    if len(types) != n or any(not isinstance(t, str) or t not in LAYER_TYPES for t in types):
        raise MappingError(f"config.json: layer_types={show(types)} should name one of {', '.join(LAYER_TYPES)} "
                           f"for each of the num_hidden_layers={n} layers")
    out: dict[str, Any] = {"layer_positions": ("none",) * n}
    mixers = tuple(LAYER_TYPES[t] for t in types)
    if "mixer" not in mixers:
        return out
    settings = {"heads": linear.get("num_heads", hf.get("linear_num_heads")),
                "head_dim": linear.get("head_dim", hf.get("linear_head_dim")),
                "conv_kernel": linear.get("short_conv_kernel_size", hf.get("linear_conv_kernel_dim")),
                "norm_eps": fields["norm"].eps}
    return out | {"mixer": "kimi_delta", "layer_mixers": mixers, "mixer_settings": settings}


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """layer_types and the KDA sizes; a mixer other than KDA, or positions, read back otherwise, so
    export refuses them by name."""
    kda = cfg.mixer == "kimi_delta"
    s = cfg.mixer_settings if kda else None
    return {"layer_types": ["linear_attention" if kda and m == "mixer" else "full_attention"
                            for m in cfg.layer_mixers],
            "linear_head_dim": s.head_dim if s else DEFAULT, "linear_num_heads": s.heads if s else DEFAULT,
            "linear_conv_kernel_dim": s.conv_kernel if s else DEFAULT}


MLP_LAYER_TYPES = Key("mlp_layer_types", list, None, nullable=True)
FIRST_DENSE = Key("first_k_dense_replace", int, 1, bound="non_negative", legacy=True)
MOE_KEYS = (Key("num_experts", int, 256), Key("num_experts_per_token", int, 8, nullable=True),
            Key("moe_intermediate_size", int, 1024), Key("num_shared_experts", int, 1),
            Key("routed_scaling_factor", float, 2.446), Key("num_expert_group", int, 1),
            Key("topk_group", int, 1, nullable=True), Key("moe_renormalize", bool, True))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """KimiLinearMoE where mlp_layer_types says "sparse" (absent: from first_k_dense_replace on):
    DeepSeek-V3's router (KimiLinearTopkRouter is DeepseekV3TopkRouter op for op) and its shared experts."""
    n = fields["n_layers"]
    dense = dense_layers(hf, n, hf.get("first_k_dense_replace"))
    if len(dense) == n:
        return {}
    first = next(i for i in range(n) if i not in dense)
    deepseek_v3.required(hf, ("num_experts_per_token", "topk_group"), first, n)
    width = hf.get("moe_intermediate_size")
    return {"moe": MoeConfig(n_experts=hf.get("num_experts"), top_k=hf.get("num_experts_per_token"), d_expert=width,
                             router="sigmoid", norm_topk=hf.get("moe_renormalize"), weights_fp32=True,
                             shared="plain", d_shared=hf.get("num_shared_experts") * width, dense_layers=dense,
                             n_group=hf.get("num_expert_group"), topk_group=hf.get("topk_group"),
                             selection_bias=True, scale=hf.get("routed_scaling_factor"), router_fp32=True)}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    dense = range(cfg.n_layers) if cfg.moe is None else cfg.moe.dense_layers
    types = ["dense" if i in dense else "sparse" for i in range(cfg.n_layers)]
    if cfg.moe is None:
        return {"mlp_layer_types": types, **{k.name: DEFAULT for k in MOE_KEYS}}
    moe = cfg.moe
    return {"mlp_layer_types": types, "num_experts": moe.n_experts,
            "num_experts_per_token": moe.top_k, "moe_intermediate_size": moe.d_expert,
            "num_shared_experts": deepseek_v3.shared_count(moe), "routed_scaling_factor": moe.scale,
            "num_expert_group": moe.n_group, "topk_group": moe.topk_group, "moe_renormalize": moe.norm_topk}


CONFIG = deepseek_v3.CONFIG.but(
    drop=("rope", "max_position_embeddings"),
    add=(llama.norm(1e-5),
         deepseek_v3.latent("kimi_linear", deinterleave=True, v_head_dim_nullable=True),
         Entry("experts", (MLP_LAYER_TYPES, FIRST_DENSE, *MOE_KEYS), experts_from_hf, experts_to_hf),
         plain("model_max_length", "max_positions", int, 1048576),
         Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf)),
    defaults={"vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 27,
              "num_attention_heads": 32, "num_key_value_heads": 32, "q_lora_rank": None},
)


# -- tensors: the same `self_attn.` names (q_proj, o_proj) are MLA's on one layer and KDA's on another
ATTN = "model.layers.{}.self_attn"
KDA_RULES = (
    *(Rule(f"{ATTN}.{n}.weight", f"layers.{{}}.mixer.{n}.weight")
      for n in ("q_proj", "k_proj", "v_proj", "b_proj", "g_a_proj", "g_b_proj", "o_norm", "o_proj")),
    *(Rule(f"{ATTN}.{p}_conv1d.weight", "layers.{}.mixer.conv1d.weight", EqualPart(3, i)) for i, p in enumerate("qkv")),
    Rule(f"{ATTN}.A_log", "layers.{}.mixer.forget_gate.A_log", Shaped((1, 1, -1, 1))),
    Rule(f"{ATTN}.dt_bias", "layers.{}.mixer.forget_gate.dt_bias"),
    *(Rule(f"{ATTN}.{n}.weight", f"layers.{{}}.mixer.forget_gate.{n}.weight") for n in ("f_a_proj", "f_b_proj")),
    # transformers 5's own layout (conversion_mapping.py: the convs stacked, the gate's tensors in its module)
    Rule(f"{ATTN}.conv1d.weight", "layers.{}.mixer.conv1d.weight"),
    Rule(f"{ATTN}.forget_gate.A_log", "layers.{}.mixer.forget_gate.A_log", Shaped((1, 1, -1, 1))),
    Rule(f"{ATTN}.forget_gate.dt_bias", "layers.{}.mixer.forget_gate.dt_bias"),
    *(Rule(f"{ATTN}.forget_gate.{n}.weight", f"layers.{{}}.mixer.forget_gate.{n}.weight")
      for n in ("f_a_proj", "f_b_proj")),
)
MOE = "model.layers.{}.block_sparse_moe"
MLP_RULES = tuple(Rule(f"model.layers.{{}}.{block}.{n}_proj.weight", f"layers.{{}}.mlp.{n}.weight")
                  for block in ("block_sparse_moe", "mlp") for n in ("gate", "up", "down"))
MOE_RULES = (
    *expert_rules("block_sparse_moe", ("w1", "w3", "w2"), "gate"),
    *(Rule(f"{block}.gate.e_score_correction_bias", "layers.{}.mlp.router.selection_bias")
      for block in (MOE, "model.layers.{}.mlp")),
    *(Rule(f"{block}.shared_experts.{n}_proj.weight", f"layers.{{}}.mlp.shared.{n}.weight")
      for block in (MOE, "model.layers.{}.mlp") for n in ("gate", "up", "down")),
)


def _at(rules: tuple[Rule, ...], layer: int) -> tuple[Rule, ...]:
    """`rules` for one layer: its number in place of the layer's `{}` (the first)."""
    return tuple(Rule(r.stored.replace("{}", str(layer), 1), r.canonical and r.canonical.replace("{}", str(layer), 1),
                      r.transform, r.shape) for r in rules)


def layout(arch: ArchConfig) -> TensorTable:
    """Each layer's `self_attn.` tensors as MLA's or KDA's, by the layer schedule."""
    per_layer = tuple(rule for i, mixing in enumerate(arch.layer_mixers)
                      for rule in _at(KDA_RULES if mixing == "mixer" else deepseek_v3.MLA_RULES, i))
    return TensorTable(llama.EDGE_RULES + llama.PRE_NORM_RULES + per_layer + MLP_RULES + MOE_RULES)


TENSORS = TensorTable(llama.EDGE_RULES + llama.PRE_NORM_RULES + deepseek_v3.MLA_RULES + MLP_RULES + MOE_RULES)

# KimiLinearAttention: kv_b_proj on the latent viewed as (B, 1, T, C), as ours; KimiLinearMoE runs the
# shared experts on the unflattened input
REFERENCE_LAYOUTS = {**LATENT, **SHARED_UNFLATTENED}


# -- llama.cpp (GGUF): its kimi-linear architecture (KimiLinearModel in llama.cpp's converter), tensor for tensor
# as that converter writes it. A KDA layer: q, k, v as attn_q/k/v, each conv as ssm_conv1d_q/k/v [1, channels, 1,
# kernel], f_a/f_b as ssm_f_a/f_b, b_proj as ssm_beta, A_log as ssm_a = -exp(A_log) [1, 1, heads, 1] (NEG_EXP: read
# back as log(-ssm_a), within a few ulps), dt_bias as ssm_dt.bias, g_a/g_b as ssm_g_a/g_b, o_norm as ssm_norm,
# o_proj as attn_output. An MLA layer in the absorbed layout (kv_b as attn_k_b, each head's k rows transposed, and
# attn_v_b), the layout llama.cpp's converter writes and its graph's MLA-cache path runs; its other path (attn_kv_b
# whole) puts each key's shared part before its no-position part where the query's comes after, and crashed
# (segfault) on the tiny test model. Which layers attend is stated as
# one KV-head count per layer (0: KDA; 1: MLA's latent cache). Refused by name: rms_norm_eps other than 1e-6
# (llama.cpp normalises MLA's kv_a and KDA's q and k with it; transformers with 1e-6: gguf/export.py, in its words
# for DeepSeek), a stack without both KDA and MLA layers (llama.cpp aborts on it), KDA heads other than the attention
# heads (llama.cpp has one head count), a q LoRA (its loader reads no q_lora_rank), dense layers that are not the first
# ones (llama.cpp's leading_dense_block_count), unrenormalised expert weights, no shared expert, a tied output (all
# hard-coded or required there), and biases (loaders.py: it loads none).
GGUF_EDGE = (Rule("token_embd.weight", "embed.weight", PADDED), Rule("output.weight", "lm_head.weight", PADDED),
             Rule("output_norm.weight", "final_norm.weight"))
GGUF_FFN = (*(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight") for g, c in (
    ("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"), ("ffn_gate", "mlp.gate"), ("ffn_up", "mlp.up"),
    ("ffn_down", "mlp.down"))), *deepseek_v3.V3_ROUTER_RULES)
GGUF_KDA = (
    *(Rule(f"blk.{{}}.{g}", f"layers.{{}}.mixer.{c}") for g, c in (
        ("attn_q.weight", "q_proj.weight"), ("attn_k.weight", "k_proj.weight"), ("attn_v.weight", "v_proj.weight"),
        ("ssm_f_a.weight", "forget_gate.f_a_proj.weight"), ("ssm_f_b.weight", "forget_gate.f_b_proj.weight"),
        ("ssm_beta.weight", "b_proj.weight"), ("ssm_dt.bias", "forget_gate.dt_bias"),
        ("ssm_g_a.weight", "g_a_proj.weight"), ("ssm_g_b.weight", "g_b_proj.weight"),
        ("ssm_norm.weight", "o_norm.weight"), ("attn_output.weight", "o_proj.weight"))),
    *(Rule(f"blk.{{}}.ssm_conv1d_{p}.weight", "layers.{}.mixer.conv1d.weight", EqualPart(3, i, unit_first=True))
      for i, p in enumerate("qkv")),
    Rule("blk.{}.ssm_a", "layers.{}.mixer.forget_gate.A_log", Chain(Shaped((1, 1, -1, 1)), NEG_EXP)),
)
MLA_PARTS = (("attn_q", "q", ("weight",)), ("attn_q_a", "q_a", ("weight", "bias")),
             ("attn_q_a_norm", "q_a_norm", ("weight",)), ("attn_q_b", "q_b", ("weight",)),
             ("attn_kv_a_mqa", "kv_a", ("weight", "bias")), ("attn_kv_a_norm", "kv_a_norm", ("weight",)),
             ("attn_output", "o", ("weight", "bias")))
GGUF_MLA = (
    *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.attn.{c}.{p}") for g, c, params in MLA_PARTS for p in params),
    *(Rule(f"blk.{{}}.attn_{n}_b.weight", "layers.{}.attn.kv_b.weight",
           HeadPart(deepseek_v3.KV_B_PARTS, (True, False), i)) for i, n in enumerate("kv")),
)


def _gguf_layout(config: Mapping[str, Any]) -> TensorTable:
    """Each layer's attn_q/k/v and attn_output as KDA's or MLA's, by the layer schedule (layer_types); the table
    beside no config is MLA's on every layer, as TENSORS is."""
    types = config.get("layer_types") or []
    per_layer = tuple(rule for i, t in enumerate(types)
                      for rule in _at(GGUF_KDA if t == "linear_attention" else GGUF_MLA, i))
    return TensorTable(GGUF_EDGE + GGUF_FFN + per_layer)


# deepseek2's keys in Kimi's spelling (KimiLinearConfig's attribute_map), but the value length (here the converter's
# transformers head_dim, written by `_to_gguf`) and expert_weights_norm (kimi-linear always renormalises); and KDA's
KIMI_SPELLING = {"n_routed_experts": "num_experts", "num_experts_per_tok": "num_experts_per_token",
                 "n_shared_experts": "num_shared_experts", "n_group": "num_expert_group"}
GGUF_KEYS = {**{k: KIMI_SPELLING.get(v, v) for k, v in deepseek_v3.DEEPSEEK2_KEYS.items()
                if k not in ("attention.value_length", "expert_weights_norm")},
             "ssm.conv_kernel": "linear_conv_kernel_dim", "kda.head_dim": "linear_head_dim"}


def _from_gguf(config: Mapping[str, Any]) -> dict[str, Any]:
    """The schedule from the per-layer KV-head counts (0: KDA), the MLA head sizes from the `_mla` lengths, the KDA
    heads as the attention heads, the mixtures from leading_dense_block_count on."""
    deepseek_v3.v3_router(config, "kimi-linear")
    n, kv = config["num_hidden_layers"], config["num_key_value_heads"]
    kv = kv if isinstance(kv, list) else [kv] * n
    rotary, heads, dense = config["qk_rope_head_dim"], config["num_attention_heads"], config["first_k_dense_replace"]
    return {"layer_types": ["full_attention" if h else "linear_attention" for h in kv],
            "num_key_value_heads": heads, "linear_num_heads": heads, "head_dim": rotary,
            "qk_nope_head_dim": config["key_length_mla"] - rotary, "v_head_dim": config["value_length_mla"],
            "mlp_layer_types": ["dense" if i < dense else "sparse" for i in range(n)]}


def _to_gguf(config: Mapping[str, Any]) -> dict[str, Any]:
    types, heads = config["layer_types"], config["num_attention_heads"]
    if {"linear_attention", "full_attention"} - set(types):
        only = "KDA" if "linear_attention" in types else "MLA"
        raise MappingError(f"llama.cpp's kimi-linear aborts on a model without both KDA and MLA layers (it allocates "
                           f"an empty recurrent state or KV cache: GGML_ASSERT(buffer) in ggml-backend.cpp), and this "
                           f"model's layers are all {only}")
    if "linear_attention" in types and config["linear_num_heads"] != heads:
        raise MappingError(f"llama.cpp's kimi-linear runs KDA with the attention's head count ({heads}), and this "
                           f"model's KDA has linear_num_heads={config['linear_num_heads']}")
    if "full_attention" in types and config.get("q_lora_rank") is not None:
        raise MappingError(f"llama.cpp's kimi-linear reads no q_lora_rank (its loader sizes attn_q_a_norm as 0), so it "
                           f"runs MLA with a plain q projection only, and this model's is low-rank "
                           f"(q_lora_rank={config['q_lora_rank']})")
    mlp = config.get("mlp_layer_types") or []
    dense = mlp.count("dense")
    if mlp != ["dense"] * dense + ["sparse"] * (len(mlp) - dense):
        raise MappingError(f"llama.cpp's kimi-linear has dense layers only before the experts "
                           f"(leading_dense_block_count), and this model's layers are {mlp}")
    if dense < len(mlp) and not config.get("moe_renormalize", True):
        raise MappingError("llama.cpp's kimi-linear always renormalises the chosen experts' weights, and this model "
                           "does not (moe_renormalize false)")
    if dense < len(mlp) and not config.get("num_shared_experts"):
        raise MappingError("llama.cpp's kimi-linear runs a shared expert beside the routed ones, and this model has "
                           "none (num_shared_experts 0)")
    if dense < len(mlp):
        deepseek_v3.expert_groups({"n_group": config.get("num_expert_group"), "topk_group": config.get("topk_group")},
                                  "kimi-linear")
    rotary, lora = config["qk_rope_head_dim"], config["kv_lora_rank"]
    # absorbed MLA, as llama.cpp's converter states it: a latent KV cache of one head (kv_lora_rank + the shared
    # key part); value_length is transformers' head_dim (qk_rope_head_dim), which its converter writes and its
    # graph does not read
    return {"attention.head_count_kv": [1 if t == "full_attention" else 0 for t in types],
            "attention.key_length": lora + rotary, "attention.value_length": rotary,
            "attention.key_length_mla": config["qk_nope_head_dim"] + rotary,
            "attention.value_length_mla": config["v_head_dim"], "leading_dense_block_count": dense}


GGUF_KIMI_LINEAR = written(
    "kimi_linear", arch="kimi-linear", keys=GGUF_KEYS, latent=True, layout=_gguf_layout,
    table=TensorTable(GGUF_EDGE + GGUF_FFN + GGUF_MLA), derived=_from_gguf, exported=_to_gguf,
    renamed={"max_position_embeddings": "model_max_length"}, constants={"expert_gating_func": deepseek_v3.SIGMOID},
    defaults={"moe_renormalize": True, "num_expert_group": 1, "topk_group": 1, "q_lora_rank": None},
    # llama.cpp's converter reads the group count only as n_group, which Kimi's config calls num_expert_group
    omitted={"expert_group_count": 1}, stated=frozenset({"vocab_size", "rope.dimension_count"}))

FAMILY = Family("kimi_linear", ("kimi_linear",), "KimiLinearForCausalLM", TENSORS, CONFIG, layout=layout,
                gguf=(GGUF_KIMI_LINEAR,), reference_layouts=REFERENCE_LAYOUTS)
