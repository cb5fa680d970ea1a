"""Llama 4 (Llama4ForCausalLM: the text decoder of Llama-4-Scout-17B-16E and Llama-4-Maverick-17B-128E).

Same as llama, except: RoPE reads each head's dims in adjacent pairs and rotates them as fp32 complex
numbers (`apply_rotary_emb`, torch.polar tables, transformers' default theta 500000), and only on the
layers `no_rope_layers` marks 1 (default: all but every `no_rope_layer_interval`-th, 4); the others
have no positions (NoPE). On the rotary layers q and k are then normalised per head by a weightless
RMS norm (`use_qk_norm`, Llama4TextL2Norm, eps `rms_norm_eps`, in fp32), and those layers
(`layer_types` "chunked_attention", default: the rotary layers when `attention_chunk_size` is set)
attend only within their chunk of `attention_chunk_size` positions (8192). On the NoPE layers each
query is scaled by 1 + `attn_scale` * log1p(floor((pos + 1) / `floor_scale`)) in fp32 when
`attn_temperature_tuning` (0.1, 8192). The FFN of the layers `moe_layers` lists (default: every
`interleave_moe_layer_step`-th, 1) is a mixture of `num_local_experts` (16) SwiGLU experts, each
`intermediate_size` (8192) wide, stored fused and transposed (`feed_forward.experts.gate_up_proj`
[experts, hidden, 2 * width] with gate then up columns, `down_proj` [experts, width, hidden]); the
router (`feed_forward.router`) takes the top `num_experts_per_tok` (1) logits and weights them by
their sigmoid in fp32 (not renormalised), the weight multiplying the expert's input, not its output;
a shared SwiGLU expert of the same width (`feed_forward.shared_expert`) is added. The other layers
keep a dense SwiGLU MLP (`feed_forward`) `intermediate_size_mlp` (16384) wide. The MLPs have no bias;
`rms_norm_eps` defaults to 1e-5. The router's auxiliary-loss keys act in training only (and
Llama4ForCausalLM adds no auxiliary loss).

Llama4ForConditionalGeneration (model_type `llama4`) is read as its `text_config` decoder, the vision
model and multi-modal projector dropped; export writes the text-only Llama4ForCausalLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmconvert.arch import ArchConfig, MoeConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, plain
from ..tables.gguf import MOE_RULES, STATES_VOCAB_AND_ROPE, tensor_table, written
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_rope import rope
from ..tables.hf_wrapper import nested_text_config, wrapped
from ..tables.points import Returned, Summed
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Chain, ExpertsTransposed, Unstack
from . import llama

FFN = "model.layers.{}.feed_forward"
EXPERT = "layers.{}.mlp.experts.{}"
FFN_RULES = (
    *(Rule(f"{FFN}.{n}_proj.weight", f"layers.{{}}.mlp.{n}.weight") for n in ("gate", "up", "down")),
    Rule(f"{FFN}.router.weight", "layers.{}.mlp.router.weight"),
    *(Rule(f"{FFN}.shared_expert.{n}_proj.weight", f"layers.{{}}.mlp.shared.{n}.weight")
      for n in ("gate", "up", "down")),
    *(Rule(f"{FFN}.experts.gate_up_proj", f"{EXPERT}.{name}.weight",
           Chain(ExpertsTransposed(), Unstack(part=part, parts=2))) for part, name in enumerate(("gate", "up"))),
    Rule(f"{FFN}.experts.down_proj", f"{EXPERT}.down.weight", Chain(ExpertsTransposed(), Unstack())),
)
TEXT_TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.PRE_NORM_RULES + FFN_RULES)
TENSORS = wrapped(TEXT_TENSORS, "vision_model", "multi_modal_projector")

# -- the per-layer pattern: positions, chunks, QK norm, temperature
NO_ROPE_LAYERS = Key("no_rope_layers", list, None, nullable=True)
NO_ROPE_INTERVAL = Key("no_rope_layer_interval", int, 4)
CHUNK = Key("attention_chunk_size", int, 8192, nullable=True)
LAYER_TYPES = Key("layer_types", list, None, nullable=True)
USE_QK_NORM = Key("use_qk_norm", bool, True)
TUNING = Key("attn_temperature_tuning", bool, True)
FLOOR_SCALE = Key("floor_scale", int, 8192)
ATTN_SCALE = Key("attn_scale", float, 0.1)
KINDS = ("full_attention", "chunked_attention")


def _rotary(hf: HfConfig, n: int) -> list[bool]:
    """Llama4TextConfig's no_rope_layers (1: the layer has RoPE): as stated (its first n entries), or, where
    absent or empty, all but every no_rope_layer_interval-th."""
    stated = hf.get("no_rope_layers")
    if not stated:
        interval = hf.get("no_rope_layer_interval")
        return [(i + 1) % interval != 0 for i in range(n)]
    if len(stated) < n or any(isinstance(v, bool) or v not in (0, 1) for v in stated):
        raise MappingError(f"config.json: no_rope_layers={show(stated)} should give 1 (RoPE) or 0 (no positions) "
                           f"for each of the num_hidden_layers={n} layers")
    return [bool(v) for v in stated[:n]]


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    rotary = _rotary(hf, n)
    chunk = hf.get("attention_chunk_size")
    types = hf.get("layer_types")
    if types is None:
        types = ["chunked_attention" if r and chunk is not None else "full_attention" for r in rotary]
    if len(types) != n or any(t not in KINDS for t in types):
        raise MappingError(f"config.json: layer_types={show(types)} should name one of {', '.join(KINDS)} for each "
                           f"of the num_hidden_layers={n} layers")
    chunked = tuple(i for i, t in enumerate(types) if t == "chunked_attention")
    if chunked and chunk is None:
        raise MappingError("config.json: some layers are chunked_attention but attention_chunk_size is null; "
                           "transformers cannot run this either; set attention_chunk_size")
    out: dict[str, Any] = {"layer_positions": tuple("rope" if r else "none" for r in rotary),
                           "chunked_layers": chunked, "attention_chunk": chunk if chunked else None,
                           "qk_l2_norm": hf.get("use_qk_norm")}
    if hf.get("attn_temperature_tuning") and hf.get("attn_scale") != 0:  # a scale of 0 multiplies by exactly 1
        out.update(attn_temperature=float(hf.get("attn_scale")), attn_temperature_floor=hf.get("floor_scale"),
                   attn_temperature_form="llama4")
    return out


def _interval(flags: list[bool], n: int) -> int | None:
    """The period p for which exactly the layers i with (i + 1) % p == 0 have the flag, if one does."""
    return next((p for p in range(1, n + 1) if flags == [(i + 1) % p == 0 for i in range(n)]), None)


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    n = cfg.n_layers
    nope = [p != "rope" for p in cfg.layer_positions]
    interval = _interval(nope, n)
    tuned = cfg.attn_temperature is not None and cfg.attn_temperature_form == "llama4"
    return {"no_rope_layers": [int(not f) for f in nope], "no_rope_layer_interval": interval or DEFAULT,
            "attention_chunk_size": cfg.attention_chunk,
            "layer_types": ["chunked_attention" if i in cfg.chunked_layers else "full_attention" for i in range(n)],
            "use_qk_norm": cfg.qk_l2_norm, "attn_temperature_tuning": tuned,
            "floor_scale": cfg.attn_temperature_floor if tuned else DEFAULT,
            "attn_scale": cfg.attn_temperature if tuned else DEFAULT}


# -- the experts
EXPERT_KEYS = (Key("num_local_experts", int, 16), Key("num_experts_per_tok", int, 1),
               Key("intermediate_size", int, 8192), Key("moe_layers", list, None, nullable=True),
               Key("interleave_moe_layer_step", int, 1))


def moe_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    listed = hf.get("moe_layers")
    if listed is None:
        step = hf.get("interleave_moe_layer_step")
        listed = list(range(step - 1, n, step))
    if any(isinstance(i, bool) or not isinstance(i, int) for i in listed):
        raise MappingError(f"config.json: moe_layers={show(listed)} should list layer indices")
    sparse = {i for i in listed if 0 <= i < n}
    if not sparse:
        return {"moe": None}
    width = hf.get("intermediate_size")
    return {"moe": MoeConfig(n_experts=hf.get("num_local_experts"), top_k=hf.get("num_experts_per_tok"),
                             d_expert=width, router="topk_sigmoid_fp32", norm_topk=False, shared="plain",
                             d_shared=width, weight_input=True,
                             dense_layers=tuple(i for i in range(n) if i not in sparse))}


def moe_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    moe = cfg.moe
    if moe is None:  # every layer dense
        return {"num_local_experts": DEFAULT, "num_experts_per_tok": DEFAULT, "intermediate_size": DEFAULT,
                "moe_layers": [], "interleave_moe_layer_step": DEFAULT}
    sparse = [moe.sparse(i) for i in range(cfg.n_layers)]
    return {"num_local_experts": moe.n_experts, "num_experts_per_tok": moe.top_k, "intermediate_size": moe.d_expert,
            "moe_layers": [i for i, s in enumerate(sparse) if s],
            "interleave_moe_layer_step": _interval(sparse, cfg.n_layers) or DEFAULT}


LLAMA4_TEXT = {"model_type": "llama4_text"}  # Llama4Config's text_config when absent: Llama4TextConfig's defaults

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias", "intermediate_size"),
    add=(llama.norm(1e-5), rope(layout="interleaved", complex_product=True),
         plain("intermediate_size_mlp", "d_ff", int, 16384),
         Entry("llama4 layers", (NO_ROPE_LAYERS, NO_ROPE_INTERVAL, CHUNK, LAYER_TYPES, USE_QK_NORM, TUNING,
                                 FLOOR_SCALE, ATTN_SCALE), layers_from_hf, layers_to_hf),
         Entry("experts", EXPERT_KEYS, moe_from_hf, moe_to_hf)),
    defaults={"vocab_size": 202048, "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
              "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
              "rope_theta": 500000.0},
    nullable={"num_key_value_heads": False, "head_dim": False, "attention_dropout": False},  # numbers only
    decoder=lambda data: nested_text_config(data, "llama4", ("llama4_text",), LLAMA4_TEXT, tie=False),
)


# Llama4Router returns its scores, then its logits; Llama4TextExperts every expert's output, the unchosen zero
REFERENCE_LAYOUTS = {"mlp.router": Returned(1, "B*T X"), "mlp.experts": Summed("X*B*T d", "X")}

# -- llama.cpp (GGUF)
# llama.cpp's llama4 (convert_hf_to_gguf.py's Llama4Model, a LlamaModel without its q/k permutation: llama.cpp's
# rope type for llama4 is its interleaved one, transformers' complex pairs): the dense layers' width as
# feed_forward_length (intermediate_size_mlp), the experts' as expert_feed_forward_length (intermediate_size), the
# shared expert as wide as one; the experts split out of gate_up_proj and stacked (`ffn_gate_exps` ...), the shared
# expert as `ffn_*_shexp`, the router as `ffn_gate_inp`. Its loader (src/models/llama4.cpp) reads only
# interleave_moe_layer_step of the layer pattern; its graph hard-codes the rest: chunks of 8192 positions on three
# layers of four, the fourth without RoPE (n_no_rope_layer_step 4) and its queries scaled by 1 + 0.1 log(floor((pos
# + 1) / 8192) + 1) (n_attn_temp_floor_scale, f_attn_temp_scale, f_attn_temp_offset), the weightless QK norm on the
# rotary layers unless there are 128 experts (use_kq_norm: Maverick has none), a top-k of the logits weighted by
# their sigmoids, unrenormalised, before the experts (build_moe_ffn), no attn_output bias. A config computing
# otherwise is refused by the read-back (`derived` fills in what the graph computes), naming what it loses. A file
# stating `attention.sliding_window` 0 (its converter's MobileLLM, every layer full, which llama.cpp then runs
# unchunked, its last layer without RoPE) is refused where the file's key types are checked (formats/gguf.py: a
# window is a positive count)
CHUNK_SIZE, NOPE_STEP, TEMPERATURE, TEMPERATURE_FLOOR, MAVERICK_EXPERTS = 8192, 4, 0.1, 8192, 128
HARD_CODED = {"attention_chunk_size": CHUNK_SIZE, "no_rope_layer_interval": NOPE_STEP,
              "attn_temperature_tuning": True, "attn_scale": TEMPERATURE, "floor_scale": TEMPERATURE_FLOOR}


def _llama_cpp_s(config: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp's llama4 graph for a model of these experts and layers: the HF keys it hard-codes."""
    n, experts = config["num_hidden_layers"], config.get("num_local_experts")
    rotary = [(i + 1) % NOPE_STEP != 0 for i in range(n)]
    step = config.get("interleave_moe_layer_step") or 0
    return {"no_rope_layers": [int(r) for r in rotary],
            "layer_types": ["chunked_attention" if r else "full_attention" for r in rotary], **HARD_CODED,
            "use_qk_norm": experts != MAVERICK_EXPERTS,
            "moe_layers": [i for i in range(n) if step > 0 and (i + 1) % step == 0]}


