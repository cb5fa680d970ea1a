"""llama.cpp's K-quant mixes (`--quant q3_k_m | q4_k_s | q4_k_m | q5_k_m`): the GGML type of each
tensor, chosen as `llama-quantize` chooses it without an importance matrix (llama.cpp's
src/llama-quant.cpp, llama-cpp-python 0.3.36: `tensor_allows_quantization`, `llama_tensor_get_type`,
`llama_tensor_get_type_impl`, `tensor_type_fallback`, and `llama_model_quantize_impl`'s tensor order
and counters). Proven against llama.cpp itself in `make llamacpp-check`
(tests/test_llamacpp_quant_mix.py).

What llama.cpp reads to choose: each tensor's name, shape and type in the float file, and five
hyperparameters of the file's metadata (QuantModel). The rules are its own, kept in its order:
- tensors never quantized keep their type (1-D ones, names not ending in "weight", norms, routers,
  positional embeddings, ... NOT_QUANTIZED);
- the output matrix, and the token embedding when there is no output (tied), take Q6_K, or Q8_0 for
  Falcon or a row length 256 does not divide;
- V-like projections (attn_v, the fused attn_qkv, MLA's attn_kv_b), counted in file order, take more
  bits on the first, last and every third of them (use_more_bits), by mix; Q8_0 with 8 experts; Q5_K
  for Llama-2-70B-shaped models;
- ffn_down by layer (the layer in the name for mixtures, the count of ffn_down tensors seen otherwise);
- attn_output and attn_k by the number of experts;
- a type whose block does not divide the row falls back (Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
  Q6_K -> Q8_0), to F16 where even that does not divide.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# --quant name -> (llama.cpp's LlamaFileType, written as `general.file_type`; the mix's default type)
MIXES: dict[str, tuple[int, str]] = {"q3_k_m": (12, "Q3_K"), "q4_k_s": (14, "Q4_K"), "q4_k_m": (15, "Q4_K"),
                                     "q5_k_m": (17, "Q5_K")}

# ggml's block sizes (elements per block) of the types a mix can choose, and of the float types
BLOCK = {"F32": 1, "F16": 1, "BF16": 1, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32,
         "Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
QUANTIZED = frozenset(t for t, block in BLOCK.items() if block > 1)
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # tensor_type_fallback

# tensor_allows_quantization: a tensor whose name contains one of these keeps its type
_TIME_MIX = ("first", "w0", "w1", "w2", "v0", "v1", "v2", "a0", "a1", "a2", "g1", "g2", "decay_w1", "decay_w2",
             "lerp_fused")
NOT_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                 "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
                 "indexer.q_proj.weight", *(f"time_mix_{w}.weight" for w in _TIME_MIX), "attn_rel_b.weight",
                 ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
                 ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
NOT_QUANTIZED_NAMES = frozenset({"position_embd.weight", "token_types.weight"})  # LLM_TN's POS_EMBD, TOKEN_TYPES
# ... and by architecture
NOT_QUANTIZED_IN = {"glm5-next": ("hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj",
                                  "indexer_compressor_gate", "indexer_compressor_ape", "ssm_f_a.weight",
                                  "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight", "ssm_beta.weight",
                                  "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight")}
# tensors an architecture never quantizes below Q8_0 (a name containing one of these)
Q8_0_AT_LEAST_IN = {"glm5-next": ("attn_q_a", "attn_q_b", "nextn.eh_proj")}

# tensor_get_category: the first match wins; exact names, then substrings
EXACT_CATEGORY = {"output.weight": "output", "token_embd.weight": "token_embd",
                  "per_layer_token_embd.weight": "token_embd"}
CATEGORY = (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"), ("attn_v.weight", "attn_v"),
            ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
            ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down"))
# llama.cpp's model type LLM_TYPE_70B, set by these architectures' load_arch_hparams (src/models/<arch>.cpp)
# from the layer count (n_layer(): without MTP layers), heads and experts; it gives attn_v Q5_K
def _llama_70b(m: QuantModel) -> bool:
    return m.n_expert != 8 and m.n_layer == 80 and m.n_head != m.n_head_kv  # 65B without grouped KV heads


IS_70B: dict[str, Callable[[QuantModel], bool]] = {
    "llama": _llama_70b, "llama-embed": _llama_70b,
    "deci": lambda m: m.n_layer == 80, "olmo": lambda m: m.n_layer == 80, "qwen2": lambda m: m.n_layer == 80,
    "jais2": lambda m: m.n_layer == 68,
}


@dataclass(frozen=True)
class QuantModel:
    """What llama.cpp's choice reads of the model, from the file's metadata (llama_model_loader,
    load_hparams): the architecture, block_count (n_layer_all, MTP layers included), n_layer()
    (without them), expert_count, and layer 0's head_count and head_count_kv."""

    arch: str
    n_layer_all: int
    n_layer: int
    n_expert: int
    n_head: int
    n_head_kv: int

    @classmethod
    def from_metadata(cls, arch: str, values: Mapping[str, Any]) -> QuantModel:
        def get(key: str, default: int) -> int:
            value = values.get(f"{arch}.{key}", default)
            value = getattr(value, "value", value)  # a gguf GGUFValue
            return int(value[0] if isinstance(value, (list, tuple)) else value)  # a per-layer array: layer 0's

        layers = get("block_count", 0)
        heads = get("attention.head_count", 0)
        return cls(arch, layers, layers - get("nextn_predict_layers", 0), get("expert_count", 0), heads,
                   get("attention.head_count_kv", heads))


