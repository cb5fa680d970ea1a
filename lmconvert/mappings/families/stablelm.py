"""StableLM (StableLM-3B-4E1T, StableLM 2).

Same as llama, except: LayerNorm with a bias (`layer_norm_eps`, default 1e-5; torch's kernel, so
the weight and bias apply in fp32); RoPE rotates only `partial_rotary_factor` (default 0.25) of
each head, also for the default rope type; `use_qkv_bias` switches the q, k and v biases (o and the
MLP never have one); `use_parallel_residual` makes the block parallel with one shared norm
(`h + attn(ln(h)) + mlp(ln(h))`, no `post_attention_layernorm`); head_dim is always hidden/heads
(attention ignores a `head_dim` key while the RoPE tables read it, so one that differs is
refused). `qk_layernorm` adds a LayerNorm per head on q and on k (eps `layer_norm_eps`, torch's
kernel, a weight and no bias, unlike the block norms), each head its own module, so its weights are
stored one tensor per head (`q_layernorm.norms.{h}.weight`) and joined into the canonical
[heads, head_dim] (`k_layernorm` over the KV heads). `hidden_dropout` drops the MLP output only, in
training, which no ArchConfig field means: it is checked, not kept.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.gguf import (
    NO_ROPE_BASE,
    PADDED,
    GgufArch,
    weight_and_bias,
)
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_rope import rope
from ..tables.points import QK_NORM_HEADS_FIRST
from ..tables.table import Rule, TensorTable
from ..tables.transforms import IDENTITY, Row
from . import llama, starcoder2

# StableLmLayerNormPerHead: one nn.LayerNorm per head, rows of the canonical [heads, head_dim] weight
QK_NORM_RULES = (Rule("model.layers.{}.self_attn.q_layernorm.norms.{}.weight", "layers.{}.attn.q_norm.weight",
                      Row("heads")),
                 Rule("model.layers.{}.self_attn.k_layernorm.norms.{}.weight", "layers.{}.attn.k_norm.weight",
                      Row("kv_heads")))
TENSORS = TensorTable(llama.EDGE_RULES + (Rule("model.norm.bias", "final_norm.bias"),) + llama.ATTENTION_RULES
                      + llama.MLP_RULES + starcoder2.NORM_RULES + QK_NORM_RULES)

PLACEMENTS = {False: "pre", True: "parallel_shared"}


def qkv_bias_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # true only when all three are there, so a partial set is reported as the biases it cannot express
    return {"use_qkv_bias": cfg.q_bias and cfg.k_bias and cfg.v_bias}



def head_dim_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    derived = fields["d_model"] // fields["n_heads"]
    if hf.get("head_dim") not in (None, derived):
        raise MappingError(f"config.json: head_dim={hf.get('head_dim')} differs from hidden_size / num_attention_heads "
                           f"= {derived}: StableLM's attention ignores it while its RoPE reads it; remove the key")
    return {}


def qk_layernorm_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    if hf.get("qk_layernorm"):
        return {"qk_norm": "head", "qk_norm_weight": "per_head", "qk_norm_bias": False}
    return {}


def qk_layernorm_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # any other QK norm reads back as none or as this one, so export refuses it by name
    return {"qk_layernorm": cfg.qk_norm == "head" and cfg.qk_norm_weight == "per_head" and not cfg.qk_norm_bias}


def parallel_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # another placement reads back as pre-norm, so export refuses it by name
    return {"use_parallel_residual": cfg.norm_placement == "parallel_shared"}


CONFIG = llama.CONFIG.but(
    drop=("attention_bias", "mlp_bias"),
    add=(Entry("head_dim", (Key("head_dim", int, None, nullable=True),), head_dim_from_hf, lambda cfg: {}),
         Entry("norm", (Key("layer_norm_eps", float, 1e-5),),
               lambda hf, _: {"norm": NormConfig(kind="layer", bias=True, eps=hf.get("layer_norm_eps"),
                                                 dtype_order="scale_then_cast")},
               lambda cfg: {"layer_norm_eps": cfg.norm.eps}),
         rope(partial=True),
         Entry("use_qkv_bias", (Key("use_qkv_bias", bool, False),),
               lambda hf, _: dict.fromkeys(("q_bias", "k_bias", "v_bias"), hf.get("use_qkv_bias")), qkv_bias_to_hf),
         Entry("use_parallel_residual", (Key("use_parallel_residual", bool, False),),
               lambda hf, _: {"norm_placement": PLACEMENTS[hf.get("use_parallel_residual")]}, parallel_to_hf),
         Entry("qk_layernorm", (Key("qk_layernorm", bool, False),), qk_layernorm_from_hf, qk_layernorm_to_hf),
         Entry("hidden_dropout", (Key("hidden_dropout", float, 0.0, bound="probability"),), lambda hf, _: {},
               lambda cfg: {"hidden_dropout": DEFAULT})),
    defaults={"vocab_size": 50304, "intermediate_size": 6912, "hidden_size": 2560, "num_key_value_heads": 32,
              "max_position_embeddings": 4096, "partial_rotary_factor": 0.25},
    nullable={"num_key_value_heads": False, "attention_dropout": False},
)


# -- llama.cpp (GGUF)
def _stablelm_table() -> TensorTable:
    """llama.cpp's StableLM (`StableLMModel`): LayerNorms with biases, optional q/k/v biases (the
    config says which; the o and MLP bias rules are gguf's names, which StableLM never fills),
    SwiGLU, q/k unpermuted (NeoX-style rotation); `output` always written."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        *(rule for g, c in (("attn_q", "attn.q"), ("attn_k", "attn.k"), ("attn_v", "attn.v"),
                            ("attn_output", "attn.o"), ("ffn_gate", "mlp.gate"), ("ffn_up", "mlp.up"),
                            ("ffn_down", "mlp.down"))
          for rule in weight_and_bias(g, c, IDENTITY)),
    ))


GGUF_STABLELM = GgufArch("stablelm", arch="stablelm", keys={"attention.layer_norm_epsilon": "layer_norm_eps",
                                               "use_parallel_residual": "use_parallel_residual"},
                         omitted=NO_ROPE_BASE,
                             defaults={"hidden_act": "silu"}, bias_flags={"use_qkv_bias": "blk.0.attn_q.bias"},
                             norm_eps="attention.layer_norm_epsilon", partial_rotary=True, table=_stablelm_table(),
                             unread={"blk.0.attn_q_norm.weight":
                                     "per-head QK LayerNorms, StableLM's qk_layernorm=true"})


# StableLmAttention: q_proj(x).view(B, T, -1, D).transpose(1, 2), then q_layernorm, a
# LayerNorm per head
REFERENCE_LAYOUTS = QK_NORM_HEADS_FIRST

FAMILY = Family("stablelm", ("stablelm",), "StableLmForCausalLM", TENSORS, CONFIG, gguf=(GGUF_STABLELM,),
                reference_layouts=REFERENCE_LAYOUTS)
