"""AFMoE (AfmoeForCausalLM: Arcee's Trinity-Mini, Trinity-Nano).

Same as exaone_moe, except: the norms are a sandwich (`input_layernorm` and `post_attention_layernorm`
around attention, `pre_mlp_layernorm` and `post_mlp_layernorm` around the FFN), each RMSNorm's weight
multiplied in fp32 before the cast back (`AfmoeRMSNorm`), q_norm / k_norm on each head of the
(B, T, H, D) view before the heads move before time; the attention output is gated: times
sigmoid(`gate_proj`(x)), elementwise over heads * head_dim, before `o_proj`, in the activation dtype;
`layer_types` (absent: every `global_attn_every_n_layers`-th layer full, default 4) picks the sliding
layers (`sliding_window`, default 1024), which alone rotate: the full layers have no positions
whether or not there is a window; the first `num_dense_layers` layers (default 1) are dense and the rest
mixtures, whose router (`mlp.router.gate`) takes its logits in the activation dtype, their sigmoid in
fp32, chooses `num_experts_per_tok` of `num_experts` on the scores plus `expert_bias` (kept in fp32),
in decreasing order, weights them by their scores renormalised (plus 1e-20) times `route_scale`, in
fp32; `num_shared_experts` plain shared experts as one FFN of their summed width, on the flat input;
no group-limited choice; `mup_enabled` multiplies the embeddings by hidden_size ** 0.5, a Python float
(rounded once); `attention_bias` switches the q, k, v and o biases (the gate has none); no `mlp_bias`.
`output_router_logits` adds no loss in transformers' AFMoE and is not read.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed, plain
from ..tables.gguf import MOE_RULES, STATES_VOCAB_AND_ROPE, tensor_table, written
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_layers import LAYER_TYPES_KEY, layer_kinds_from_hf, layer_types_to_hf, window_fields
from ..tables.hf_moe import expert_rules
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import Rule, TensorTable
from . import llama

# read where layer_types is absent; never written (layer_types says it)
EVERY_KEY = Key("global_attn_every_n_layers", int, 4, nullable=True, legacy=True)
# null: AfmoeConfig accepts it, but its sliding layers cannot run without one (window_fields refuses it)
WINDOW_KEY = Key("sliding_window", int, 1024, nullable=True)


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    kinds = layer_kinds_from_hf(hf, fields["n_layers"],
                                lambda i: bool((i + 1) % stated(hf, "global_attn_every_n_layers")))
    return {**window_fields(kinds, hf.get("sliding_window")),
            "layer_positions": tuple("rope" if kind == "local" else "none" for kind in kinds)}


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The layers by name; RoPE anywhere but on the sliding layers reads back otherwise, so export
    refuses it by name."""
    return {"layer_types": layer_types_to_hf(cfg.layer_kinds),
            "sliding_window": DEFAULT if cfg.sliding_window is None else cfg.sliding_window}


def stated(hf: HfConfig, name: str) -> Any:
    """A key AfmoeConfig types `| None` but its model cannot be built with as null."""
    value = hf.get(name)
    if value is None:
        raise MappingError(f"config.json: {name}=null: transformers' Afmoe model cannot be built with it; set it, "
                           f"or remove the key for the default ({hf.keys[name].default})")
    return value


def head_dim_from_hf(value: int | None) -> int:
    if value is None:  # AfmoeConfig accepts it, AfmoeAttention then multiplies the heads by None
        raise MappingError("config.json: head_dim=null: transformers' AfmoeAttention cannot be built with it; set "
                           "head_dim, or remove the key for the default (128)")
    return value


MUP_KEY = Key("mup_enabled", bool, False, nullable=True)


def mup_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    # AfmoeModel: `hidden_states * (self.config.hidden_size**0.5)`, the Python float itself
    return {"embed_scale": fields["d_model"] ** 0.5 if hf.get("mup_enabled") else None, "embed_scale_unrounded": True}


def mup_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # any other scale reads back as sqrt(hidden_size) or none, so export refuses it by name
    return {"mup_enabled": cfg.embed_scale is not None}


# all but the width typed `| None` by AfmoeConfig, none of which its model can be built with (`stated`)
KEYS = (Key("num_dense_layers", int, 1, nullable=True, bound="non_negative"),
        Key("num_experts", int, 64, nullable=True), Key("num_experts_per_tok", int, 6, nullable=True),
        Key("moe_intermediate_size", int, 1408), Key("num_shared_experts", int, 2, nullable=True),
        Key("route_scale", float, 1.0, nullable=True))


