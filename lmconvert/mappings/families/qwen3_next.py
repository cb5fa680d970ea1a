"""Qwen3-Next (Qwen3-Next-80B-A3B).

Same as qwen2_moe, except: a hybrid stack, `layer_types` naming each layer "linear_attention" or
"full_attention" (absent: every `full_attention_interval`-th layer attends, default 4); a linear
layer's token mixer is the gated delta-net (`mixer="gated_deltanet"`, arch/gated_deltanet.py: sizes
`linear_num_key_heads`, `linear_num_value_heads`, `linear_key_head_dim`, `linear_value_head_dim`,
conv width `linear_conv_kernel_dim`, its output norm's eps `rms_norm_eps`, the conv's activation
`hidden_act`), whose projections are stored fused per key head: `in_proj_qkvz` holds, for each key
head, its q, k and the v and z of the value heads it serves, `in_proj_ba` their b and a (split into
our in_proj_qkv, in_proj_z, in_proj_b, in_proj_a on import, joined back on export: `Groups` then
`Piece`); the attention's q_proj emits each head's query and a sigmoid output gate
(`attn_output_gate="q_heads"`), a per-head QK norm before RoPE, and RoPE rotates
`partial_rotary_factor` (default 0.25) of each head; every RMSNorm but the gated one multiplies by
(1 + w) in fp32 (zero-centred weights, as Gemma's); `attention_bias` switches the q, k, v and o
biases; head_dim defaults to 256; the experts' top-k weights renormalise by default
(`norm_topk_prob` true), `num_experts` 0 makes every FFN dense, and there is no sliding window. The
multi-token-prediction head (`mtp.*`) is left out, as transformers leaves it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.gguf import QWEN_MOE_KEYS, GgufArch, tensor_table
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import layer_mixers_from_types
from ..tables.hf_moe import expert_rules, experts
from ..tables.hf_rope import rope
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import Rule, TensorTable
from ..tables.transforms import NEG_EXP, Chain, Groups, Offset, Piece
from . import lfm2, llama, qwen2_moe

if TYPE_CHECKING:
    pass

LINEAR = "model.layers.{}.linear_attn"
# the gated delta-net's tensors that every family stores under our names (Qwen3.5's layout)
GDN_RULES = tuple(Rule(f"{LINEAR}.{n}", f"layers.{{}}.mixer.{n}")
                  for n in ("dt_bias", "A_log", "conv1d.weight", "norm.weight", "out_proj.weight"))
# per key head: its q and k rows, then the v and z rows of the value heads it serves (b and a: one row each)
QKVZ = Groups("mixer.key_heads", ("mixer.key_head_dim", "mixer.key_head_dim", "mixer.values_per_key",
                                  "mixer.values_per_key"))
BA = Groups("mixer.key_heads", ("mixer.heads_per_key", "mixer.heads_per_key"))
FUSED_GDN_RULES = (
    *(Rule(f"{LINEAR}.in_proj_qkvz.weight", f"layers.{{}}.mixer.{ours}.weight",
           Chain(QKVZ, Piece(("mixer.qkv", "mixer.values"), i)))
      for i, ours in enumerate(("in_proj_qkv", "in_proj_z"))),
    *(Rule(f"{LINEAR}.in_proj_ba.weight", f"layers.{{}}.mixer.{ours}.weight",
           Chain(BA, Piece(("mixer.value_heads", "mixer.value_heads"), i)))
      for i, ours in enumerate(("in_proj_b", "in_proj_a"))),
)
MTP_RULES = (Rule("mtp.*", None),)  # the multi-token-prediction head, which transformers does not load
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + llama.PRE_NORM_RULES
                      + llama.QK_NORM_RULES + expert_rules("mlp", ("gate_proj", "up_proj", "down_proj"), "gate")
                      + qwen2_moe.SHARED_RULES + GDN_RULES + FUSED_GDN_RULES + MTP_RULES)


LAYER_TYPES = {"full_attention": "attention", "linear_attention": "mixer"}
GDN_KEYS = (Key("layer_types", list, None, nullable=True), Key("full_attention_interval", int, 4, legacy=True),
            Key("linear_conv_kernel_dim", int, 4), Key("linear_key_head_dim", int, 128),
            Key("linear_value_head_dim", int, 128), Key("linear_num_key_heads", int, 16),
            Key("linear_num_value_heads", int, 32))
SIZE_KEYS = {"key_heads": "linear_num_key_heads", "value_heads": "linear_num_value_heads",
             "key_head_dim": "linear_key_head_dim", "value_head_dim": "linear_value_head_dim",
             "conv_kernel": "linear_conv_kernel_dim"}


def interval_types(hf: HfConfig, n: int) -> list[str]:
    """Qwen3NextConfig.__post_init__ without layer_types: every full_attention_interval-th layer attends."""
    every = hf.get("full_attention_interval")
    return ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]


def gated_deltanet(keys: tuple[Key, ...], default_types: Callable[[HfConfig, int], list[str]],
                   settings: Callable[[HfConfig, dict[str, Any]], dict[str, Any]],
                   settings_to_hf: Callable[[ArchConfig], dict[str, Any]]) -> Entry:
    """The layer schedule and the gated delta-net's settings, one row: `layer_types` (absent:
    `default_types`), each "linear_attention" layer a gated delta-net of `settings`; a stack without
    one reads as plain attention. Export writes a mixer other than the gated delta-net's layers as
    attention, so it is refused by name."""

    def read(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
        n = fields["n_layers"]
        types = hf.get("layer_types")
        mixers = layer_mixers_from_types(default_types(hf, n) if types is None else types, n, LAYER_TYPES)
        if "mixer" not in mixers:
            return {}
        return {"mixer": "gated_deltanet", "layer_mixers": mixers, "mixer_settings": settings(hf, fields)}

    def write(cfg: ArchConfig) -> dict[str, Any]:
        gdn = cfg.mixer == "gated_deltanet"
        types = ["linear_attention" if gdn and m == "mixer" else "full_attention" for m in cfg.layer_mixers]
        written = settings_to_hf(cfg) if gdn else {key: DEFAULT for key in SIZE_KEYS.values()}
        return {"layer_types": types, **written}

    return Entry("layer schedule", keys, read, write)


def qwen_settings(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """The sizes, the output norm's eps (rms_norm_eps) and the conv's activation (hidden_act)."""
    return {**{ours: hf.get(key) for ours, key in SIZE_KEYS.items()}, "norm_eps": fields["norm"].eps,
            "activation": fields["activation"]}


def qwen_settings_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The sizes; the eps and the activation are the model's (a mixer whose differ reads back otherwise)."""
    s = cfg.mixer_settings
    return {key: getattr(s, ours) for ours, key in SIZE_KEYS.items()}


