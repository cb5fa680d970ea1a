"""Ling 3 (inclusionAI, BailingHybridForCausalLM: Ling-3.0-Flash's hybrid linear/latent stack).

Same as kimi_linear, except: the Kimi delta attention layers (`mixer="kimi_delta"`) have one
`f_proj` for the forget gate and one `g_proj` for the output gate (`gate_projections="full"`, not
the low-rank pairs), a forget gate bounded below (`kda_safe_gate`, default true:
`kda_lower_bound` (default -5) * sigmoid(exp(A_log) * (f_proj(x) + dt_bias)); false: -exp(A_log) *
softplus(...), torch's) cast to the activation dtype, and the conv and A_log kept in fp32
(`_keep_in_fp32_modules_strict`); their heads are `num_attention_heads` of `head_dim` and the conv
width is `short_conv_kernel_size` (transformers ignores the `linear_*` keys it writes, and writes
`head_dim` back as qk_rope_head_dim, so a file it saved reads back as it does: with the KDA head
size qk_rope_head_dim); the latent attention layers have RoPE (DeepSeek-V3's, interleaved and
written de-interleaved; `rope_parameters`, default theta 6e6) and a sigmoid output gate per head,
`g_proj`, in fp32 (`attn_output_gate="projection_head"`, `attn_gate_activation="sigmoid_fp32"`); absent
`layer_types`, a layer attends where (i + 1) % `layer_group_size` (default 6) == 0; `rms_norm_eps`
defaults to 1e-6; `first_k_dense_replace` to 2; no `linear_attn_config`. On disk the checkpoints'
own names: `model.word_embeddings`, `attention.` for `self_attn.`, `dense` for o_proj, q/k/v_conv1d,
f_proj, dt_bias and A_log (one per head) beside the projections, `mlp.gate.expert_bias` for the
selection bias, each expert's gate/up/down_proj (transformers' in-memory names read too). The
multi-token-prediction layers stored after the decoder layers (`num_nextn_predict_layers`), which
transformers does not load, are dropped. SwiGLU clipping (`expert_swiglu_limit_list`,
`share_expert_swiglu_limit_list`, clamped after the activation) is refused by name where a limit is
not 0: MoeConfig has no such clamp.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, plain
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_moe import FUSED_RULES
from ..tables.hf_rope import KEYS as ROPE_KEYS
from ..tables.hf_rope import rope_from_hf, rope_parameters, rope_to_hf
from ..tables.table import Rule, TensorTable
from ..tables.transforms import EqualPart
from . import deepseek_v3, kimi_linear, llama

LAYER_TYPES = kimi_linear.LAYER_TYPES
SCHEDULE_KEYS = (Key("layer_types", list, None, nullable=True), Key("layer_group_size", int, 6),
                 Key("head_dim", int, 128), Key("short_conv_kernel_size", int, 4),
                 Key("kda_safe_gate", bool, True), Key("kda_lower_bound", float, -5.0, bound="finite"))


def schedule_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """BailingHybridConfig.__post_init__: layer_types, else attention where (i + 1) % layer_group_size
    == 0; the KDA layers' settings; RoPE on every layer (only the latent layers use it)."""
    n, group = fields["n_layers"], hf.get("layer_group_size")
    types = hf.get("layer_types")
    if types is None:
        if group <= 0:
            raise MappingError(f"config.json: layer_group_size={group} should be a positive number of layers")
        types = ["full_attention" if (i + 1) % group == 0 else "linear_attention" for i in range(n)]
    if len(types) != n or any(not isinstance(t, str) or t not in LAYER_TYPES for t in types):
        raise MappingError(f"config.json: layer_types={show(types)} should name one of {', '.join(LAYER_TYPES)} "
                           f"for each of the num_hidden_layers={n} layers")
    mixers = tuple(LAYER_TYPES[t] for t in types)
    if "mixer" not in mixers:
        return {}
    settings = {"heads": fields["n_heads"], "head_dim": hf.get("head_dim"),
                "conv_kernel": hf.get("short_conv_kernel_size"), "norm_eps": fields["norm"].eps,
                "gate_projections": "full",
                "forget_gate": "bounded" if hf.get("kda_safe_gate") else "softplus_cast",
                "gate_lower_bound": hf.get("kda_lower_bound"), "fp32_kept": "dt_bias+A_log+conv1d"}
    return {"mixer": "kimi_delta", "layer_mixers": mixers, "mixer_settings": settings}


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """layer_types and the KDA settings; a mixer other than Ling's KDA reads back otherwise, so export
    refuses it by name."""
    kda = cfg.mixer == "kimi_delta"
    s = cfg.mixer_settings if kda else None
    return {"layer_types": ["linear_attention" if kda and m == "mixer" else "full_attention"
                            for m in cfg.layer_mixers],
            # without KDA layers, what transformers writes: head_dim overwritten by qk_rope_head_dim
            "layer_group_size": DEFAULT, "head_dim": s.head_dim if s else cfg.head_dim,
            "short_conv_kernel_size": s.conv_kernel if s else DEFAULT,
            "kda_safe_gate": s.forget_gate == "bounded" if s else DEFAULT,
            "kda_lower_bound": s.gate_lower_bound if s else DEFAULT}


