"""lmconvert's C kernels (_ggml.c: GGUF-in dequantization, llama.cpp's K-quant encoders), loaded
in one place so that a checkout whose extension was never built says so in one line."""

from __future__ import annotations

try:
    from . import _ggml
except ImportError as e:  # pragma: no cover - a built install always has it
    raise ImportError(f"lmconvert.formats._ggml, the C kernels of lmconvert/formats/_ggml.c, is not built ({e}); "
                      "run `pip install -e .` in the checkout (it needs a C compiler such as gcc)") from None

dequantize = _ggml.dequantize
quantize = _ggml.quantize

__all__ = ["dequantize", "quantize"]
