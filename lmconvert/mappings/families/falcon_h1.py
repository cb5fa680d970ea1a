"""Falcon-H1 (TII; `FalconH1ForCausalLM`).

Same as bamba, except: every layer is a parallel hybrid (`layer_mixers` "attention+mixer"): attention and the
Mamba2 mixer read the same normed input side by side and their outputs are summed, `mamba + attention`, before
the residual add, then the SwiGLU FFN (`pre_ff_layernorm`); muP multipliers, each a Python float on the
activation dtype: the embeddings times `embedding_multiplier` (unrounded), the attention's input times
`attention_in_multiplier` and its output times `attention_out_multiplier`, k times `key_multiplier` as it comes
out of k_proj, the mixer's output times `ssm_out_multiplier`, the FFN's gate projection times `mlp_multipliers[0]`
before the activation and its output times `mlp_multipliers[1]`, the logits times `lm_head_multiplier`; inside
the mixer, its input times `ssm_in_multiplier` and in_proj's output times the muP vector, one of
`ssm_multipliers` per part of [z | x | B | C | dt] (transformers' non-persistent `mup_vector`, computed from the
config, so never stored); the mixer's width is `mamba_d_ssm` (null: `mamba_expand` x hidden_size), its heads
`mamba_n_heads` x `mamba_d_head` ("auto": the width over the heads); its gated norm only with `mamba_rms_norm`
(FalconH1RMSNormGated: the weight in fp32, `mamba_norm_before_gate` says whether it normalises before the gate),
else the scan output times SiLU(z); `mamba_proj_bias` is in_proj's bias, `projectors_bias` out_proj's; full
RoPE; defaults vocab 128000, 8 KV heads, 8192 positions, rms_norm_eps 1e-5, untied. A null boolean is false, as
transformers takes it; a null size or multiplier it cannot run is refused by name. In GGUF (llama.cpp's falcon-h1)
the multipliers are folded into the weights, as llama.cpp's converter folds them, so a file reads back as this model
with every multiplier 1, computing the same logits to fp32 rounding (each folded weight rounded once more).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig
from lmconvert.arch.config import PARALLEL_MIXING as PARALLEL  # every layer's attention and mixer side by side

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.gguf import tensor_table, written
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_rope import rope
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Chain, Scale
from . import bamba, granite, llama, mamba2

MIXER_KEYS = (Key("mamba_d_ssm", int, 1024, nullable=True), Key("mamba_n_heads", int, 128),
              Key("mamba_d_head", int, "auto"), Key("mamba_n_groups", int, 1, nullable=True),
              Key("mamba_d_state", int, 256, nullable=True), Key("mamba_d_conv", int, 4, nullable=True),
              Key("mamba_expand", int, 2, nullable=True), Key("mamba_chunk_size", int, 256, nullable=True),
              Key("mamba_conv_bias", bool, True, nullable=True), Key("mamba_proj_bias", bool, False, nullable=True),
              Key("projectors_bias", bool, False, nullable=True),
              Key("mamba_rms_norm", bool, False, nullable=True),
              Key("mamba_norm_before_gate", bool, True, nullable=True),
              Key("time_step_limit", list, (0.0, float("inf")), nullable=True),
              Key("ssm_multipliers", list, None, nullable=True), Key("ssm_in_multiplier", float, 1.0, nullable=True))
# nulls transformers accepts in the config but cannot run (a size of None, a clamp or a multiplier of None)
CRASHING_NULLS = ("mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_chunk_size", "time_step_limit",
                  "ssm_in_multiplier", "ssm_out_multiplier", "attention_in_multiplier", "attention_out_multiplier",
                  "key_multiplier", "embedding_multiplier", "lm_head_multiplier")


def _refuse_crashing_nulls(hf: HfConfig, names: tuple[str, ...]) -> None:
    for name in names:
        if hf.stated(name) and hf.get(name) is None:
            raise MappingError(f"config.json: {name}=null leaves Falcon-H1 without a value transformers can run; "
                               "remove the key for the default")


def _multipliers(hf: HfConfig, key: str, count: int) -> tuple[float, ...]:
    """A list of `count` muP multipliers (null: all 1, as FalconH1Config makes it)."""
    value = hf.get(key)
    if value is None:
        return (1.0,) * count
    if not isinstance(value, (list, tuple)) or len(value) != count or \
            any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf") for v in value):
        raise MappingError(f"config.json: {key}={show(value)} should be a list of {count} positive numbers; remove "
                           "the key for the default (all 1)")
    return tuple(float(v) for v in value)


def mixer_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Mamba2Settings from the mamba_* keys, with Falcon-H1's gated norm, biases and muP vector."""
    _refuse_crashing_nulls(hf, CRASHING_NULLS[:6])
    if fields["activation"] != "silu":
        raise MappingError(f"config.json: hidden_act={show(fields['activation'])} is also the Mamba2 conv's "
                           "activation, which lmconvert runs as SiLU only; use silu")
    d, heads, expand, width = fields["d_model"], hf.get("mamba_n_heads"), hf.get("mamba_expand"), hf.get("mamba_d_ssm")
    if width is None:
        if expand is None:
            raise MappingError("config.json: mamba_d_ssm=null takes the mixer's width from mamba_expand, which is "
                               "null too; state one of them")
        width = expand * d
    head_dim = hf.get("mamba_d_head") if hf.stated("mamba_d_head") else width // heads
    if width % heads or heads * head_dim != width:
        raise MappingError(f"config.json: mamba_n_heads={heads} x mamba_d_head={head_dim} should equal the mixer's "
                           f"width {width} (mamba_d_ssm, else mamba_expand x hidden_size), as transformers requires; "
                           "fix the sizes")
    zxbcdt = _multipliers(hf, "ssm_multipliers", 5)
    normed = bool(hf.get("mamba_rms_norm"))
    return {"mixer": "mamba2", "mixer_settings": {
        "n_heads": heads, "head_dim": head_dim, "d_state": hf.get("mamba_d_state"),
        "n_groups": hf.get("mamba_n_groups"),
        "conv_kernel": hf.get("mamba_d_conv"), "chunk_size": hf.get("mamba_chunk_size"),
        "conv_bias": bool(hf.get("mamba_conv_bias")), "in_bias": bool(hf.get("mamba_proj_bias")),
        "out_bias": bool(hf.get("projectors_bias")), "norm": "falcon_h1" if normed else "none",
        "norm_before_gate": normed and bool(hf.get("mamba_norm_before_gate")), "norm_eps": fields["norm"].eps,
        "in_multiplier": hf.get("ssm_in_multiplier"),
        "zxbcdt_multipliers": None if zxbcdt == (1.0,) * 5 else zxbcdt, **mamba2.time_step_limit(hf)},
        "layer_mixers": (PARALLEL,) * fields["n_layers"]}


