"""Jais 2 (inceptionai/Jais-2-8B-Chat).

Same as llama, except: every norm is torch's LayerNorm with a bias (`layer_norm_eps`, default 1e-5;
there is no `rms_norm_eps`), run in the activation dtype, whose kernel computes the statistics in
fp32, applies the weight and bias in fp32 and rounds once; the MLP is plain, not gated
(`up_proj`, `hidden_act` (relu2), `down_proj`), as Nemotron's; `attention_bias` and `mlp_bias`
default to true; its own defaults (150272 tokens, 3328 wide, 32 layers, 26 heads, 26624 FFN width,
8192 positions).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmconvert.arch import NormConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry, fixed
from ..tables.gguf import layernorm_table, written
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



# -- llama.cpp (GGUF)
def _no_rope_freqs(config: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp's jais2 loads no `rope_freqs` (Llama 3's RoPE scaling): refused both ways."""
    if (config.get("rope_scaling") or {}).get("rope_type") == "llama3":
        raise MappingError("llama.cpp's jais2 loads no rope_freqs tensor, so it cannot hold llama3 RoPE scaling")
    return {}


# llama.cpp's jais2 (Jais2Model in its converter): LayerNorms with biases, q/k unpermuted (NeoX-style
# rotation); its loader requires the o and MLP biases (so q, k and v have theirs: one HF switch)
GGUF_JAIS2 = written("jais2", arch="jais2", keys={"attention.layer_norm_epsilon": "layer_norm_eps"},
                     defaults={"hidden_act": "relu2", "attention_bias": True, "mlp_bias": True},
                     norm_eps="attention.layer_norm_epsilon", table=layernorm_table(), derived=_no_rope_freqs,
                     stated=frozenset({"rope.dimension_count"}))

FAMILY = Family("jais2", ("jais2",), "Jais2ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_JAIS2,))
