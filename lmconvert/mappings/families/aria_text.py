"""Aria's text decoder (`aria_text`, AriaTextForCausalLM).

Same as llama, except: every layer's FFN is a mixture of `moe_num_experts` SwiGLU experts, each
`intermediate_size` wide, stored fused per layer and transposed (`mlp.experts.fc1` [experts,
hidden, gate columns then up columns], `fc2` [experts, width, hidden], multiplied as `x @ W`;
transformers 5's `mlp.experts.gate_up_proj` / `down_proj`, the same layout, also read), with a
router (`mlp.router`) that takes the top `moe_topk` of the logits and weights them by the softmax
over those k alone, in the activation dtype (`AriaTextTopKRouter`), plus plain shared experts
(`mlp.shared_experts`, one SwiGLU MLP `moe_num_shared_experts * intermediate_size` wide) added to
the experts' sum. The routed experts' activation is always SiLU and they have no biases, so only
`hidden_act` silu and `mlp_bias` false are read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry, plain, unsupported
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import experts
from ..tables.points import SHARED_UNFLATTENED
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Chain, ExpertsTransposed, Unstack
from . import llama


def _expert_rules(gate_up: str, down: str) -> tuple[Rule, ...]:
    return (Rule(f"model.layers.{{}}.mlp.experts.{gate_up}", "layers.{}.mlp.experts.{}.gate.weight",
                 Chain(ExpertsTransposed(), Unstack(part=0, parts=2))),
            Rule(f"model.layers.{{}}.mlp.experts.{gate_up}", "layers.{}.mlp.experts.{}.up.weight",
                 Chain(ExpertsTransposed(), Unstack(part=1, parts=2))),
            Rule(f"model.layers.{{}}.mlp.experts.{down}", "layers.{}.mlp.experts.{}.down.weight",
                 Chain(ExpertsTransposed(), Unstack())))


MOE_RULES = (
    Rule("model.layers.{}.mlp.router.weight", "layers.{}.mlp.router.weight"),
    # the Hub's names (written by export), then transformers 5's own (save_original_format=False)
    *_expert_rules("fc1.weight", "fc2.weight"), *_expert_rules("gate_up_proj", "down_proj"),
    *(Rule(f"model.layers.{{}}.mlp.shared_experts.{n}_proj.weight", f"layers.{{}}.mlp.shared.{n}.weight")
      for n in ("gate", "up", "down")),
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.PRE_NORM_RULES + MOE_RULES)

EXPERTS = experts(Key("moe_num_experts", int, 8), Key("moe_topk", int, 2), router="topk_softmax", norm_topk=False,
                  softmax_fp32=False)
SHARED = Key("moe_num_shared_experts", int, 2, bound="non_negative")


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    out = EXPERTS.read(hf, fields)
    if count := hf.get(SHARED.name):  # 0: no shared experts
        out["moe"] = replace(out["moe"], shared="plain", d_shared=count * fields["d_ff"])
    return out


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The shared experts' count; a width that is no multiple of the experts' is written as the
    nearest count, so export refuses it by name."""
    moe = cfg.moe
    count = DEFAULT if moe is None else 0 if moe.d_shared is None else max(1, round(moe.d_shared / cfg.d_ff))
    return {**EXPERTS.write(cfg), SHARED.name: count}


CONFIG = llama.CONFIG.but(
    add=(plain("hidden_act", "activation", str, "silu", name="activation", choices={"silu": "silu", "swish": "silu"},
               read=lambda _: "silu", write=lambda a: "silu" if a == "silu" else DEFAULT),
         unsupported("mlp_bias", bool, False, "biases on the shared experts alone", "Aria"),
         Entry("experts", (*EXPERTS.keys, SHARED), experts_from_hf, experts_to_hf)),
    defaults={"intermediate_size": 4096},
)


FAMILY = Family("aria_text", ("aria_text",), "AriaTextForCausalLM", TENSORS, CONFIG,
                reference_layouts=SHARED_UNFLATTENED)  # its shared experts run on the unflattened input
