"""ERNIE 4.5 mixture of experts (Ernie4_5_MoeForCausalLM: ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B).

Same as ernie4_5, except: its own size defaults (head_dim hidden/heads: no `head_dim` key); the
layers i with (i + 1) % `moe_layer_interval` == 0 within [`moe_layer_start_index`,
`moe_layer_end_index`] (-1: the last layer) are mixtures of `moe_num_experts` (alias
`num_experts`) experts, `moe_intermediate_size` wide, without biases, plus
`moe_num_shared_experts` ungated shared experts (one FFN of their summed width, with the block's
`use_bias`, run on the flattened input and added last); the router (`mlp.gate`, weight and
`e_score_correction_bias` [1, experts] kept in fp32 by transformers) takes fp32 logits from the
fp32 input, a softmax over them in fp32, chooses `moe_k` (alias `num_experts_per_tok`) experts on
the probabilities plus the correction bias, and divides the chosen probabilities by their sum
clamped below at `moe_norm_min`, then casts them to the activation dtype. `use_bias` with a
mixture-of-experts layer is refused: its experts have no biases where its other FFNs have them.
The multi-token-prediction layers (`mtp_*`), which transformers does not load, are not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.gguf import MOE_RULES as GGUF_MOE_RULES
from ..tables.gguf import tensor_table, written
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import FUSED_RULES
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Squeeze
from . import ernie4_5, llama

COUNT, TOP_K = Key("moe_num_experts", int, 64, nullable=True), Key("moe_k", int, 6, nullable=True)
KEYS = (COUNT, TOP_K, Key("num_experts", int, None, legacy=True), Key("num_experts_per_tok", int, None, legacy=True),
        Key("moe_intermediate_size", int, 1536), Key("moe_num_shared_experts", int, 2, nullable=True,
                                                       bound="non_negative"),
        Key("moe_layer_start_index", int, 1, nullable=True, bound="non_negative"),
        Key("moe_layer_end_index", int, -1, nullable=True, bound="finite"),
        Key("moe_layer_interval", int, 1, nullable=True),
        Key("moe_norm_min", float, 1e-12, nullable=True, bound="non_negative"),
        Key("output_router_logits", bool, False, nullable=True),
        Key("router_aux_loss_coef", float, 0.001, nullable=True, bound="non_negative"))


def needed(hf: HfConfig, key: str) -> Any:  # noqa: ANN401 - the key's value
    """A key Ernie4_5_MoeConfig accepts as null but its model cannot be built (or run) with."""
    value = hf.get(key)
    if value is None:
        raise MappingError(f"config.json: {key}=null: transformers cannot build or run this model with it; state "
                           f"the model's value, or remove the key for the default")
    return value


def either(hf: HfConfig, own: str, alias: str) -> Any:  # noqa: ANN401 - the key's value
    """The key, or its attribute_map alias where only that is stated."""
    return hf.get(alias) if not hf.stated(own) and hf.stated(alias) else needed(hf, own)


def sparse_layers(hf: HfConfig, n: int) -> list[int]:
    start, end, step = (needed(hf, f"moe_layer_{k}") for k in ("start_index", "end_index", "interval"))
    end = n - 1 if end == -1 else end
    return [i for i in range(n) if (i + 1) % step == 0 and start <= i <= end]


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    sparse = sparse_layers(hf, n)
    if not sparse:
        return {}
    if fields["mlp_bias"]:
        raise MappingError(f"config.json: use_bias=true with mixture-of-experts layers {sparse}: ERNIE 4.5's experts "
                           "have no biases where its dense and shared FFNs have them, which lmconvert's mixture of "
                           "experts does not express")
    width, shared = hf.get("moe_intermediate_size"), needed(hf, "moe_num_shared_experts")
    aux = hf.get("router_aux_loss_coef") if hf.get("output_router_logits") else 0.0
    moe = MoeConfig(n_experts=either(hf, "moe_num_experts", "num_experts"),
                    top_k=either(hf, "moe_k", "num_experts_per_tok"), d_expert=width,
                    router="softmax", norm_topk=True, norm_min=needed(hf, "moe_norm_min"), weights_fp32=False,
                    shared="plain" if shared else "none", d_shared=shared * width if shared else None,
                    dense_layers=tuple(i for i in range(n) if i not in sparse), selection_bias=True,
                    router_fp32=True, aux_loss=aux or 0.0)
    return {"moe": moe}


def layers_to_hf(sparse: list[int], n: int) -> dict[str, Any]:
    """The start, end and interval that give exactly these sparse layers; none: the defaults,
    which read back as another model (export names the mixture of experts)."""
    for step in range(1, n + 1):
        start, end = sparse[0], sparse[-1]
        if [i for i in range(n) if (i + 1) % step == 0 and start <= i <= end] == sparse:
            return {"moe_layer_start_index": start, "moe_layer_end_index": end, "moe_layer_interval": step}
    return {}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    if moe is None:  # every layer dense: the mixture of experts starts past the last layer
        return {**{k.name: DEFAULT for k in KEYS if not k.legacy}, "moe_layer_start_index": cfg.n_layers,
                "moe_layer_end_index": cfg.n_layers - 1}
    sparse = [i for i in range(cfg.n_layers) if moe.sparse(i)]
    shared = DEFAULT if moe.d_shared is not None and moe.d_shared % moe.d_expert else \
        (moe.d_shared or 0) // moe.d_expert
    return {"moe_num_experts": moe.n_experts, "moe_k": moe.top_k, "moe_intermediate_size": moe.d_expert,
            "moe_num_shared_experts": shared, "moe_norm_min": moe.norm_min or DEFAULT,
            "output_router_logits": bool(moe.aux_loss), "router_aux_loss_coef": moe.aux_loss or DEFAULT,
            **layers_to_hf(sparse, cfg.n_layers)}


EXPERTS = Entry("experts", KEYS, experts_from_hf, experts_to_hf)

CONFIG = ernie4_5.CONFIG.but(
    add=(EXPERTS,),
    defaults={"hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 28, "num_attention_heads": 20,
              "num_key_value_heads": 4, "head_dim": None},
)

MOE_RULES = (
    Rule("model.layers.{}.mlp.gate.weight", "layers.{}.mlp.router.weight"),
    # the Hub's name, and the one transformers 5 holds in memory
    Rule("model.layers.{}.mlp.moe_statics.e_score_correction_bias", "layers.{}.mlp.router.selection_bias", Squeeze()),
    Rule("model.layers.{}.mlp.gate.moe_statics.e_score_correction_bias", "layers.{}.mlp.router.selection_bias",
         Squeeze()),
    *(Rule(f"model.layers.{{}}.mlp.experts.{{}}.{n}_proj.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight")
      for n in ("gate", "up", "down")),
    *(Rule(f"model.layers.{{}}.mlp.shared_experts.{n}_proj.{p}", f"layers.{{}}.mlp.shared.{n}.{p}")
      for n in ("gate", "up", "down") for p in ("weight", "bias")),
    *FUSED_RULES,
)
TENSORS = TensorTable(llama.TENSORS.rules + MOE_RULES)


# -- llama.cpp (GGUF): ernie4_5-moe. Its graph makes layer i sparse when i >= leading_dense_block_count and
# (i + 1) % interleave_moe_layer_step == 0, with no end index (a model whose experts stop before the last
# layer reads back otherwise, and is refused); its loader gives every layer from the first sparse one
# expert tensors, so only a step of 1 loads. Softmax routing, the selection bias as exp_probs_b, the
# chosen weights renormalised (the sum clamped at 2^-14 where transformers clamps at moe_norm_min).
SHARED_FFN = "lmconvert_shared_ffn"  # the shared experts' summed width, which config.json does not state


def _shared_ffn(config: Mapping[str, Any]) -> Any:  # noqa: ANN401 - a width
    return (config.get("moe_num_shared_experts") or 0) * config.get("moe_intermediate_size", 1536)


def _ernie4_5_moe(config: Mapping[str, Any]) -> dict[str, Any]:
    """The shared experts' count from their width (llama.cpp's converter writes both; the width
    decides what llama.cpp runs)."""
    width, shared = config.get("moe_intermediate_size", 1536), config.get(SHARED_FFN) or 0
    if shared % width:
        raise MappingError(f"ernie4_5-moe.expert_shared_feed_forward_length={shared} is not a multiple of the "
                           f"experts' width {width}: ERNIE 4.5's shared experts are whole experts")
    return {"moe_num_shared_experts": shared // width}


GGUF_ERNIE4_5_MOE = written(
    "ernie4_5_moe", arch="ernie4_5-moe",
    keys={"expert_count": "moe_num_experts", "expert_used_count": "moe_k", "interleave_moe_layer_step":
          "moe_layer_interval", "leading_dense_block_count": "moe_layer_start_index",
          "expert_feed_forward_length": "moe_intermediate_size", "expert_shared_count": "moe_num_shared_experts",
          "expert_shared_feed_forward_length": SHARED_FFN},
    defaults={"hidden_act": "silu"}, derived=_ernie4_5_moe, unstated={SHARED_FFN: _shared_ffn},
    table=TensorTable(tensor_table(False, 0.0, True).rules
                      + tuple(r for r in GGUF_MOE_RULES if "shared_gate" not in r.canonical)
                      + tuple(Rule(f"blk.{{}}.ffn_{n}_shexp.bias", f"layers.{{}}.mlp.shared.{n}.bias")
                              for n in ("gate", "up", "down"))  # llama.cpp loads none: refused
                      + (Rule("blk.{}.exp_probs_b.bias", "layers.{}.mlp.router.selection_bias"),)))

FAMILY = Family("ernie4_5_moe", ("ernie4_5_moe",), "Ernie4_5_MoeForCausalLM", TENSORS, CONFIG,
                gguf=(GGUF_ERNIE4_5_MOE,))
