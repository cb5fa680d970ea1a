"""Phi-3.5-MoE (PhimoeForCausalLM, model_type `phimoe`).

Same as mixtral, except: the norms are torch's LayerNorm with a bias (`rms_norm_eps` is its eps,
default 1e-5); `attention_bias` switches the q, k, v and o biases and `lm_head_bias` the LM head's;
the router (`block_sparse_moe.gate` on the Hub, `mlp.router` in transformers 5) is SparseMixer's
inference path (MoeConfig router "sparsemixer"): always two experts whatever `num_experts_per_tok`
says, each weighted by a softmax in the activation dtype over the experts within a relative
2 x `router_jitter_noise` (default 0.01) of its score, not renormalised, weights in the activation
dtype; `sliding_window` (default null) windows every layer; RoPE's theta defaults to 1e6, and a
scaled RoPE must be longrope with `short_mscale` and `long_mscale`, which PhimoeRotaryEmbedding
multiplies cos/sin by in place of longrope's attention factor, and whose frequencies it always
takes from `short_factor` (it recomputes them without the sequence length): `long_factor` is read
as `short_factor`, and the two mscales must be equal (as published: 1.243), lmconvert's longrope
scaling both regimes alike. `input_jitter_noise` acts in training only and is not read.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig, NormConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, plain
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import expert_rules
from ..tables.hf_rope import KEYS, rope_from_hf, rope_parameters, rope_to_hf
from ..tables.table import Rule, TensorTable
from . import llama, ministral3, mixtral, starcoder2

TENSORS = TensorTable(llama.EDGE_RULES + (Rule("model.norm.bias", "final_norm.bias"),
                                          Rule("lm_head.bias", "lm_head.bias"))
                      + llama.ATTENTION_RULES + starcoder2.NORM_RULES
                      + expert_rules("block_sparse_moe", ("w1", "w3", "w2"), "gate")
                      + (Rule("model.layers.{}.mlp.router.weight", "layers.{}.mlp.router.weight"),))


def rope_from_phimoe(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    params, where = rope_parameters(hf)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in ("default", None):
        return {"rope": rope_from_hf(hf, params, where)}
    if kind != "longrope":
        raise MappingError(f"config.json: {where}rope_type={kind!r}: PhiMoE scales cos/sin of any scaled RoPE by "
                           "short_mscale / long_mscale; lmconvert reads only its longrope")
    short, long = params.get("short_mscale"), params.get("long_mscale")
    for name, value in (("short_mscale", short), ("long_mscale", long)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MappingError(f"config.json: {where}{name}={value!r} should be a number (PhimoeConfig refuses it)")
    if short != long:
        raise MappingError(f"config.json: {where}short_mscale={short} and long_mscale={long} differ: lmconvert's "
                           "longrope scales cos/sin by one factor before and past original_max_position_embeddings")
    return {"rope": rope_from_hf(hf, {**params, "long_factor": params.get("short_factor"),
                                      "attention_factor": float(short)}, where)}


def rope_to_phimoe(cfg: ArchConfig) -> dict[str, Any]:
    out = rope_to_hf(cfg.rope)
    if cfg.rope.scaling == "longrope":
        scale = out.pop("attention_factor", None) or cfg.rope.longrope_attention_factor()
        out.update(short_mscale=scale, long_mscale=scale)
        if cfg.rope.factor == cfg.max_positions / cfg.rope.original_max_positions:  # what an absent one means
            out.pop("factor", None)
    return {"rope_parameters": out}


EXPERT_KEYS = (Key("num_local_experts", int, 16), Key("num_experts_per_tok", int, 2),
               Key("router_jitter_noise", float, 0.01, bound="non_negative"),
               Key("output_router_logits", bool, False),
               Key("router_aux_loss_coef", float, 0.001, bound="non_negative"))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """SparseMixer chooses two experts whatever num_experts_per_tok says (transformers passes it on unused)."""
    aux = hf.get("router_aux_loss_coef") if hf.get("output_router_logits") else 0.0
    return {"moe": MoeConfig(n_experts=hf.get("num_local_experts"), top_k=2, d_expert=fields["d_ff"],
                             router="sparsemixer", norm_topk=False, sparsemixer_eps=hf.get("router_jitter_noise"),
                             aux_loss=aux)}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    if moe is None or moe.router != "sparsemixer":  # read back as SparseMixer: export refuses it by name
        return {"num_local_experts": DEFAULT}
    return {"num_local_experts": moe.n_experts, "num_experts_per_tok": moe.top_k,
            "router_jitter_noise": moe.sparsemixer_eps, "output_router_logits": bool(moe.aux_loss),
            "router_aux_loss_coef": moe.aux_loss or DEFAULT}


CONFIG = mixtral.CONFIG.but(
    add=(Entry("norm", (Key("rms_norm_eps", float, 1e-5),),
               lambda hf, _: {"norm": NormConfig(kind="layer", bias=True, eps=hf.get("rms_norm_eps"),
                                                 dtype_order="scale_then_cast")},
               lambda cfg: {"rms_norm_eps": cfg.norm.eps}),
         Entry("rope", KEYS, rope_from_phimoe, rope_to_phimoe),
         Entry("layer kinds", (ministral3.WINDOW,), ministral3.window_from_hf, ministral3.window_to_hf),
         Entry("experts", EXPERT_KEYS, experts_from_hf, experts_to_hf),
         Entry("head_dim", (Key("head_dim", int, None),), lambda hf, _: {"head_dim": hf.get("head_dim")},
               lambda cfg: {"head_dim": cfg.head_dim}),  # not a PhimoeConfig key: read if stated; null cannot run
         llama.ATTENTION_BIAS,
         plain("lm_head_bias", "lm_head_bias", bool, False)),
    defaults={"vocab_size": 32064, "hidden_size": 4096, "intermediate_size": 6400, "num_hidden_layers": 32,
              "rope_theta": 1e6},
)


FAMILY = Family("phimoe", ("phimoe",), "PhimoeForCausalLM", TENSORS, CONFIG,
                no_gguf="llama.cpp's phimoe graph routes with a softmax over every expert and renormalised top-2 "
                        "weights, not SparseMixer's two masked softmaxes (whose weights each come near 1), so it "
                        "computes another model")
