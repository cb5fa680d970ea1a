"""Jamba (AI21; `JambaForCausalLM`).

Same as llama, except: a hybrid stack, layer i attending where i % `attn_layer_period` ==
`attn_layer_offset` and running Mamba's selective scan otherwise (`mixer="mamba"`, arch/mamba.py, its
dt, B and C RMS-normed with weights, `bc_dt_norm="weighted"`, eps `rms_norm_eps`; tensors
`model.layers.{i}.mamba.*`; width `mamba_expand` x hidden_size, state `mamba_d_state`, conv
`mamba_d_conv`, dt rank `mamba_dt_rank` ("auto": ceil(hidden_size / 16)), `mamba_proj_bias`,
`mamba_conv_bias`); attention has no positions (no RoPE) and no biases; layer i's FFN is a mixture of
`num_experts` SwiGLU experts where i % `expert_layer_period` == `expert_layer_offset`, else dense
(`feed_forward.{gate,up,down}_proj`); the router (`feed_forward.router`) takes the top
`num_experts_per_tok` of the fp32 softmax, unnormalised, cast to the activation dtype; head_dim
is read where stated (JambaAttention takes it if the config has it); norms
`input_layernorm` / `pre_ff_layernorm`, final `final_layernorm`, eps default 1e-6; 262144 positions.
`use_mamba_kernels`, `use_mambapy`, `use_associative_scan` pick kernels (the torch path is the same),
the auxiliary-loss keys act in training only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.gguf import MOE_RULES, tensor_table, written
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import experts
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Unstack
from . import bamba, llama, mamba, mamba2

FFN = "model.layers.{}.feed_forward"
EXPERT_RULES = (
    Rule(f"{FFN}.router.weight", "layers.{}.mlp.router.weight"),
    *(Rule(f"{FFN}.experts.{{}}.{n}_proj.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight")
      for n in ("gate", "up", "down")),
    # transformers 5's own layout
    Rule(f"{FFN}.experts.gate_up_proj", "layers.{}.mlp.experts.{}.gate.weight", Unstack(part=0, parts=2)),
    Rule(f"{FFN}.experts.gate_up_proj", "layers.{}.mlp.experts.{}.up.weight", Unstack(part=1, parts=2)),
    Rule(f"{FFN}.experts.down_proj", "layers.{}.mlp.experts.{}.down.weight", Unstack()),
)
JAMBA_MAMBA = mamba.MAMBA_PARAMS + ("dt_layernorm.weight", "b_layernorm.weight", "c_layernorm.weight")
TENSORS = TensorTable(bamba.EDGE_RULES + llama.ATTENTION_RULES + bamba.NORM_RULES + bamba.FFN_RULES + EXPERT_RULES
                      + mamba2.mixer_rules("model.layers.{}.mamba", JAMBA_MAMBA))


def periodic(n: int, period: int, offset: int) -> list[int]:
    return [i for i in range(n) if i % period == offset]


def period_of(layers: list[int], n: int) -> tuple[Any, Any]:
    """The (period, offset) whose layers are `layers`, the longest period where several give them (one layer
    of four: 4 and 2, not 3 and 2); DEFAULT for both where none does: export refuses."""
    if not layers:  # a period longer than the stack
        return n + 1, n
    for period in range(n, 0, -1):
        for offset in range(period):
            if periodic(n, period, offset) == layers:
                return period, offset
    return DEFAULT, DEFAULT


ATTN_KEYS = (Key("attn_layer_period", int, 8), Key("attn_layer_offset", int, 4, bound="non_negative"))


def schedule_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n, period, offset = fields["n_layers"], hf.get("attn_layer_period"), hf.get("attn_layer_offset")
    if offset >= period:
        raise MappingError(f"config.json: attn_layer_offset={offset} must be smaller than attn_layer_period={period}")
    attending = periodic(n, period, offset)
    return {"layer_mixers": tuple("attention" if i in attending else "mixer" for i in range(n)),
            "layer_positions": ("none",) * n}


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    period, offset = period_of(cfg.layers_mixed_by("attention"), cfg.n_layers)
    return {"attn_layer_period": period, "attn_layer_offset": offset}


BASE_EXPERTS = experts(Key("num_experts", int, 16), Key("num_experts_per_tok", int, 2), norm_topk=False,
                       aux_default=0.001)
EXPERT_KEYS = (Key("expert_layer_period", int, 2), Key("expert_layer_offset", int, 1, bound="non_negative"))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n, period, offset = fields["n_layers"], hf.get("expert_layer_period"), hf.get("expert_layer_offset")
    if offset >= period:
        raise MappingError(f"config.json: expert_layer_offset={offset} must be smaller than "
                           f"expert_layer_period={period}")
    sparse = periodic(n, period, offset)
    if not sparse:
        return {}
    moe = BASE_EXPERTS.read(hf, fields)["moe"]
    return {"moe": replace(moe, dense_layers=tuple(i for i in range(n) if i not in sparse))}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    if cfg.moe is None:  # every layer dense: a period no layer meets
        return {**BASE_EXPERTS.write(cfg), "expert_layer_period": cfg.n_layers + 1, "expert_layer_offset": cfg.n_layers}
    sparse = [i for i in range(cfg.n_layers) if i not in cfg.moe.dense_layers]
    period, offset = period_of(sparse, cfg.n_layers)
    return {**BASE_EXPERTS.write(cfg), "expert_layer_period": period, "expert_layer_offset": offset}


MIXER_KEYS = (Key("mamba_d_state", int, 16), Key("mamba_d_conv", int, 4), Key("mamba_expand", int, 2),
              Key("mamba_dt_rank", int, "auto"), Key("mamba_conv_bias", bool, True),
              Key("mamba_proj_bias", bool, False))


def mixer_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    if "mixer" not in fields["layer_mixers"]:
        return {}
    if fields["activation"] != "silu":
        raise MappingError(f"config.json: hidden_act={fields['activation']!r} is also the Mamba conv's activation, "
                           "which lmconvert runs as SiLU only; use silu")
    d = fields["d_model"]
    rank = hf.get("mamba_dt_rank") if hf.stated("mamba_dt_rank") else -(-d // 16)
    return {"mixer": "mamba", "mixer_settings": {
        "d_inner": hf.get("mamba_expand") * d, "d_state": hf.get("mamba_d_state"), "dt_rank": rank,
        "conv_kernel": hf.get("mamba_d_conv"), "conv_bias": hf.get("mamba_conv_bias"),
        "proj_bias": hf.get("mamba_proj_bias"), "bc_dt_norm": "weighted", "bc_dt_norm_eps": fields["norm"].eps}}


def mixer_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    s = cfg.mixer_settings if cfg.mixer == "mamba" and cfg.mixer_settings.bc_dt_norm == "weighted" else None
    if s is None:
        return {}
    return {"mamba_d_state": s.d_state, "mamba_d_conv": s.conv_kernel, "mamba_dt_rank": s.dt_rank,
            "mamba_expand": s.d_inner // cfg.d_model if s.d_inner % cfg.d_model == 0 else DEFAULT,
            "mamba_conv_bias": s.conv_bias, "mamba_proj_bias": s.proj_bias}


CONFIG = llama.CONFIG.but(
    drop=("rope", "attention_bias", "mlp_bias"),
    add=(Entry("layer schedule", ATTN_KEYS, schedule_from_hf, schedule_to_hf),
         Entry("experts", BASE_EXPERTS.keys + EXPERT_KEYS, experts_from_hf, experts_to_hf),
         Entry("mixer", MIXER_KEYS, mixer_from_hf, mixer_to_hf)),
    defaults={"vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 262144},
    nullable={"head_dim": False, "num_key_value_heads": False, "attention_dropout": False},
)


# -- llama.cpp (GGUF): its jamba architecture (JambaModel in its converter). The schedule is stated as one KV-head
# count per layer (0 on a Mamba layer: what the import reads the attention layers from) and each layer's FFN by
# its tensors (a router: that layer's experts, stacked; none: its dense FFN, of the same width); attention has no
# RoPE (q/k unpermuted). The Mamba mixer's tensors are mamba's (`ssm_*`, the conv squeezed, A as -exp(A_log)) and
# its dt/B/C norms' weights `ssm_dt_norm`, `ssm_b_norm`, `ssm_c_norm`. What llama.cpp's jamba cannot run is refused
# by name: a width other than 2 x hidden_size (its loader asserts it), no conv bias (it requires one), in_proj or
# out_proj biases (it loads none: PROJECTION_BIASES), heads that do not split the width (its o is [width, width]).
def _gguf_table() -> TensorTable:
    mixer = "layers.{}.mixer"
    ssm = (*mamba.GGUF_MIXER_RULES,
           *(Rule(f"blk.{{}}.ssm_{n}_norm.weight", f"{mixer}.{n}_layernorm.weight") for n in ("dt", "b", "c")))
    routed = MOE_RULES[:4]  # the router and the stacked experts; Jamba has no shared expert
    return TensorTable((*tensor_table(False, 0.0, True).rules, *routed, *ssm))


GGUF_KEYS = {"ssm.conv_kernel": "mamba_d_conv", "ssm.state_size": "mamba_d_state",
             "ssm.time_step_rank": "mamba_dt_rank", "expert_count": "num_experts",
             "expert_used_count": "num_experts_per_tok",
             "ssm.inner_size": "mamba_expand"}  # read as llama.cpp states it; `derived` makes the factor of it


def _from_gguf(config: dict[str, Any]) -> dict[str, Any]:
    """The attention layers from the per-layer KV-head counts, the expert layers from their routers, each as the
    (period, offset) JambaConfig states; the expansion factor from ssm.inner_size."""
    n, counts = config["num_hidden_layers"], config["num_key_value_heads"]
    counts = counts if isinstance(counts, list) else [counts] * n
    attn_period, attn_offset = period_of([i for i, c in enumerate(counts) if c], n)
    expert_period, expert_offset = period_of(config["expert_layers"], n)
    if DEFAULT in (attn_period, expert_period):
        raise MappingError("its attention or expert layers are not every n-th layer from an offset, the only "
                           "schedule JambaConfig states")
    return {"num_key_value_heads": max(counts), "attn_layer_period": attn_period, "attn_layer_offset": attn_offset,
            "expert_layer_period": expert_period, "expert_layer_offset": expert_offset,
            "mamba_expand": config["mamba_expand"] // config["hidden_size"]}


def _to_gguf(config: dict[str, Any]) -> dict[str, Any]:
    d, heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("mamba_expand") != 2:
        raise MappingError(f"llama.cpp's jamba runs a Mamba width of 2 x hidden_size only, and this model's is "
                           f"mamba_expand={config.get('mamba_expand')} x hidden_size")
    if not config.get("mamba_conv_bias", True):
        raise MappingError("llama.cpp's jamba requires the Mamba conv's bias, which this model has not "
                           "(mamba_conv_bias false)")
    if config.get("head_dim") not in (None, d // heads) or d % heads:
        raise MappingError(f"llama.cpp's jamba runs heads of hidden_size / num_attention_heads, and this model's "
                           f"are {config.get('head_dim')} wide")
    n, kv = config["num_hidden_layers"], config["num_key_value_heads"]
    attending = periodic(n, config["attn_layer_period"], config["attn_layer_offset"])
    return {"ssm.inner_size": 2 * d, "attention.head_count_kv": [kv if i in attending else 0 for i in range(n)]}


GGUF_JAMBA = written("jamba", arch="jamba", keys=GGUF_KEYS, table=_gguf_table(), head_dim_stated=False,
                     defaults={"mamba_conv_bias": True, "mamba_proj_bias": False},
                     layer_tensors={"expert_layers": "blk.{}.ffn_gate_inp.weight"}, derived=_from_gguf,
                     exported=_to_gguf, refused=mamba2.PROJECTION_BIASES)

FAMILY = Family("jamba", ("jamba",), "JambaForCausalLM", TENSORS, CONFIG, gguf=(GGUF_JAMBA,))
