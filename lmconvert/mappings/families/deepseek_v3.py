"""DeepSeek-V3.

Same as llama, except: attention is multi-head latent attention (the "latent" kind), with
`q_lora_rank` (null: a plain `q_proj`), `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim` (what
transformers also calls `head_dim`) and `v_head_dim`; `attention_bias` switches the biases of
`q_a_proj`, `kv_a_proj_with_mqa` and `o_proj` only; the MLA-internal RMSNorms use eps 1e-6
whatever `rms_norm_eps` says; `rope_interleave` (default true) reads the rotary dims in pairs; under
scaled RoPE with `mscale_all_dim` the score scale is multiplied by mscale squared; there is no
`mlp_bias`. Layers from `first_k_dense_replace` on are mixtures of `n_routed_experts` experts
(`moe_intermediate_size` wide) with `n_shared_experts` ungated shared experts; the router
(`mlp.gate`, kept in fp32 by transformers) scores experts by a sigmoid of fp32 logits, chooses
`num_experts_per_tok` of them on those scores plus `e_score_correction_bias` within the best
`topk_group` of `n_group` groups, renormalises the chosen scores when `norm_topk_prob` and scales
them by `routed_scaling_factor` (in fp32).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig
from lmconvert.arch.attention_kinds import LatentSettings

from ..errors import Inexpressible, MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.gguf import MOE_RULES as GGUF_MOE_RULES
from ..tables.gguf import (
    PADDED,
    STATES_VOCAB_AND_ROPE,
    GgufArch,
    written,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import FUSED_RULES
from ..tables.hf_rope import KEYS as ROPE_KEYS
from ..tables.hf_rope import rope_from_hf, rope_parameters, rope_to_hf
from ..tables.points import LATENT, SHARED_UNFLATTENED
from ..tables.table import Rule, TensorTable
from ..tables.transforms import HeadPart
from . import llama

MLA_RULES = tuple(
    Rule(f"model.layers.{{}}.self_attn.{hf}.{p}", f"layers.{{}}.attn.{c}.{p}")
    for hf, c, params in (
        ("q_proj", "q", ("weight",)),
        ("q_a_proj", "q_a", ("weight", "bias")),
        ("q_a_layernorm", "q_a_norm", ("weight",)),
        ("q_b_proj", "q_b", ("weight",)),
        ("kv_a_proj_with_mqa", "kv_a", ("weight", "bias")),
        ("kv_a_layernorm", "kv_a_norm", ("weight",)),
        ("kv_b_proj", "kv_b", ("weight",)),
        ("o_proj", "o", ("weight", "bias")),
    )
    for p in params
)

def latent_keys(v_head_dim_nullable: bool) -> tuple[Key, ...]:
    return (
        Key("q_lora_rank", int, 1536, nullable=True),  # null: a plain q_proj
        Key("kv_lora_rank", int, 512),
        Key("qk_nope_head_dim", int, 128),
        Key("qk_rope_head_dim", int, 64),
        Key("v_head_dim", int, 128, nullable=v_head_dim_nullable),  # V3's class takes null; no model runs with it
        Key("attention_bias", bool, False),
        # transformers writes head_dim (= qk_rope_head_dim) and overwrites whatever a file states:
        # checked as a count on the way in, never read for a value, never written
        Key("head_dim", int, None, nullable=True, legacy=True),
    )


def latent(family: str, deinterleave: bool, v_head_dim_nullable: bool,
           null_v_head_dim: Callable[[dict[str, Any]], int] | None = None) -> Entry:
    """The MLA sizes <-> ArchConfig's latent attention; `deinterleave` is the family's constant;
    `null_v_head_dim`: the value head size a null v_head_dim means (from the fields read so far),
    where the family's config class gives it one (MiniCPM3), else a null is refused."""

    def read(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
        v_head_dim = hf.get("v_head_dim")
        if v_head_dim is None and null_v_head_dim is not None:
            v_head_dim = null_v_head_dim(fields)
        if v_head_dim is None:  # transformers' config class accepts it; building the model then fails
            raise MappingError("config.json: v_head_dim=null: transformers cannot build this model; state the "
                               "value head size")
        settings = LatentSettings(kv_lora_rank=hf.get("kv_lora_rank"), qk_nope_head_dim=hf.get("qk_nope_head_dim"),
                                  v_head_dim=v_head_dim, q_lora_rank=hf.get("q_lora_rank"),
                                  bias=hf.get("attention_bias"), deinterleave=deinterleave)
        return {"attention": "latent", "attention_settings": settings, "head_dim": hf.get("qk_rope_head_dim")}

    def write(cfg: ArchConfig) -> dict[str, Any]:
        if cfg.attention != "latent":  # said here: read back, the defaults would fail on something else first
            raise Inexpressible(f"{family} always has latent attention (MLA), which this model lacks "
                                f"(attention={cfg.attention!r}); export to the source family instead")
        return latent_to_hf(cfg)

    return Entry("latent attention", latent_keys(v_head_dim_nullable), read, write)


def latent_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    s = cfg.attention_settings
    return {"q_lora_rank": s.q_lora_rank, "kv_lora_rank": s.kv_lora_rank, "qk_nope_head_dim": s.qk_nope_head_dim,
            "qk_rope_head_dim": cfg.head_dim, "v_head_dim": s.v_head_dim, "attention_bias": s.bias}


INTERLEAVE = Key("rope_interleave", bool, True, nullable=True)  # null: the half layout, as false


def rope_from_deepseek(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    layout = "interleaved" if hf.get("rope_interleave") else "half"
    return {"rope": rope_from_hf(hf, *rope_parameters(hf), layout=layout)}


def rope_to_deepseek(cfg: ArchConfig) -> dict[str, Any]:
    return {"rope_parameters": rope_to_hf(cfg.rope), "rope_interleave": cfg.rope.layout == "interleaved"}


def first_dense(hf: HfConfig, fields: dict[str, Any]) -> int | None:
    """`first_k_dense_replace`: transformers makes layer i a mixture-of-experts layer when
    i >= first_k_dense_replace; None when every layer is dense."""
    first, n = hf.get("first_k_dense_replace"), fields["n_layers"]
    if first is None:  # transformers' config class accepts it; building the model then fails
        raise MappingError("config.json: first_k_dense_replace=null: transformers cannot build this model; "
                           "set it to num_hidden_layers for a dense model")
    return None if first >= n else first


def required(hf: HfConfig, names: tuple[str, ...], first: int, n: int) -> None:
    """Keys a mixture-of-experts layer needs, which the config class lets be null (transformers
    then fails building the model)."""
    for name in names:
        if hf.get(name) is None:
            layers = str(first) if first == n - 1 else f"{first}-{n - 1}"
            raise MappingError(f"config.json: {name}=null, but first_k_dense_replace={first} makes layers {layers} "
                               f"mixture-of-experts layers, which need it; state it from the model card")


def shared_count(moe: MoeConfig) -> Any:
    """n_shared_experts, which transformers multiplies by moe_intermediate_size."""
    if moe.d_shared is None or moe.d_shared % moe.d_expert:
        return DEFAULT  # read back, a different model: reported as this mixture of experts
    return moe.d_shared // moe.d_expert


def experts_row(name: str, first: Key, keys: tuple[Key, ...], read_moe: Callable[[HfConfig, int, int], MoeConfig],
                write_moe: Callable[[MoeConfig], dict[str, Any]]) -> Entry:
    """The MoE row of both DeepSeek families: a dense model (every layer below
    first_k_dense_replace) has no MoeConfig; export writes first_k_dense_replace as the number of
    dense layers and the other keys as the family's (their defaults for a dense model)."""

    def read(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
        first, n = first_dense(hf, fields), fields["n_layers"]
        return {} if first is None else {"moe": read_moe(hf, first, n)}

    def write(cfg: ArchConfig) -> dict[str, Any]:
        if cfg.moe is None:
            return {"first_k_dense_replace": cfg.n_layers, **{k.name: DEFAULT for k in keys}}
        return {"first_k_dense_replace": len(cfg.moe.dense_layers), **write_moe(cfg.moe)}

    return Entry(name, (first, *keys), read, write)


FIRST_DENSE = Key("first_k_dense_replace", int, 3, nullable=True, bound="non_negative")
V3_KEYS = (Key("n_routed_experts", int, 256), Key("num_experts_per_tok", int, 8, nullable=True),
           Key("moe_intermediate_size", int, 2048), Key("n_shared_experts", int, 1),
           Key("routed_scaling_factor", float, 2.5), Key("n_group", int, 8, nullable=True),
           Key("topk_group", int, 4, nullable=True), Key("norm_topk_prob", bool, True, nullable=True))


def v3_moe(hf: HfConfig, first: int, n: int) -> MoeConfig:
    """DeepseekV3TopkRouter: sigmoid scores, e_score_correction_bias for choosing, the best
    topk_group of n_group groups, renormalised when norm_topk_prob, times routed_scaling_factor;
    n_shared_experts ungated shared experts as one FFN."""
    required(hf, ("num_experts_per_tok", "n_group", "topk_group"), first, n)
    width = hf.get("moe_intermediate_size")
    return MoeConfig(n_experts=hf.get("n_routed_experts"), top_k=hf.get("num_experts_per_tok"), d_expert=width,
                     router="sigmoid", norm_topk=bool(hf.get("norm_topk_prob")), weights_fp32=True, shared="plain",
                     d_shared=hf.get("n_shared_experts") * width, dense_layers=tuple(range(first)),
                     n_group=hf.get("n_group"), topk_group=hf.get("topk_group"), selection_bias=True,
                     scale=hf.get("routed_scaling_factor"), router_fp32=True)


def v3_to_hf(moe: MoeConfig) -> dict[str, Any]:
    return {"n_routed_experts": moe.n_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.d_expert,
            "n_shared_experts": shared_count(moe), "routed_scaling_factor": moe.scale, "n_group": moe.n_group,
            "topk_group": moe.topk_group, "norm_topk_prob": moe.norm_topk}


MOE_RULES = (
    Rule("model.layers.{}.mlp.gate.weight", "layers.{}.mlp.router.weight"),
    Rule("model.layers.{}.mlp.gate.e_score_correction_bias", "layers.{}.mlp.router.selection_bias"),
    *(Rule(f"model.layers.{{}}.mlp.experts.{{}}.{n}_proj.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight")
      for n in ("gate", "up", "down")),
    *(Rule(f"model.layers.{{}}.mlp.shared_experts.{n}_proj.{p}", f"layers.{{}}.mlp.shared.{n}.{p}")
      for n in ("gate", "up", "down") for p in ("weight", "bias")),
    *FUSED_RULES,
)


CONFIG = llama.CONFIG.but(
    drop=("mlp_bias", "head_dim", "attention_bias"),
    add=(
        Entry("rope", (*ROPE_KEYS, INTERLEAVE), rope_from_deepseek, rope_to_deepseek),
        latent("deepseek_v3", deinterleave=True, v_head_dim_nullable=True),
        experts_row("experts", FIRST_DENSE, V3_KEYS, v3_moe, v3_to_hf),
    ),
    defaults={"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
              "num_attention_heads": 128, "num_key_value_heads": 128, "max_position_embeddings": 4096},
)

TENSORS = TensorTable(llama.EDGE_RULES + MLA_RULES + llama.MLP_RULES + llama.PRE_NORM_RULES + MOE_RULES)


# -- llama.cpp (GGUF)
KV_B_PARTS = ("k_nope", "v_head")  # each head's rows of DeepSeek's kv_b: its no-RoPE key, then its value


def _deepseek2_table() -> TensorTable:
    """llama.cpp's DeepSeek-V2/V3 (`DeepseekV2Model`) in the layout its loader reads without MLA
    absorption (`attn_kv_b` whole, which export writes), or with it (its converter's files: kv_b as
    `attn_k_b`, each head's k rows transposed, and `attn_v_b`, gathered back on import): q (or q's
    low-rank pair with its norm), kv_a with the rotary key, kv_a's norm, kv_b; dense SwiGLU layers
    first, then stacked experts with shared ones and the selection bias (`exp_probs_b`)."""
    attention = (("attn_q", "attn.q"), ("attn_q_a", "attn.q_a"), ("attn_q_a_norm", "attn.q_a_norm"),
                 ("attn_q_b", "attn.q_b"), ("attn_kv_a_mqa", "attn.kv_a"), ("attn_kv_a_norm", "attn.kv_a_norm"),
                 ("attn_kv_b", "attn.kv_b"), ("attn_output", "attn.o"), ("attn_norm", "attn_norm"),
                 ("ffn_norm", "mlp_norm"), ("ffn_gate", "mlp.gate"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))
    biased = (("attn_q_a", "attn.q_a"), ("attn_kv_a_mqa", "attn.kv_a"), ("attn_output", "attn.o"),
              *((f"ffn_{n}{e}", f"mlp.{s}{n}") for n in ("gate", "up", "down") for e, s in (("", ""),
                                                                                              ("_shexp", "shared."))))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED), Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight"),
        *(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight") for g, c in attention),
        *(Rule(f"blk.{{}}.attn_{n}_b.weight", "layers.{}.attn.kv_b.weight", HeadPart(KV_B_PARTS, (True, False), i))
          for i, n in enumerate("kv")),
        *(Rule(f"blk.{{}}.{g}.bias", f"layers.{{}}.{c}.bias") for g, c in biased),  # llama.cpp loads none: refused
        Rule("blk.{}.exp_probs_b.bias", "layers.{}.mlp.router.selection_bias"),
        *GGUF_MOE_RULES,
    ))


def mla_sizes(config: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek's MLA sizes from llama.cpp's. In the layout without absorption (lmconvert's files,
    `attn_kv_b` whole) the key length is the no-RoPE part plus the rotary width
    (`rope.dimension_count`) and the value length v_head_dim; in the layout of llama.cpp's converter
    (absorbed MLA: `attn_k_b`, `attn_v_b`) those are the latent's (kv_lora_rank plus the rotary width,
    kv_lora_rank) with one KV head (its MQA cache), and the heads' own are `key_length_mla` and
    `value_length_mla`. transformers' head_dim is the rotary width. llama.cpp scales the chosen experts'
    weights only by an `expert_weights_scale` other than 0 (and 1)."""
    rotary, heads = config["qk_rope_head_dim"], config["num_attention_heads"]
    sizes: dict[str, Any] = {"qk_nope_head_dim": config["head_dim"] - rotary, "head_dim": rotary}
    if "key_length_mla" in config or "value_length_mla" in config:
        latent = (config.get("kv_lora_rank", 0) + rotary, config.get("kv_lora_rank"), 1)
        if {"key_length_mla", "value_length_mla"} - set(config) or \
                (config["head_dim"], config.get("v_head_dim"), config["num_key_value_heads"]) != latent:
            raise MappingError("its deepseek2 MLA sizes (attention.key_length_mla, value_length_mla, key_length, "
                               "value_length, head_count_kv) are not those llama.cpp's converter writes together")
        sizes = {"qk_nope_head_dim": config["key_length_mla"] - rotary, "head_dim": rotary,
                 "v_head_dim": config["value_length_mla"], "num_key_value_heads": heads}
    if config.get("routed_scaling_factor") == 0:
        sizes["routed_scaling_factor"] = 1.0
    return sizes


def expert_groups(config: Mapping[str, Any], arch: str = "deepseek2") -> tuple[int, Any]:
    """(expert groups, groups used), refused where llama.cpp's loader asserts (for every `arch`): it
    takes grouping to keep fewer groups than there are."""
    groups, used = config.get("n_group") or 1, config.get("topk_group")
    if groups > 1 and used is not None and used >= groups:
        raise MappingError(f"llama.cpp's {arch} loader requires expert_group_used_count below expert_group_count "
                           f"(it aborts otherwise), and this model uses {used} of {groups} expert groups")
    return groups, used


def _deepseek_v3(config: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3's router: llama.cpp's sigmoid scores (`expert_gating_func` 2), with the selection
    bias and groups scored by their two best experts, as DeepseekV3TopkRouter."""
    if config.get("expert_gating_func") != 2:
        raise MappingError(f"deepseek2.expert_gating_func={config.get('expert_gating_func')}: lmconvert reads "
                           "llama.cpp's softmax router (1, DeepSeek-V2's) and its sigmoid one (2, DeepSeek-V3's)")
    expert_groups(config)
    return mla_sizes(config)


def _deepseek_v2(config: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek-V2's router: llama.cpp's softmax scores (`expert_gating_func` 1, or none stated),
    the top k taken unrenormalised and scaled, as DeepseekV2TopkRouter's `greedy`. Its
    `group_limited_greedy` scores a group by its best expert, llama.cpp by its two best experts'
    sum: the same only when every group is kept, which llama.cpp's loader does not take."""
    if config.get("norm_topk_prob"):
        raise MappingError("deepseek2.expert_weights_norm=true with softmax routing (expert_gating_func 1): "
                           "DeepSeek-V2 never renormalises the chosen experts' weights")
    groups, used = expert_groups(config)
    if groups > 1:
        raise MappingError(f"softmax routing limited to {used} of {groups} expert groups: llama.cpp's deepseek2 "
                           "scores a group by the sum of its two best experts, DeepSeek-V2's group_limited_greedy by "
                           "its best one, so they choose different experts")
    return {**mla_sizes(config), "topk_method": "greedy", "n_group": None, "topk_group": None}


# the `{arch}.` keys of llama.cpp's deepseek2 (MLA, and its MoE keys)
DEEPSEEK2_KEYS = {
    "attention.q_lora_rank": "q_lora_rank", "attention.kv_lora_rank": "kv_lora_rank",
    "attention.value_length": "v_head_dim", "rope.dimension_count": "qk_rope_head_dim",
    "attention.key_length_mla": "key_length_mla", "attention.value_length_mla": "value_length_mla",
    "leading_dense_block_count": "first_k_dense_replace", "expert_count": "n_routed_experts",
    "expert_used_count": "num_experts_per_tok", "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_count": "n_shared_experts", "expert_weights_scale": "routed_scaling_factor",
    "expert_weights_norm": "norm_topk_prob", "expert_group_count": "n_group", "expert_group_used_count": "topk_group",
    "expert_gating_func": "expert_gating_func"}
# DeepSeek-V3's router as llama.cpp's other architectures that run it state it (dots1, glm4moe): the
# deepseek2 keys but MLA's, and what its loader assumes where a file leaves one out
V3_ROUTER_KEYS = {k: v for k, v in DEEPSEEK2_KEYS.items() if not k.startswith(("attention.", "rope."))}
V3_ROUTER_DEFAULTS = {"norm_topk_prob": False, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1}
SIGMOID = 2  # llama.cpp's expert_gating_func for sigmoid scores (LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID)
V3_ROUTER_RULES = (*GGUF_MOE_RULES, Rule("blk.{}.exp_probs_b.bias", "layers.{}.mlp.router.selection_bias"),
                   # their loaders read none: refused (loaders.py)
                   *(Rule(f"blk.{{}}.ffn_{n}_shexp.bias", f"layers.{{}}.mlp.shared.{n}.bias")
                     for n in ("gate", "up", "down")))


def v3_router(config: Mapping[str, Any], arch: str) -> None:
    """Refuses a file of `arch` whose router is not DeepSeek-V3's (sigmoid scores; groups scored by
    their two best experts, fewer kept than there are, as llama.cpp's loader asserts)."""
    if config.get("expert_gating_func") != SIGMOID:
        raise MappingError(f"{arch}.expert_gating_func={config.get('expert_gating_func')}: this router takes sigmoid "
                           f"scores ({SIGMOID})")
    expert_groups(config, arch)


# what llama.cpp assumes when a deepseek2 file leaves a key out: no q LoRA, no renormalising, no groups, no scale
DEEPSEEK2_DEFAULTS = {"hidden_act": "silu", "q_lora_rank": None, "norm_topk_prob": False, "n_group": 1,
                      "topk_group": 1, "routed_scaling_factor": 1.0}
# DeepSeek-V3 (dense or MoE), interleaved RoPE (llama.cpp's rope type for deepseek2), MLA in llama.cpp's
# layout without absorption; DeepSeek-V2 the same with its softmax router (its RoPE always interleaved)
DEEPSEEK_V3 = written("deepseek_v3", arch="deepseek2", stated=STATES_VOCAB_AND_ROPE,
                      omitted={"expert_weights_norm": False}, keys=DEEPSEEK2_KEYS,
                      defaults={**DEEPSEEK2_DEFAULTS, "rope_interleave": True},
                       latent=True, table=_deepseek2_table(), derived=_deepseek_v3,
                      # llama.cpp's deepseek2 loader requires the expert keys of a dense model too (its converter: the
                      # dense width, no shared experts), and with experts stated, at least one used (dense V2
                      # states none)
                      unstated={"moe_intermediate_size": lambda config: config["intermediate_size"],
                                "n_shared_experts": lambda config: 0, "num_experts_per_tok": lambda config: 1})
DEEPSEEK_V2 = replace(DEEPSEEK_V3, model_type="deepseek_v2", defaults=DEEPSEEK2_DEFAULTS, derived=_deepseek_v2)
# another model type llama.cpp runs as deepseek2 with DeepSeek-V3's router (or none: dense), told apart by
# a word of its general.name (the family's GGUF entry), its sigmoid scores stated
def runs_as_v3(model_type: str, word: str, **facts: Any) -> GgufArch:  # noqa: ANN401 - GgufArch's fields
    return replace(DEEPSEEK_V3, model_type=model_type, named=word, constants={"expert_gating_func": SIGMOID}, **facts)


# llama.cpp's loader takes a file stating no gating function as DeepSeek-V2's (softmax)
GGUF_DEEPSEEK2 = replace(DEEPSEEK_V3, told_apart=(("expert_gating_func", 2, DEEPSEEK_V3),
                                                      ("expert_gating_func", 1, DEEPSEEK_V2),
                                                      ("expert_gating_func", None, DEEPSEEK_V2)), arch="deepseek2")


# DeepseekV3Attention: kv_b_proj on the latent viewed as (B, 1, T, C) in `expand_kv`, as ours;
# DeepseekV3MoE runs the shared experts on the unflattened input
REFERENCE_LAYOUTS = {**LATENT, **SHARED_UNFLATTENED}

FAMILY = Family("deepseek_v3", ("deepseek_v3",), "DeepseekV3ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_DEEPSEEK2,),
                reference_layouts=REFERENCE_LAYOUTS)
