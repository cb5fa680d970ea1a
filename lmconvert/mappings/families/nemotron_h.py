"""Nemotron-H (NVIDIA; `NemotronHForCausalLM`): single-mixer blocks.

Same as llama, except: each layer is one block, a norm then one of Mamba2 (`mixer="mamba2"`),
attention, or an MLP, as `layers_block_type` names it ("linear_attention", "full_attention", "mlp";
the older `hybrid_override_pattern` spells them M, *, -), so a Mamba2 or attention layer has no FFN
and an MLP layer no token mixer (`layer_mixers` "none"); the number of layers is the pattern's length
(`num_hidden_layers` is ignored, as NemotronHConfig ignores it); every block's tensors are
`backbone.layers.{i}.mixer.*` (as the Hub's files and transformers' save_pretrained name them; its
modules are under `model.`) and its norm `backbone.layers.{i}.norm`, which is
the attention norm or the MLP norm by the block's type; the MLP is ungated, `up_proj` then
`mlp_hidden_act` (default relu2) then `down_proj`, `mlp_bias` its biases; attention has no positions
(no RoPE) and no biases, `head_dim` default 128; the norms (NemotronHRMSNorm) apply the weight in fp32
before the cast, eps `layer_norm_epsilon` (default 1e-5), which the mixer's gated norm shares; the
Mamba2 mixer: `mamba_num_heads` x `mamba_head_dim`, `ssm_state_size`, `n_groups`, `conv_kernel`,
`chunk_size`, `use_bias` (in_proj and out_proj), `use_conv_bias`, `time_step_limit`, `mamba_hidden_act`
(SiLU only); embeddings `backbone.embeddings`, the final norm `backbone.norm_f`. A MoE block ("moe", E;
NemotronHMoE) is a mixture in place of the MLP: `n_routed_experts` ungated experts (`mixer.experts.{e}.up_proj`,
`down_proj`, `moe_intermediate_size` wide, no biases: split experts of the model's ungated kind,
`mlp_hidden_act`), DeepSeek-V3's router (`mixer.gate`, fp32 logits, sigmoid scores, `e_score_correction_bias` for
choosing within the best `topk_group` of `n_group` groups, `num_experts_per_tok` chosen, renormalised by
`norm_topk_prob`, times `routed_scaling_factor`), and one shared expert (`mixer.shared_experts`, an MLP of
`moe_shared_expert_intermediate_size` with `mlp_bias` biases) added after; `moe_latent_size` (a latent projection
around the experts) is refused by name; `n_shared_experts`, `moe_shared_expert_overlap` and the multi-token-prediction
keys change nothing transformers computes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig, NormConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.gguf import tensor_table, written
from ..tables.hf_config import HfConfig, Key, show
from ..tables.points import SHARED_UNFLATTENED
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Unstack
from . import llama, mamba2

LAYER = "backbone.layers.{}.mixer"
BLOCK_RULES = (
    Rule("backbone.embeddings.weight", "embed.weight"),
    Rule("backbone.norm_f.weight", "final_norm.weight"),
    Rule("lm_head.weight", "lm_head.weight"),
    *(Rule(f"{LAYER}.{hf}_proj.weight", f"layers.{{}}.attn.{c}.weight") for hf, c in
      (("q", "q"), ("k", "k"), ("v", "v"), ("o", "o"))),
    *(Rule(f"{LAYER}.{n}_proj.{p}", f"layers.{{}}.mlp.{n}.{p}") for n in ("up", "down") for p in ("weight", "bias")),
    *mamba2.mixer_rules(LAYER),
    # a MoE block (the Hub's per-expert names, which transformers' save_pretrained writes)
    Rule(f"{LAYER}.gate.weight", "layers.{}.mlp.router.weight"),
    Rule(f"{LAYER}.gate.e_score_correction_bias", "layers.{}.mlp.router.selection_bias"),
    *(Rule(f"{LAYER}.experts.{{}}.{n}_proj.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight")
      for n in ("up", "down")),
    *(Rule(f"{LAYER}.shared_experts.{n}_proj.{p}", f"layers.{{}}.mlp.shared.{n}.{p}") for n in ("up", "down")
      for p in ("weight", "bias")),
)
# transformers 5's own layout (save_original_format=False): `model.` for `backbone.`, each MoE block's experts
# stacked (`mixer.experts.up_proj` [experts, width, hidden], `down_proj`); read, never written
OWN_RULES = (*(Rule(r.stored.replace("backbone.", "model.", 1), r.canonical, r.transform) for r in BLOCK_RULES
               if r.stored.startswith("backbone.")),
             *(Rule(f"model.layers.{{}}.mixer.experts.{n}_proj", f"layers.{{}}.mlp.experts.{{}}.{n}.weight", Unstack())
               for n in ("up", "down")))
BLOCK_RULES += OWN_RULES
TENSORS = TensorTable(BLOCK_RULES + (Rule("backbone.layers.{}.norm.weight", "layers.{}.attn_norm.weight"),
                                     Rule("model.layers.{}.norm.weight", "layers.{}.attn_norm.weight")))


def layout_table(arch: ArchConfig) -> TensorTable:
    """Each block's one norm: the MLP's on MLP blocks, the attention's (or Mamba2's) on the others."""
    norms = tuple(Rule(f"{prefix}.layers.{i}.norm.weight", f"layers.{i}.{'mlp' if m == 'none' else 'attn'}_norm.weight")
                  for prefix in ("backbone", "model") for i, m in enumerate(arch.layer_mixers))
    return TensorTable(BLOCK_RULES + norms)


BLOCKS = {"linear_attention": ("mixer", "none"), "full_attention": ("attention", "none"), "mlp": ("none", "ffn"),
          "moe": ("none", "ffn")}
PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
SCHEDULE_KEYS = (Key("layers_block_type", list, None, nullable=True),
                 Key("hybrid_override_pattern", str, None, legacy=True))


def block_types(hf: HfConfig) -> list[str]:
    """Each block's type, from layers_block_type or the older pattern (transformers' default where neither)."""
    types = hf.get("layers_block_type")
    if types is None and hf.stated("hybrid_override_pattern"):
        pattern = hf.get("hybrid_override_pattern")
        if any(c not in PATTERN for c in pattern):
            raise MappingError(f"config.json: hybrid_override_pattern={show(pattern)} should spell each layer as one "
                               f"of {', '.join(PATTERN)}")
        types = [PATTERN[c] for c in pattern]
    types = ["linear_attention", "moe", "full_attention", "mlp"] if types is None else types
    if not types or any(not isinstance(t, str) or t not in BLOCKS for t in types):
        raise MappingError(f"config.json: layers_block_type={show(types)} should name one of {', '.join(BLOCKS)} "
                           "for each layer")
    return types


def schedule_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    types = block_types(hf)
    n = len(types)
    return {"n_layers": n, "layer_mixers": tuple(BLOCKS[t][0] for t in types),
            "layer_ffns": tuple(BLOCKS[t][1] for t in types), "layer_positions": ("none",) * n}


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """A layer with both a mixer and an FFN has no block type: it reads back as its mixer alone, refused by name."""
    types = ["linear_attention" if m == "mixer" else "full_attention" if m == "attention"
             else "moe" if cfg.moe is not None and cfg.moe.sparse(i) else "mlp" for i, m in enumerate(cfg.layer_mixers)]
    return {"layers_block_type": types}


# NemotronHConfig's mixture keys (n_shared_experts, moe_shared_expert_overlap: inert, not declared)
MOE_KEYS = (Key("n_routed_experts", int, 8), Key("num_experts_per_tok", int, 2),
            Key("moe_intermediate_size", int, 7688), Key("moe_shared_expert_intermediate_size", int, 7688),
            Key("routed_scaling_factor", float, 1.0),
            Key("n_group", int, 1), Key("topk_group", int, 1), Key("norm_topk_prob", bool, True),
            Key("moe_latent_size", int, None, nullable=True))


def moe_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """NemotronHMoE on the "moe" blocks: NemotronHTopkRouter (DeepSeek-V3's), split ungated experts, one shared."""
    types = block_types(hf)
    if "moe" not in types:
        return {}
    if hf.get("moe_latent_size") is not None:
        raise MappingError(f"config.json: moe_latent_size={hf.get('moe_latent_size')} (the experts run in a latent "
                           "projection of the residual) is not supported; only Nemotron-H mixtures without one are")
    return {"moe": MoeConfig(
        n_experts=hf.get("n_routed_experts"), top_k=hf.get("num_experts_per_tok"),
        d_expert=hf.get("moe_intermediate_size"), router="sigmoid", norm_topk=hf.get("norm_topk_prob"),
        weights_fp32=True, shared="plain",
        d_shared=hf.get("moe_shared_expert_intermediate_size"), experts_split=True,
        dense_layers=tuple(i for i, t in enumerate(types) if t != "moe"), n_group=hf.get("n_group"),
        topk_group=hf.get("topk_group"), selection_bias=True, scale=hf.get("routed_scaling_factor"), router_fp32=True)}


def moe_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    if moe is None:
        return dict.fromkeys((k.name for k in MOE_KEYS), DEFAULT)
    return {"n_routed_experts": moe.n_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.d_expert,
            "moe_shared_expert_intermediate_size": moe.d_shared, "routed_scaling_factor": moe.scale,
            "n_group": moe.n_group, "topk_group": moe.topk_group, "norm_topk_prob": moe.norm_topk,
            "moe_latent_size": None}


MIXER_KEYS = (Key("mamba_num_heads", int, 128), Key("mamba_head_dim", int, 64), Key("ssm_state_size", int, 128),
              Key("n_groups", int, 8), Key("conv_kernel", int, 4), Key("chunk_size", int, 128),
              Key("use_bias", bool, False), Key("use_conv_bias", bool, True),
              Key("time_step_limit", list, (0.0, float("inf"))), mamba2.silu_only("mamba_hidden_act"))


def mixer_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    if "mixer" not in fields["layer_mixers"]:
        return {}
    return {"mixer": "mamba2", "mixer_settings": {
        "n_heads": hf.get("mamba_num_heads"), "head_dim": hf.get("mamba_head_dim"), "d_state": hf.get("ssm_state_size"),
        "n_groups": hf.get("n_groups"), "conv_kernel": hf.get("conv_kernel"), "chunk_size": hf.get("chunk_size"),
        "conv_bias": hf.get("use_conv_bias"), "in_bias": hf.get("use_bias"), "out_bias": hf.get("use_bias"),
        "norm_eps": fields["norm"].eps, **mamba2.time_step_limit(hf)}}


def mixer_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return mamba2.keys_of(cfg, {"n_heads": "mamba_num_heads", "head_dim": "mamba_head_dim", "d_state": "ssm_state_size",
                                "n_groups": "n_groups", "conv_kernel": "conv_kernel", "chunk_size": "chunk_size",
                                "in_bias": "use_bias", "conv_bias": "use_conv_bias",
                                "time_step_limit": "time_step_limit", "activation": "mamba_hidden_act"})


NORM = Entry("norm", (Key("layer_norm_epsilon", float, 1e-5),),
             lambda hf, _: {"norm": NormConfig(eps=hf.get("layer_norm_epsilon"), dtype_order="scale_then_cast")},
             lambda cfg: {"layer_norm_epsilon": cfg.norm.eps})

CONFIG = llama.CONFIG.but(
    drop=("num_hidden_layers", "rope", "attention_bias", "activation"),
    add=(Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf), NORM,
         llama.activation("mlp_hidden_act", "relu2"), Entry("mixer", MIXER_KEYS, mixer_from_hf, mixer_to_hf),
         Entry("ungated MLP", (), lambda hf, _: {"gated": False}, lambda cfg: {}),
         Entry("experts", MOE_KEYS, moe_from_hf, moe_to_hf)),
    defaults={"vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 21504, "num_attention_heads": 32,
              "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096},
    nullable={"head_dim": False, "num_key_value_heads": False, "attention_dropout": False},
)


# -- llama.cpp (GGUF): its nemotron_h architecture (NemotronHModel in its converter, a GraniteHybridModel). The blocks
# are stated as one KV-head count and one FFN width per layer (an attention block: heads, width 0; an MLP block: no
# heads, its width; a Mamba2 block: neither), each block's norm as `attn_norm` (the attention's or the MLP's norm by
# the block: `_gguf_layout`), q/k permuted as granitehybrid's (no RoPE: the
# permutation changes no score), the Mamba2 blocks in mamba2's llama.cpp layout, the eps as `layer_norm_epsilon`, no
# RoPE (`rope.scaling.finetuned` false, a context of 2**20, which lmconvert states as its own
# `lmconvert.context_length` too). Refused by name: an MLP activation other than relu2 (llama.cpp's graph runs relu2),
# in_proj or out_proj biases (it loads none), a dt clamp (it runs none: a clamped model reads back otherwise).
GGUF_RULES = (*(r for r in tensor_table(True, 0.0, True).rules if not r.stored.endswith(("attn_norm.weight",
                                                                                          "ffn_norm.weight"))),
              *mamba2.gguf_mixer_rules())


def _gguf_layout(config: Mapping[str, Any], rules: tuple[Rule, ...] = GGUF_RULES) -> TensorTable:
    """Each block's one norm, `attn_norm`: the FFN's on MLP and MoE blocks, the attention's (or Mamba2's) on the
    others."""
    types = config.get("layers_block_type") or []
    return TensorTable((*rules, *(Rule(f"blk.{i}.attn_norm.weight",
                                       f"layers.{i}.{'mlp' if t in ('mlp', 'moe') else 'attn'}_norm.weight")
                                  for i, t in enumerate(types))))


GGUF_KEYS = {"ssm.conv_kernel": "conv_kernel", "ssm.state_size": "ssm_state_size", "ssm.group_count": "n_groups",
             "ssm.time_step_rank": "mamba_num_heads", "attention.layer_norm_epsilon": "layer_norm_epsilon",
             "ssm.inner_size": "mamba_head_dim",  # read as llama.cpp states d_inner; `derived` makes the head size
             "rope.scaling.finetuned": "rotates"}  # always false, and never read


def _from_gguf(config: dict[str, Any]) -> dict[str, Any]:
    n, heads, widths = config["num_hidden_layers"], config["num_key_value_heads"], config["intermediate_size"]
    heads, widths = (v if isinstance(v, list) else [v] * n for v in (heads, widths))
    types = ["full_attention" if h else "mlp" if w else "linear_attention" for h, w in zip(heads, widths, strict=True)]
    return {"layers_block_type": types, "num_key_value_heads": max(heads), "intermediate_size": max(widths),
            "mamba_head_dim": config["mamba_head_dim"] // config["mamba_num_heads"],
            "mlp_bias": bool(config["mlp_biased"])}


def _to_gguf(config: dict[str, Any]) -> dict[str, Any]:
    if config.get("mlp_hidden_act", "relu2") != "relu2":
        raise MappingError(f"llama.cpp's nemotron_h runs the MLP blocks with relu2, and this model's activation is "
                           f"mlp_hidden_act={config['mlp_hidden_act']!r}")
    types, kv, width = config["layers_block_type"], config["num_key_value_heads"], config["intermediate_size"]
    return {"ssm.inner_size": config["mamba_num_heads"] * config["mamba_head_dim"], "rope.scaling.finetuned": False,
            "context_length": 2**20, "attention.head_count_kv": [kv if t == "full_attention" else 0 for t in types],
            "feed_forward_length": [width if t == "mlp" else 0 for t in types]}


BLOCK_NORM = Rule("blk.{}.attn_norm.weight", "layers.{}.attn_norm.weight")  # the table beside no config
GGUF_NEMOTRON_H = written("nemotron_h", arch="nemotron_h", keys=GGUF_KEYS, permute_qk=True, layout=_gguf_layout,
                          table=TensorTable((*GGUF_RULES, BLOCK_NORM)),
                          norm_eps="attention.layer_norm_epsilon",
                          own={"ssm.chunk_size": "chunk_size", "context_length": "max_position_embeddings"},
                          layer_tensors={"mlp_biased": "blk.{}.ffn_up.bias"}, derived=_from_gguf, exported=_to_gguf,
                          unstated={"num_hidden_layers": lambda config: len(config["layers_block_type"])},
                          stated=frozenset({"vocab_size", "rope.dimension_count"}), refused=mamba2.PROJECTION_BIASES)



# -- llama.cpp's nemotron_h_moe (its converter's NemotronHModel for a config stating num_experts_per_tok): the MoE
# blocks' FFN widths per layer (`moe_intermediate_size` on a MoE block, 0 elsewhere), the mixture's keys, the router
# as `ffn_gate_inp` and `exp_probs_b` (the selection bias), the experts stacked (`ffn_up_exps`, `ffn_down_exps`), the
# shared expert as `ffn_up_shexp` / `ffn_down_shexp`; `expert_shared_count` 1 (NemotronHMoE has one, whatever
# n_shared_experts says); the groups as `expert_group_count` and `expert_group_used_count`. The dense
# intermediate_size, which sizes nothing here, is lmconvert's own key. llama.cpp's graph (build_moe_ffn, SIGMOID
# gating) is DeepseekV3TopkRouter's: sigmoid of fp32 logits, the bias for choosing, groups by their two best,
# renormalised, scaled. Refused by name: an MLP block beside the MoE blocks (llama.cpp's loader reads every FFN block
# of a model with experts as a mixture: nemotron-h.cpp, `if (n_expert != 0)`), biases on the shared expert (it
# loads none), and what nemotron_h refuses.
MOE_GGUF_RULES = (
    Rule("blk.{}.ffn_gate_inp.weight", "layers.{}.mlp.router.weight"),
    Rule("blk.{}.exp_probs_b.bias", "layers.{}.mlp.router.selection_bias"),
    *(Rule(f"blk.{{}}.ffn_{n}_exps.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight", Unstack())
      for n in ("up", "down")),
    *(Rule(f"blk.{{}}.ffn_{n}_shexp.weight", f"layers.{{}}.mlp.shared.{n}.weight") for n in ("up", "down")),
)
MOE_GGUF_KEYS = {**GGUF_KEYS, "expert_count": "n_routed_experts", "expert_used_count": "num_experts_per_tok",
                 "expert_feed_forward_length": "moe_intermediate_size",
                 "expert_shared_feed_forward_length": "moe_shared_expert_intermediate_size",
                 "expert_weights_norm": "norm_topk_prob", "expert_weights_scale": "routed_scaling_factor",
                 "expert_group_count": "n_group", "expert_group_used_count": "topk_group"}


def _from_gguf_moe(config: dict[str, Any]) -> dict[str, Any]:
    """The blocks by their KV heads (attention) and their router (MoE); the dense width lmconvert's own key, else
    (llama.cpp's files) the experts'."""
    n, heads, mixtures = config["num_hidden_layers"], config["num_key_value_heads"], set(config["moe_layers"])
    heads = heads if isinstance(heads, list) else [heads] * n
    width = config["intermediate_size"]
    return {"layers_block_type": ["full_attention" if h else "moe" if i in mixtures else "linear_attention"
                                  for i, h in enumerate(heads)],
            "num_key_value_heads": max(heads), "mamba_head_dim": config["mamba_head_dim"] // config["mamba_num_heads"],
            "intermediate_size": width if isinstance(width, int) else config["moe_intermediate_size"]}


def _to_gguf_moe(config: dict[str, Any]) -> dict[str, Any]:
    types = config["layers_block_type"]
    if "mlp" in types:
        raise MappingError("llama.cpp's nemotron_h_moe reads every FFN block of a model with experts as a mixture "
                           "(nemotron-h.cpp: `if (n_expert != 0)`), and this model has MLP blocks beside its MoE "
                           f"blocks (layers {[i for i, t in enumerate(types) if t == 'mlp']})")
    out = _to_gguf(config)
    return {**out, "feed_forward_length": [config["moe_intermediate_size"] if t == "moe" else 0 for t in types]}


GGUF_NEMOTRON_H_MOE = replace(
    GGUF_NEMOTRON_H, arch="nemotron_h_moe", keys=MOE_GGUF_KEYS,
    layout=lambda config: _gguf_layout(config, GGUF_RULES + MOE_GGUF_RULES),
    table=TensorTable((*GGUF_RULES, *MOE_GGUF_RULES, BLOCK_NORM)), constants={"expert_shared_count": 1},
    own={**GGUF_NEMOTRON_H.own, "feed_forward_length": "intermediate_size"},
    layer_tensors={"moe_layers": "blk.{}.ffn_gate_inp.weight"}, derived=_from_gguf_moe, exported=_to_gguf_moe,
    refused={**mamba2.PROJECTION_BIASES, **{f"blk.0.ffn_{n}_shexp.bias": f"a shared-expert {n}_proj bias (mlp_bias)"
                                            for n in ("up", "down")}})
# export: a model with MoE blocks is written as llama.cpp's nemotron_h_moe (a nemotron_h file holding experts is not
# llama.cpp's)
GGUF_NEMOTRON_H = replace(GGUF_NEMOTRON_H, written_as=((lambda config: "moe" in config["layers_block_type"],
                                                         GGUF_NEMOTRON_H_MOE),),
                          refused={**GGUF_NEMOTRON_H.refused, **{f"blk.0.ffn_{n}_exps.weight": "a MoE block's experts, "
                                                                 "which llama.cpp's nemotron_h_moe holds"
                                                                 for n in ("up", "down")}})

FAMILY = Family("nemotron_h", ("nemotron_h",), "NemotronHForCausalLM", TENSORS, CONFIG, layout=layout_table,
                gguf=(GGUF_NEMOTRON_H, GGUF_NEMOTRON_H_MOE),
                reference_layouts=SHARED_UNFLATTENED)  # NemotronHMoE's shared expert runs on the unflattened input
