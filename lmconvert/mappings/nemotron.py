"""Nemotron (Minitron, Nemotron-4).

Same as llama, except: LayerNorm1P, a LayerNorm with a bias whose stored weight is zero-centred
(`weight + 1.0`, added in the weight's dtype, then torch's LayerNorm in fp32; `norm_eps`, default
1e-5); the MLP is plain, not gated (`up_proj`, `hidden_act` (relu2), `down_proj`); RoPE rotates
only `partial_rotary_factor` (default 0.5) of each head, also for the default rope type; its own
config defaults.
"""

from __future__ import annotations

from lmconvert.arch import NormConfig

from . import llama, starcoder2
from .config_table import Entry, fixed
from .family import Family
from .hf_config import Key
from .hf_rope import rope
from .table import Rule, TensorTable

TENSORS = TensorTable(llama.EDGE_RULES + (Rule("model.norm.bias", "final_norm.bias"),) + llama.ATTENTION_RULES
                      + llama.MLP_RULES + starcoder2.NORM_RULES)

CONFIG = llama.CONFIG.but(
    add=(Entry("norm", (Key("norm_eps", float, 1e-5),),
               lambda hf, _: {"norm": NormConfig(kind="layer", bias=True, weight_offset=1.0, eps=hf.get("norm_eps"),
                                                 dtype_order="scale_then_cast")},
               lambda cfg: {"norm_eps": cfg.norm.eps}),
         llama.activation("hidden_act", "relu2"),
         rope(partial=True),
         fixed("plain MLP", gated=False)),
    defaults={"vocab_size": 256000, "hidden_size": 6144, "intermediate_size": 24576, "num_attention_heads": 48,
              "max_position_embeddings": 4096, "partial_rotary_factor": 0.5},
    nullable={"attention_dropout": False},
)

FAMILY = Family("nemotron", ("nemotron",), "NemotronForCausalLM", TENSORS, CONFIG)