def experts_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    dense = tuple(range(min(stated(hf, "num_dense_layers"), n)))
    values = {name: stated(hf, name) for name in ("num_experts", "num_experts_per_tok", "num_shared_experts",
                                                  "route_scale")}
    if len(dense) == n:
        return {}
    width = hf.get("moe_intermediate_size")
    return {"moe": MoeConfig(n_experts=values["num_experts"], top_k=values["num_experts_per_tok"], d_expert=width,
                             router="sigmoid_fp32_sorted", norm_topk=True, weights_fp32=True, shared="plain",
                             d_shared=values["num_shared_experts"] * width, dense_layers=dense, selection_bias=True,
                             scale=values["route_scale"], kept_fp32=("selection_bias",))}


def experts_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The leading dense layers; any other pattern, router or shared width reads back otherwise and
    is refused by name."""
    moe = cfg.moe
    if moe is None:
        return {"num_dense_layers": cfg.n_layers, **{k.name: DEFAULT for k in KEYS[1:]}}
    leading = next(i for i in range(cfg.n_layers) if moe.sparse(i))
    shared = DEFAULT if moe.d_shared is None or moe.d_shared % moe.d_expert else moe.d_shared // moe.d_expert
    return {"num_dense_layers": leading, "num_experts": moe.n_experts, "num_experts_per_tok": moe.top_k,
            "moe_intermediate_size": moe.d_expert, "num_shared_experts": shared, "route_scale": moe.scale}


CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(plain("head_dim", "head_dim", int, 128, nullable=True, read=head_dim_from_hf),
         llama.norm(1e-5, dtype_order="scale_then_cast"),
         fixed("sandwich norms", norm_placement="sandwich", qk_norm="head", attn_output_gate="projection"),
         Entry("layer kinds", (WINDOW_KEY, LAYER_TYPES_KEY, EVERY_KEY), layers_from_hf, layers_to_hf),
         Entry("mup", (MUP_KEY,), mup_from_hf, mup_to_hf),
         Entry("experts", KEYS, experts_from_hf, experts_to_hf)),
    defaults={"vocab_size": 200192, "hidden_size": 2048, "intermediate_size": 6144, "num_attention_heads": 16,
              "max_position_embeddings": 16384},
)

SANDWICH_RULES = (
    Rule("model.layers.{}.input_layernorm.weight", "layers.{}.attn_norm.weight"),
    Rule("model.layers.{}.post_attention_layernorm.weight", "layers.{}.attn_post_norm.weight"),
    Rule("model.layers.{}.pre_mlp_layernorm.weight", "layers.{}.mlp_norm.weight"),
    Rule("model.layers.{}.post_mlp_layernorm.weight", "layers.{}.mlp_post_norm.weight"),
)
TENSORS = TensorTable(
    llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + SANDWICH_RULES + llama.QK_NORM_RULES
    + (Rule("model.layers.{}.self_attn.gate_proj.weight", "layers.{}.attn.out_gate.weight"),
       Rule("model.layers.{}.mlp.expert_bias", "layers.{}.mlp.router.selection_bias"))
    + expert_rules("mlp", ("gate_proj", "up_proj", "down_proj"), "router.gate")
    + tuple(Rule(f"model.layers.{{}}.mlp.shared_experts.{n}_proj.weight", f"layers.{{}}.mlp.shared.{n}.weight")
            for n in ("gate", "up", "down")))

# q_proj(x).view(B, T, -1, D), then q_norm, then the transpose; the shared experts on the flat input (the default)
REFERENCE_LAYOUTS = QK_NORM_PER_HEAD


# -- llama.cpp (GGUF): its afmoe architecture (AfmoeModel in its converter, a LlamaModel: q/k unpermuted, the vocabulary
# and rotated width stated; it reads the Hub's route_norm and score_func, which transformers' AfmoeConfig does not
# keep). The sandwich norms as attn_norm / post_attention_norm / ffn_norm / post_ffw_norm, the output gate as
# `attn_gate`, the selection bias as `exp_probs_b`, the leading dense layers as leading_dense_block_count, the shared
# experts as one FFN of expert_shared_count x the experts' width; renormalised (expert_weights_norm) sigmoid scores
# (expert_gating_func), scaled by expert_weights_scale; no layer pattern stated (llama.cpp's: every fourth layer
# full). What its afmoe graph hard-codes otherwise than the model says is refused by name (`_to_gguf`).
GGUF_KEYS = {"expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
             "expert_feed_forward_length": "moe_intermediate_size", "expert_shared_count": "num_shared_experts",
             "leading_dense_block_count": "num_dense_layers", "expert_weights_scale": "route_scale",
             "expert_weights_norm": "route_norm", "expert_gating_func": "expert_gating_func",
             "attention.sliding_window": "sliding_window"}
SIGMOID = 2  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, which AfmoeModel writes from the Hub's score_func
NO_ROPE_STEP = 4  # llama.cpp's hparams.n_no_rope_layer_step, which its afmoe reads from no key


def _unrotated(n_layers: int) -> list[str]:
    """The layer types whose full layers are those llama.cpp's afmoe graph leaves unrotated."""
    return ["sliding_attention" if (i + 1) % NO_ROPE_STEP else "full_attention" for i in range(n_layers)]


