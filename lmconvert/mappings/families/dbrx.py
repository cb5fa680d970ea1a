"""DBRX (databricks/dbrx-base, dbrx-instruct), as transformers 5 runs it.

Same as mixtral, except: its config nests the attention keys in `attn_config` (`kv_n_heads`,
`clip_qkv`, `attn_pdrop`) and the FFN's in `ffn_config` (`ffn_hidden_size`, the experts' width,
`moe_num_experts`, `moe_top_k`, `ffn_act_fn` {"name": ...}, `moe_normalize_expert_weights`,
`moe_loss_weight`), and spells the shared keys `d_model`, `n_heads`, `n_layers`, `max_seq_len`
(DbrxConfig's attribute_map also reads hidden_size, num_attention_heads, num_hidden_layers,
max_position_embeddings); LayerNorms (torch's, eps 1e-5) with a weight and no bias, `norm_1`
before attention and `norm_2` before the FFN; q, k, v one fused projection (`Wqkv`, all q rows,
then k, then v) clamped to +-`clip_qkv`; no biases; untied (DbrxConfig refuses tied embeddings);
the router (`ffn.router.layer`) takes the softmax of its logits in the activation dtype, the top
k, and divides them by their `moe_normalize_expert_weights`-norm (torch.norm, p=1 by default;
null: not renormalised), all in the activation dtype; every expert's gate, up and down are blocks
of `ffn_size` rows of `ffn.experts.mlp.w1`, `v1` and `w2` (w2 stored [width, hidden], multiplied as
`x @ w2`), gate and up computed as two products, and summed expert by expert (`index_add_`), the one
order transformers' `DbrxExperts` has (`sum_order="eager"`). `resid_pdrop` drops each sublayer's output in
training; `emb_pdrop` and `moe_jitter_eps` act in training only and are read and unused. transformers
5 takes RoPE's theta from `rope_parameters` (or `rope_theta`), not from `attn_config.rope_theta`
(which DbrxAttention needs present, and which llama.cpp's converter reads): a file where the two
disagree is refused.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig, NormConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, ConfigTable, Entry, fixed, plain
from ..tables.gguf import MOE_RULES, PADDED, written
from ..tables.hf_alias import aliased
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_rope import rope
from ..tables.points import FUSED_QKV, RESIDUAL
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Chain, ExpertBlocks, ExpertsTransposed, Piece, Unstack
from . import llama
from .gpt_neox import fused_qkv

BLOCK = "transformer.blocks.{}"
TENSORS = TensorTable((
    Rule("transformer.wte.weight", "embed.weight"),
    Rule(f"{BLOCK}.norm_attn_norm.norm_1.weight", "layers.{}.attn_norm.weight"),
    *fused_qkv(f"{BLOCK}.norm_attn_norm.attn.Wqkv.weight", grouped=False),  # already [q; k; v]
    Rule(f"{BLOCK}.norm_attn_norm.attn.out_proj.weight", "layers.{}.attn.o.weight"),
    Rule(f"{BLOCK}.norm_attn_norm.norm_2.weight", "layers.{}.mlp_norm.weight"),
    Rule(f"{BLOCK}.ffn.router.layer.weight", "layers.{}.mlp.router.weight"),
    Rule(f"{BLOCK}.ffn.experts.mlp.w1", "layers.{}.mlp.experts.{}.gate.weight", Chain(ExpertBlocks("ffn"), Unstack())),
    Rule(f"{BLOCK}.ffn.experts.mlp.v1", "layers.{}.mlp.experts.{}.up.weight", Chain(ExpertBlocks("ffn"), Unstack())),
    Rule(f"{BLOCK}.ffn.experts.mlp.w2", "layers.{}.mlp.experts.{}.down.weight",
         Chain(ExpertBlocks("ffn"), ExpertsTransposed(), Unstack())),
    Rule("transformer.norm_f.weight", "final_norm.weight"),
    Rule("lm_head.weight", "lm_head.weight"),
))

# attn_config's and ffn_config's keys: DbrxAttentionConfig's and DbrxFFNConfig's defaults
ATTN_KEYS: dict[str, Key] = {key.name: key for key in (
    Key("attn_pdrop", float, 0.0, bound="probability"), Key("clip_qkv", float, None, nullable=True),
    Key("kv_n_heads", int, 1), Key("rope_theta", float, None),
)}
FFN_KEYS: dict[str, Key] = {key.name: key for key in (
    Key("ffn_act_fn", dict, None, nullable=True), Key("ffn_hidden_size", int, 3584),
    Key("moe_num_experts", int, 4), Key("moe_top_k", int, 1),
    Key("moe_jitter_eps", float, None, nullable=True, bound="non_negative"),
    Key("moe_loss_weight", float, 0.01, bound="non_negative"),
    Key("moe_normalize_expert_weights", float, 1.0, nullable=True),
    Key("hidden_size", int, 6144),  # DbrxConfig sets it to d_model on load: read and unused
)}


def sub(hf: HfConfig, name: str, keys: dict[str, Key]) -> HfConfig:
    return HfConfig(dict(hf.get(name) or {}), keys, f"{name}.")


def attention_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    attn = sub(hf, "attn_config", ATTN_KEYS)
    theta = attn.get("rope_theta")
    if theta is not None and theta != fields["rope"].theta:
        raise MappingError(f"config.json: attn_config.rope_theta={theta:g} but RoPE's theta is "
                           f"{fields['rope'].theta:g} (rope_parameters, or rope_theta): transformers 5 runs DBRX "
                           "with the latter, llama.cpp with the former; state the model's theta in both")
    p = attn.get("attn_pdrop")
    return {"n_kv_heads": attn.get("kv_n_heads"), "clip_qkv": attn.get("clip_qkv"), "attn_dropout": p}


def attention_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"attn_config": {"attn_pdrop": cfg.attn_dropout, "clip_qkv": cfg.clip_qkv, "kv_n_heads": cfg.n_kv_heads,
                            "rope_theta": cfg.rope.theta}}


def ffn_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    ffn = sub(hf, "ffn_config", FFN_KEYS)
    act = dict(ffn.get("ffn_act_fn") or {"name": "silu"})
    name = act.pop("name", "silu")
    if act or name not in llama.ACTIVATIONS_FROM_HF:
        raise MappingError(f"config.json: ffn_config.ffn_act_fn={ffn.get('ffn_act_fn')!r} is not supported; "
                           f"supported: {{\"name\": one of {', '.join(llama.ACTIVATIONS_FROM_HF)}}}")
    p = ffn.get("moe_normalize_expert_weights")
    width = ffn.get("ffn_hidden_size")
    moe = MoeConfig(n_experts=ffn.get("moe_num_experts"), top_k=ffn.get("moe_top_k"), d_expert=width,
                    norm_topk=p is not None, norm_p=p, softmax_fp32=False, experts_split=True, sum_order="eager",
                    aux_loss=ffn.get("moe_loss_weight") if hf.get("output_router_logits") else 0.0)
    return {"activation": llama.ACTIVATIONS_FROM_HF[name], "d_ff": width, "moe": moe}


def ffn_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    if moe is None:  # a dense model: DBRX cannot express it; said through the lost field
        return {"ffn_config": {"ffn_hidden_size": cfg.d_ff}, "output_router_logits": DEFAULT}
    act = llama.activation_to_hf(cfg.activation)
    return {"ffn_config": {"ffn_act_fn": {"name": "silu" if act is DEFAULT else act}, "ffn_hidden_size": moe.d_expert,
                           "moe_num_experts": moe.n_experts, "moe_top_k": moe.top_k,
                           "moe_normalize_expert_weights": moe.norm_p if moe.norm_topk else None,
                           "moe_loss_weight": moe.aux_loss or FFN_KEYS["moe_loss_weight"].default},
            "output_router_logits": bool(moe.aux_loss)}


def spelled(key: str, alias: str, field: str, default: int) -> Entry:
    """`key` (written), or its attribute_map alias (read only) where `key` is absent or null, as
    DbrxConfig resolves them; null with no alias stated is refused (transformers' model fails on it)."""
    def read(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
        value = hf.get(key)
        if value is None and hf.stated(alias):
            value = hf.get(alias)
        if value is None:
            raise MappingError(f"config.json: {key}=null is not supported (transformers' model fails on it); "
                               "set a number, or remove the key for the default")
        return {field: value}

    return Entry(key, (Key(key, int, default, nullable=True), Key(alias, int, default, legacy=True)), read,
                 lambda cfg: {key: getattr(cfg, field)})


CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 32000),
    aliased("d_model", "hidden_size", "d_model", int, 2048),  # null: DbrxConfig refuses it (ffn_config.hidden_size)
    *(spelled(key, alias, field, default) for key, alias, field, default in (
        ("n_heads", "num_attention_heads", "n_heads", 16), ("n_layers", "num_hidden_layers", "n_layers", 24),
        ("max_seq_len", "max_position_embeddings", "max_positions", 2048))),
    Entry("tie_word_embeddings", (Key("tie_word_embeddings", bool, False),),
          lambda hf, _: {"tie_embeddings": hf.get("tie_word_embeddings")},
          lambda cfg: {"tie_word_embeddings": cfg.tie_embeddings}),
    rope(),
    Entry("attn_config", (Key("attn_config", dict, None, nullable=True),), attention_from_hf, attention_to_hf),
    Entry("ffn_config", (Key("ffn_config", dict, None, nullable=True), Key("output_router_logits", bool, False,
                                                                            nullable=True)),
          ffn_from_hf, ffn_to_hf),
    plain("resid_pdrop", "resid_dropout", float, 0.0, nullable=True, bound="probability",
          read=lambda p: p or 0.0),
    Entry("emb_pdrop", (Key("emb_pdrop", float, 0.0, nullable=True, bound="probability"),), lambda hf, _: {},
          lambda cfg: {"emb_pdrop": DEFAULT}),  # stored by DbrxModel, never applied
    fixed("block", norm=NormConfig(kind="layer", eps=1e-5, dtype_order="scale_then_cast")),
))


