"""LFM2-MoE (Liquid AI's LFM2-8B-A1B).

Same as lfm2, except: `layer_types` alone names the conv and attention layers (no `full_attn_idxs`;
without it, read as every layer attending: transformers builds no model from such a file); the dense
FFN is `intermediate_size` wide as stated (no adjustment keys); and every layer from `num_dense_layers`
(default 2) on is a mixture of `num_experts` (32) SwiGLU experts `moe_intermediate_size` (1792) wide
(`feed_forward.experts.{e}.w1` / `w3` / `w2`), routed by `feed_forward.gate` (`Lfm2MoeTopKRouter`):
sigmoid scores in the activation dtype, a sorted top `num_experts_per_tok` (4) chosen on them plus
`feed_forward.expert_bias` when `use_expert_bias` (the selection bias, a buffer in the model's dtype),
weighted by the unbiased scores, renormalised by their sum plus 1e-6 when `norm_topk_prob`, times
`routed_scaling_factor` (`router="sigmoid_sorted"`).
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry, plain
from ..tables.gguf import MOE_RULES, written
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Unstack
from . import deepseek_v3, lfm2

LAYER = "model.layers.{}.feed_forward"
TENSORS = TensorTable(lfm2.TENSORS.rules + (
    Rule(f"{LAYER}.gate.weight", "layers.{}.mlp.router.weight"),
    Rule(f"{LAYER}.expert_bias", "layers.{}.mlp.router.selection_bias"),
    *(Rule(f"{LAYER}.experts.{{}}.{hf}.weight", f"layers.{{}}.mlp.experts.{{}}.{ours}.weight")
      for hf, ours in (("w1", "gate"), ("w3", "up"), ("w2", "down"))),
    # transformers 5's own layout, save_pretrained(save_original_format=False): gate rows, then up rows
    Rule(f"{LAYER}.experts.gate_up_proj", "layers.{}.mlp.experts.{}.gate.weight", Unstack(part=0, parts=2)),
    Rule(f"{LAYER}.experts.gate_up_proj", "layers.{}.mlp.experts.{}.up.weight", Unstack(part=1, parts=2)),
    Rule(f"{LAYER}.experts.down_proj", "layers.{}.mlp.experts.{}.down.weight", Unstack()),
))

EXPERT_KEYS = (Key("num_experts", int, 32), Key("num_experts_per_tok", int, 4), Key("moe_intermediate_size", int, 1792),
               Key("num_dense_layers", int, 2, bound="non_negative"), Key("norm_topk_prob", bool, True),
               Key("use_expert_bias", bool, True), Key("routed_scaling_factor", float, 1.0))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Lfm2MoeDecoderLayer: the first num_dense_layers layers dense, the others the mixture."""
    n = fields["n_layers"]
    dense = tuple(range(min(hf.get("num_dense_layers"), n)))
    if len(dense) == n:
        return {}
    return {"moe": MoeConfig(n_experts=hf.get("num_experts"), top_k=hf.get("num_experts_per_tok"),
                             d_expert=hf.get("moe_intermediate_size"), router="sigmoid_sorted",
                             norm_topk=hf.get("norm_topk_prob"), selection_bias=hf.get("use_expert_bias"),
                             scale=hf.get("routed_scaling_factor"), dense_layers=dense)}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """A mixture's fields; one this config cannot hold reads back otherwise, so export names it lost."""
    moe = cfg.moe
    if moe is None:  # every layer dense: the experts' keys at their defaults
        return {**{k.name: DEFAULT for k in EXPERT_KEYS}, "num_dense_layers": cfg.n_layers}
    first = len(moe.dense_layers) if moe.dense_layers == tuple(range(len(moe.dense_layers))) else DEFAULT
    return {"num_experts": moe.n_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.d_expert,
            "num_dense_layers": first, "norm_topk_prob": moe.norm_topk, "use_expert_bias": moe.selection_bias,
            "routed_scaling_factor": moe.scale}


SCHEDULE_KEYS = tuple(k for k in lfm2.SCHEDULE_KEYS if k.name != "full_attn_idxs")


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {k: v for k, v in lfm2.schedule_to_hf(cfg).items() if k != "full_attn_idxs"}


CONFIG = lfm2.CONFIG.but(
    add=(plain("intermediate_size", "d_ff", int, 7168, name="FFN width"),
         Entry("layer schedule", SCHEDULE_KEYS, lfm2.schedule_from_hf, schedule_to_hf),
         Entry("experts", EXPERT_KEYS, experts_from_hf, experts_to_hf)),
    defaults={"hidden_size": 2048},
)

# -- llama.cpp (GGUF): its lfm2moe architecture, lfm2's layout (GGUF_LFM2) with stacked experts after the
# `leading_dense_block_count` dense layers and the expert bias as `exp_probs_b` (required by its loader). Its graph
# always renormalises the chosen weights (clamping the sum below at 6.1e-5 where transformers adds 1e-6) and
# applies no scale (it reads no expert_weights_scale): a model without the bias, without renormalising or with a
# routed_scaling_factor other than 1 reads back otherwise, so its export is refused naming the mixture.
GGUF_LFM2MOE = written(
    "lfm2_moe", arch="lfm2moe",
    keys={**lfm2.GGUF_LFM2.keys, "expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
          "expert_feed_forward_length": "moe_intermediate_size", "leading_dense_block_count": "num_dense_layers"},
    defaults={"norm_topk_prob": True, "routed_scaling_factor": 1.0, "use_expert_bias": True},
    constants={"expert_gating_func": deepseek_v3.SIGMOID}, renamed=lfm2.GGUF_LFM2.renamed,
    derived=lfm2.GGUF_LFM2.derived, exported=lfm2.GGUF_LFM2.exported, head_dim_stated=False,
    stated=lfm2.GGUF_LFM2.stated, refused=lfm2.GGUF_LFM2.refused,
    # no `output`: gguf's lfm2moe lists none (its converter writes tied models only)
    table=TensorTable((*(r for r in lfm2.GGUF_LFM2.tensors.rules if r.stored != "output.weight"), *MOE_RULES,
                       Rule("blk.{}.exp_probs_b.bias", "layers.{}.mlp.router.selection_bias"))))

FAMILY = Family("lfm2_moe", ("lfm2_moe",), "Lfm2MoeForCausalLM", TENSORS, CONFIG, gguf=(GGUF_LFM2MOE,),
                reference_layouts=lfm2.REFERENCE_LAYOUTS)