SCHEDULE = gated_deltanet(GDN_KEYS, interval_types, qwen_settings, qwen_settings_to_hf)

_EXPERTS = experts(Key("num_experts", int, 512, bound="non_negative"), Key("num_experts_per_tok", int, 10),
                   width=Key("moe_intermediate_size", int, 512), norm_key=Key("norm_topk_prob", bool, True),
                   shared_width=Key("shared_expert_intermediate_size", int, 512),
                   sparse_step=Key("decoder_sparse_step", int, 1),
                   dense_list=Key("mlp_only_layers", list, None, nullable=True), shared="gated", aux_default=0.001)
# num_experts 0: every FFN dense (Qwen3NextDecoderLayer builds a mixture only where num_experts > 0)
EXPERTS = Entry("experts", _EXPERTS.keys,
                lambda hf, fields: {} if hf.get("num_experts") == 0 else _EXPERTS.read(hf, fields),
                lambda cfg: {**dict.fromkeys((k.name for k in _EXPERTS.keys), DEFAULT), "num_experts": 0,
                              "mlp_only_layers": []}
                if cfg.moe is None else _EXPERTS.write(cfg))

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(llama.norm(1e-6, weight_offset=1.0, dtype_order="scale_then_cast"), rope(partial=True),
         fixed("gated attention", qk_norm="head", attn_output_gate="q_heads"), SCHEDULE, EXPERTS),
    defaults={"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48,
              "num_attention_heads": 16, "num_key_value_heads": 2, "max_position_embeddings": 32768,
              "head_dim": 256, "partial_rotary_factor": 0.25},
    nullable={"head_dim": False, "num_key_value_heads": False, "attention_dropout": False},
)


# q_norm(query.view(B, T, -1, D)), transposed afterwards; q_proj emits each head's query and gate
REFERENCE_LAYOUTS = {**QK_NORM_PER_HEAD, "attn.q": "B T H*QG"}

# -- llama.cpp (GGUF): its qwen3next architecture (Qwen3NextModel in llama.cpp's converter). Every norm but the
# gated delta-net's is stored as 1 + w (Offset), the post-attention norm as `post_attention_norm`, the shared
# expert's gate as the [1, hidden] matrix it is (llama.cpp's converter keeps it so here; qwen2moe's is a vector);
# q_proj's rows (each head's query, then its gate) and q/k (NeoX rotation) unchanged. The delta-net: in_proj_qkvz
# split into `attn_qkv` ([all q | all k | all v], our in_proj_qkv) and `attn_gate` (our in_proj_z), in_proj_ba
# kept grouped per key head (`ssm_ba`), the conv squeezed to [channels, kernel], dt_bias as `ssm_dt.bias`, A_log
# as `ssm_a` = -exp(A_log) (transforms.NEG_EXP, as llama.cpp's converter computes it; read back as log(-ssm_a):
# not bit for bit in general), the gated norm as
# `ssm_norm`. Metadata: the `ssm.` sizes (state_size the key head size: llama.cpp's loader takes the value heads
# as wide, so a model whose differ is refused by name), the schedule as `attention.recurrent_layers`. llama.cpp
# runs experts on every layer, renormalised, and no o bias.


