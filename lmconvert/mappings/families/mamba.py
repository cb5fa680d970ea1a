"""Mamba (v1; `MambaForCausalLM`).

Same as mamba2, except: each layer's mixer is Mamba's selective scan (`mixer="mamba"`, arch/mamba.py),
whose tensors are A_log, D, in_proj, conv1d, x_proj, dt_proj (with its bias) and out_proj; its width
is `intermediate_size` where stated (MambaConfig sets its own kwargs after deriving it), else `expand`
x `hidden_size` (`expand` is read, never written: transformers writes intermediate_size); its
state `state_size` (default 16), its dt rank `time_step_rank` (default "auto": ceil(hidden_size / 16),
which transformers resolves before it writes a config; a stated "auto" is refused, naming the key);
`use_bias` switches in_proj's and out_proj's biases; there is no chunk size, no time-step clamp and no
gated norm; embeddings tied by default.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import ConfigTable, Entry, plain
from ..tables.gguf import written
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from ..tables.transforms import NEG_EXP
from . import mamba2

MAMBA_PARAMS = ("A_log", "D", "in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias", "x_proj.weight",
                "dt_proj.weight", "dt_proj.bias", "out_proj.weight", "out_proj.bias")
TENSORS = TensorTable(mamba2.BACKBONE_RULES + mamba2.mixer_rules("backbone.layers.{}.mixer", MAMBA_PARAMS))

MIXER_KEYS = (Key("state_size", int, 16), Key("expand", int, 2, legacy=True), Key("conv_kernel", int, 4),
              Key("use_bias", bool, False), Key("use_conv_bias", bool, True), Key("time_step_rank", int, "auto"),
              Key("intermediate_size", int, None), mamba2.silu_only("hidden_act"))


def dt_rank(hf: HfConfig, d_model: int) -> int:
    """`time_step_rank`, "auto" (absent) meaning ceil(hidden_size / 16) as MambaConfig resolves it."""
    return math.ceil(d_model / 16) if not hf.stated("time_step_rank") else hf.get("time_step_rank")


def mixer(norm: str, eps_key: str | None = None) -> Entry:
    """The selective scan's row; `norm` its dt/B/C norms (MambaSettings.bc_dt_norm), their eps under `eps_key`."""
    keys = MIXER_KEYS + ((Key(eps_key, float, 1e-6),) if eps_key else ())

    def read(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
        d = fields["d_model"]
        width = hf.get("intermediate_size") if hf.stated("intermediate_size") else hf.get("expand") * d
        settings = {"d_inner": width, "d_state": hf.get("state_size"), "dt_rank": dt_rank(hf, d),
                    "conv_kernel": hf.get("conv_kernel"), "conv_bias": hf.get("use_conv_bias"),
                    "proj_bias": hf.get("use_bias"), "bc_dt_norm": norm}
        if eps_key:
            settings["bc_dt_norm_eps"] = hf.get(eps_key)
        return {"mixer": "mamba", "mixer_settings": settings}

    def write(cfg: ArchConfig) -> dict[str, Any]:
        """Another mixer, or dt/B/C norms this family does not have, reads back otherwise: export refuses it."""
        s = cfg.mixer_settings if cfg.mixer == "mamba" and cfg.mixer_settings.bc_dt_norm == norm else None
        if s is None:
            return {}
        written = {"intermediate_size": s.d_inner, "state_size": s.d_state, "conv_kernel": s.conv_kernel,
                   "use_bias": s.proj_bias, "use_conv_bias": s.conv_bias, "time_step_rank": s.dt_rank,
                   "hidden_act": s.activation}
        return written | ({eps_key: s.bc_dt_norm_eps} if eps_key else {})

    return Entry("mixer", keys, read, write)


CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 50280),
    plain("hidden_size", "d_model", int, 768),
    plain("num_hidden_layers", "n_layers", int, 32),
    plain("tie_word_embeddings", "tie_embeddings", bool, True),
    mamba2.eps_norm("layer_norm_epsilon", 1e-5),
    mamba2.RESIDUAL_FP32,
    mixer("none"),
    mamba2.SCHEDULE,
))

# -- llama.cpp (GGUF): its mamba architecture (MambaModel in its converter), FalconMamba's too, told apart by
# `ssm.dt_b_c_rms` (true: the weightless dt/B/C norms, whose eps llama.cpp takes as the model's norm eps: a
# FalconMamba whose mixer_rms_eps differs reads back otherwise and is refused). The mixer's tensors are `ssm_*`: the
# conv kernel squeezed ([channels, kernel], F32), A as -exp(A_log) ([d_inner, d_state]), dt_proj as `ssm_dt`, x_proj
# as `ssm_x`; no in_proj or out_proj biases (llama.cpp loads none) and a conv bias always (llama.cpp requires one).
GGUF_MIXER_RULES = (
    Rule("blk.{}.ssm_in.weight", "layers.{}.mixer.in_proj.weight"),
    Rule("blk.{}.ssm_conv1d.weight", "layers.{}.mixer.conv1d.weight", mamba2.SQUEEZED_CONV),
    Rule("blk.{}.ssm_conv1d.bias", "layers.{}.mixer.conv1d.bias"),
    Rule("blk.{}.ssm_x.weight", "layers.{}.mixer.x_proj.weight"),
    Rule("blk.{}.ssm_dt.weight", "layers.{}.mixer.dt_proj.weight"),
    Rule("blk.{}.ssm_dt.bias", "layers.{}.mixer.dt_proj.bias"),
    Rule("blk.{}.ssm_a", "layers.{}.mixer.A_log", NEG_EXP),
    Rule("blk.{}.ssm_d", "layers.{}.mixer.D"),
    Rule("blk.{}.ssm_out.weight", "layers.{}.mixer.out_proj.weight"))
GGUF_TABLE = mamba2.gguf_all_mixer_table(*GGUF_MIXER_RULES)
GGUF_KEYS = {"ssm.conv_kernel": "conv_kernel", "ssm.inner_size": "intermediate_size", "ssm.state_size": "state_size",
             "ssm.time_step_rank": "time_step_rank"}
MAMBA = written("mamba", arch="mamba", keys=GGUF_KEYS, renamed={"rms_norm_eps": "layer_norm_epsilon"},
                constants={**mamba2.NO_ATTENTION, "ssm.dt_b_c_rms": False}, head_dim_stated=False, table=GGUF_TABLE,
                refused=mamba2.PROJECTION_BIASES)
FALCON_MAMBA = replace(MAMBA, model_type="falcon_mamba", constants={**mamba2.NO_ATTENTION, "ssm.dt_b_c_rms": True},
                       derived=lambda config: {"mixer_rms_eps": config["rms_norm_eps"]})
GGUF_MAMBA = replace(MAMBA, told_apart=(("ssm.dt_b_c_rms", True, FALCON_MAMBA),))

FAMILY = Family("mamba", ("mamba",), "MambaForCausalLM", TENSORS, CONFIG, gguf=(GGUF_MAMBA,))
