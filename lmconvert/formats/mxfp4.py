"""MXFP4 as gpt-oss ships its experts (`quant_method: "mxfp4"`), a scheme of `quantized.py`: no
`X` is stored, only `X_blocks` (uint8 [experts, rows, groups, 16]: 32 OCP MX E2M1 values per group,
two per byte, the low nibble first) and `X_scales` (uint8 [experts, rows, groups]: each group's
E8M0 exponent, biased by 127).

It dequantizes as transformers 5.25 does on CPU (`_convert_moe_packed_tensors` in
transformers/integrations/mxfp4.py, which `Mxfp4Config(dequantize=True)` runs): each nibble through
the E2M1 table, `ldexp` by its group's exponent, the groups of a row joined, then rows and columns
swapped ([experts, groups * 32, rows], the layout of transformers' fused experts: the scheme's
`transposed`, which `quantized.py` applies). Every value is
exact in float32 and in bfloat16 (two significant bits times a power of two), so the float32 result
cast to the model's dtype is transformers' own. An exponent byte 255 (E8M0's NaN) is refused.

Each part holds one row per row of the weight (its groups run along the inputs), so a family's
table that moves rows (gpt-oss's experts split out of the fused tensor, gate and up rows apart)
moves the parts with them, every group whole: a canonical checkpoint keeps each expert's
`X.weight_blocks` [out, in / 32, 16] and `X.weight_scales` [out, in / 32], the nn.Linear weight
[out, in] its parts dequantize to without any transpose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .dtypes import DTYPES
from .errors import InputError
from .quant_scheme import Recipe, Scheme
from .quantized_linear import check_options
from .source import TensorReader, dtype_name

if TYPE_CHECKING:
    import torch

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
GROUP_BYTES = 16  # 32 E2M1 values per shared exponent
IGNORED = ("quant_method", "modules_to_not_convert", "dequantize")


def check(source: TensorReader, weight: str, parts: dict[str, str], settings: dict[str, Any]) -> tuple[int, ...]:
    blocks, scales = parts["blocks"], parts["scales"]
    for part in (blocks, scales):
        if dtype_name(source, part) != "U8":
            raise InputError(f"{source.where(part)}: tensor {part!r} is {DTYPES[dtype_name(source, part)].torch_name};"
                             " MXFP4 blocks and scales are uint8; the checkpoint is inconsistent")
    shape, scale_shape = source.shape(blocks), source.shape(scales)
    if len(shape) < 3 or shape[-1] != GROUP_BYTES:
        raise InputError(f"{source.where(blocks)}: tensor {blocks!r} has shape {list(shape)}, not [..., rows, "
                         f"groups, {GROUP_BYTES}] (32 four-bit values per group); the checkpoint is inconsistent")
    if scale_shape != shape[:-1]:
        raise InputError(f"{source.where(scales)}: tensor {scales!r} has shape {list(scale_shape)}, but {blocks!r} "
                         f"{list(shape)} needs one exponent per group: {list(shape[:-1])}; the checkpoint is "
                         "inconsistent")
    return (*shape[:-2], shape[-2] * 2 * GROUP_BYTES)


def dequantize(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """transformers' `_convert_moe_packed_tensors` in float32, in one chunk, before its last swap
    of rows and columns: [..., rows, groups * 32]."""
    import torch

    *rows, groups, size = blocks.shape
    lut = torch.tensor(E2M1, dtype=torch.float32)
    packed = blocks.reshape(-1, size)
    out = torch.empty(packed.shape[0], size * 2, dtype=torch.float32)
    out[:, 0::2] = lut[(packed & 0x0F).to(torch.int)]
    out[:, 1::2] = lut[(packed >> 4).to(torch.int)]
    torch.ldexp(out, scales.reshape(-1, 1).to(torch.int32) - 127, out=out)
    return out.reshape(*rows, groups * size * 2)


def usable(scales: torch.Tensor) -> bool:
    return not bool((scales == 255).any())


MXFP4 = Scheme("mxfp4", parts={"blocks": "_blocks", "scales": "_scales"}, anchor="scales", check=check,
               dequantize=lambda t, *_: dequantize(t["blocks"], t["scales"]),
               stored_type=lambda _: "MXFP4 (E2M1, E8M0 per 32)", finite={"scales": usable},
               quantized_dtypes=(), own_dims={"blocks": 2, "scales": 1}, transposed=True)


def read_mxfp4(where: str, quant: dict[str, Any]) -> Recipe:
    check_options(quant, where, {}, IGNORED)
    return Recipe("mxfp4", MXFP4, {}, quant)


def ggml_blocks(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Blocks [..., rows, groups, 16] and scales [..., rows, groups] as GGML's `block_mxfp4` rows,
    uint8 [..., rows, groups * 17]: per group its E8M0 byte, then 16 bytes whose byte j holds value
    j in its low nibble and value j + 16 in its high one (the source holds values 2j and 2j + 1).
    Only bits move: GGML's E2M1 table is the same codes doubled and its scale the same exponent
    halved (`ggml_e8m0_to_fp32_half`), as llama.cpp's converter repacks gpt-oss
    (`ModelBase.repack_mxfp4_blocks` in convert_hf_to_gguf.py's conversion/base.py)."""
    import torch

    values = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).reshape(*blocks.shape[:-1], 2 * GROUP_BYTES)
    codes = values[..., :GROUP_BYTES] | (values[..., GROUP_BYTES:] << 4)
    return torch.cat((scales.unsqueeze(-1), codes), dim=-1).reshape(*blocks.shape[:-2], -1)