GDN_GGUF_RULES = (
    Rule("blk.{}.attn_qkv.weight", "layers.{}.mixer.in_proj_qkv.weight"),
    Rule("blk.{}.attn_gate.weight", "layers.{}.mixer.in_proj_z.weight"),
    Rule("blk.{}.ssm_conv1d.weight", "layers.{}.mixer.conv1d.weight", lfm2.CONV_2D),
    Rule("blk.{}.ssm_dt.bias", "layers.{}.mixer.dt_bias"),
    Rule("blk.{}.ssm_a", "layers.{}.mixer.A_log", NEG_EXP),
    Rule("blk.{}.ssm_norm.weight", "layers.{}.mixer.norm.weight"),
    Rule("blk.{}.ssm_out.weight", "layers.{}.mixer.out_proj.weight"),
)
SSM_BA = tuple(Rule("blk.{}.ssm_ba.weight", f"layers.{{}}.mixer.{ours}.weight",
                    Chain(BA, Piece(("mixer.value_heads", "mixer.value_heads"), i)))
               for i, ours in enumerate(("in_proj_b", "in_proj_a")))


def gguf_table(experts: bool, gdn: tuple[Rule, ...]) -> TensorTable:
    """llama.cpp's qwen3next / qwen35 / qwen35moe tensors: norms as 1 + w, the post-attention norm as
    `post_attention_norm`, and the gated delta-net's `gdn` rules."""
    own = ("blk.{}.ffn_norm.weight", "blk.{}.post_attention_norm.weight", "blk.{}.ffn_gate_inp_shexp.weight")
    kept = tuple(r for r in tensor_table(False, 1.0, True, experts=experts).rules if r.stored not in own)
    return TensorTable((*kept, Rule("blk.{}.post_attention_norm.weight", "layers.{}.mlp_norm.weight", Offset(1.0)),
                        *((Rule("blk.{}.ffn_gate_inp_shexp.weight", "layers.{}.mlp.shared_gate.weight"),)
                          if experts else ()),
                        *gdn))


GDN_GGUF_KEYS = {"ssm.conv_kernel": "linear_conv_kernel_dim", "ssm.state_size": "linear_key_head_dim",
                 "ssm.group_count": "linear_num_key_heads", "ssm.time_step_rank": "linear_num_value_heads",
                 "full_attention_interval": "full_attention_interval",
                 # read as llama.cpp reads them; `derived` makes HF's of them (export writes them: `exported`)
                 "ssm.inner_size": "linear_value_head_dim", "attention.recurrent_layers": "layer_types"}


def schedule_from_gguf(config: Mapping[str, Any]) -> dict[str, Any]:
    """The value head size from ssm.inner_size (over the value heads), the schedule from the recurrent
    flags (absent: every full_attention_interval-th layer attends, as llama.cpp and transformers both say)."""
    out: dict[str, Any] = {}
    if config.get("linear_value_head_dim") is not None:
        out["linear_value_head_dim"] = config["linear_value_head_dim"] // config["linear_num_value_heads"]
    flags = config.get("layer_types")
    if flags is not None:
        out["layer_types"] = ["linear_attention" if flag else "full_attention" for flag in flags]
    return out


def schedule_to_gguf(config: Mapping[str, Any]) -> dict[str, Any]:
    """ssm.inner_size, and one recurrent flag per layer where config.json names the layers (it does, as
    transformers writes it)."""
    if config["linear_value_head_dim"] != config["linear_key_head_dim"]:
        raise MappingError("llama.cpp's qwen3next, qwen35 and qwen35moe load the gated delta-net's value heads as "
                           f"wide as its key heads (ssm.state_size), and this model's are "
                           f"{config['linear_value_head_dim']} and {config['linear_key_head_dim']} wide")
    types = config.get("layer_types")
    return {"ssm.inner_size": config["linear_value_head_dim"] * config["linear_num_value_heads"],
            **({"attention.recurrent_layers": [t == "linear_attention" for t in types]} if types else {})}


GGUF_QWEN3NEXT = GgufArch(
    "qwen3_next", arch="qwen3next",
    keys={**QWEN_MOE_KEYS, "expert_shared_feed_forward_length": "shared_expert_intermediate_size", **GDN_GGUF_KEYS},
    defaults={"norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []},
    unstated={"full_attention_interval": lambda _: 4}, derived=schedule_from_gguf, exported=schedule_to_gguf,
    table=gguf_table(True, GDN_GGUF_RULES + SSM_BA), partial_rotary=True, experts=True,
    stated=frozenset({"rope.dimension_count"}))

FAMILY = Family("qwen3_next", ("qwen3_next",), "Qwen3NextForCausalLM", TENSORS, CONFIG,
                gguf=(GGUF_QWEN3NEXT,), reference_layouts=REFERENCE_LAYOUTS)
