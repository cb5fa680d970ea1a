"""Kolibri 1 (Kolibri1ForCausalLM).

Same as exaone4, except: the norms are a sandwich (`input_layernorm` before attention,
`post_self_attn_layernorm` on its output before the residual add, `post_attention_layernorm` before
the FFN, `post_mlp_layernorm` on its output, as GLM-4's); without `layer_types` every fifth layer is
full attention (no `sliding_window_pattern` key), the window defaults to 513; `rms_norm_eps`
defaults to 1e-6 and head_dim to 128; and every layer is a mixture of `num_experts` (alias
`num_local_experts`) experts `moe_intermediate_size` wide (there is no dense FFN and no
`intermediate_size`) plus one ungated shared expert `shared_expert_intermediate_size` wide (run on
the unflattened input and added last). The router (`mlp.gate`; its weight in the model's dtype, its
`e_score_correction_bias` kept in fp32) takes fp32 logits from fp32 copies of input and weight,
chooses `num_experts_per_tok` experts on the logits plus the bias, weights them by the sigmoid of
their logits, divided by their sum when `norm_topk_prob` (default false), all in fp32, and each
expert's output is weighted in fp32 before the cast back. `output_router_logits` adds no loss in
transformers' Kolibri and is not read.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import LAYER_TYPES_KEY, SLIDING_WINDOW_KEY, layer_kinds_from_hf, window_fields
from ..tables.hf_moe import FUSED_RULES
from ..tables.points import QK_NORM_HEADS_FIRST, SHARED_UNFLATTENED
from ..tables.table import Rule, TensorTable
from . import exaone4, llama


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    window = hf.get("sliding_window")
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: (i + 1) % 5 != 0)
    positions = tuple("rope" if window is None or kind == "local" else "none" for kind in kinds)
    return {**window_fields(kinds, window), "layer_positions": positions}


KEYS = (Key("num_experts", int, 384), Key("num_local_experts", int, None, legacy=True),
        Key("num_experts_per_tok", int, 6), Key("moe_intermediate_size", int, 512),
        Key("shared_expert_intermediate_size", int, 512), Key("norm_topk_prob", bool, False))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    count = hf.get("num_local_experts") if not hf.stated("num_experts") and hf.stated("num_local_experts") \
        else hf.get("num_experts")
    width = hf.get("moe_intermediate_size")
    moe = MoeConfig(n_experts=count, top_k=hf.get("num_experts_per_tok"), d_expert=width, router="logits",
                    norm_topk=hf.get("norm_topk_prob"), weights_fp32=True, shared="plain",
                    d_shared=hf.get("shared_expert_intermediate_size"), selection_bias=True, router_fp32=True,
                    kept_fp32=("selection_bias",))
    return {"d_ff": width, "moe": moe}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    if moe is None or moe.dense_layers or moe.d_shared is None:  # read back, another model: reported as it
        return {k.name: DEFAULT for k in KEYS if not k.legacy}
    return {"num_experts": moe.n_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.d_expert,
            "shared_expert_intermediate_size": moe.d_shared, "norm_topk_prob": moe.norm_topk}


CONFIG = exaone4.CONFIG.but(
    drop=("intermediate_size",),
    add=(llama.norm(1e-6), fixed("output norms", norm_placement="sandwich", qk_norm="head"),
         Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY), layers_from_hf, exaone4.layers_to_hf),
         Entry("experts", KEYS, experts_from_hf, experts_to_hf)),
    defaults={"vocab_size": 128000, "hidden_size": 2560, "num_hidden_layers": 50, "num_attention_heads": 48,
              "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 262144, "sliding_window": 513},
)

SANDWICH_RULES = tuple(Rule(f"model.layers.{{}}.{hf}.weight", f"layers.{{}}.{ours}.weight") for hf, ours in (
    ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "mlp_norm"),
    # the Hub's names (transformers' save_pretrained writes them), then those transformers holds in memory
    ("post_attn_norm", "attn_post_norm"), ("post_ffn_norm", "mlp_post_norm"),
    ("post_self_attn_layernorm", "attn_post_norm"), ("post_mlp_layernorm", "mlp_post_norm")))
MOE_RULES = (
    Rule("model.layers.{}.mlp.gate.weight", "layers.{}.mlp.router.weight"),
    Rule("model.layers.{}.moe.router.expert_bias", "layers.{}.mlp.router.selection_bias"),
    Rule("model.layers.{}.mlp.gate.e_score_correction_bias", "layers.{}.mlp.router.selection_bias"),
    *(Rule(f"model.layers.{{}}.mlp.experts.{{}}.{n}_proj.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight")
      for n in ("gate", "up", "down")),
    *(Rule(f"model.layers.{{}}.mlp.shared_experts.{n}_proj.weight", f"layers.{{}}.mlp.shared.{n}.weight")
      for n in ("gate", "up", "down")),
    *FUSED_RULES,
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.QK_NORM_RULES + SANDWICH_RULES + MOE_RULES)

# q_proj(x).view(B, T, -1, D).transpose(1, 2), then q_norm; the shared expert on the unflattened input
REFERENCE_LAYOUTS = {**QK_NORM_HEADS_FIRST, **SHARED_UNFLATTENED}

FAMILY = Family("kolibri1", ("kolibri1",), "Kolibri1ForCausalLM", TENSORS, CONFIG,
                reference_layouts=REFERENCE_LAYOUTS)