def mixer_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The mixer's keys; a schedule other than every layer parallel reads back as one, refused by name."""
    keys = mamba2.keys_of(cfg, {"n_heads": "mamba_n_heads", "head_dim": "mamba_d_head", "n_groups": "mamba_n_groups",
                                "d_state": "mamba_d_state", "conv_kernel": "mamba_d_conv",
                                "chunk_size": "mamba_chunk_size", "conv_bias": "mamba_conv_bias",
                                "in_bias": "mamba_proj_bias", "out_bias": "projectors_bias",
                                "time_step_limit": "time_step_limit", "in_multiplier": "ssm_in_multiplier"})
    s = cfg.mixer_settings if cfg.mixer == "mamba2" else None
    if s is None:
        return keys
    normed = s.norm == "falcon_h1"  # Mamba2's own gated norm reads back as Falcon-H1's: refused by name
    return keys | {"mamba_d_ssm": s.d_inner, "mamba_expand": DEFAULT, "mamba_rms_norm": normed,
                   "mamba_norm_before_gate": s.norm_before_gate if normed else DEFAULT,
                   "ssm_multipliers": list(s.zxbcdt_multipliers or (1.0,) * 5)}


MIXER = Entry("mixer", MIXER_KEYS, mixer_from_hf, mixer_to_hf)

# the block's and the head's muP multipliers: config key -> ArchConfig field
BLOCK_MULTIPLIERS = {"attention_in_multiplier": "attn_in_multiplier", "attention_out_multiplier": "attn_out_multiplier",
                     "key_multiplier": "key_multiplier", "ssm_out_multiplier": "mixer_out_multiplier",
                     "lm_head_multiplier": "logit_scale"}