MAX_POSITIONS = Key("max_position_embeddings", int, 262144)


def _rope(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """BailingHybridAttention rotates with apply_rotary_pos_emb_interleave always (no rope_interleave key);
    a scaled RoPE's context is `model_max_length` (BailingHybridConfig's attribute_map)."""
    keys = {k.name: k for k in (*ROPE_KEYS, MAX_POSITIONS)}
    data = {k: v for k, v in hf.data.items() if k in keys} | {"max_position_embeddings": fields["max_positions"]}
    return {"rope": rope_from_hf(HfConfig(data, keys), *rope_parameters(hf), theta=hf.get("rope_theta"),
                                layout="interleaved")}


LIMIT_KEYS = (Key("expert_swiglu_limit_list", list, None, nullable=True),
              Key("share_expert_swiglu_limit_list", list, None, nullable=True))


def _no_limits(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Ling's SwiGLU clipping, min(act(gate), limit) * clamp(up, +-limit) per layer: refused where a limit is set."""
    for key in LIMIT_KEYS:
        limits = hf.get(key.name)
        if limits is not None and any(limit != 0 for limit in limits):
            raise MappingError(f"config.json: {key.name}={show(limits)}: SwiGLU clipping after the activation is "
                               "not supported (MoeConfig has no such clamp); only limits of 0 (none) are")
    return {}


GATE = {"attn_output_gate": "projection_head", "attn_gate_activation": "sigmoid_fp32"}
LATENT = deepseek_v3.latent("bailing_hybrid", deinterleave=True, v_head_dim_nullable=False)
CONFIG = kimi_linear.CONFIG.but(
    add=(llama.norm(1e-6),
         Entry("latent attention", tuple(k for k in LATENT.keys if k.name != "head_dim"),
               lambda hf, fields: LATENT.read(hf, fields) | GATE, LATENT.write),
         Entry("rope", ROPE_KEYS, _rope, lambda cfg: {"rope_parameters": rope_to_hf(cfg.rope)}),
         Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf),
         Entry("swiglu limits", LIMIT_KEYS, _no_limits, lambda cfg: {k.name: [0] * cfg.n_layers for k in LIMIT_KEYS}),
         plain("model_max_length", "max_positions", int, 262144)),
    defaults={"vocab_size": 157184, "hidden_size": 2560, "intermediate_size": 6144, "num_hidden_layers": 42,
              "num_attention_heads": 32, "num_key_value_heads": 32, "first_k_dense_replace": 2, "num_experts": 512,
              "moe_intermediate_size": 768, "routed_scaling_factor": 2.5, "num_expert_group": 8, "topk_group": 4,
              "rope_theta": 6e6, "q_lora_rank": None},
    nullable={"attention_dropout": False, "topk_group": False},
)


def _spellings(prefix: str, pairs: tuple[tuple[str, str, str], ...]) -> tuple[Rule, ...]:
    """(the checkpoints' name, transformers' in-memory name, ours) under `model.layers.{}.`: the
    checkpoints' first, which export writes (transformers saves them so)."""
    return tuple(Rule(f"model.layers.{{}}.{attn}.{name}", f"layers.{{}}.{prefix}.{ours}")
                 for attn, i in (("attention", 0), ("self_attn", 1)) for *names, ours in pairs
                 for name in (names[i],))


KDA_RULES = (
    *_spellings("mixer", tuple((f"{n}.weight", f"{n}.weight", f"{n}.weight")
                               for n in ("q_proj", "k_proj", "v_proj", "b_proj", "g_proj", "o_norm"))
                + (("dense.weight", "o_proj.weight", "o_proj.weight"),
                   ("f_proj.weight", "forget_gate.f_proj.weight", "forget_gate.f_proj.weight"),
                   ("dt_bias", "forget_gate.dt_bias", "forget_gate.dt_bias"),
                   ("A_log", "forget_gate.A_log", "forget_gate.A_log"))),
    *(Rule(f"model.layers.{{}}.attention.{p}_conv1d.weight", "layers.{}.mixer.conv1d.weight", EqualPart(3, i))
      for i, p in enumerate("qkv")),
    Rule("model.layers.{}.self_attn.conv1d.weight", "layers.{}.mixer.conv1d.weight"),
)
MLA_RULES = _spellings("attn", (
    ("q_proj.weight", "q_proj.weight", "q.weight"),
    *((f"{n}.{p}", f"{n}.{p}", f"{c}.{p}") for n, c in (("q_a_proj", "q_a"), ("kv_a_proj_with_mqa", "kv_a"))
      for p in ("weight", "bias")),
    *((f"{n}.weight", f"{n}.weight", f"{c}.weight")
      for n, c in (("q_a_layernorm", "q_a_norm"), ("q_b_proj", "q_b"), ("kv_a_layernorm", "kv_a_norm"),
                   ("kv_b_proj", "kv_b"), ("g_proj", "out_gate"))),
    *((f"dense.{p}", f"o_proj.{p}", f"o.{p}") for p in ("weight", "bias")),
))
MOE_RULES = (
    Rule("model.layers.{}.mlp.gate.weight", "layers.{}.mlp.router.weight"),
    *(Rule(f"model.layers.{{}}.mlp.gate.{n}", "layers.{}.mlp.router.selection_bias")
      for n in ("expert_bias", "e_score_correction_bias")),
    *(Rule(f"model.layers.{{}}.mlp.experts.{{}}.{n}_proj.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight")
      for n in ("gate", "up", "down")),
    *(Rule(f"model.layers.{{}}.mlp.shared_experts.{n}_proj.weight", f"layers.{{}}.mlp.shared.{n}.weight")
      for n in ("gate", "up", "down")),
    *FUSED_RULES,
)
EDGE_RULES = (Rule("model.word_embeddings.weight", "embed.weight"), *llama.EDGE_RULES)
MLP_RULES = tuple(Rule(f"model.layers.{{}}.mlp.{n}_proj.weight", f"layers.{{}}.mlp.{n}.weight")
                  for n in ("gate", "up", "down"))
MTP_LAYERS = 8  # at most this many multi-token-prediction layers after the decoder's are dropped


def layout(arch: ArchConfig) -> TensorTable:
    """Each layer's attention tensors as MLA's or KDA's, by the layer schedule; the MTP layers after
    the last decoder layer dropped."""
    per_layer = tuple(rule for i, mixing in enumerate(arch.layer_mixers)
                      for rule in kimi_linear._at(KDA_RULES if mixing == "mixer" else MLA_RULES, i))
    mtp = tuple(Rule(f"model.layers.{arch.n_layers + i}.*", None) for i in range(MTP_LAYERS))
    return TensorTable(EDGE_RULES + llama.PRE_NORM_RULES + per_layer + MLP_RULES + MOE_RULES + mtp)


TENSORS = TensorTable(EDGE_RULES + llama.PRE_NORM_RULES + MLA_RULES + MLP_RULES + MOE_RULES)

FAMILY = Family("bailing_hybrid", ("bailing_hybrid",), "BailingHybridForCausalLM", TENSORS, CONFIG, layout=layout,
                no_gguf="llama.cpp's converter writes Ling 3 as `bailingmoe3`, an architecture the gguf package "
                        "(0.19.0) that lmconvert writes with does not know",
                # BailingHybridAttention's g_proj: one gate per head
                reference_layouts={**kimi_linear.REFERENCE_LAYOUTS, "attn.out_gate": "B T H"})
