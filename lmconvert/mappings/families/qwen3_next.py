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

from collections.abc import Callable
from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import layer_mixers_from_types
from ..tables.hf_moe import expert_rules, experts
from ..tables.hf_rope import rope
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Chain, Groups, Piece
from . import llama, qwen2_moe

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

NO_GGUF = ("lmconvert does not write llama.cpp's qwen3next architecture yet: its gated delta-net tensors (ssm_a "
           "as -exp(A_log), dt_proj.bias, the squeezed conv, ssm_ba), recurrent-layer schedule and norms stored "
           "as 1 + w are not mapped to llama.cpp's metadata and tensors")

FAMILY = Family("qwen3_next", ("qwen3_next",), "Qwen3NextForCausalLM", TENSORS, CONFIG,
                no_gguf=NO_GGUF, reference_layouts=REFERENCE_LAYOUTS)
