"""GPT-J (GPT-J-6B and its fine-tunes).

Same as llama, except: LayerNorm with a bias (`layer_norm_epsilon`, default 1e-5; torch's
kernel, so weight and bias apply in fp32); one norm shared by attention and the MLP, which run in
parallel and are summed `(attn + mlp) + h`; interleaved RoPE (rotate every two) over an absolute
`rotary_dim` (default 64) of each head, theta fixed at 10000, cos/sin tables in fp32 cast to the
activation dtype; q and k upcast to fp32 before the scores; no attention biases; a plain MLP with
biases (`fc_in`, `activation_function` (gelu_new), `fc_out`); an LM head with a bias (so never
tied); GPT-2 style keys (`n_embd`, `n_layer`, `n_head`, `n_positions`, also read as hidden_size,
num_hidden_layers, num_attention_heads, max_position_embeddings, GPTJConfig's attribute_map;
`n_inner`: None means 4 x n_embd) and dropouts (`resid_pdrop`, `embd_pdrop`, `attn_pdrop`,
training only); no KV grouping.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, NormConfig, RopeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import ConfigTable, Entry, fixed, plain, unsupported
from ..tables.hf_alias import aliased
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from . import llama


def layer_norm(key: str, eps: float, nullable: bool = False, **constants: Any) -> Entry:
    """`key` <-> norm.eps of torch's LayerNorm with a bias (weight and bias applied in fp32 by the
    kernel); `constants` are further NormConfig fields the family fixes. `nullable`: the config
    class accepts null (Falcon), which no LayerNorm can run with, so it is refused here."""
    def read(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
        if hf.get(key) is None:
            raise MappingError(f"config.json: {key}=null gives the LayerNorms no epsilon; state it (default {eps:g})")
        values = {"kind": "layer", "bias": True, "dtype_order": "scale_then_cast", **constants}
        return {"norm": NormConfig(eps=hf.get(key), **values)}

    return Entry("norm", (Key(key, float, eps, nullable=nullable),), read, lambda cfg: {key: cfg.norm.eps})


def inner_from_hf(key: str) -> Entry:
    """`key` (None: 4 x hidden size) <-> d_ff; written as None where it is that."""
    return Entry("d_ff", (Key(key, int, None, nullable=True),),
                 lambda hf, fields: {"d_ff": hf.get(key) or 4 * fields["d_model"]},
                 lambda cfg: {key: None if cfg.d_ff == 4 * cfg.d_model else cfg.d_ff})


def rotary_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    return {"rope": RopeConfig(layout="interleaved", rotary_dims=hf.get("rotary_dim"))}


def rotary_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # head_dim is always n_embd / n_head: another one reads back as that, refused as "this head_dim"
    head_dim = cfg.d_model // cfg.n_heads
    return {"rotary_dim": min(cfg.rope.rotary_dim(cfg.head_dim), head_dim)}


TENSORS = TensorTable((
    Rule("transformer.wte.weight", "embed.weight"),
    *(Rule(f"transformer.h.{{}}.ln_1.{p}", f"layers.{{}}.attn_norm.{p}") for p in ("weight", "bias")),
    *(Rule(f"transformer.h.{{}}.attn.{hf}.weight", f"layers.{{}}.attn.{c}.weight")
      for hf, c in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o"))),
    *(Rule(f"transformer.h.{{}}.mlp.{hf}.{p}", f"layers.{{}}.mlp.{c}.{p}")
      for hf, c in (("fc_in", "up"), ("fc_out", "down")) for p in ("weight", "bias")),
    Rule("transformer.h.{}.attn.bias", None),  # the causal-mask buffers of older files
    Rule("transformer.h.{}.attn.masked_bias", None),
    *(Rule(f"transformer.ln_f.{p}", f"final_norm.{p}") for p in ("weight", "bias")),
    *(Rule(f"lm_head.{p}", f"lm_head.{p}") for p in ("weight", "bias")),
))

CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 50400),
    aliased("n_embd", "hidden_size", "d_model", int, 4096),
    aliased("n_layer", "num_hidden_layers", "n_layers", int, 28),
    aliased("n_head", "num_attention_heads", "n_heads", int, 16),
    inner_from_hf("n_inner"),
    aliased("n_positions", "max_position_embeddings", "max_positions", int, 2048),
    layer_norm("layer_norm_epsilon", 1e-5),
    llama.activation("activation_function", "gelu_new"),
    Entry("rope", (Key("rotary_dim", int, 64),), rotary_from_hf, rotary_to_hf),
    unsupported("tie_word_embeddings", bool, False, "an LM head tied to the embeddings, keeping its own bias",
                "GPT-J"),
    plain("resid_pdrop", "resid_dropout", float, 0.0, bound="probability"),
    plain("embd_pdrop", "embed_dropout", float, 0.0, bound="probability"),
    plain("attn_pdrop", "attn_dropout", float, 0.0, bound="probability"),
    fixed("block", norm_placement="parallel_shared", parallel_sum="attn+mlp+h", gated=False, mlp_bias=True,
          lm_head_bias=True, scores_fp32=True),
))

FAMILY = Family("gptj", ("gptj",), "GPTJForCausalLM", TENSORS, CONFIG,
                no_gguf="llama.cpp names a gptj architecture but has no graph that runs it")
