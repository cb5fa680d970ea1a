"""OPT (facebook/opt-125m ... 66b, opt-350m).

Same as llama, except: LayerNorms with weight and bias (eps fixed at torch's 1e-5, no config key;
`layer_norm_elementwise_affine` false drops both; `nn.LayerNorm`, so weight and bias apply inside
the kernel in the activation dtype); pre-norm when `do_layer_norm_before` (the final norm kept
unless `_remove_final_layer_norm`), else post-norm with no final norm (opt-350m); learned
positions whose table starts at index 2 (`embed_positions`, max_position_embeddings + 2 rows); q
is multiplied by head_dim ** -0.5 right after its projection and the scores are left unscaled;
`enable_bias` switches the q, k, v, out_proj, fc1 and fc2 biases together; the MLP is plain
(`fc1`, `activation_function` (relu), `fc2`); MHA only, head_dim hidden/heads; embeddings and the
(tied) head are `word_embed_proj_dim` wide, with bias-free `project_in` / `project_out` between
them and the model width when that differs from hidden_size (opt-350m: 512 and 1024). `dropout`
drops each sublayer's output and `attention_dropout` the attention probabilities (training only);
`layerdrop` (training only) is checked, not kept. Positions follow `cumsum(attention_mask)`
(`positions_from_mask`), so a left-padded row is numbered from its first token. Checkpoints saved
from OPTModel (names under `decoder.`, not `model.decoder.`) are read too; export writes
OPTForCausalLM's names.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from ..family import Family
from ..tables.config_table import DEFAULT, ConfigTable, Entry, fixed, plain
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from . import llama

POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding.offset

# q, k, v and out_proj under `self_attn`: the names the fairseq-derived families (OPT, XGLM, GPT-Neo's
# `attn.attention`) share, under each family's prefix
def attention_rules(prefix: str) -> tuple[Rule, ...]:
    return tuple(Rule(f"{prefix}.{hf}_proj.{p}", f"layers.{{}}.attn.{c}.{p}")
                 for hf, c in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o")) for p in ("weight", "bias"))


def fairseq_layer_rules(prefix: str) -> tuple[Rule, ...]:
    """A fairseq decoder layer under `prefix`: self_attn, its norm, fc1 / fc2 and final_layer_norm."""
    return attention_rules(f"{prefix}.self_attn") + tuple(
        Rule(f"{prefix}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
        for hf, c in (("self_attn_layer_norm", "attn_norm"), ("fc1", "mlp.up"), ("fc2", "mlp.down"),
                      ("final_layer_norm", "mlp_norm"))
        for p in ("weight", "bias"))


def _decoder_rules(prefix: str) -> tuple[Rule, ...]:
    """The decoder's tensors under `prefix`: "model.decoder." as OPTForCausalLM saves them,
    "decoder." as checkpoints saved from OPTModel (the original uploads) hold them."""
    return (
        Rule(f"{prefix}embed_tokens.weight", "embed.weight"),
        Rule(f"{prefix}project_in.weight", "project_in.weight"),
        Rule(f"{prefix}embed_positions.weight", "pos_embed.weight"),
        *fairseq_layer_rules(f"{prefix}layers.{{}}"),
        Rule(f"{prefix}final_layer_norm.weight", "final_norm.weight"),
        Rule(f"{prefix}final_layer_norm.bias", "final_norm.bias"),
        Rule(f"{prefix}project_out.weight", "project_out.weight"),
    )


TENSORS = TensorTable(_decoder_rules("model.decoder.") + (Rule("lm_head.weight", "lm_head.weight"),)
                      + _decoder_rules("decoder."))

BIASES = ("q_bias", "k_bias", "v_bias", "o_bias", "mlp_bias")


def norm_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    affine = hf.get("layer_norm_elementwise_affine")
    return {"norm": NormConfig(kind="layer", eps=1e-5, weight=affine, bias=affine, dtype_order="scale_then_cast")}


def norm_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # any other norm reads back as this one, so export refuses it by name
    return {"layer_norm_elementwise_affine": cfg.norm.weight}


def placement_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    before = hf.get("do_layer_norm_before")
    return {"norm_placement": "pre" if before else "post",
            "final_norm": before and not hf.get("_remove_final_layer_norm")}


def placement_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    before = cfg.norm_placement != "post"
    return {"do_layer_norm_before": before, "_remove_final_layer_norm": DEFAULT if cfg.final_norm or not before
            else True}


def learned_positions(n_layers: int, offset: int) -> dict[str, Any]:
    """A learned table added to the embeddings, and no positions inside attention."""
    return {"absolute_positions": "learned", "position_offset": offset, "layer_positions": ("none",) * n_layers}


def embed_dim_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    return {"embed_dim": hf.get("word_embed_proj_dim")}  # null or absent: hidden_size


def enable_bias_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # true only when all five are there, so a partial set is reported as the biases it cannot express
    return {"enable_bias": all(getattr(cfg, name) for name in BIASES)}


CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 50272),
    plain("hidden_size", "d_model", int, 768),
    plain("ffn_dim", "d_ff", int, 3072),
    plain("num_hidden_layers", "n_layers", int, 12),
    plain("num_attention_heads", "n_heads", int, 12),
    plain("max_position_embeddings", "max_positions", int, 2048),
    plain("tie_word_embeddings", "tie_embeddings", bool, True),
    Entry("norm", (Key("layer_norm_elementwise_affine", bool, True),), norm_from_hf, norm_to_hf),
    Entry("placement", (Key("do_layer_norm_before", bool, True), Key("_remove_final_layer_norm", bool, False)),
          placement_from_hf, placement_to_hf),
    llama.activation("activation_function", "relu"),
    Entry("enable_bias", (Key("enable_bias", bool, True),),
          lambda hf, _: dict.fromkeys(BIASES, hf.get("enable_bias")), enable_bias_to_hf),
    Entry("word_embed_proj_dim", (Key("word_embed_proj_dim", int, None, nullable=True),), embed_dim_from_hf,
          lambda cfg: {"word_embed_proj_dim": cfg.embed_dim}),
    plain("dropout", "resid_dropout", float, 0.1, bound="probability"),
    plain("attention_dropout", "attn_dropout", float, 0.0, bound="probability"),
    Entry("layerdrop", (Key("layerdrop", float, 0.0, bound="probability"),), lambda hf, _: {},
          lambda cfg: {"layerdrop": DEFAULT}),
    fixed("OPT attention", gated=False, scale_query=True),
    fixed("OPT positions", positions_from_mask=True),
    Entry("positions", (), lambda hf, fields: learned_positions(fields["n_layers"], POSITION_OFFSET),
          lambda cfg: {}),
))


# OPTDecoderLayer runs its MLP on the hidden states flattened to (B*T, d)
def reference_layouts(cfg: ArchConfig) -> dict[str, str]:
    """OPTDecoderLayer runs its MLP on the hidden states flattened to (B*T, d); pre-norm, its
    `final_layer_norm` (our mlp_norm) too, which post-norm runs after the view back."""
    flat = {"mlp.up": "B*T F", "mlp.down": "B*T d"}
    return {**flat, "mlp_norm": "B*T d"} if cfg.norm_placement == "pre" else flat


REFERENCE_LAYOUTS = reference_layouts

FAMILY = Family("opt", ("opt",), "OPTForCausalLM", TENSORS, CONFIG, reference_layouts=REFERENCE_LAYOUTS)