def _from_gguf(config: Mapping[str, Any]) -> dict[str, Any]:
    """Import: what llama.cpp's llama4 graph computes for the file's experts and layers."""
    return {k: v for k, v in _llama_cpp_s(config).items() if k != "moe_layers"}


GGUF_TABLE = TensorTable((*tensor_table(False, 0.0, True).rules,
                          *(r for r in MOE_RULES if "gate_inp_shexp" not in r.stored)))
GGUF_LLAMA4 = written("llama4_text", arch="llama4", table=GGUF_TABLE, stated=STATES_VOCAB_AND_ROPE,
                      keys={"feed_forward_length": "intermediate_size_mlp", "expert_count": "num_local_experts",
                            "expert_used_count": "num_experts_per_tok",
                            "expert_feed_forward_length": "intermediate_size",
                            "interleave_moe_layer_step": "interleave_moe_layer_step"},
                      defaults={"hidden_act": "silu"}, derived=_from_gguf)

FAMILY = Family("llama4_text", ("llama4_text",), "Llama4ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_LLAMA4,),
                wraps={"llama4": ("llama4_text",)}, reference_layouts=REFERENCE_LAYOUTS,
                notes={"llama4": "Llama4ForConditionalGeneration (model_type llama4): only the text decoder is read; "
                                 "the vision model and multi-modal projector are left out"})
