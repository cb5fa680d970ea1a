"""LaraMini (LaraMiniForCausalLM: Lara-4-Mini).

Same as qwen3_5_moe_text, except: `layer_types` names each layer "linear_attention" (the gated
delta-net, Qwen3.5's), "sliding_attention" (attention within `sliding_window`, default 512, with
RoPE) or "full_attention" (attention without positions); absent, the released pattern of period 5
[linear, sliding, linear, full, sliding]; attention is Qwen3's (per-head QK norm before RoPE, the
tables rounded to the activation dtype, the whole head rotated: `partial_rotary_factor` is not
read by the default RoPE) with no output gate; every RMSNorm multiplies its plain weight in fp32
before the cast back (`LaraMiniRMSNorm`, the QK norms too), and so does the delta-net's gated norm,
which is cast back only after silu(z) (`norm_dtype_order="scale_then_cast"`); every layer is a
mixture of `num_experts` (128) SwiGLU experts `moe_intermediate_size` wide, routed on logits
computed in fp32 from fp32 copies of the input and the (model-dtype) router weight, softmax, top
`num_experts_per_tok` (4), renormalised when `norm_topk_prob` (default true), the weights cast to
the activation dtype; plus one ungated shared expert `shared_expert_intermediate_size` wide. There
is no dense FFN and no `intermediate_size`. The files (the Hub's, and transformers' save) fuse the
delta-net's projections into one `in_proj` (rows [q | k | v | z | b | a]) and name its gated norm
`out_norm`; they hold the experts fused (`experts.gate_up_proj`, `experts.down_proj`), as
transformers reads them. Defaults: hidden 1024, 34 layers, 16 heads of 128, 4 KV heads, delta-net
8 key heads and 16 value heads of 128, conv 4, eps 1e-6, tied embeddings.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import layer_mixers_from_types, window_fields
from ..tables.hf_moe import FUSED_RULES, experts
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Piece
from . import llama, qwen2_moe, qwen3, qwen3_next
from .qwen3_5_text import UNFUSED_GDN_RULES

L, S, F = "linear_attention", "sliding_attention", "full_attention"
PATTERN = (L, S, L, F, S)  # LaraMiniConfig.__post_init__'s, repeated
LINEAR = qwen3_next.LINEAR
IN_PROJ = ("mixer.qkv", "mixer.values", "mixer.value_heads", "mixer.value_heads")
# the files' names first (what export writes), then transformers' in-memory ones (what verify finds its modules by)
FILE_GDN_RULES = (
    *(Rule(f"{LINEAR}.in_proj.weight", f"layers.{{}}.mixer.{ours}.weight", Piece(IN_PROJ, i))
      for i, ours in enumerate(("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))),
    Rule(f"{LINEAR}.out_norm.weight", "layers.{}.mixer.norm.weight"),
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.PRE_NORM_RULES + llama.QK_NORM_RULES
                      + (Rule("model.layers.{}.mlp.gate.weight", "layers.{}.mlp.router.weight"),) + FUSED_RULES
                      + qwen2_moe.SHARED_RULES[:3] + FILE_GDN_RULES + qwen3_next.GDN_RULES + UNFUSED_GDN_RULES)

SCHEDULE_KEYS = (Key("layer_types", list, None, nullable=True), Key("sliding_window", int, 512),
                 Key("linear_conv_kernel_dim", int, 4), Key("linear_key_head_dim", int, 128),
                 Key("linear_value_head_dim", int, 128), Key("linear_num_key_heads", int, 8),
                 Key("linear_num_value_heads", int, 16))
TYPES = {L: "mixer", S: "attention", F: "attention"}


def schedule_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Each layer's kind: the delta-net, sliding attention with RoPE, or full attention without positions."""
    n = fields["n_layers"]
    types = hf.get("layer_types")
    types = [PATTERN[i % len(PATTERN)] for i in range(n)] if types is None else types
    mixers = layer_mixers_from_types(types, n, TYPES)
    kinds = tuple("local" if t == S else "global" for t in types)
    out = {**window_fields(kinds, hf.get("sliding_window")),
           "layer_positions": tuple("none" if t == F else "rope" for t in types)}
    if "mixer" in mixers:
        out.update(mixer="gated_deltanet", layer_mixers=mixers,
                   mixer_settings={**qwen3_next.qwen_settings(hf, fields), "norm_dtype_order": "scale_then_cast"})
    return out


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """A global layer is written full_attention and a local one sliding_attention (one with other positions
    reads back otherwise, so export names what is lost); a mixer other than the delta-net's as attention."""
    gdn = cfg.mixer == "gated_deltanet"
    types = [L if gdn and m == "mixer" else S if k == "local" else F
             for m, k in zip(cfg.layer_mixers, cfg.layer_kinds, strict=True)]
    sizes = qwen3_next.qwen_settings_to_hf(cfg) if gdn else {k: DEFAULT for k in qwen3_next.SIZE_KEYS.values()}
    return {"layer_types": types, "sliding_window": DEFAULT if cfg.sliding_window is None else cfg.sliding_window,
            **sizes}


ROUTED = experts(Key("num_experts", int, 128), Key("num_experts_per_tok", int, 4),
                 width=Key("moe_intermediate_size", int, 512), norm_key=Key("norm_topk_prob", bool, True),
                 shared_width=Key("shared_expert_intermediate_size", int, 512), aux_default=0.001,
                 router="softmax", router_fp32=True, kept_fp32=(), shared="plain")
# every layer a mixture: the model's d_ff is the experts' width (no dense FFN to hold another)
EXPERTS = Entry("experts", ROUTED.keys,
                lambda hf, fields: {**ROUTED.read(hf, fields), "d_ff": hf.get("moe_intermediate_size")},
                ROUTED.write)

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias", "intermediate_size"),
    add=(llama.norm(1e-6, dtype_order="scale_then_cast"), llama.ATTENTION_BIAS, fixed("QK norm", qk_norm="head"),
         Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf), EXPERTS),
    defaults={"vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 34, "num_attention_heads": 16,
              "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 131072,
              "tie_word_embeddings": True},
    nullable={"head_dim": False, "num_key_value_heads": False, "attention_dropout": False},
)

FAMILY = Family("lara_mini", ("lara_mini",), "LaraMiniForCausalLM", TENSORS, CONFIG,
                no_gguf="llama.cpp's converter has no LaraMini architecture (its sliding and position-free "
                        "attention beside the gated delta-net); export to safetensors instead",
                reference_layouts=qwen3.REFERENCE_LAYOUTS)
