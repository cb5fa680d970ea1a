"""Jais 2 (inceptionai/Jais-2-8B-Chat).

Same as llama, except: every norm is torch's LayerNorm with a bias (`layer_norm_eps`, default 1e-5;
there is no `rms_norm_eps`), run in the activation dtype, whose kernel computes the statistics in
fp32, applies the weight and bias in fp32 and rounds once; the MLP is plain, not gated
(`up_proj`, `hidden_act` (relu2), `down_proj`), as Nemotron's; `attention_bias` and `mlp_bias`
default to true; its own defaults (150272 tokens, 3328 wide, 32 layers, 26 heads, 26624 FFN width,
8192 positions).
"""

from __future__ import annotations

from lmconvert.arch import NormConfig

from ..family import Family
from ..tables.config_table import Entry, fixed
from ..tables.hf_config import Key
from ..tables.table import Rule, TensorTable
from . import llama, starcoder2

TENSORS = TensorTable(llama.EDGE_RULES + (Rule("model.norm.bias", "final_norm.bias"),) + llama.ATTENTION_RULES
                      + llama.MLP_RULES + starcoder2.NORM_RULES)

CONFIG = llama.CONFIG.but(
    add=(Entry("norm", (Key("layer_norm_eps", float, 1e-5),),
               lambda hf, _: {"norm": NormConfig(kind="layer", bias=True, eps=hf.get("layer_norm_eps"),
                                                 dtype_order="scale_then_cast")},
               lambda cfg: {"layer_norm_eps": cfg.norm.eps}),
         llama.activation("hidden_act", "relu2"),
         fixed("plain MLP", gated=False)),
    defaults={"vocab_size": 150272, "hidden_size": 3328, "intermediate_size": 26624, "num_attention_heads": 26,
              "max_position_embeddings": 8192, "attention_bias": True, "mlp_bias": True},
)


FAMILY = Family("jais2", ("jais2",), "Jais2ForCausalLM", TENSORS, CONFIG)