# -- llama.cpp (GGUF)
def _dbrx_table() -> TensorTable:
    """llama.cpp's DBRX: LayerNorms with weights only (`norm_2` is `attn_output_norm`), q, k, v
    fused as [q | k | v] (DBRX's Wqkv), stacked experts ([experts, width, hidden] for gate and
    up, [experts, hidden, width] for down), no biases."""
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED), Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight"), Rule("blk.{}.attn_norm.weight", "layers.{}.attn_norm.weight"),
        Rule("blk.{}.attn_output_norm.weight", "layers.{}.mlp_norm.weight"),
        *(Rule("blk.{}.attn_qkv.weight", f"layers.{{}}.attn.{c}.weight", Piece(("q", "kv", "kv"), i))
          for i, c in enumerate("qkv")),
        Rule("blk.{}.attn_output.weight", "layers.{}.attn.o.weight"),
        *MOE_RULES,
    ))


# DBRX: RoPE in halves (no q/k permutation), clip_qkv as clamp_kqv, the experts' width as feed_forward_length;
# llama.cpp renormalises the top k by their sum (DBRX's default p=1); its config spells the shared keys its own way
GGUF_DBRX = written("dbrx", arch="dbrx", constants={"attention.layer_norm_epsilon": 1e-5},
                    keys={"attention.clamp_kqv": "attn_config.clip_qkv", "expert_count": "ffn_config.moe_num_experts",
                          "expert_used_count": "ffn_config.moe_top_k"},
                    renamed={"hidden_size": "d_model", "num_attention_heads": "n_heads",
                             "num_hidden_layers": "n_layers", "max_position_embeddings": "max_seq_len",
                             "intermediate_size": "ffn_config.ffn_hidden_size",
                             "num_key_value_heads": "attn_config.kv_n_heads"},
                    norm_eps="attention.layer_norm_epsilon", table=_dbrx_table(), experts=True)


# Wqkv: [q; k; v] along its output; the experts run on (and give) the unflattened hidden states
REFERENCE_LAYOUTS = {**FUSED_QKV, "mlp.experts": RESIDUAL, "mlp.expert": RESIDUAL}

FAMILY = Family("dbrx", ("dbrx",), "DbrxForCausalLM", TENSORS, CONFIG, gguf=(GGUF_DBRX,),
                reference_layouts=REFERENCE_LAYOUTS)
