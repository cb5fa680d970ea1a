"""FalconMamba (TII; `FalconMambaForCausalLM`).

Same as mamba, except: dt, B and C are RMS-normed without weights before dt_proj (`bc_dt_norm=
"weightless"`, FalconMambaWeightlessRMSNorm, eps `mixer_rms_eps`, default 1e-6); the dummy weights
transformers holds for those norms (`dt_layernorm.weight`, `b_layernorm.weight`, `c_layernorm.weight`,
non-persistent ones, never used) are dropped where a file holds them. Its GGUF entry is mamba's
(llama.cpp's mamba architecture, `ssm.dt_b_c_rms` true: mamba.FALCON_MAMBA).
"""

from __future__ import annotations

from ..family import Family
from ..tables.table import Rule, TensorTable
from . import mamba

UNUSED_NORMS = tuple(Rule(f"backbone.layers.{{}}.mixer.{n}_layernorm.weight", None) for n in ("dt", "b", "c"))
TENSORS = TensorTable(mamba.TENSORS.rules + UNUSED_NORMS)
CONFIG = mamba.CONFIG.but(add=(mamba.mixer("weightless", "mixer_rms_eps"),))

FAMILY = Family("falcon_mamba", ("falcon_mamba",), "FalconMambaForCausalLM", TENSORS, CONFIG)