MUP_KEYS = (*(Key(k, float, 1.0, nullable=True) for k in BLOCK_MULTIPLIERS), Key("mlp_multipliers", list, None,
                                                                                  nullable=True))


def mup_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    _refuse_crashing_nulls(hf, CRASHING_NULLS[6:])
    gate, down = _multipliers(hf, "mlp_multipliers", 2)
    return {field: hf.get(key) for key, field in BLOCK_MULTIPLIERS.items()} | {
        "mlp_gate_multiplier": gate, "mlp_down_multiplier": down}


def mup_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {key: getattr(cfg, field) for key, field in BLOCK_MULTIPLIERS.items()} | {
        "mlp_multipliers": [cfg.mlp_gate_multiplier, cfg.mlp_down_multiplier]}


EMBEDDING_MULTIPLIER = Entry("embedding_multiplier", (Key("embedding_multiplier", float, 1.0, nullable=True),),
                             granite.embed_scale_from_hf, granite.embed_scale_to_hf)

CONFIG = llama.CONFIG.but(
    add=(llama.norm(1e-5), rope(), MIXER, Entry("muP multipliers", MUP_KEYS, mup_from_hf, mup_to_hf),
         EMBEDDING_MULTIPLIER),
    defaults={"vocab_size": 128000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192},
    nullable={"head_dim": False},  # head_dim: not a FalconH1Config key, read if stated (its attention and RoPE do)
)


# -- llama.cpp (GGUF): its falcon-h1 architecture (FalconH1Model in its converter, a Mamba2Model). Every layer holds
# attention (`attn_*`, unpermuted: llama.cpp rotates falcon-h1 NeoX-style) and the Mamba2 mixer in mamba2's llama.cpp
# layout (`ssm_*`, d_inner `ssm.inner_size`, heads `ssm.time_step_rank`) under one `attn_norm`, the FFN under
# `ffn_norm` (no `.weight`). The muP multipliers are folded into the weights as its converter folds them (FalconH1Model.
# modify_tensors, each a Scale from the config): the embeddings times embedding_multiplier, q and v times
# attention_in_multiplier, k times key_multiplier then attention_in_multiplier, o_proj (and its bias) times
# attention_out_multiplier, in_proj times ssm_in_multiplier then each part of [z | x | B | C | dt] times its
# ssm_multipliers, out_proj times ssm_out_multiplier, the FFN's gate (and bias) and down (and bias) times
# mlp_multipliers, the LM head times lm_head_multiplier; so the file states none, and what it reads back is this
# model with every multiplier 1 (`folded`), computing the same logits to fp32 rounding (each folded weight rounds
# once more than the reference's multiplies). Refused by name: what llama.cpp's graph does not run: attention
# biases (it adds no o_proj bias, and its converter folds attention_in_multiplier into the q/k/v biases, which the
# reference adds after that multiply), the norm before the gate (it gates, then normalises), no conv bias (its
# graph adds one), in_proj or out_proj biases (it loads none), a tied LM head whose multiplier is not the
# embeddings' (the one matrix is folded once), a dt clamp (it runs none: a clamped model reads back otherwise).

# the FFN's norm as llama.cpp names it for falcon-h1: `blk.{i}.ffn_norm`, no `.weight` (its TensorNameMap maps the
# whole of `pre_ff_layernorm.weight`, and its loader reads that name)
FFN_NORM = Rule("blk.{}.ffn_norm", "layers.{}.mlp_norm.weight")
GGUF_RULES = (*(r for r in tensor_table(False, 0.0, True).rules if r.stored != "blk.{}.ffn_norm.weight"), FFN_NORM,
              *mamba2.gguf_mixer_rules())
FOLDED = {**dict.fromkeys((*BLOCK_MULTIPLIERS, "embedding_multiplier", "ssm_in_multiplier"), 1.0),
          "mlp_multipliers": [1.0, 1.0], "ssm_multipliers": [1.0] * 5}


