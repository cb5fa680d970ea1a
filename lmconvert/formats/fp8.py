"""Block-wise FP8 checkpoints as the Hub ships them (DeepSeek-V3, Qwen3's -FP8 repos): e4m3 weights
`X.weight` beside a `X.weight_scale_inv` per block of `weight_block_size` (config.json's
`quantization_config`, `quant_method: "fp8"`).

The source's tensors are seen through `Fp8Tensors`: each (weight, weight_scale_inv) pair is one
float32 tensor under the weight's name, so the family tables map names as for any float checkpoint
and never see a scale. It is dequantized as transformers 5.25 dequantizes on CPU
(`Fp8Dequantize._dequantize_one` in transformers/integrations/finegrained_fp8.py): both sides
to float32, the weight times its block's scale in float32; a --dtype cast comes after, as
transformers casts the product to the model's dtype. Everything the headers can show is checked
when the checkpoint is opened, before a tensor is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .dtypes import DTYPES
from .errors import InputError
from .source import TensorReader, dtype_name

if TYPE_CHECKING:
    import torch

SCALE = "_scale_inv"  # X.weight -> X.weight_scale_inv
SCALE_DTYPES = ("F32", "BF16")  # DeepSeek-V3 ships float32 scales, some requantized repos bfloat16
# quantization_config's options: the values read here; `dequantize` and the skip list are load-time
# settings of transformers (a module it skips simply has no scale beside its weight)
OPTIONS: dict[str, tuple[Any, ...]] = {
    "fmt": ("e4m3",), "activation_scheme": ("dynamic",), "scale_fmt": ("float",), "expert_dtype": ("fp8",),
    "modules_to_convert": (None, []),
}
IGNORED = ("quant_method", "weight_block_size", "dequantize", "modules_to_not_convert", "ignored_layers")
# methods a family's config table reads itself (mappings/families/bitnet.py refuses its own by name)
FAMILY_READS = ("bitnet",)


def recipe(config: dict[str, Any], config_file: Path) -> tuple[int, int] | None:
    """The block size of a block-wise FP8 checkpoint, None for an unquantized one; any other
    quantization (or an FP8 option not handled) is refused by name."""
    quant = config.get("quantization_config")
    if quant is None:
        return None
    where = f"{config_file}: quantization_config"
    if not isinstance(quant, dict):
        raise InputError(f"{where} is {type(quant).__name__}, not an object; fix config.json")
    method = quant.get("quant_method")
    if method in FAMILY_READS:
        return None
    if method != "fp8":
        raise InputError(f"{where}.quant_method {method!r} is not read (lmconvert reads block-wise 'fp8' only); "
                         "convert an unquantized copy of the model")
    for key, value in quant.items():
        if key not in OPTIONS and key not in IGNORED:
            raise InputError(f"{where}.{key} is an option lmconvert does not handle; convert an unquantized copy")
        if key in OPTIONS and value not in OPTIONS[key]:
            handled = ", ".join(repr(v) for v in OPTIONS[key])
            raise InputError(f"{where}.{key} {value!r} is not handled (only {handled}); convert an unquantized copy")
    block = quant.get("weight_block_size")
    if block is None:
        raise InputError(f"{where}.weight_block_size is null (per-tensor FP8), which is not handled yet; "
                         "only block-wise FP8 is read")
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise InputError(f"{where}.weight_block_size {block!r} is not two positive integers; fix config.json")
    return block[0], block[1]


class Fp8Tensors:
    """A safetensors directory's tensors with each FP8 (weight, weight_scale_inv) pair read as one
    dequantized float32 tensor under the weight's name; the scales themselves are not listed."""

    def __init__(self, source: TensorReader, block: tuple[int, int]) -> None:
        self.source = source
        self.block = block
        names = source.names()
        present = set(names)
        self.scales: dict[str, str] = {}  # weight -> its scale
        for name in names:
            if name.endswith(SCALE):
                weight = name.removesuffix(SCALE)
                if not weight.endswith(".weight"):  # transformers 5's fused experts, requantized on save
                    raise InputError(f"{source.where(name)}: tensor {name!r} scales {weight!r}, which is not a "
                                     "module's .weight: transformers 5.25 dequantizes only X.weight / "
                                     "X.weight_scale_inv pairs (the Hub's per-expert layout), so this is not read")
                if weight not in present:
                    raise InputError(f"{source.where(name)}: tensor {name!r} has no {weight!r} beside it to scale; "
                                     "the checkpoint is incomplete")
                self._check_pair(weight, name)
                self.scales[weight] = name
            elif dtype_name(source, name) == "F8_E4M3" and name + SCALE not in present:
                raise InputError(f"{source.where(name)}: tensor {name!r} is float8_e4m3fn but has no "
                                 f"{name + SCALE!r} beside it; the checkpoint is incomplete")
        self._names = [n for n in names if not n.endswith(SCALE) or n.removesuffix(SCALE) not in self.scales]

    def _check_pair(self, weight: str, scale: str) -> None:
        """The pair as its headers describe it: an e4m3 matrix (or a stack of them) whose blocks the
        scale covers one to one."""
        source, (rows_block, cols_block) = self.source, self.block
        where = source.where(weight)
        kind, scale_kind = dtype_name(source, weight), dtype_name(source, scale)
        if kind != "F8_E4M3":
            raise InputError(f"{where}: tensor {weight!r} has a {scale!r} but is {DTYPES[kind].torch_name}, not "
                             "float8_e4m3fn; the checkpoint is inconsistent")
        if scale_kind not in SCALE_DTYPES:
            raise InputError(f"{source.where(scale)}: tensor {scale!r} is {DTYPES[scale_kind].torch_name}; "
                             "FP8 block scales are read as float32 or bfloat16 only")
        shape, scale_shape = source.shape(weight), source.shape(scale)
        if len(shape) < 2:
            raise InputError(f"{where}: tensor {weight!r} has shape {list(shape)}; block-wise FP8 weights are "
                             "matrices; the checkpoint is inconsistent")
        rows, cols = shape[-2:]
        if rows % rows_block or cols % cols_block:
            raise InputError(f"{where}: tensor {weight!r} has shape {list(shape)}, which weight_block_size "
                             f"[{rows_block}, {cols_block}] does not divide; transformers cannot dequantize it either")
        want = (*shape[:-2], rows // rows_block, cols // cols_block)
        if scale_shape != want:
            raise InputError(f"{source.where(scale)}: tensor {scale!r} has shape {list(scale_shape)}, but {weight!r} "
                             f"{list(shape)} in blocks of [{rows_block}, {cols_block}] needs {list(want)}; "
                             "the checkpoint is inconsistent")

    def names(self) -> list[str]:
        return self._names

    def shape(self, name: str) -> tuple[int, ...]:
        return self.source.shape(name)

    def where(self, name: str) -> Path:
        return self.source.where(name)

    def dtype_name(self, name: str) -> str:
        """A pair is read as float32, the dtype transformers multiplies in."""
        return "F32" if name in self.scales else dtype_name(self.source, name)

    def stored_type(self, name: str) -> str:
        if name in self.scales:
            return f"float8_e4m3fn, {self.block[0]}x{self.block[1]} blocks"
        return DTYPES[dtype_name(self.source, name)].torch_name

    def raw_location(self, name: str) -> tuple[Path, int, int] | None:
        """A pair is never a byte copy."""
        located = getattr(self.source, "raw_location", None)
        return None if name in self.scales or located is None else located(name)

    def position(self, name: str) -> tuple[Path, int] | None:
        """Where the tensor's bytes start, for the writer's order (a pair's: its weight's)."""
        located = getattr(self.source, "raw_location", None)
        if located is None:
            return None
        file, start, _ = located(name)
        return file, start

    def get(self, name: str) -> torch.Tensor:
        scale = self.scales.get(name)
        if scale is None:
            return self.source.get(name)
        return dequantize(self.source.get(name), self._scale(scale))

    def _scale(self, name: str) -> torch.Tensor:
        import torch

        scales = self.source.get(name)
        if not bool(torch.isfinite(scales).all()):
            raise InputError(f"{self.source.where(name)}: tensor {name!r} holds NaN or Inf scales; "
                             "re-download or re-quantize the checkpoint")
        return scales

    def close(self) -> None:
        self.source.close()


def dequantize(quantized: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """transformers' `Fp8Dequantize._dequantize_one` for e4m3 weights, its output dtype float32:
    the block size is the weight's over the scale grid, both sides float32, one float32 product
    (made in place: the same products, one weight-sized float32 tensor fewer)."""
    import torch

    rows, cols = quantized.shape[-2:]
    scale_rows, scale_cols = scales.shape[-2:]
    q = quantized.to(torch.float32).reshape(-1, scale_rows, rows // scale_rows, scale_cols, cols // scale_cols)
    s = scales.to(torch.float32).reshape(-1, scale_rows, scale_cols).unsqueeze(-1).unsqueeze(2)
    return q.mul_(s).reshape(quantized.shape)


def dequantized(config: dict[str, Any], config_file: Path,
                tensors: TensorReader) -> tuple[TensorReader, dict[str, Any]]:
    """An HF checkpoint's tensors as the family tables read them, and what lmconvert.json's "source"
    records of its quantization: a block-wise FP8 one's pairs as float tensors (`Fp8Tensors`)."""
    block = recipe(config, config_file)
    if block is None:
        return tensors, {}
    info = {"quantization": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(block),
                             "dequantized": "float32 product of weight and scale, as transformers' Fp8Dequantize"}}
    return Fp8Tensors(tensors, block), info
