"""OLMo-hybrid (OlmoHybridForCausalLM).

Same as olmo2, except: a hybrid stack, `layer_types` naming each layer "linear_attention" or
"full_attention" (absent: every fourth layer attends, the last one when none would; transformers
refuses a stack without either kind, and so does the import); a linear layer is a gated delta-net
(`mixer="gated_deltanet"`) whose tensors are named otherwise (q_proj, k_proj, v_proj joined into our
in_proj_qkv, and q_conv1d, k_conv1d, v_conv1d into our conv1d, as the Hub's files and transformers'
save hold them; g_proj, b_proj, a_proj, o_norm, o_proj for in_proj_z, in_proj_b, in_proj_a, norm,
out_proj), whose sizes default to what OlmoHybridConfig derives (`linear_num_key_heads` and
`linear_num_value_heads` the attention heads, `linear_key_head_dim` int(0.75 x hidden / key heads),
`linear_value_head_dim` twice that), whose beta may double (`linear_allow_neg_eigval`, default true:
2 sigmoid(b)), and whose output norm's eps is 1e-5 whatever `rms_norm_eps` says (FLA's
FusedRMSNormGated); and is pre-norm (`mixer_norm_placement="pre"`), while the attention layers keep OLMo 2's output
norms. The files (the Hub's, and transformers' save) name a layer's norms `attention_layer_norm`,
`feedforward_layer_norm` and `post_feedforward_layernorm` (transformers renames the first two
input_layernorm and post_attention_layernorm on load), so `feedforward_layer_norm` is a gated
delta-net layer's norm before the MLP and an attention layer's norm after attention: the table is
per config (`layout`).
`rms_norm_eps` defaults to 1e-6, attention has no head_dim key, and the MLP no bias. The
initialisation ranges (`linear_a_log_min`, `linear_dt_min`, ...) shape nothing and are not read.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import fixed
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Joined
from . import llama, olmo2, qwen3_next

LINEAR = qwen3_next.LINEAR
RENAMED = (("g_proj", "in_proj_z"), ("b_proj", "in_proj_b"), ("a_proj", "in_proj_a"), ("o_norm", "norm"),
           ("o_proj", "out_proj"))
QKV = ("mixer.key_dim", "mixer.key_dim", "mixer.values")
GDN_RULES = (
    *(Rule(f"{LINEAR}.{n}", f"layers.{{}}.mixer.{n}") for n in ("dt_bias", "A_log")),
    *(Rule(f"{LINEAR}.{theirs}.weight", f"layers.{{}}.mixer.{ours}.weight") for theirs, ours in RENAMED),
    *(Rule(f"{LINEAR}.{n}_proj.weight", "layers.{}.mixer.in_proj_qkv.weight", Joined(QKV, i))
      for i, n in enumerate("qkv")),
    # transformers' save writes the conv as three equal parts (the Hub's files: q | k | v): read either, write its
    *(Rule(f"{LINEAR}.{n}_conv1d.weight", "layers.{}.mixer.conv1d.weight", Joined(QKV, i, even=True))
      for i, n in enumerate("qkv")),
    Rule(f"{LINEAR}.conv1d.weight", "layers.{}.mixer.conv1d.weight"),  # transformers' own, joined on load
)
BASE_RULES = llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + llama.QK_NORM_RULES + GDN_RULES \
    + qwen3_next.MTP_RULES
# each layer's two norms as the files name them (transformers renames them on load and back on save):
# `feedforward_layer_norm` is a gated delta-net layer's norm before the MLP, an attention layer's after attention
# (after them, transformers' own names, which verify finds its modules by and a file may hold)
PRE_NORMS = (("attention_layer_norm", "attn_norm"), ("feedforward_layer_norm", "mlp_norm"),
             ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm"))
OUTPUT_NORMS = (("feedforward_layer_norm", "attn_post_norm"), ("post_feedforward_layernorm", "mlp_post_norm"),
                ("post_attention_layernorm", "attn_post_norm"))
# without a config: every layer read as an attention layer
TENSORS = TensorTable(BASE_RULES + tuple(Rule(f"model.layers.{{}}.{theirs}.weight", f"layers.{{}}.{ours}.weight")
                                         for theirs, ours in OUTPUT_NORMS))


def layout(arch: ArchConfig) -> TensorTable:
    """The norms of each layer by its kind: a gated delta-net layer's pre-norms, an attention layer's output norms."""
    norms = tuple(Rule(f"model.layers.{i}.{theirs}.weight", f"layers.{i}.{ours}.weight")
                  for i, mixing in enumerate(arch.layer_mixers)
                  for theirs, ours in (PRE_NORMS if mixing == "mixer" else OUTPUT_NORMS))
    return TensorTable(BASE_RULES + norms)


GDN_KEYS = (Key("layer_types", list, None, nullable=True), Key("linear_conv_kernel_dim", int, 4),
            *(Key(key, int, None, nullable=True) for key in ("linear_num_key_heads", "linear_num_value_heads",
                                                            "linear_key_head_dim", "linear_value_head_dim")),
            Key("linear_allow_neg_eigval", bool, True))


def default_types(_: HfConfig, n: int) -> list[str]:
    """OlmoHybridConfig.__post_init__ without layer_types: every fourth layer attends (the last when none would)."""
    types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


def settings_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """The sizes as OlmoHybridConfig derives the absent ones; the output norm's eps fixed at 1e-5."""
    key_heads = hf.get("linear_num_key_heads") or fields["n_heads"]
    key_dim = hf.get("linear_key_head_dim") or int(0.75 * fields["d_model"] / key_heads)
    return {"key_heads": key_heads, "value_heads": hf.get("linear_num_value_heads") or fields["n_heads"],
            "key_head_dim": key_dim, "value_head_dim": hf.get("linear_value_head_dim") or 2 * key_dim,
            "conv_kernel": hf.get("linear_conv_kernel_dim"), "neg_eigval": hf.get("linear_allow_neg_eigval"),
            "norm_eps": 1e-5, "activation": fields["activation"]}


def settings_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    s = cfg.mixer_settings
    return {**qwen3_next.qwen_settings_to_hf(cfg), "linear_allow_neg_eigval": s.neg_eigval}


def read_schedule(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    read = SCHEDULE_ROW.read(hf, fields)
    mixers = read.get("layer_mixers", ())
    if "mixer" not in mixers or "attention" not in mixers:
        raise MappingError("config.json: layer_types: OLMo-hybrid needs at least one linear_attention and one "
                           "full_attention layer (OlmoHybridConfig refuses any other stack)")
    return {**read, "mixer_norm_placement": "pre"}


SCHEDULE_ROW = qwen3_next.gated_deltanet(GDN_KEYS, default_types, settings_from_hf, settings_to_hf)
SCHEDULE = type(SCHEDULE_ROW)(SCHEDULE_ROW.name, GDN_KEYS, read_schedule, SCHEDULE_ROW.write)

CONFIG = olmo2.CONFIG.but(
    add=(llama.norm(1e-6, dtype_order="scale_then_cast"), SCHEDULE,
         fixed("output norms", norm_placement="output", qk_norm="projection")),
    nullable={"attention_dropout": True},
    defaults={"vocab_size": 100352, "hidden_size": 3840, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 30, "max_position_embeddings": 65536},
)

FAMILY = Family("olmo_hybrid", ("olmo_hybrid",), "OlmoHybridForCausalLM", TENSORS, CONFIG, layout=layout,
                reference_layouts=olmo2.REFERENCE_LAYOUTS)
