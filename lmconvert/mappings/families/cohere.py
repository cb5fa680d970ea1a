"""Cohere (Command-R, Command-R+).

Same as llama, except: the block is parallel with one shared norm (`h + attn(ln(h)) + mlp(ln(h))`,
summed in that order; no `post_attention_layernorm`); the norm is a mean-subtracting LayerNorm
with a weight and no bias (`layer_norm_eps`, default 1e-5), written out as fp32 mean and variance
ops (not torch's kernel) with the weight applied before the cast back; RoPE is interleaved (pairs
(0, 1), (2, 3), ...) and q and k are rotated in fp32 (`q.float()`) with cos/sin already rounded to
the activation dtype; the logits are multiplied by `logit_scale` (default 0.0625); `use_qk_norm`
adds LayerNorms on q and k per head, with a separate weight for each head ([heads, head_dim],
`q_norm` / `k_norm`); `attention_bias` switches the q, k, v and o biases; the MLP has no bias;
tied by default; RoPE's theta defaults to 500000; a null `layer_norm_eps` or `logit_scale`, which
CohereConfig accepts and its model cannot compute with, is refused.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry, fixed
from ..tables.gguf import (
    written,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_rope import rope
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import TensorTable
from . import llama

NORM_RULES = llama.PRE_NORM_RULES[:1]  # input_layernorm only: one norm feeds both branches
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + NORM_RULES + llama.QK_NORM_RULES)

def stated(hf: HfConfig, key: str) -> Any:
    """A key CohereConfig accepts as null but its model cannot compute with (`variance + None`,
    `logits * None`): refused here rather than at the first forward."""
    value = hf.get(key)
    if value is None:
        raise MappingError(f"config.json: {key}=null cannot run (transformers accepts it in the config, then fails "
                           f"in the forward pass); set the model's value, or remove the key for the default")
    return value


NORM = Entry("norm", (Key("layer_norm_eps", float, 1e-5, nullable=True),),
             lambda hf, _: {"norm": NormConfig(kind="layer", bias=False, eps=stated(hf, "layer_norm_eps"),
                                               dtype_order="scale_then_cast", written_out=True)},
             lambda cfg: {"layer_norm_eps": cfg.norm.eps})
LOGIT_SCALE = Entry("logit_scale", (Key("logit_scale", float, 0.0625, nullable=True),),
                    lambda hf, _: {"logit_scale": stated(hf, "logit_scale")},
                    lambda cfg: {"logit_scale": cfg.logit_scale})
ROPE = rope(layout="interleaved", fp32_rotation=True)


def qk_norm_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    if hf.get("use_qk_norm"):  # null means off, as transformers' truth test reads it
        return {"qk_norm": "head", "qk_norm_weight": "per_head"}
    return {}


def qk_norm_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # any other QK norm reads back as none or per head, so export refuses it by name
    return {"use_qk_norm": cfg.qk_norm == "head" and cfg.qk_norm_weight == "per_head"}


# the Cohere rows, which cohere2 inherits
BASE = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(NORM, ROPE,
         fixed("parallel block", norm_placement="parallel_shared"),
         LOGIT_SCALE),
    defaults={"vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "num_hidden_layers": 40,
              "num_attention_heads": 64, "max_position_embeddings": 8192, "tie_word_embeddings": True,
              "rope_theta": 500000.0},
    nullable={"head_dim": False},  # head_dim: not a CohereConfig key, read if stated
)
CONFIG = BASE.but(add=(Entry("use_qk_norm", (Key("use_qk_norm", bool, False, nullable=True),), qk_norm_from_hf,
                             qk_norm_to_hf),))


# -- llama.cpp (GGUF)
# Command-R (`cohere`): one LayerNorm without a bias shared by the parallel attention and MLP, q/k
# norms per head (llama.cpp: exactly when there are 64 layers or more, as Command R+), the output
# always tied, the logits multiplied by logit_scale
GGUF_COMMAND_R = written("cohere", arch="command-r", keys={"logit_scale": "logit_scale",
                                              "attention.layer_norm_epsilon": "layer_norm_eps"},
                              defaults={"hidden_act": "silu"}, bias_flags={"use_qk_norm": "blk.0.attn_q_norm.weight"},
                              norm_eps="attention.layer_norm_epsilon", output=False,
                              constants={"rope.scaling.type": "none"},  # as llama.cpp's converter states it
                              head_dim_stated=False)


# q_norm(q_proj(x).view(B, T, -1, D)), a weight per head, transposed afterwards
REFERENCE_LAYOUTS = QK_NORM_PER_HEAD

FAMILY = Family("cohere", ("cohere",), "CohereForCausalLM", TENSORS, CONFIG, gguf=(GGUF_COMMAND_R,),
                reference_layouts=REFERENCE_LAYOUTS)