def file_type(mix: str) -> int:
    """`general.file_type` for a mix: llama.cpp's LlamaFileType."""
    return MIXES[mix][0]


def _n_dims(shape: Sequence[int]) -> int:
    """ggml_n_dims: trailing ggml dimensions of 1 (leading ones in torch order) do not count."""
    ne = list(reversed(shape))
    return next((i + 1 for i in range(len(ne) - 1, 0, -1) if ne[i] > 1), 1)


def allows_quantization(arch: str, name: str, shape: Sequence[int]) -> bool:
    """tensor_allows_quantization (llama-quantize's defaults: the output quantized too)."""
    if _n_dims(shape) < 2:
        return False
    # name.rfind("weight") == name.size() - 6 in C++: also true of a 5-character name, whose size - 6 is npos
    ends_weight = name.endswith("weight") or len(name) == 5
    return (ends_weight and name not in NOT_QUANTIZED_NAMES
            and not any(part in name for part in (*NOT_QUANTIZED, *NOT_QUANTIZED_IN.get(arch, ()))))


def category(name: str) -> str | None:
    """tensor_get_category."""
    return EXACT_CATEGORY.get(name) or next((cat for part, cat in CATEGORY if part in name), None)


_BLOCK_NUMBER = re.compile(r"blk\.\s*([+-]?\d+)")  # sscanf(name, "blk.%d.", &layer)


def _block(name: str) -> int | None:
    found = _BLOCK_NUMBER.match(name)
    return int(found.group(1)) if found else None


def _layer_order(name: str) -> tuple[int, str]:
    """llama_model_loader's weight_name_comparer: by the layer in `blk.N.` (-1 without), then by name."""
    block = _block(name)
    return (-1 if block is None else block), name


