"""HunYuan MoE (Hunyuan-A13B, model_type `hunyuan_v1_moe`).

Same as hunyuan_v1_dense, except: every layer's FFN is a mixture of `num_experts` SwiGLU experts,
each `intermediate_size` wide, plus one ungated shared MLP (`mlp.shared_mlp`, also
`intermediate_size` wide) added to their sum; the router (`mlp.gate.wg`) is an fp32 linear
(transformers builds it in float32 whatever the model's dtype) that scores fp32 inputs, its softmax
in fp32, the top `moe_topk` weights always renormalised and kept in fp32, so each expert's output is
weighted in fp32 before the cast back; `moe_topk` may be a list with one entry per layer, read
where every entry is the same and refused otherwise (the decoder has one top-k); `num_experts` and
`moe_topk` default to 1.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.gguf import ATTENTION_BIAS_FLAG, written
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_moe import FUSED_RULES
from ..tables.points import RESIDUAL
from ..tables.table import Rule, TensorTable
from . import hunyuan_v1_dense, llama


class PerLayer(Key):
    """An integer, or a list of one positive integer per layer (HunYuan's `moe_topk`)."""

    def check(self, value: Any, where: str = "") -> Any:  # noqa: ANN401 - a JSON value
        if not isinstance(value, list):
            return super().check(value, where)
        return [super(PerLayer, self).check(item, where) for item in value] if value else \
            super().check(value, where)


NUM_EXPERTS = Key("num_experts", int, 1)
TOP_K = PerLayer("moe_topk", int, 1)


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    top_k = hf.get(TOP_K.name)
    if isinstance(top_k, list):
        if len(top_k) != fields["n_layers"] or len(set(top_k)) != 1:
            raise MappingError(f"config.json: moe_topk={show(top_k)}: a top-k per layer that differs between layers "
                               "(or a list not one per layer) is not supported; the decoder routes every layer to "
                               "the same number of experts")
        top_k = top_k[0]
    d_ff = fields["d_ff"]
    return {"moe": MoeConfig(n_experts=hf.get(NUM_EXPERTS.name), top_k=top_k, d_expert=d_ff, router="softmax",
                             norm_topk=True, weights_fp32=True, router_fp32=True, shared="plain", d_shared=d_ff)}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    if moe is None:  # a dense model: the family cannot express it; say so through the lost field
        return {NUM_EXPERTS.name: DEFAULT}
    return {NUM_EXPERTS.name: moe.n_experts, TOP_K.name: moe.top_k}


EXPERTS = Entry("experts", (NUM_EXPERTS, TOP_K), experts_from_hf, experts_to_hf)

ROUTED_RULES = (
    Rule("model.layers.{}.mlp.gate.wg.weight", "layers.{}.mlp.router.weight"),
    *(Rule(f"model.layers.{{}}.mlp.experts.{{}}.{n}_proj.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight")
      for n in ("gate", "up", "down")),
    *FUSED_RULES,
    *(Rule(f"model.layers.{{}}.mlp.shared_mlp.{n}_proj.weight", f"layers.{{}}.mlp.shared.{n}.weight")
      for n in ("gate", "up", "down")),
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.PRE_NORM_RULES
                      + hunyuan_v1_dense.QK_NORM_RULES + ROUTED_RULES)

CONFIG = hunyuan_v1_dense.CONFIG.but(add=(EXPERTS,))


# -- llama.cpp (GGUF): its converter reads the Hub files' per-layer lists (moe_intermediate_size,
# num_shared_expert), which transformers' config has not: the expert and shared widths are
# intermediate_size, one shared MLP
def _width(config: Any) -> Any:  # noqa: ANN401 - a config value
    return config.get("intermediate_size")


GGUF_HUNYUAN_MOE = written("hunyuan_v1_moe", arch="hunyuan-moe",
                           keys={"expert_count": "num_experts", "expert_used_count": "moe_topk",
                                 "expert_feed_forward_length": "moe_intermediate_size",
                                 "expert_shared_feed_forward_length": "shared_intermediate_size"},
                           defaults={"hidden_act": "silu"}, bias_flags=ATTENTION_BIAS_FLAG, experts=True,
                           unstated={"moe_intermediate_size": _width, "shared_intermediate_size": _width},
                           constants={"expert_shared_count": 1})

# the shared MLP runs on (B, T, d) there, before the tokens are flattened for the experts
REFERENCE_LAYOUTS = {**hunyuan_v1_dense.REFERENCE_LAYOUTS, "mlp.shared.gate": "B T S", "mlp.shared.up": "B T S",
                     "mlp.shared.down": RESIDUAL}

FAMILY = Family("hunyuan_v1_moe", ("hunyuan_v1_moe",), "HunYuanMoEV1ForCausalLM", TENSORS, CONFIG,
                gguf=(GGUF_HUNYUAN_MOE,), reference_layouts=REFERENCE_LAYOUTS)
