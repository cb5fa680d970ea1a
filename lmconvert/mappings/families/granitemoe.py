"""GraniteMoE (PowerMoE-3B, Granite 3.0 MoE).

Same as granite, except: every layer's FFN is a mixture of `num_local_experts` SwiGLU experts,
each `intermediate_size` wide, stored fused per layer (`block_sparse_moe.input_linear` [experts,
gate rows then up rows, hidden] and `output_linear` [experts, hidden, width]; transformers 5's
`block_sparse_moe.experts.gate_up_proj` / `down_proj` also read), with a router
(`block_sparse_moe.router.layer`, transformers 5's `router`) that takes the top
`num_experts_per_tok` of the logits and weights them by the softmax over those k alone, in fp32,
cast back to the activation dtype before the experts' outputs are weighted
(`GraniteMoeTopKRouter`); there is no MLP bias and `rms_norm_eps` defaults to 1e-6.
The auxiliary-loss keys act in training only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import ATTENTION_BIAS_FLAG, STATES_VOCAB_AND_ROPE, written
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import experts
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Unstack
from . import granite, llama

MOE = "model.layers.{}.block_sparse_moe"
EXPERT_RULES = (
    # the Hub's names (written by export), then transformers 5's own (save_original_format=False)
    Rule(f"{MOE}.router.layer.weight", "layers.{}.mlp.router.weight"),
    Rule(f"{MOE}.input_linear.weight", "layers.{}.mlp.experts.{}.gate.weight", Unstack(part=0, parts=2)),
    Rule(f"{MOE}.input_linear.weight", "layers.{}.mlp.experts.{}.up.weight", Unstack(part=1, parts=2)),
    Rule(f"{MOE}.output_linear.weight", "layers.{}.mlp.experts.{}.down.weight", Unstack()),
    Rule(f"{MOE}.router.weight", "layers.{}.mlp.router.weight"),
    Rule(f"{MOE}.experts.gate_up_proj", "layers.{}.mlp.experts.{}.gate.weight", Unstack(part=0, parts=2)),
    Rule(f"{MOE}.experts.gate_up_proj", "layers.{}.mlp.experts.{}.up.weight", Unstack(part=1, parts=2)),
    Rule(f"{MOE}.experts.down_proj", "layers.{}.mlp.experts.{}.down.weight", Unstack()),
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.PRE_NORM_RULES + EXPERT_RULES)

EXPERTS = experts(Key("num_local_experts", int, 8), Key("num_experts_per_tok", int, 2), router="topk_softmax",
                  norm_topk=False, aux_default=0.001)
def taking_null(entry: Entry, *names: str, refused: bool = True) -> Entry:
    """A row with its keys `names` nullable, as the config class declares them (GraniteMoeConfig,
    DbrxConfig); null `refused` where transformers' model fails on it (GraniteMoE multiplies by its
    multipliers, sizes its experts by the counts), else read as the row reads it (the
    auxiliary-loss keys, unused unless training)."""
    def read(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
        for name in names if refused else ():
            if hf.stated(name) and hf.get(name) is None:
                raise MappingError(f"config.json: {name}=null is not supported (transformers' model fails on it); "
                                   "set a number, or remove the key for the default")
        return entry.read(hf, fields)

    return Entry(entry.name, tuple(replace(k, nullable=True) if k.name in names else k for k in entry.keys), read,
                 entry.write)


EXPERTS = taking_null(taking_null(experts(Key("num_local_experts", int, 8), Key("num_experts_per_tok", int, 2),
                                          router="topk_softmax", norm_topk=False, aux_default=0.001),
                                  "output_router_logits", "router_aux_loss_coef", refused=False),
                      "num_local_experts", "num_experts_per_tok")
MULTIPLIERS = ("attention_multiplier", "embedding_multiplier", "residual_multiplier", "logits_scaling")
CONFIG = granite.CONFIG.but(drop=("mlp_bias",),
                            add=(EXPERTS, *(taking_null(e, e.keys[0].name) for e in granite.CONFIG.entries
                                            if e.name in MULTIPLIERS)),
                            nullable={"attention_dropout": True})


# -- llama.cpp (GGUF)
# llama.cpp's granitemoe graph: granite's scales, stacked experts on every layer (feed_forward_length
# is the expert width), granitemoeshared's shared MLP as the `shexp` tensors
GGUF_KEYS = {**granite.GGUF_GRANITE.keys, "expert_count": "num_local_experts",
             "expert_used_count": "num_experts_per_tok"}
# granitemoeshared, told apart by its shared MLP's tensors; llama.cpp's GraniteMoeModel is a LlamaModel
GGUF_SHARED = written("granitemoeshared", arch="granitemoe",
                      keys={**GGUF_KEYS, "expert_shared_feed_forward_length": "shared_intermediate_size"},
                      defaults={"hidden_act": "silu"}, bias_flags=ATTENTION_BIAS_FLAG, permute_qk=True, experts=True,
                      stated=STATES_VOCAB_AND_ROPE, head_dim_stated=False)
GGUF_GRANITEMOE = written("granitemoe", arch="granitemoe", keys=GGUF_KEYS, defaults={"hidden_act": "silu"},
                          bias_flags=ATTENTION_BIAS_FLAG, permute_qk=True, experts=True, stated=STATES_VOCAB_AND_ROPE,
                          head_dim_stated=False,  # GraniteMoeConfig keeps no head_dim
                          variants=(("blk.0.ffn_gate_shexp.weight", GGUF_SHARED),))


FAMILY = Family("granitemoe", ("granitemoe",), "GraniteMoeForCausalLM", TENSORS, CONFIG, gguf=(GGUF_GRANITEMOE,))
