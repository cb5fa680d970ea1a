"""GPT-2 (openai-community/gpt2 ... gpt2-xl, DistilGPT2, and the many models saved as GPT2LMHeadModel).

Same as gpt_neo, except: q, k and v are one `Conv1D` `attn.c_attn` (weight stored [in, out], the
output q | k | v), and `attn.c_proj`, `mlp.c_fc`, `mlp.c_proj` are `Conv1D`s too, all with biases
(the tensor table transposes them and cuts c_attn into its three pieces; export joins them back),
computed as Conv1D computes them (`conv1d_linears`: addmm over the weight held [in, out], whose bf16
and fp16 bits differ from `linear` over [out, in] on AVX2 kernels);
every layer is global; scores are scaled by head_dim ** -0.5 when `scale_attn_weights` (default
true), further divided by layer index + 1 when `scale_attn_by_inverse_layer_idx`; `reorder_and_upcast_attn`
computes q.k from fp32 copies as one baddbmm with the scale inside (eager only: transformers' SDPA
path ignores it); the softmax runs in the scores' dtype, which rounds as fp32 cast back; the keys
are `n_embd`, `n_layer`, `n_head`, `n_positions`, `n_inner` (null: 4 * n_embd), also read as hidden_size,
num_hidden_layers, num_attention_heads, max_position_embeddings (GPT2Config's attribute_map);
dropouts `embd_pdrop`, `resid_pdrop`, `attn_pdrop` (training only). The original checkpoints'
names without `transformer.`, and their stored causal-mask buffers (`attn.bias`,
`attn.masked_bias`), are read too; export writes the prefixed names. `add_cross_attention` (an
encoder-decoder's cross attention) is refused.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from ..family import Family
from ..tables.config_table import ConfigTable, Entry, fixed, plain, unsupported
from ..tables.gguf import (
    GgufArch,
    weight_and_bias,
)
from ..tables.hf_alias import aliased
from ..tables.hf_config import HfConfig, Key
from ..tables.points import Piece as PointPiece
from ..tables.table import Rule, TensorTable
from ..tables.transforms import IDENTITY, Chain, Piece, Transpose
from .llama import activation
from .opt import learned_positions

THIRDS = ("q", "q", "q")  # c_attn: q | k | v, each as wide as the model

QKV = ("q", "k", "v")


def _rules(prefix: str) -> tuple[Rule, ...]:
    """The whole table under one prefix ("transformer." as transformers saves it, "" as the
    original checkpoints do)."""
    layer = f"{prefix}h.{{}}"
    return (
        Rule(f"{prefix}wte.weight", "embed.weight"),
        Rule(f"{prefix}wpe.weight", "pos_embed.weight"),
        *(Rule(f"{layer}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
          for hf, c in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")) for p in ("weight", "bias")),
        *(Rule(f"{layer}.attn.c_attn.weight", f"layers.{{}}.attn.{c}.weight", Chain(Transpose(), Piece(THIRDS, i)))
          for i, c in enumerate(QKV)),
        *(Rule(f"{layer}.attn.c_attn.bias", f"layers.{{}}.attn.{c}.bias", Piece(THIRDS, i)) for i, c in enumerate(QKV)),
        *(Rule(f"{layer}.{hf}.weight", f"layers.{{}}.{c}.weight", Transpose())
          for hf, c in (("attn.c_proj", "attn.o"), ("mlp.c_fc", "mlp.up"), ("mlp.c_proj", "mlp.down"))),
        *(Rule(f"{layer}.{hf}.bias", f"layers.{{}}.{c}.bias")
          for hf, c in (("attn.c_proj", "attn.o"), ("mlp.c_fc", "mlp.up"), ("mlp.c_proj", "mlp.down"))),
        Rule(f"{layer}.attn.bias", None),  # causal-mask buffers of older checkpoints
        Rule(f"{layer}.attn.masked_bias", None),
        Rule(f"{prefix}ln_f.weight", "final_norm.weight"),
        Rule(f"{prefix}ln_f.bias", "final_norm.bias"),
    )


TENSORS = TensorTable(_rules("transformer.") + (Rule("lm_head.weight", "lm_head.weight"),) + _rules(""))


def attention_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    return {"attn_scale": None if hf.get("scale_attn_weights") else 1.0,
            "scale_by_inverse_layer": hf.get("scale_attn_by_inverse_layer_idx"),
            "scores_fp32": hf.get("reorder_and_upcast_attn"), "scale_in_product": hf.get("reorder_and_upcast_attn")}


def attention_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # another custom scale reads back as head_dim's own, so export refuses it by name
    return {"scale_attn_weights": cfg.attn_scale != 1.0, "scale_attn_by_inverse_layer_idx": cfg.scale_by_inverse_layer,
            "reorder_and_upcast_attn": cfg.scores_fp32 and cfg.scale_in_product}


# GPT-2's LayerNorm (weight and bias, torch's kernel), GPT-Neo's too
LAYER_NORM = Entry("norm", (Key("layer_norm_epsilon", float, 1e-5),),
                   lambda hf, _: {"norm": NormConfig(kind="layer", bias=True, eps=hf.get("layer_norm_epsilon"),
                                                     dtype_order="scale_then_cast")},
                   lambda cfg: {"layer_norm_epsilon": cfg.norm.eps})

CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 50257),
    aliased("n_embd", "hidden_size", "d_model", int, 768),
    Entry("n_inner", (Key("n_inner", int, None, nullable=True),),
          lambda hf, fields: {"d_ff": hf.get("n_inner") or 4 * fields["d_model"]},
          lambda cfg: {"n_inner": None if cfg.d_ff == 4 * cfg.d_model else cfg.d_ff}),
    aliased("n_layer", "num_hidden_layers", "n_layers", int, 12),
    aliased("n_head", "num_attention_heads", "n_heads", int, 12),
    aliased("n_positions", "max_position_embeddings", "max_positions", int, 1024),
    plain("tie_word_embeddings", "tie_embeddings", bool, True),
    LAYER_NORM,
    activation("activation_function", "gelu_new"),
    Entry("attention", (Key("scale_attn_weights", bool, True), Key("scale_attn_by_inverse_layer_idx", bool, False),
                        Key("reorder_and_upcast_attn", bool, False)), attention_from_hf, attention_to_hf),
    plain("embd_pdrop", "embed_dropout", float, 0.1, bound="probability"),
    plain("resid_pdrop", "resid_dropout", float, 0.1, bound="probability"),
    plain("attn_pdrop", "attn_dropout", float, 0.1, bound="probability"),
    unsupported("add_cross_attention", bool, False, "cross attention to an encoder", "GPT-2"),
    fixed("GPT-2 layers", gated=False, q_bias=True, k_bias=True, v_bias=True, o_bias=True, mlp_bias=True,
          conv1d_linears=True),
    Entry("positions", (), lambda hf, fields: learned_positions(fields["n_layers"], 0), lambda cfg: {}),
))


# -- llama.cpp (GGUF)
def _gpt2_table() -> TensorTable:
    """llama.cpp's GPT-2 (`GPT2Model` in convert_hf_to_gguf.py): its converter transposes the Conv1D
    weights to nn.Linear's [out, in], so c_attn is `attn_qkv`, q | k | v along its rows; norms have
    biases; `position_embd` is the learned table; `output` is always written (a copy of
    token_embd for the tied original)."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight"),
        Rule("position_embd.weight", "pos_embed.weight"),
        *(Rule(f"blk.{{}}.attn_qkv.{p}", f"layers.{{}}.attn.{c}.{p}", Piece(("q", "q", "q"), i))
          for p in ("weight", "bias") for i, c in enumerate("qkv")),
        *weight_and_bias("attn_output", "attn.o", IDENTITY), *weight_and_bias("ffn_up", "mlp.up", IDENTITY),
        *weight_and_bias("ffn_down", "mlp.down", IDENTITY),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        Rule("output.weight", "lm_head.weight"),
    ))


GGUF_GPT2 = GgufArch("gpt2", arch="gpt2", keys={"attention.layer_norm_epsilon": "layer_norm_epsilon",
                                       "feed_forward_length": "n_inner"},
                         norm_eps="attention.layer_norm_epsilon", table=_gpt2_table())


# q, k and v are the three pieces of one Conv1D, `c_attn`: q | k | v along its output
REFERENCE_LAYOUTS = {"attn.q": PointPiece("B T P*H*D", "P", 0), "attn.k": PointPiece("B T P*KV*D", "P", 1),
                     "attn.v": PointPiece("B T P*KV*DV", "P", 2)}

FAMILY = Family("gpt2", ("gpt2",), "GPT2LMHeadModel", TENSORS, CONFIG, gguf=(GGUF_GPT2,),
                reference_layouts=REFERENCE_LAYOUTS)
