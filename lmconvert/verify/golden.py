"""Golden files: transformers' outputs on one token batch, stored as safetensors, so that parity is
regression-tested (in CI, say) without transformers installed.

Tensors: `ids`, `logits` (transformers in the compute dtype), `points.<name>` (the hidden states
after the embedding, each attention and MLP sublayer (`attn.o`, `mlp.down`), each block and the
final norm), `generation.sequences` / `generation.logits` (greedy decoding); in bf16/fp16 also
`logits.fp32`, and `points.*` are then the fp32 run's. Metadata (strings, JSON where structured):
format, format_version, dtype, device, tolerance, versions, own_errors and reference_error
(transformers' own errors in low precision), prompt_tokens, info.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from lmconvert.formats.errors import InputError

from .expected import Expected
from .tolerance import Tolerance
from .trace import layer_of, sublayer_of

FORMAT = "lmconvert-golden"
FORMAT_VERSION = 1
KEPT_SUBLAYERS = ("output", "attn.o", "mlp.down")  # residual-width points: enough to name the layer and sublayer


def kept(point: str) -> bool:
    """The points a golden file keeps: every residual-stream-wide one, not q/k/v or the MLP's
    wide projections, which would multiply its size for little more precision in localization."""
    return layer_of(point) is None or sublayer_of(point) in KEPT_SUBLAYERS


def save(expected: Expected, file: Path) -> None:
    tensors = {"ids": expected.ids, "logits": expected.logits}
    tensors.update({f"points.{name}": t for name, t in expected.points.items() if kept(name)})
    if expected.exact_logits is not None:
        tensors["logits.fp32"] = expected.exact_logits
    if expected.generation is not None:
        tensors["generation.sequences"], tensors["generation.logits"] = expected.generation
    metadata = {
        "format": FORMAT, "format_version": str(FORMAT_VERSION), "dtype": expected.dtype, "device": expected.device,
        "tolerance": json.dumps(expected.tolerance.to_dict()), "versions": json.dumps(expected.info.get("versions")),
        "own_errors": json.dumps({k: v for k, v in (expected.own or {}).items() if kept(k)}),
        "reference_error": json.dumps(expected.reference_error), "prompt_tokens": str(expected.prompt_tokens),
        "info": json.dumps(expected.info),
    }
    file.parent.mkdir(parents=True, exist_ok=True)
    try:
        save_file({k: t.detach().cpu().contiguous().clone() for k, t in tensors.items()}, str(file), metadata)
    except OSError as exc:
        raise InputError(f"--save-golden {file}: cannot write ({exc.strerror or exc}); check the path") from None


def load(file: Path) -> Expected:
    """The Expected a golden file holds; one-line errors for anything that is not one."""
    try:
        with safe_open(str(file), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError) as exc:
        reason = " ".join(str(exc).split())
        raise InputError(f"--golden {file}: not a readable safetensors file ({reason}); record one with "
                         "--save-golden") from None
    if metadata.get("format") != FORMAT or "ids" not in tensors or "logits" not in tensors:
        raise InputError(f"--golden {file}: not an lmconvert golden file; record one with --save-golden")
    if metadata.get("format_version") != str(FORMAT_VERSION):
        raise InputError(f"--golden {file}: format_version {metadata.get('format_version')!r} is not "
                         f"{FORMAT_VERSION}; record it again with this lmconvert")
    try:
        tolerance = Tolerance.from_dict(json.loads(metadata["tolerance"]))
        own = {k: tuple(v) for k, v in json.loads(metadata.get("own_errors", "{}")).items()}
        info = json.loads(metadata.get("info", "{}"))
        reference_error = json.loads(metadata.get("reference_error", "null"))
        prompt_tokens = int(metadata.get("prompt_tokens", "0"))
        dtype = metadata["dtype"]
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype {dtype!r}")
    except (KeyError, ValueError, TypeError) as exc:
        raise InputError(f"--golden {file}: its metadata is damaged ({exc}); record it again") from None
    generation = None
    if "generation.sequences" in tensors and "generation.logits" in tensors:
        generation = (tensors["generation.sequences"], tensors["generation.logits"])
    points = {name.removeprefix("points."): t for name, t in tensors.items() if name.startswith("points.")}
    if not tolerance.exact and ("logits.fp32" not in tensors or reference_error is None):
        raise InputError(f"--golden {file}: a {tolerance.dtype} golden file needs the fp32 reference logits and "
                         "transformers' own error; record it again")
    return Expected(ids=tensors["ids"], logits=tensors["logits"], points=points, dtype=dtype,
                    device=metadata.get("device", "cpu"), tolerance=tolerance, exact_logits=tensors.get("logits.fp32"),
                    reference_error=reference_error, own=own or None, generation=generation,
                    prompt_tokens=prompt_tokens, info=info)
