"""JetMoE (JetMoeForCausalLM: jetmoe/jetmoe-8b).

Same as granitemoe's experts on llama's blocks, except: attention is a mixture of attention heads
(the "head_mixture" kind, `self_attention`): a router (`experts.router.layer`) picks
`num_experts_per_tok` of `num_local_experts` experts per token, as the MLP's does, each expert a query
projection (`experts.input_linear` [experts, kv heads * kv_channels, hidden]) and an output projection
(`experts.output_linear`), over one key and value projection shared by all (`kv_proj`, [k | v]), the
keys tiled for each chosen expert's heads; the experts' weighted outputs are summed and
`experts.bias` added. `num_attention_heads` is derived (kv heads times top-k) and a stated one is
ignored, as JetMoeConfig ignores it; `kv_channels` (also read as `head_dim`) is the head dim. The MLP
mixture (`mlp`: `input_linear` [experts, gate rows then up rows, hidden], `output_linear`, `router.layer`)
sums its experts as it runs its attention experts (the rows sorted by expert, one index_add:
`sum_order="sorted"`; JetMoE has no experts implementation to choose) and adds `mlp.bias`. No q,
k, v or MLP biases; the block RMSNorms keep eps 1e-6 and only the final norm reads `rms_norm_eps`,
so only 1e-6 (its default) is supported; `activation_function` names the experts' activation; the
embeddings are tied by default. With `output_router_logits`, the training loss adds `aux_loss_coef`
times the load balance over every router, the attention's included.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig, NormConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed, unsupported
from ..tables.hf_alias import aliased
from ..tables.hf_config import HfConfig, Key
from ..tables.points import RESIDUAL, Parallel, Returned
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Piece, Unstack
from . import llama

ATTN, MLP = "model.layers.{}.self_attention", "model.layers.{}.mlp"
TENSORS = TensorTable(llama.EDGE_RULES + llama.PRE_NORM_RULES + (
    Rule(f"{ATTN}.experts.bias", "layers.{}.attn.bias"),
    Rule(f"{ATTN}.experts.router.layer.weight", "layers.{}.attn.router.weight"),
    Rule(f"{ATTN}.experts.input_linear.weight", "layers.{}.attn.q.{}.weight", Unstack()),
    *(Rule(f"{ATTN}.kv_proj.weight", f"layers.{{}}.attn.{name}.weight", Piece(("kv", "kv"), i))
      for i, name in enumerate("kv")),
    Rule(f"{ATTN}.experts.output_linear.weight", "layers.{}.attn.o.{}.weight", Unstack()),
    Rule(f"{MLP}.router.layer.weight", "layers.{}.mlp.router.weight"),
    Rule(f"{MLP}.bias", "layers.{}.mlp.experts.bias"),
    Rule(f"{MLP}.input_linear.weight", "layers.{}.mlp.experts.{}.gate.weight", Unstack(part=0, parts=2)),
    Rule(f"{MLP}.input_linear.weight", "layers.{}.mlp.experts.{}.up.weight", Unstack(part=1, parts=2)),
    Rule(f"{MLP}.output_linear.weight", "layers.{}.mlp.experts.{}.down.weight", Unstack()),
))

KEYS = (Key("num_local_experts", int, 8), Key("num_experts_per_tok", int, 2),
        Key("output_router_logits", bool, False), Key("aux_loss_coef", float, 0.01, bound="non_negative"))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """One router setting for both mixtures; the heads are the chosen experts' (JetMoeConfig's
    num_attention_heads = num_key_value_heads * num_experts_per_tok)."""
    n, k = hf.get("num_local_experts"), hf.get("num_experts_per_tok")
    aux = hf.get("aux_loss_coef") if hf.get("output_router_logits") else 0.0
    return {"moe": MoeConfig(n_experts=n, top_k=k, d_expert=fields["d_ff"], router="topk_softmax", norm_topk=False,
                             sum_order="sorted", sum_bias=True, aux_loss=aux),
            "attention": "head_mixture", "attention_settings": {"n_experts": n, "top_k": k},
            "n_heads": fields["n_kv_heads"] * k, "o_bias": True}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The MLP mixture's counts; an attention mixture of other counts (or none) reads back as this
    one, so export refuses it by name."""
    moe = cfg.moe
    if moe is None:
        return {"num_local_experts": DEFAULT}
    return {"num_local_experts": moe.n_experts, "num_experts_per_tok": moe.top_k,
            "output_router_logits": bool(moe.aux_loss), "aux_loss_coef": moe.aux_loss or DEFAULT}


CONFIG = llama.CONFIG.but(
    drop=("num_attention_heads", "head_dim", "norm", "attention_bias", "mlp_bias"),
    add=(llama.activation("activation_function", "silu"),
         aliased("kv_channels", "head_dim", "head_dim", int, 128),
         unsupported("rms_norm_eps", float, 1e-6, "the final RMSNorm's eps, where the block RMSNorms keep 1e-6",
                     "JetMoE"),
         fixed("block norms", norm=NormConfig(eps=1e-6)),
         Entry("experts", KEYS, experts_from_hf, experts_to_hf)),
    defaults={"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 12, "num_key_value_heads": 16,
              "max_position_embeddings": 4096, "tie_word_embeddings": True},
    nullable={"num_key_value_heads": False, "attention_dropout": False},
)

# JetMoeTopKGating returns (sorted rows, their tokens, their weights, counts, logits); the experts' projections
# run on the (token, slot) rows sorted by expert (R), as ours do; kv_proj is [k | v]; the MLP mixture's experts
# run inside it (its output, the weighted sum and the bias, is our experts' point; each alone, Parallel)
REFERENCE_LAYOUTS = {
    "attn.router": Returned(4, "B*T XA"), "attn.q": "R KV*D", "attn.o": "R d",
    "attn.k": "B T [KV*D]|KV*D", "attn.v": "B T KV*D|[KV*DV]",
    "mlp.router": Returned(4, "B*T X"), "mlp.experts": Parallel(RESIDUAL),
}

FAMILY = Family("jetmoe", ("jetmoe",), "JetMoeForCausalLM", TENSORS, CONFIG, reference_layouts=REFERENCE_LAYOUTS,
                no_gguf="llama.cpp's converter does not read JetMoE: it has no mixture of attention heads",
                no_offload="transformers' JetMoE attention reads its experts' bias outside their forward, where "
                           "accelerate never loads an offloaded module's weights")