def _to_gguf(config: dict[str, Any]) -> dict[str, Any]:
    if not config.get("mup_enabled"):
        raise MappingError("llama.cpp's afmoe graph scales the embeddings by sqrt(hidden_size) whatever the file says "
                           "(src/models/afmoe.cpp: `inpL = ggml_scale(ctx0, inpL, sqrtf(float(n_embd)))`), and this "
                           "model does not (mup_enabled false)")
    if config.get("attention_bias"):
        raise MappingError("llama.cpp's afmoe loads no attention output bias (src/models/afmoe.cpp: `layer.wo = "
                           "create_tensor(tn(LLM_TENSOR_ATTN_OUT, \"weight\", i), ...)`), and this model has q, k, v "
                           "and o biases (attention_bias true)")
    kinds = config["layer_types"]
    if list(kinds) != _unrotated(len(kinds)):
        full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
        raise MappingError(f"llama.cpp's afmoe graph rotates every layer but each {NO_ROPE_STEP}th "
                           "(src/models/afmoe.cpp: `use_rope = hparams.n_no_rope_layer_step > 0 && (il + 1) % "
                           f"hparams.n_no_rope_layer_step != 0`, the step {NO_ROPE_STEP} read from no key), where "
                           f"transformers' AFMoE leaves its full layers unrotated, and this model's are layers {full}")
    return {"expert_weights_norm": True, "expert_gating_func": SIGMOID}


def _from_gguf(config: dict[str, Any]) -> dict[str, Any]:
    """What transformers' AFMoE has of what llama.cpp's afmoe runs; anything else refused by name."""
    if config.get("route_norm") is not True:
        raise MappingError("afmoe.expert_weights_norm is not true: llama.cpp's afmoe then leaves the chosen experts' "
                           "weights unnormalised, which transformers' AFMoE always renormalises")
    if config.get("expert_gating_func", SIGMOID) != SIGMOID:
        raise MappingError(f"afmoe.expert_gating_func={config['expert_gating_func']}: transformers' AFMoE scores its "
                           f"experts by a sigmoid ({SIGMOID}); lmconvert reads no other")
    if config.get("sliding_window") is None or config["layer_types"] != _unrotated(config["num_hidden_layers"]):
        raise MappingError(f"its sliding layers (afmoe.attention.sliding_window, sliding_window_pattern) are not "
                           f"all but each {NO_ROPE_STEP}th, the layers llama.cpp's afmoe rotates, where transformers' "
                           "AFMoE rotates its sliding layers alone")
    return {}


GGUF_AFMOE = written(
    "afmoe", arch="afmoe", keys=GGUF_KEYS, swa_pattern=NO_ROPE_STEP, stated=STATES_VOCAB_AND_ROPE,
    defaults={"hidden_act": "silu", "mup_enabled": True, "num_dense_layers": 0, "route_scale": 1.0},
    derived=_from_gguf, exported=_to_gguf,
    table=TensorTable((*tensor_table(False, 0.0, True).rules, *MOE_RULES[:7],
                       Rule("blk.{}.attn_gate.weight", "layers.{}.attn.out_gate.weight"),
                       Rule("blk.{}.exp_probs_b.bias", "layers.{}.mlp.router.selection_bias"))))

FAMILY = Family("afmoe", ("afmoe",), "AfmoeForCausalLM", TENSORS, CONFIG, reference_layouts=REFERENCE_LAYOUTS,
                gguf=(GGUF_AFMOE,))