def _folds(config: Mapping[str, Any]) -> dict[str, Scale]:
    """Each GGUF tensor's multipliers, as llama.cpp's converter multiplies it (k by key_multiplier first)."""
    def m(key: str) -> float:
        return config.get(key, FOLDED[key])

    gate, down = config.get("mlp_multipliers") or FOLDED["mlp_multipliers"]
    z, x, b, c, dt = config.get("ssm_multipliers") or FOLDED["ssm_multipliers"]
    inner = config.get("mamba_d_ssm") or 0
    states = config.get("mamba_n_groups", 1) * config.get("mamba_d_state", 0)
    attn_in = m("attention_in_multiplier")
    weight_and_bias = {"attn_q": (attn_in,), "attn_k": (m("key_multiplier"), attn_in), "attn_v": (attn_in,),
                       "attn_output": (m("attention_out_multiplier"),), "ffn_gate": (gate,), "ffn_down": (down,)}
    return {**{f"blk.{{}}.{name}.{p}": Scale(factors) for name, factors in weight_and_bias.items()
               for p in ("weight", "bias")},
            "token_embd.weight": Scale((m("embedding_multiplier"),)),
            "output.weight": Scale((m("lm_head_multiplier"),)),
            "blk.{}.ssm_out.weight": Scale((m("ssm_out_multiplier"),)),
            "blk.{}.ssm_in.weight": Scale((m("ssm_in_multiplier"),),
                                          ((inner, z), (inner, x), (states, b), (states, c), (None, dt)))}


def _gguf_layout(config: Mapping[str, Any]) -> TensorTable:
    """The table with the config's multipliers folded in, after each rule's own step (the vocabulary's padding)."""
    folds = _folds(config)
    return TensorTable(tuple(replace(r, transform=Chain(r.transform, folds[r.stored])) if r.stored in folds else r
                             for r in GGUF_RULES))


def _from_gguf(config: dict[str, Any]) -> dict[str, Any]:
    return {"mamba_d_head": config["mamba_d_ssm"] // config["mamba_n_heads"], "mamba_norm_before_gate": False}


def _to_gguf(config: dict[str, Any]) -> dict[str, Any]:
    """No keys beyond the table's; refusals of what llama.cpp's falcon-h1 graph does not run (see above)."""
    if config.get("attention_bias"):
        raise MappingError("llama.cpp's falcon-h1 does not run attention biases (its graph adds no o_proj bias, and "
                           "its converter folds attention_in_multiplier into the q/k/v biases, which the reference "
                           "adds after that multiply), which this model has (attention_bias=true)")
    if config.get("mamba_rms_norm") and config.get("mamba_norm_before_gate", True):
        raise MappingError("llama.cpp's falcon-h1 does not run the Mamba2 gated norm before the gate (it gates, then "
                           "normalises), which this model has (mamba_norm_before_gate=true)")
    head, embed = config.get("lm_head_multiplier", 1.0), config.get("embedding_multiplier", 1.0)
    if config.get("tie_word_embeddings") and head != embed:
        raise MappingError(f"llama.cpp's falcon-h1 folds the tied embedding matrix once, by embedding_multiplier="
                           f"{embed}, and this model's LM head multiplies it by lm_head_multiplier={head}; untie it")
    return {}


GGUF_FALCON_H1 = written("falcon_h1", arch="falcon-h1", keys={
    "ssm.conv_kernel": "mamba_d_conv", "ssm.state_size": "mamba_d_state", "ssm.group_count": "mamba_n_groups",
    "ssm.time_step_rank": "mamba_n_heads", "ssm.inner_size": "mamba_d_ssm"},
    own={"ssm.chunk_size": "mamba_chunk_size"}, defaults={"hidden_act": "silu"}, folded=FOLDED,
    bias_flags={"mlp_bias": "blk.0.ffn_up.bias", "mamba_rms_norm": "blk.0.ssm_norm.weight",
                "mamba_conv_bias": "blk.0.ssm_conv1d.bias"},
    table=TensorTable(GGUF_RULES), layout=_gguf_layout, derived=_from_gguf, exported=_to_gguf,
    stated=frozenset({"vocab_size", "attention.key_length"}), refused=mamba2.PROJECTION_BIASES)

FAMILY = Family("falcon_h1", ("falcon_h1",), "FalconH1ForCausalLM", bamba.TENSORS, CONFIG, gguf=(GGUF_FALCON_H1,))
