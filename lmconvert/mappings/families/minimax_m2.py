"""MiniMax-M2 (MiniMaxM2ForCausalLM: MiniMax-M2, MiniMax-M2.1).

Same as mixtral, except: q_norm / k_norm normalise the whole q and k projections (all heads
together, llama's RMSNorm, the weight after the cast back) before the head split, as olmo2's; RoPE
rotates only `partial_rotary_factor` of each head (older files: `rotary_dim` dims), in halves,
theta default 5e6; there is no sliding window; `rms_norm_eps` defaults to 1e-6 and head_dim to
128; the router (`gate`) takes its logits in the weight's dtype (no fp32 copy), their sigmoid in
fp32, chooses `num_experts_per_tok` experts on those scores plus `e_score_correction_bias` (a
buffer, in the model's dtype), divides the chosen scores by their sum (no guard), and each
expert's output is weighted in fp32 before the cast back. The experts are `intermediate_size`
wide; there is no dense FFN and no shared expert. `router_jitter_noise` acts in training only and
is not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry, fixed
from ..tables.gguf import GgufArch, tensor_table
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_moe import expert_rules, experts
from ..tables.hf_rope import FRACTION, KEYS, rope_from_hf, rope_parameters, rope_to_hf
from ..tables.points import QK_NORM_PROJECTION
from ..tables.table import Rule, TensorTable
from . import llama

ROTARY_DIM = Key("rotary_dim", int, None, nullable=True, legacy=True)  # older files: rotated dims per head


def rope_from_minimax(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """MiniMaxM2Config: a stated `rotary_dim` gives partial_rotary_factor = rotary_dim / head_dim
    where no fraction is stated."""
    params, where = rope_parameters(hf)
    rope = rope_from_hf(hf, params, where, partial=True)
    rotary = hf.get("rotary_dim")
    if rotary is not None and FRACTION.name not in params and not hf.stated(FRACTION.name):
        head_dim = fields["head_dim"] or fields["d_model"] // fields["n_heads"]
        rope = replace(rope, fraction=rotary / head_dim)
    return {"rope": rope}


def rope_to_minimax(cfg: ArchConfig) -> dict[str, Any]:
    return {"rope_parameters": rope_to_hf(cfg.rope)}


ROPE = Entry("rope", (*KEYS, ROTARY_DIM), rope_from_minimax, rope_to_minimax)

CONFIG = llama.CONFIG.but(
    drop=("attention_bias", "mlp_bias"),
    add=(ROPE, fixed("QK norm", qk_norm="projection"),
         experts(Key("num_local_experts", int, 256), Key("num_experts_per_tok", int, 8),
                 count_legacy=Key("num_experts", int, None, legacy=True), aux_default=0.001,
                 router="sigmoid_fp32", selection_bias=True, norm_topk=True, weights_fp32=True)),
    defaults={"vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536, "num_hidden_layers": 62,
              "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
              "max_position_embeddings": 196608, "rope_theta": 5e6},
    nullable={"num_key_value_heads": False, "head_dim": False, "attention_dropout": False},
)

SELECTION_BIAS_RULES = tuple(Rule(f"model.layers.{{}}.{block}.e_score_correction_bias",
                                  "layers.{}.mlp.router.selection_bias") for block in ("block_sparse_moe", "mlp"))
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.PRE_NORM_RULES + llama.QK_NORM_RULES
                      + expert_rules("block_sparse_moe", ("w1", "w3", "w2"), "gate") + SELECTION_BIAS_RULES)

REFERENCE_LAYOUTS = QK_NORM_PROJECTION


# -- llama.cpp (GGUF): minimax-m2, its experts `feed_forward_length` wide, the q/k norms over the whole
# projection, NEOX rope over `rope.dimension_count` dims, and the router's gating function stated (its
# converter writes sigmoid from the Hub config's scoring_func; llama.cpp's default is softmax)
SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID


def _minimax_m2(config: Mapping[str, Any]) -> dict[str, Any]:
    gating = config.get("expert_gating_func")
    if gating != SIGMOID:
        raise MappingError(f"minimax-m2.expert_gating_func={gating}: MiniMax-M2's router is a sigmoid (2); lmconvert "
                           "reads no other")
    return {}


# transformers' GGUF loader reads it too (verify's reference for such a file)
GGUF_MINIMAXM2 = GgufArch(
    "minimax_m2", arch="minimax-m2",
    keys={"expert_count": "num_local_experts", "expert_used_count": "num_experts_per_tok",
          "expert_feed_forward_length": "intermediate_size", "expert_gating_func": "expert_gating_func"},
    defaults={"hidden_act": "silu"}, partial_rotary=True, constants={"expert_gating_func": SIGMOID},
    derived=_minimax_m2,
    table=TensorTable(tensor_table(False, 0.0, True, experts=True).rules
                      + (Rule("blk.{}.exp_probs_b.bias", "layers.{}.mlp.router.selection_bias"),)))

FAMILY = Family("minimax_m2", ("minimax_m2",), "MiniMaxM2ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_MINIMAXM2,),
                reference_layouts=REFERENCE_LAYOUTS)
