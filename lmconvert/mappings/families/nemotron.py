"""Nemotron (Minitron, Nemotron-4).

Same as llama, except: LayerNorm1P, a LayerNorm with a bias whose stored weight is zero-centred
(`weight + 1.0`, added in the weight's dtype, then torch's LayerNorm in fp32; `norm_eps`, default
1e-5); the MLP is plain, not gated (`up_proj`, `hidden_act` (relu2), `down_proj`); RoPE rotates
only `partial_rotary_factor` (default 0.5) of each head, also for the default rope type; its own
config defaults.
"""

from __future__ import annotations

from lmconvert.arch import NormConfig

from ..family import Family
from ..tables.config_table import Entry, fixed
from ..tables.gguf import (
    PADDED,
    STATES_VOCAB_AND_ROPE,
    GgufArch,
    weight_and_bias,
)
from ..tables.hf_config import Key
from ..tables.hf_rope import rope
from ..tables.table import Rule, TensorTable
from ..tables.transforms import IDENTITY, Offset
from . import llama, starcoder2

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


# -- llama.cpp (GGUF)
def _nemotron_table() -> TensorTable:
    """llama.cpp's Nemotron (`NemotronModel`): LayerNorm1P stored as `w + 1` with biases, optional
    attention and MLP biases, a plain squared-ReLU MLP (`ffn_up`, `ffn_down`)."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    plus_one = Offset(1.0)
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight", plus_one), Rule("output_norm.bias", "final_norm.bias"),
        *(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight", plus_one) for g, c in norms),
        *(Rule(f"blk.{{}}.{g}.bias", f"layers.{{}}.{c}.bias") for g, c in norms),
        *(rule for g, c in (("attn_q", "attn.q"), ("attn_k", "attn.k"), ("attn_v", "attn.v"),
                            ("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))
          for rule in weight_and_bias(g, c, IDENTITY)),
    ))


# llama.cpp's converter states the LayerNorm eps under the RMS norm's key too, and no RoPE scaling as "none"
GGUF_NEMOTRON = GgufArch("nemotron", arch="nemotron", keys={"attention.layer_norm_epsilon": "norm_eps",
                                                            "attention.layer_norm_rms_epsilon": "norm_eps"},
                         stated=STATES_VOCAB_AND_ROPE,
                             constants={"rope.scaling.type": "none"},
                             defaults={"hidden_act": "relu2"},
                             bias_flags={"attention_bias": "blk.0.attn_q.bias", "mlp_bias": "blk.0.ffn_up.bias"},
                             norm_eps="attention.layer_norm_epsilon", partial_rotary=True, table=_nemotron_table())


FAMILY = Family("nemotron", ("nemotron",), "NemotronForCausalLM", TENSORS, CONFIG, gguf=(GGUF_NEMOTRON,))
