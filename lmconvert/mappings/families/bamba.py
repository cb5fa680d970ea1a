"""Bamba (IBM; `BambaForCausalLM`).

Same as llama, except: a hybrid stack, the layers `attn_layer_indices` lists attending and every other
layer's token mixer Mamba2 (`mixer="mamba2"`, arch/mamba2.py; tensors `model.layers.{i}.mamba.*` with
transformers' names; none listed: every layer Mamba2); every layer has its SwiGLU FFN
(`feed_forward.{gate,up,down}_proj`), its norms `input_layernorm` and `pre_ff_layernorm`, the final norm
`final_layernorm`; the mixer's sizes are `mamba_n_heads` x `mamba_d_head` ("auto": `mamba_expand` x
hidden_size / heads), `mamba_n_groups`, `mamba_d_state`, `mamba_d_conv`, `mamba_chunk_size`;
`mamba_proj_bias` switches in_proj's and out_proj's biases, `mamba_conv_bias` the conv's (null: none,
as nn.Linear and nn.Conv1d take it); `time_step_limit` clamps dt in the chunked prefill; the mixer's
gated norm takes `rms_norm_eps` and its conv `hidden_act` (SiLU only); RoPE rotates the first
`partial_rotary_factor` of each head (BambaConfig sets 0.5 where rope_parameters states none); defaults
rms_norm_eps 1e-5, 262144 positions.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_rope import rope
from ..tables.table import Rule, TensorTable
from . import llama, mamba2

LAYER = "model.layers.{}"
EDGE_RULES = (
    Rule("model.embed_tokens.weight", "embed.weight"),
    Rule("model.final_layernorm.weight", "final_norm.weight"),
    Rule("lm_head.weight", "lm_head.weight"),
)
NORM_RULES = (
    Rule(f"{LAYER}.input_layernorm.weight", "layers.{}.attn_norm.weight"),
    Rule(f"{LAYER}.pre_ff_layernorm.weight", "layers.{}.mlp_norm.weight"),
)
FFN_RULES = tuple(Rule(f"{LAYER}.feed_forward.{n}_proj.{p}", f"layers.{{}}.mlp.{n}.{p}")
                  for n in ("gate", "up", "down") for p in ("weight", "bias"))
MIXER_RULES = mamba2.mixer_rules(f"{LAYER}.mamba")
TENSORS = TensorTable(EDGE_RULES + llama.ATTENTION_RULES + NORM_RULES + FFN_RULES + MIXER_RULES)


# the keys BambaConfig (and GraniteMoeHybridConfig) give the Mamba2 mixer; null where transformers takes it
MIXER_KEYS = (Key("mamba_n_heads", int, 128), Key("mamba_d_head", int, "auto"),
              Key("mamba_n_groups", int, 1, nullable=True), Key("mamba_d_state", int, 256, nullable=True),
              Key("mamba_d_conv", int, 4, nullable=True), Key("mamba_expand", int, 2),
              Key("mamba_chunk_size", int, 256, nullable=True), Key("mamba_conv_bias", bool, True, nullable=True),
              Key("mamba_proj_bias", bool, False, nullable=True),
              Key("time_step_limit", list, (0.0, float("inf")), nullable=True))
CRASHING_NULLS = ("mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_chunk_size", "time_step_limit")


def mixer_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Mamba2Settings from the mamba_* keys; only where some layer is Mamba2's (`fields["layer_mixers"]`)."""
    if "mixer" not in fields.get("layer_mixers", ()):
        return {}
    for name in CRASHING_NULLS:
        if hf.stated(name) and hf.get(name) is None:
            raise MappingError(f"config.json: {name}=null leaves the Mamba2 layers without a value transformers "
                               "can run; remove the key for the default")
    if fields["activation"] != "silu":
        raise MappingError(f"config.json: hidden_act={show(fields['activation'])} is also the Mamba2 conv's "
                           "activation, which lmconvert runs as SiLU only; use silu")
    d, heads, expand = fields["d_model"], hf.get("mamba_n_heads"), hf.get("mamba_expand")
    head_dim = expand * d // heads if not hf.stated("mamba_d_head") else hf.get("mamba_d_head")
    if heads * head_dim != expand * d:
        raise MappingError(f"config.json: mamba_n_heads={heads} x mamba_d_head={head_dim} should equal mamba_expand="
                           f"{expand} x hidden_size={d}, as transformers requires; fix the sizes")
    return {"mixer": "mamba2", "mixer_settings": {
        "n_heads": heads, "head_dim": head_dim, "d_state": hf.get("mamba_d_state"),
        "n_groups": hf.get("mamba_n_groups"), "conv_kernel": hf.get("mamba_d_conv"),
        "chunk_size": hf.get("mamba_chunk_size"), "conv_bias": bool(hf.get("mamba_conv_bias")),
        "in_bias": bool(hf.get("mamba_proj_bias")), "out_bias": bool(hf.get("mamba_proj_bias")),
        "norm_eps": fields["norm"].eps, **mamba2.time_step_limit(hf)}}


def mixer_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return mamba2.keys_of(cfg, {"n_heads": "mamba_n_heads", "head_dim": "mamba_d_head", "n_groups": "mamba_n_groups",
                                "d_state": "mamba_d_state", "conv_kernel": "mamba_d_conv",
                                "chunk_size": "mamba_chunk_size", "expand": "mamba_expand",
                                "conv_bias": "mamba_conv_bias", "in_bias": "mamba_proj_bias",
                                "time_step_limit": "time_step_limit"})


MIXER = Entry("mixer", MIXER_KEYS, mixer_from_hf, mixer_to_hf)
SCHEDULE_KEYS = (Key("attn_layer_indices", list, None, nullable=True),)


def schedule_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """BambaConfig.layers_block_type: the listed layers attend, the others run Mamba2 (all of them when null)."""
    n, attending = fields["n_layers"], hf.get("attn_layer_indices") or []
    if any(isinstance(i, bool) or not isinstance(i, int) for i in attending):
        raise MappingError(f"config.json: attn_layer_indices={show(attending)} should list layer indices")
    return {"layer_mixers": tuple("attention" if i in attending else "mixer" for i in range(n))}


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """A layer without a mixer or an FFN has no name here: it reads back as one with both, refused by name."""
    return {"attn_layer_indices": cfg.layers_mixed_by("attention")}


SCHEDULE = Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf)

CONFIG = llama.CONFIG.but(
    add=(llama.norm(1e-5), rope(partial=True), SCHEDULE, MIXER),
    defaults={"vocab_size": 128000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 262144,
              "partial_rotary_factor": 0.5},
)

FAMILY = Family("bamba", ("bamba",), "BambaForCausalLM", TENSORS, CONFIG,
                no_gguf=mamba2.NO_GGUF.replace("mamba2", "granitehybrid"))