def _c_mod(a: int, b: int) -> int:
    return int(math.fmod(a, b))


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or _c_mod(i_layer - n_layers // 8, 3) == 2


@dataclass
class _Counters:
    """quantize_state_impl's counters, advanced as llama.cpp advances them."""

    n_attention_wv: int
    tied: bool
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0


def _layer_info(model: QuantModel, counted: int, name: str) -> tuple[int, int]:
    """The layer a feed-forward tensor is in: with experts, the one its name says (Mixtral's experts
    are not stored in layer order); otherwise how many of its kind came before it."""
    if max(1, model.n_expert) > 1:
        order = _block(name)
        if order is None:
            raise ValueError(f"llama.cpp cannot quantize this file: failed to determine layer for tensor {name}")
        if order < 0 or order >= model.n_layer_all:
            raise ValueError(f"llama.cpp cannot quantize this file: bad layer {order} for tensor {name}, "
                             f"must be in [0, {model.n_layer_all})")
        return order, model.n_layer_all
    return counted, model.n_layer_all


def _output_type(model: QuantModel, mix_default: str, ncols: int) -> str:
    if model.arch == "falcon" or ncols % BLOCK[mix_default] != 0:
        return "Q8_0"
    return "Q6_K" if mix_default != "Q8_0" else mix_default


def _attn_v(mix: str, model: QuantModel, state: _Counters, new: str) -> str:
    i, n = state.i_attention_wv, state.n_attention_wv
    if mix == "q3_k_m":
        new = "Q5_K" if i < 2 else "Q4_K"
    elif mix in ("q4_k_m", "q5_k_m") and use_more_bits(i, n):
        new = "Q6_K"
    elif mix == "q4_k_s" and i < 4:
        new = "Q5_K"
    if IS_70B.get(model.arch, lambda _: False)(model) and new in ("Q3_K", "Q4_K"):
        new = "Q5_K"  # 8 heads share each attn_v: more bits cost little
    if model.n_expert == 8:
        new = "Q8_0"
    state.i_attention_wv += 1
    return new


def _ffn_down(mix: str, model: QuantModel, state: _Counters, new: str, name: str) -> str:
    i, n = _layer_info(model, state.i_ffn_down, name)
    falcon = model.arch == "falcon"
    if mix == "q3_k_m":
        new = "Q5_K" if i < n // 16 else "Q4_K" if not falcon or use_more_bits(i, n) else "Q3_K"
    elif mix == "q4_k_m":
        if falcon:
            new = "Q6_K" if i < n // 16 else "Q5_K" if use_more_bits(i, n) else "Q4_K"
        elif use_more_bits(i, n):
            new = "Q6_K"
    elif mix == "q5_k_m" and use_more_bits(i, n):
        new = "Q6_K"
    elif mix == "q4_k_s" and not falcon and i < n // 8:
        new = "Q5_K"
    state.i_ffn_down += 1
    return new


def _attn_output(mix: str, model: QuantModel, new: str) -> str:
    if model.arch == "falcon":
        return new  # only Q3_K_L changes Falcon's
    if model.n_expert == 8:
        return "Q5_K" if mix in ("q3_k_m", "q4_k_s", "q4_k_m") else new
    return "Q4_K" if mix == "q3_k_m" else new


def _attn_k(model: QuantModel, new: str) -> str:
    return "Q8_0" if model.n_expert == 8 else new


def _counted(field: str) -> Callable[[str, QuantModel, _Counters, str, str], str]:
    """ffn_gate and ffn_up: no mix here changes them; llama.cpp still finds their layer (and fails as
    it fails) and counts them."""
    def rule(mix: str, model: QuantModel, state: _Counters, new: str, name: str) -> str:
        _layer_info(model, getattr(state, field), name)
        setattr(state, field, getattr(state, field) + 1)
        return new
    return rule


# llama_tensor_get_type_impl's branches for these mixes, by category (ATTENTION_QKV's own branch in
# llama.cpp is never reached: category_is_attn_v takes the fused projection first)
RULES: dict[str | None, Callable[[str, QuantModel, _Counters, str, str], str]] = {
    "attn_v": lambda mix, model, state, new, name: _attn_v(mix, model, state, new),
    "attn_k": lambda mix, model, state, new, name: _attn_k(model, new),
    "ffn_down": _ffn_down,
    "attn_output": lambda mix, model, state, new, name: _attn_output(mix, model, new),
    "ffn_gate": _counted("i_ffn_gate"),
    "ffn_up": _counted("i_ffn_up"),
}


def _fallback(target: str, ncols: int) -> str:
    """tensor_type_fallback: a type whose block does not divide the row length."""
    if ncols % BLOCK[target] == 0:
        return target
    chosen = FALLBACK.get(target, target)  # a 32-block type has no smaller block: F16 below
    return chosen if ncols % BLOCK[chosen] == 0 else "F16"


def _choose(mix: str, model: QuantModel, state: _Counters, name: str, shape: Sequence[int], base: str) -> str:
    """llama_tensor_get_type for one tensor of type `base` in the float file."""
    if not allows_quantization(model.arch, name, shape):
        return base
    new = MIXES[mix][1]
    ncols = shape[-1]
    cat = category(name)
    floor = Q8_0_AT_LEAST_IN.get(model.arch, ())
    if any(part in name for part in floor):
        return _fallback("Q8_0", ncols)
    if cat == "output" or (state.tied and cat == "token_embd"):
        new = _output_type(model, new, ncols)
    elif cat in RULES:
        new = RULES[cat](mix, model, state, new, name)
    return _fallback(new, ncols)


def pure_types(kind: str, model: QuantModel, tensors: Sequence[tuple[str, Sequence[int], str]]) -> list[str]:
    """`llama-quantize --pure` to `kind`: each tensor it may quantize (tensor_allows_quantization) in
    that type, or its fallback where the row length does not divide into its blocks; the others keep
    their type in the float file. The same tensors as `mix_types` takes."""
    return [_fallback(kind, shape[-1]) if allows_quantization(model.arch, name, shape) else base
            for name, shape, base in tensors]


def mix_types(mix: str, model: QuantModel, tensors: Sequence[tuple[str, Sequence[int], str]]) -> list[str]:
    """The GGML type name of each (GGUF name, shape in torch order, type in the float file) under the
    mix `mix` (a MIXES key), in the order given: what `llama-quantize` writes for each tensor of a
    float GGUF holding these tensors and `model`'s metadata. The tensors are every tensor of the
    file: which are present (output.weight: tied or not) and their order (llama.cpp's, by layer
    then name) decide the counters."""
    names = [name for name, _, _ in tensors]
    if len(set(names)) != len(names):
        raise ValueError("mix_types: a tensor name is listed twice")
    state = _Counters(n_attention_wv=sum(category(n) == "attn_v" for n in names), tied="output.weight" not in names)
    chosen: dict[str, str] = {}
    for name, shape, base in sorted(tensors, key=lambda t: _layer_order(t[0])):
        if base not in BLOCK or base in QUANTIZED:
            raise ValueError(f"mix_types: {name} is {base}; a mix quantizes a float file (F32, F16, BF16)")
        chosen[name] = _choose(mix, model, state, name, shape, base)
    return [chosen[name] for name in names]


__all__ = ["MIXES", "QuantModel", "allows_quantization", "category", "file_type", "mix_types", "pure_types",
           "use_more_bits"]
