"""Zamba (Zyphra; `ZambaForCausalLM`).

Same as zamba2, except: the mixer is Zamba's multi-head Mamba (`mixer="mamba_heads"`, arch/mamba.py's
MambaHeadsMixer: `n_mamba_heads` heads of `mamba_expand` x hidden_size / heads channels, in_proj's x and z
interleaved, `x_proj_weight`, `dt_proj_weight`, `dt_proj_bias`, `A_log`, `D` per head, `mamba_dt_rank` ("auto":
ceil(hidden_size / 16)), `mamba_d_state`, `mamba_d_conv`, `mamba_conv_bias`, `mamba_proj_bias`, `hidden_mamba_act`
SiLU only; `use_associative_scan` changes nothing outside torch.compile); one shared block (`shared_transf`, tied
across every hybrid layer, stored under the first), no adapters, its FFN's gate and up two projections
(`gate_proj`, `up_proj`); the attention's head_dim `attention_head_dim` (null: 2 x hidden_size / heads; the
`head_dim` spelling too), its width `attention_hidden_size` 2 x hidden_size only, no RoPE; the schedule
`layers_block_type`, or (null) layers 0 and 1 Mamba, 2 hybrid, then hybrid where (i - 3) % `attn_layer_period` ==
`attn_layer_offset`; intermediate_size 14848 by default; no dt clamp.
"""

from __future__ import annotations

import math
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.hf_config import HfConfig, Key, show
from ..tables.table import Rule, TensorTable
from . import llama, mamba2, zamba2

MIXER_PARAMS = ("x_proj_weight", "dt_proj_weight", "dt_proj_bias", "A_log", "D", "in_proj.weight", "in_proj.bias",
                "conv1d.weight", "conv1d.bias", "out_proj.weight", "out_proj.bias")


def layout_table(arch: ArchConfig) -> TensorTable:
    """Zamba's tensors for this schedule: the one block under the first hybrid layer, each hybrid layer's linear."""
    hybrid = () if arch.shared_blocks is None else arch.shared_blocks.layers
    rules = list(zamba2.EDGE_RULES)
    for i in range(arch.n_layers):
        stored = f"model.layers.{i}.mamba_decoder" if i in hybrid else f"model.layers.{i}"
        rules.append(Rule(f"{stored}.input_layernorm.weight", f"layers.{i}.attn_norm.weight"))
        rules += [Rule(f"{stored}.mamba.{p}", f"layers.{i}.mixer.{p}") for p in MIXER_PARAMS]
    if not hybrid:
        return TensorTable(tuple(rules))
    stored, ours = f"model.layers.{hybrid[0]}.shared_transf", "shared_blocks.0"
    rules += [Rule(f"{stored}.input_layernorm.weight", f"{ours}.attn_norm.weight"),
              Rule(f"{stored}.pre_ff_layernorm.weight", f"{ours}.mlp_norm.weight"),
              *(Rule(f"{stored}.self_attn.{p}_proj.weight", f"{ours}.attn.{p}.weight") for p in "qkvo"),
              *(Rule(f"{stored}.feed_forward.{p}_proj.weight", f"{ours}.mlp.{p}.weight")
                for p in ("gate", "up", "down")),
              *(Rule(f"model.layers.{i}.linear.weight", f"layers.{i}.shared.linear.weight") for i in hybrid)]
    refused = tuple((rf"^model\.layers\.{i}\.shared_transf\.",
                     f"a copy of the shared block under a later hybrid layer ({i}), which save_pretrained leaves out: "
                     "transformers ties it only where it equals the first caller's and runs it untied otherwise, and "
                     "lmconvert holds the block once; where the copies equal the first caller's, remove them from "
                     "the file (as save_pretrained does)") for i in hybrid[1:])
    return TensorTable(tuple(rules), refused=refused)


TENSORS = TensorTable((*zamba2.EDGE_RULES, Rule("model.layers.{}.input_layernorm.weight", "layers.{}.attn_norm.weight"),
                       *mamba2.mixer_rules("model.layers.{}.mamba", MIXER_PARAMS)))


MIXER_KEYS = (Key("n_mamba_heads", int, 2), Key("mamba_expand", int, 2), Key("mamba_d_state", int, 16),
              Key("mamba_d_conv", int, 4), Key("mamba_dt_rank", int, "auto"), Key("mamba_conv_bias", bool, True),
              Key("mamba_proj_bias", bool, False), mamba2.silu_only("hidden_mamba_act"))


