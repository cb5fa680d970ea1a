"""Cohere 2 (Command R7B, Command A).

Same as cohere, except: there is no QK norm; `layer_types` (else `sliding_window_pattern`, default
4: every fourth layer full) picks the sliding layers, which attend within `sliding_window` (default
4096) and are the only ones with RoPE: full-attention layers have no position encoding at all
(NoPE); head_dim is hidden_size / heads unless config.json states it; RoPE's theta defaults to
10000.
"""

from __future__ import annotations

from typing import Any

from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import (
    STATES_VOCAB_AND_ROPE,
    tensor_table,
    written,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layers_and_window_to_hf,
    window_fields,
)
from ..tables.table import TensorTable
from . import cohere

PATTERN_KEY = Key("sliding_window_pattern", int, 4, legacy=True)  # read when layer_types is absent
POSITIONS = {"local": "rope", "global": "none"}


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    pattern = hf.get("sliding_window_pattern")
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: (i + 1) % pattern != 0)
    return {**window_fields(kinds, hf.get("sliding_window")), "layer_positions": tuple(POSITIONS[k] for k in kinds)}


CONFIG = cohere.BASE.but(
    # export writes the layer types alone: RoPE anywhere but exactly the sliding layers reads back otherwise,
    # so export refuses it by name
    add=(Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY, PATTERN_KEY), layers_from_hf,
               layers_and_window_to_hf),),
    defaults={"sliding_window": 4096, "rope_theta": 10000.0},
    nullable={"layer_norm_eps": False, "logit_scale": False, "attention_dropout": False},
)


# -- llama.cpp (GGUF)
# Cohere2: Command-R's block, sliding-window layers with RoPE and every fourth layer global without it
GGUF_COHERE2 = written("cohere2", arch="cohere2", stated=STATES_VOCAB_AND_ROPE,
                       keys={"attention.sliding_window": "sliding_window", "logit_scale": "logit_scale",
                                             "attention.layer_norm_epsilon": "layer_norm_eps"},
                            defaults={"hidden_act": "silu"}, norm_eps="attention.layer_norm_epsilon", output=False,
                            constants={"rope.scaling.type": "none"},  # as llama.cpp's converter states it
                            swa_pattern=4, table=TensorTable(tuple(r for r in tensor_table(False, 0.0, False).rules
                                                                   if "attn_q_norm" not in r.stored
                                                                   and "attn_k_norm" not in r.stored)))  # none


FAMILY = Family("cohere2", ("cohere2",), "Cohere2ForCausalLM", cohere.TENSORS, CONFIG, gguf=(GGUF_COHERE2,))
