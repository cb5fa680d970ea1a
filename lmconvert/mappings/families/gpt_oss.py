"""gpt-oss (GptOssForCausalLM: gpt-oss-20b, gpt-oss-120b), in its bf16/fp32 form.

Same as mixtral, except: every attention head has a learned sink (`self_attn.sinks` [heads]), a logit
that joins each query's softmax as one more column and is dropped after it, the scores and the sink
less their row max, softmaxed in the scores' dtype (transformers has no SDPA for it: such layers run
eager); `layer_types` (default: even layers sliding, odd layers full) picks the layers that attend
within `sliding_window` (default 128); q, k, v and o have biases (`attention_bias`, default true); the
norms are RMSNorms whose weight multiplies in fp32 before the cast back (`GptOssRMSNorm`,
`rms_norm_eps` default 1e-5); RoPE defaults to YaRN (factor 32 over 4096 positions, beta_fast 32,
beta_slow 1, untruncated, theta 150000) when config.json states none; the router
(`mlp.router`, with a bias) takes the top `num_experts_per_tok` (default 4) of `num_local_experts`
(default 128; `num_experts` read too) logits and weights them by the softmax over those k alone, in
the activation dtype; the experts are stored fused and transposed (`mlp.experts.gate_up_proj`
[experts, hidden, 2 * width] with gate and up columns interleaved, `down_proj` [experts, width,
hidden]), each projection with a bias added after the product (`gate_up_proj_bias`,
`down_proj_bias`), and gate with a clamped SwiGLU: the gate clamped above at `swiglu_limit` (7.0),
up to +-`swiglu_limit`, then (up + 1) * gate * sigmoid(`swiglu_alpha` (1.702) * gate); `hidden_act`
is not read by the model. The Hub's MXFP4 expert blocks (`*_blocks`, `*_scales`) are read by
formats/mxfp4.py, and kept as they are through this table (each transform's counterpart on them).
The auxiliary-loss keys act in training only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.gguf import ATTENTION_BIAS_FLAG, PADDED, weight_and_bias, written
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layers_and_window_to_hf,
    window_fields,
)
from ..tables.hf_moe import experts
from ..tables.hf_rope import KEYS, rope_from_hf, rope_parameters, rope_to_hf
from ..tables.table import Rule, TensorTable
from ..tables.transforms import IDENTITY, Chain, ExpertsTransposed, PairedRows, Unstack
from . import llama

MLP = "model.layers.{}.mlp"
EXPERT = "layers.{}.mlp.experts.{}"
EXPERT_RULES = (
    Rule(f"{MLP}.router.weight", "layers.{}.mlp.router.weight"),
    Rule(f"{MLP}.router.bias", "layers.{}.mlp.router.bias"),
    *(Rule(f"{MLP}.experts.gate_up_proj", f"{EXPERT}.{name}.weight",
           Chain(ExpertsTransposed(), PairedRows(), Unstack(part=part, parts=2)))
      for part, name in enumerate(("gate", "up"))),
    *(Rule(f"{MLP}.experts.gate_up_proj_bias", f"{EXPERT}.{name}.bias",
           Chain(PairedRows(), Unstack(part=part, parts=2))) for part, name in enumerate(("gate", "up"))),
    Rule(f"{MLP}.experts.down_proj", f"{EXPERT}.down.weight", Chain(ExpertsTransposed(), Unstack())),
    Rule(f"{MLP}.experts.down_proj_bias", f"{EXPERT}.down.bias", Unstack()),
)
SINK_RULES = (Rule("model.layers.{}.self_attn.sinks", "layers.{}.attn.sinks"),)
TENSORS = TensorTable(llama.EDGE_RULES + SINK_RULES + llama.ATTENTION_RULES + llama.PRE_NORM_RULES + EXPERT_RULES)

# GptOssConfig's RoPE when config.json states neither rope_parameters nor rope_scaling (its theta: rope_theta's)
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def rope_from_gpt_oss(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    if not hf.get("rope_scaling") and hf.get("rope_parameters") is None:
        params, where = dict(DEFAULT_ROPE), "rope_parameters."
    else:
        params, where = rope_parameters(hf)
    return {"rope": rope_from_hf(hf, params, where)}


def rope_to_gpt_oss(cfg: ArchConfig) -> dict[str, Any]:
    """`rope_parameters`; YaRN's betas and truncation always stated, as GptOssConfig's default states them."""
    out = rope_to_hf(cfg.rope)
    if out["rope_type"] == "yarn":
        out.update(beta_fast=cfg.rope.beta_fast, beta_slow=cfg.rope.beta_slow, truncate=cfg.rope.truncate)
    return {"rope_parameters": out}


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: (i + 1) % 2 == 1)
    return window_fields(kinds, hf.get("sliding_window"))


ROUTED = experts(Key("num_local_experts", int, 128), Key("num_experts_per_tok", int, 4),
                 count_legacy=Key("num_experts", int, None, legacy=True), router="topk_softmax", norm_topk=False,
                 softmax_fp32=False, router_bias=True, expert_bias=True, aux_default=0.001)
SWIGLU = (Key("swiglu_alpha", float, 1.702), Key("swiglu_limit", float, 7.0))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    moe = ROUTED.read(hf, fields)["moe"]
    return {"moe": replace(moe, glu="clamped_swiglu", glu_alpha=hf.get("swiglu_alpha"),
                           glu_limit=hf.get("swiglu_limit"))}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    clamped = cfg.moe is not None and cfg.moe.glu == "clamped_swiglu"
    return {**ROUTED.write(cfg), "swiglu_alpha": cfg.moe.glu_alpha if clamped else DEFAULT,
            "swiglu_limit": cfg.moe.glu_limit if clamped else DEFAULT}


CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(llama.norm(1e-5, dtype_order="scale_then_cast"),
         Entry("rope", KEYS, rope_from_gpt_oss, rope_to_gpt_oss),
         Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY), window_from_hf, layers_and_window_to_hf),
         Entry("experts", ROUTED.keys + SWIGLU, experts_from_hf, experts_to_hf),
         fixed("sinks", attn_sinks=True)),
    defaults={"vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
              "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
              "max_position_embeddings": 131072, "rope_theta": 150000.0, "sliding_window": 128,
              "attention_bias": True},
    nullable={"num_key_value_heads": False, "head_dim": False, "attention_dropout": False},
)


# -- llama.cpp (GGUF)
# llama.cpp's gpt-oss (convert_hf_to_gguf.py's GptOssModel on a bf16/fp32 checkpoint): q/k/v/o with biases,
# unpermuted (NeoX rotation); the sinks as `attn_sinks.weight`; the MLP's norm as `post_attention_norm`; the
# router and each projection's experts stacked with their biases ([experts, width, hidden] and [experts,
# width]), gate and up split out of the interleaved gate_up_proj. Its graph hard-codes the sliding pattern (even
# layers sliding), the SwiGLU's alpha 1.702 and limit 7.0, YaRN's betas 32 and 1 (its loader reads no others) and
# its truncated correction range: a model with others is refused by name (its read-back differs). A file without
# RoPE scaling is unscaled RoPE (GptOssConfig's default would be YaRN)
GGUF_TABLE = TensorTable((
    Rule("token_embd.weight", "embed.weight", PADDED),
    Rule("output.weight", "lm_head.weight", PADDED),
    Rule("output_norm.weight", "final_norm.weight"),
    *(r for g, c in (("attn_q", "attn.q"), ("attn_k", "attn.k"), ("attn_v", "attn.v"), ("attn_output", "attn.o"))
      for r in weight_and_bias(g, c, IDENTITY)),
    Rule("blk.{}.attn_sinks.weight", "layers.{}.attn.sinks"),
    Rule("blk.{}.attn_norm.weight", "layers.{}.attn_norm.weight"),
    Rule("blk.{}.post_attention_norm.weight", "layers.{}.mlp_norm.weight"),
    *weight_and_bias("ffn_gate_inp", "mlp.router", IDENTITY),
    *(Rule(f"blk.{{}}.ffn_{n}_exps.{p}", f"layers.{{}}.mlp.experts.{{}}.{n}.{p}", Unstack())
      for n in ("gate", "up", "down") for p in ("weight", "bias")),
))
GGUF_GPT_OSS = written("gpt_oss", arch="gpt-oss", table=GGUF_TABLE, experts=True,
                       keys={"expert_count": "num_local_experts", "expert_used_count": "num_experts_per_tok",
                             "expert_feed_forward_length": "intermediate_size",
                             "attention.sliding_window": "sliding_window"},
                       defaults={"swiglu_alpha": 1.702, "swiglu_limit": 7.0, "hidden_act": "silu"},
                       bias_flags=ATTENTION_BIAS_FLAG, rope_fixed={"beta_fast": 32.0, "beta_slow": 1.0},
                       derived=lambda config: {} if config.get("rope_scaling") else
                       {"rope_scaling": {"rope_type": "default"}})


FAMILY = Family("gpt_oss", ("gpt_oss",), "GptOssForCausalLM", TENSORS, CONFIG, gguf=(GGUF_GPT_OSS,))