def mixer_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    d, heads, expand = fields["d_model"], hf.get("n_mamba_heads"), hf.get("mamba_expand")
    if (expand * d) % heads:
        raise MappingError(f"config.json: mamba_expand={expand} x hidden_size={d} does not split into n_mamba_heads="
                           f"{heads} heads, as ZambaConfig requires; fix the sizes")
    rank = math.ceil(d / 16) if not hf.stated("mamba_dt_rank") else hf.get("mamba_dt_rank")  # "auto" when absent
    return {"mixer": "mamba_heads", "mixer_settings": {
        "n_heads": heads, "d_inner": expand * d, "d_state": hf.get("mamba_d_state"), "dt_rank": rank,
        "conv_kernel": hf.get("mamba_d_conv"), "conv_bias": hf.get("mamba_conv_bias"),
        "proj_bias": hf.get("mamba_proj_bias")}}


def mixer_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    s = cfg.mixer_settings if cfg.mixer == "mamba_heads" else None
    if s is None:
        return {}
    return {**zamba2.sizes_to_hf(cfg), "mamba_dt_rank": s.dt_rank, "mamba_conv_bias": s.conv_bias,
            "mamba_proj_bias": s.proj_bias, "hidden_mamba_act": s.activation}


SCHEDULE_KEYS = (Key("layers_block_type", list, None, nullable=True), Key("attn_layer_period", int, 6),
                 Key("attn_layer_offset", int, 4, bound="non_negative"),
                 Key("attention_head_dim", int, None, nullable=True), Key("head_dim", int, None, legacy=True),
                 Key("attention_hidden_size", int, None, nullable=True))


def schedule_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Every layer Zamba's Mamba, the hybrid ones calling the one shared block; no positions."""
    n, d, heads = fields["n_layers"], fields["d_model"], fields["n_heads"]
    types = hf.get("layers_block_type")
    if types is None:
        period, offset = hf.get("attn_layer_period"), hf.get("attn_layer_offset")
        types = ["mamba", "mamba", "hybrid"] + ["hybrid" if i % period == offset else "mamba" for i in range(n - 3)]
    odd = [t for t in types if t not in (*zamba2.MIXER_TYPES, "hybrid")]
    if odd or len(types) != n:
        raise MappingError(f"config.json: layers_block_type={show(types)} should name each of the num_hidden_layers="
                           f"{n} layers 'hybrid', 'mamba' or 'linear_attention'; fix the list")
    width = hf.get("attention_hidden_size")
    if width is not None and width != 2 * d:
        raise MappingError(f"config.json: attention_hidden_size={width} is not 2 x hidden_size={2 * d}, the width of "
                           "the concatenation Zamba's shared block reads; remove the key")
    head_dim = hf.get("attention_head_dim") or (hf.get("head_dim") if hf.stated("head_dim") else None) \
        or 2 * d // heads
    hybrid = tuple(i for i, t in enumerate(types) if t == "hybrid")
    blocks = {"n_blocks": 1, "layers": hybrid, "adapter_rank": None, "fused_gate_up": False} if hybrid else None
    return {"layer_mixers": ("mixer",) * n, "layer_ffns": ("none",) * n, "shared_blocks": blocks,
            "head_dim": head_dim, "attn_scale": (head_dim / 2) ** -0.5, "layer_positions": ("none",) * n}


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    hybrid = () if cfg.shared_blocks is None else cfg.shared_blocks.layers
    return {"layers_block_type": ["hybrid" if i in hybrid else "linear_attention" for i in range(cfg.n_layers)],
            "attn_layer_period": DEFAULT, "attn_layer_offset": DEFAULT, "attention_head_dim": cfg.head_dim,
            "attention_hidden_size": 2 * cfg.d_model}


CONFIG = llama.CONFIG.but(
    drop=("head_dim", "attention_bias", "mlp_bias", "rope"),
    add=(llama.norm(1e-5), llama.activation("hidden_act", "gelu"),
         Entry("mixer", MIXER_KEYS, mixer_from_hf, mixer_to_hf),
         Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf)),
    defaults={"vocab_size": 32000, "hidden_size": 3712, "intermediate_size": 14848, "num_hidden_layers": 76,
              "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 4096,
              "tie_word_embeddings": True},
    nullable={"attention_dropout": False, "num_key_value_heads": False},
)

NO_GGUF = "llama.cpp has no Zamba architecture (its converter reads no zamba model)"
FAMILY = Family("zamba", ("zamba",), "ZambaForCausalLM", TENSORS, CONFIG, layout=layout_table, no_gguf=NO_GGUF)
