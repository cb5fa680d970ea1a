"""GPTQ checkpoints (`quantization_config.quant_method = "gptq"`, as gptqmodel, AutoGPTQ and optimum
write them): each quantized linear `X` is `X.qweight`, `X.qzeros`, `X.scales` and `X.g_idx` in place
of `X.weight`.

    qweight  int32 [in * bits / 32, out]   rows packed: input row r*pf + j is field j of word r
    qzeros   int32 [groups, out * bits / 32]   columns packed the same way (pf = 32 // bits)
    scales   float16 (or bf16/f32) [groups, out]
    g_idx    int32 [in]   the group of each input row (arange // group_size unless desc_act)

Dequantized as gptqmodel's torch kernel does, the one transformers 5.25 runs on CPU through
gptqmodel and optimum (ModelCloud/GPTQModel, gptqmodel/nn_modules/qlinear/__init__.py,
`PackableQuantLinear.dequantize_weight` / `_dequantize_from_codes`; gptqmodel/nn_modules/qlinear/torch.py,
`TorchQuantLinear._dequantize_weight_cached_248`): fields unpacked to int8 (int16 at 8 bits), then
`scales[g_idx] * (weight - zeros[g_idx])`, one product in the scales' dtype; the weight is that
[in, out] matrix transposed. The v1 checkpoint format (`checkpoint_format: "gptq"`, the default, AutoGPTQ's)
stores every zero minus one; gptqmodel adds it back to the packed int32 words as it loads
(gptqmodel/utils/model.py, `convert_gptq_v1_to_v2_format_module`: `qzeros += 0b00010001...` at 4 bits,
`0b00000001...` at 8), a whole-word addition, so a field stored as all ones carries into the next one;
that is kept here (AutoGPTQ's qlinear_cuda_old adds one per field instead, `(zeros + 1) & maxq`, which
differs only where a zero is 0; gptqmodel's v2->v1 export, `convert_gptq_v2_to_v1_format_module`,
subtracts the same whole word, so its v1 files come back exactly). `gptq_v2` stores zeros as they are.

Handled: 4 and 8 bits, any group size dividing in_features (-1: one group per row), sym or not,
desc_act with any g_idx, v1 and v2 zeros, int32 words. Refused by name: 2/3-bit and planar formats
(marlin, bitblas, gptq_p...), per-module `dynamic` overrides, rotations, adapters, other pack dtypes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError
from .quantized_linear import (
    FLOATS,
    Headers,
    Part,
    check_options,
    check_parts,
    count,
    finite,
    flag,
    grouping,
    little_endian_bytes,
)

if TYPE_CHECKING:
    import torch

    from .quant_bands import Banded

METHOD = "gptq"
PARTS = ("qweight", "qzeros", "scales", "g_idx")
MARKERS = ("qweight",)  # the part whose presence makes X a quantized linear
# options whose value changes what the tensors mean, with the values handled
HANDLED: dict[str, tuple[Any, ...]] = {
    "quant_method": ("gptq",), "method": ("gptq",), "bits": (4, 8),
    "checkpoint_format": ("gptq", "gptq_v2"), "format": ("gptq", "gptq_v2"), "pack_dtype": ("int32",),
    "dynamic": (None, {}), "rotation": (None,), "adapter": (None,), "is_marlin_format": (False,),
}
FREE = ("group_size", "sym", "desc_act", "lm_head")  # checked for their type below
# calibration, kernel and bookkeeping settings (transformers' GPTQConfig, optimum, AutoGPTQ, gptqmodel):
# they never change what the stored tensors mean (which modules are quantized the tensors themselves say)
INERT = ("tokenizer", "dataset", "damp_percent", "damp_auto_increment", "true_sequential", "static_groups",
         "act_group_aware", "mse", "model_seqlen", "block_name_to_quantize", "module_name_preceding_first_block",
         "batch_size", "pad_token_id", "use_exllama", "disable_exllama", "exllama_config", "max_input_length",
         "cache_block_outputs", "modules_in_block_to_quantize", "use_cuda_fp16", "backend", "model_name_or_path",
         "model_file_base_name", "meta")
V1_ADD = {4: 0x11111111, 8: 0x01010101}  # gptqmodel's convert_gptq_v1_to_v2_format_module, int32 words


@dataclass(frozen=True)
class GptqRecipe:
    bits: int
    group_size: int  # -1: one group per row
    sym: bool
    desc_act: bool
    checkpoint_format: str  # "gptq" (v1: zeros stored minus one) or "gptq_v2"

    @property
    def pack(self) -> int:
        return 32 // self.bits

    def describe(self) -> str:
        act = ", desc_act" if self.desc_act else ""
        return f"GPTQ {self.bits}-bit, {grouping(self.group_size)}{act} ({self.checkpoint_format})"


def recipe(quant: Mapping[str, Any], config_file: Path | str) -> GptqRecipe:
    """config.json's `quantization_config` of a GPTQ checkpoint; an option or value not handled is
    refused by name."""
    return read(quant, f"{config_file}: quantization_config")


def read(quant: Mapping[str, Any], where: str) -> GptqRecipe:
    """`recipe`, `where` naming quantization_config in messages."""
    check_options(quant, where, HANDLED, (*FREE, *INERT))
    formats = {quant[k] for k in ("checkpoint_format", "format") if k in quant}
    if len(formats) > 1:
        raise InputError(f"{where}: checkpoint_format and format disagree ({sorted(formats)}); fix config.json")
    if "bits" not in quant:
        raise InputError(f"{where}.bits is missing; fix config.json")
    for key in ("sym", "desc_act", "lm_head"):
        if key in quant:
            flag(quant[key], f"{where}.{key}")
    return GptqRecipe(bits=quant["bits"], group_size=count(quant.get("group_size", 128), f"{where}.group_size", True),
                      sym=quant.get("sym", True), desc_act=quant.get("desc_act", False),
                      checkpoint_format=formats.pop() if formats else "gptq")


def module_of(name: str) -> str | None:
    """The linear `X` a tensor name `X.qweight` stands for, None for any other name."""
    module, _, suffix = name.rpartition(".")
    return module if suffix in MARKERS else None


def groups(recipe: GptqRecipe, in_features: int, module: str) -> int:
    group = in_features if recipe.group_size == -1 else recipe.group_size
    if in_features % group:
        raise InputError(f"quantized linear {module!r}: group_size {group} does not divide its {in_features} input "
                         "features; lmconvert reads whole groups only")
    return in_features // group


def parts(recipe: GptqRecipe, out_features: int, in_features: int, module: str = "?") -> list[Part]:
    """The tensors of one quantized linear of `out_features` x `in_features`, with their shapes."""
    pack = recipe.pack
    for what, size in (("input", in_features), ("output", out_features)):
        if size <= 0 or size % pack:
            raise InputError(f"quantized linear {module!r}: {size} {what} features is not a multiple of "
                             f"{pack} ({recipe.bits}-bit fields per int32 word); the checkpoint is inconsistent")
    n = groups(recipe, in_features, module)
    return [Part("qweight", (in_features // pack, out_features), ("I32",)),
            Part("qzeros", (n, out_features // pack), ("I32",)),
            Part("scales", (n, out_features), FLOATS),
            Part("g_idx", (in_features,), ("I32", "I64"), optional=not recipe.desc_act)]


def features(recipe: GptqRecipe, module: str, headers: Headers) -> tuple[int, int]:
    """(out_features, in_features) as the qweight header claims them."""
    name = f"{module}.{MARKERS[0]}"
    shape = headers.shape(name)
    if len(shape) != 2:
        raise InputError(f"{headers.where(name)}: tensor {name!r} has shape {list(shape)}, not a matrix; "
                         "the checkpoint is inconsistent")
    return shape[1], shape[0] * recipe.pack


def check_linear(recipe: GptqRecipe, module: str, headers: Headers,
                 out_features: int | None = None, in_features: int | None = None) -> tuple[int, int]:
    """That `module`'s tensors are one complete, consistent GPTQ linear (of the given features, or of
    those its qweight claims), from the headers alone; returns (out_features, in_features)."""
    if out_features is None or in_features is None:
        out_features, in_features = features(recipe, module, headers)
    check_parts(module, parts(recipe, out_features, in_features, module), headers, recipe.describe())
    return out_features, in_features


def _fields(words: torch.Tensor, bits: int) -> torch.Tensor:
    """Fields of int64-held 32-bit words, least significant first: [..., 32 // bits]."""
    import torch

    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    return (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)


def zeros(recipe: GptqRecipe, qzeros: torch.Tensor) -> torch.Tensor:
    """The zero points [groups, out] as int16: v1's stored-minus-one added back to the words as
    gptqmodel does (whole-word, 32-bit wrap-around)."""
    import torch

    words = qzeros.to(torch.int64) & 0xFFFFFFFF
    if recipe.checkpoint_format == "gptq":
        words = (words + V1_ADD[recipe.bits]) & 0xFFFFFFFF
    return _fields(words, recipe.bits).flatten(-2).to(torch.int16)


_TABLES: dict[tuple[int, Any], Any] = {}  # (bits, dtype) -> a byte's fields' values, as numpy ints of their bytes


def _lookup(bits: int, dtype: torch.dtype) -> Any:  # noqa: ANN401 - a numpy array
    """For each of the 256 bytes, the values of its fields (4 bits: low nibble first, the next input row
    second; 8 bits: the byte) in `dtype`, exactly (integers below 256), their bytes as one integer:
    one lookup per byte writes them where they go."""
    import numpy as np
    import torch

    key = (bits, dtype)
    if key not in _TABLES:
        byte = torch.arange(256)
        fields = torch.stack((byte & 15, byte >> 4), dim=-1) if bits == 4 else byte.unsqueeze(-1)
        values = fields.to(dtype).contiguous()
        ints = {2: np.int16, 4: np.int32, 8: np.int64}[values.element_size() * values.shape[1]]
        _TABLES[key] = values.view(torch.uint8).numpy().view(ints).reshape(256)
    return _TABLES[key]


def _codes_into(recipe: GptqRecipe, words: torch.Tensor, out: torch.Tensor) -> None:
    """The quantized values of transposed qweight words [rows, in / pf] into `out` [rows, in] (a float
    dtype), exactly: input row r*pf + j of a column is field j of its word r, so each output row's
    fields lie in order in its words' little-endian bytes, a byte's fields looked up at once."""
    import numpy as np
    import torch

    table = _lookup(recipe.bits, out.dtype)
    as_bytes = little_endian_bytes(words).reshape(words.shape[0], -1).numpy()
    into = out.view({np.int16: torch.int16, np.int32: torch.int32, np.int64: torch.int64}[table.dtype.type]).numpy()
    np.take(table, as_bytes, out=into, mode="clip")  # every byte is an index: clip never clips (and needs no buffer)


CHUNK = 1 << 20  # values a step: the temporaries stay small and are reused, never faulted in


def dequantize(recipe: GptqRecipe, module: str, tensors: Mapping[str, torch.Tensor], where: str,
               dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """`module`'s float weight [out, in] from its parts (by suffix; shapes already checked by
    `check_linear`), as gptqmodel's torch kernel computes it: in the scales' dtype, or with the
    scales cast to `dtype` first where the loader casts them (a model loaded in that dtype). `out`,
    a contiguous tensor of that shape and dtype, receives it (a buffer reused from one linear to the
    next spares the page faults of fresh memory). Done a few output rows at a time (`banded`)."""
    import torch

    rows = banded(recipe, module, tensors, where, dtype)
    weight = torch.empty(rows.rows, rows.cols, dtype=rows.native) if out is None else out
    step = max(1, CHUNK // rows.cols)
    for start in range(0, rows.rows, step):
        rows.fill(start, min(start + step, rows.rows), weight[start:start + step])
    return weight


def banded(recipe: GptqRecipe, module: str, tensors: Mapping[str, torch.Tensor], where: str,
           dtype: torch.dtype | None = None) -> Banded:
    """`dequantize` as bands of output rows (quant_bands.py), each computed on its own in the scales'
    dtype (or `dtype`, the scales cast first).

    The reference's integer difference `weight - zeros[g_idx]` times the scale is one rounding of an
    exact product; here the codes and zeros are in the scales' dtype first (exactly: integers below
    256, the codes looked up a byte at a time) and subtracted there (exactly), then multiplied: the
    same rounding, so the same bits."""
    import torch

    from .quant_bands import Banded

    qweight, scales = tensors["qweight"], tensors["scales"]
    finite(scales, f"{module}.scales", where)
    in_features, out_features = qweight.shape[0] * recipe.pack, qweight.shape[1]
    n = scales.shape[0]
    group = in_features // n
    g_idx = tensors.get("g_idx")
    if g_idx is not None:
        g_idx = g_idx.to(torch.int64)
        low, high = int(g_idx.min()), int(g_idx.max())
        if low < 0 or high >= n:
            raise InputError(f"{where}: tensor {module + '.g_idx'!r} holds groups from {low} to {high}, outside "
                             f"the {n} groups of its scales; the checkpoint is inconsistent")
        if torch.equal(g_idx, torch.arange(in_features, dtype=torch.int64) // group):
            g_idx = None  # rows in group order: one value per group, broadcast
    scale = (scales if dtype is None else scales.to(dtype)).t().contiguous()  # [out, groups]
    zero = zeros(recipe, tensors["qzeros"]).t().to(scale.dtype).contiguous()
    words = qweight.t().contiguous()  # [out, in / pf]: an eighth (a quarter) of the values' bytes

    def fill(start: int, stop: int, part: torch.Tensor) -> None:
        span = slice(start, stop)
        _codes_into(recipe, words[span], part)
        if g_idx is None:
            part.view(-1, n, group).sub_(zero[span].unsqueeze(-1)).mul_(scale[span].unsqueeze(-1))
        else:
            index = g_idx.expand(part.shape[0], in_features)  # gather: far faster than index_select on dim 1
            part.sub_(torch.gather(zero[span], 1, index)).mul_(torch.gather(scale[span], 1, index))

    return Banded(out_features, in_features, scale.dtype, fill)
