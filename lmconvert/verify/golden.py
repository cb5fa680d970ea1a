"""Golden files: transformers' outputs on one token batch, stored as safetensors, so that parity is
regression-tested (in CI, say) without transformers installed.

Tensors: `ids`, `logits` (transformers in the compute dtype), `points.<name>` (the hidden states
after the embedding, each attention and MLP sublayer (`attn.o`, `mlp.down`), each block and the
final norm), `generation.sequences` / `generation.logits` (greedy decoding); in bf16/fp16 also
`logits.fp32`, and `points.*` are then the fp32 run's; for left-padded rows (`--padded`),
`attention_mask` (B, T) of 1 and 0. Metadata (strings, JSON where structured):
format, format_version, dtype, device, tolerance, versions, own_errors and reference_error
(transformers' own errors in low precision), prompt_tokens, info.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from lmconvert.formats import schema
from lmconvert.formats.atomic import atomic_file
from lmconvert.formats.dtypes import CASTS
from lmconvert.formats.errors import InputError
from lmconvert.formats.jsonfile import parse_json

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


def save(expected: Expected, file: Path, force: bool = False) -> None:
    """Write the golden file atomically (`formats.atomic`): a full disk leaves nothing behind, and
    an existing file is replaced only with `force`, and only if it is a golden file."""
    tensors = {"ids": expected.ids, "logits": expected.logits}
    tensors.update({f"points.{name}": t for name, t in expected.points.items() if kept(name)})
    if expected.exact_logits is not None:
        tensors["logits.fp32"] = expected.exact_logits
    if expected.attention_mask is not None:
        tensors["attention_mask"] = expected.attention_mask
    if expected.generation is not None:
        tensors["generation.sequences"], tensors["generation.logits"] = expected.generation
    metadata = {
        "format": FORMAT, "format_version": str(FORMAT_VERSION), "dtype": expected.dtype, "device": expected.device,
        "tolerance": json.dumps(expected.tolerance.to_dict()), "versions": json.dumps(expected.info.get("versions")),
        "own_errors": json.dumps({k: v for k, v in (expected.own or {}).items() if kept(k)}),
        "reference_error": json.dumps(expected.reference_error), "prompt_tokens": str(expected.prompt_tokens),
        "info": json.dumps(expected.info),
    }
    with atomic_file(file, force, is_golden, f"--save-golden {file}") as tmp:
        try:
            save_file({k: t.detach().cpu().contiguous().clone() for k, t in tensors.items()}, str(tmp), metadata)
        except SafetensorError as exc:  # safetensors reports a failed write (a full disk) as its own error
            raise _os_error(exc) from exc


def _os_error(exc: SafetensorError) -> BaseException:
    """The OSError behind safetensors' "I/O error: ... (os error N)"; anything else stays a bug."""
    text = str(exc)
    code = re.search(r"\(os error (\d+)\)", text)
    if code:
        return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
    return OSError(errno.EIO, text) if "I/O error" in text else exc


def is_golden(file: Path) -> bool:
    """Whether `file` is a golden file lmconvert wrote (so --force may replace it)."""
    try:
        with safe_open(str(file), framework="pt") as f:
            return (f.metadata() or {}).get("format") == FORMAT
    except (SafetensorError, OSError):
        return False


# The metadata load() reads back, JSON parts decoded: what save() writes, checked before use.
JSON_PARTS = ("tolerance", "versions", "own_errors", "reference_error", "prompt_tokens", "info")
METADATA = schema.Object(
    required={"dtype": schema.String(CASTS),
              "tolerance": schema.Object(required={"dtype": schema.String(CASTS)},
                                         optional={k: schema.Nullable(schema.POSITIVE)
                                                   for k in ("logits_max_abs", "point_rtol", "faithfulness")})},
    optional={"device": schema.String(), "versions": schema.Nullable(schema.MapOf(schema.Nullable(schema.String()))),
              "own_errors": schema.MapOf(schema.Array(schema.Number(minimum=0), min_items=2, max_items=2)),
              "reference_error": schema.Nullable(schema.Number(minimum=0)), "prompt_tokens": schema.COUNT,
              "info": schema.MapOf()})


def _metadata(file: Path, metadata: dict[str, str]) -> dict[str, Any]:
    decoded: dict[str, Any] = {k: v for k, v in metadata.items() if k not in JSON_PARTS}
    for key in JSON_PARTS:
        if key in metadata:
            decoded[key] = parse_json(metadata[key], f"--golden {file}: metadata {key!r}")
    schema.validate(decoded, METADATA, f"--golden {file}: metadata", "record it again")
    tolerance = decoded["tolerance"]
    needs = ("logits_max_abs", "point_rtol") if decoded["dtype"] == "float32" else ("faithfulness",)
    if tolerance["dtype"] != decoded["dtype"] or any(tolerance.get(k) is None for k in needs) or (
            decoded["dtype"] == "float32" and tolerance.get("faithfulness") is not None):
        raise InputError(f"--golden {file}: metadata: tolerance {tolerance} does not fit dtype {decoded['dtype']}; "
                         "record it again")
    return decoded


def _check_tensors(file: Path, tensors: dict[str, torch.Tensor], prompt_tokens: int) -> None:
    """The shapes save() writes: ids (B, T) of token ids, logits (B, T, vocab), greedy sequences
    (1, prompt + new) that start with the first row's prompt, and their step logits (1, new, vocab)."""
    def bad(what: str) -> InputError:
        return InputError(f"--golden {file}: {what}; record it again")

    ids, logits = tensors["ids"], tensors["logits"]
    for name, t in tensors.items():
        integer = name in ("ids", "generation.sequences", "attention_mask")
        if t.dtype.is_floating_point == integer or t.dtype == torch.bool:
            raise bad(f"tensor {name!r} is {str(t.dtype).removeprefix('torch.')}, not "
                      f"{'integer token ids' if integer else 'floating point'}")
    if ids.dim() != 2 or 0 in ids.shape:
        raise bad(f"ids has shape {list(ids.shape)}, not (batch, tokens)")
    for name in ("ids", "generation.sequences"):
        if name in tensors and tensors[name].numel() and int(tensors[name].min()) < 0:
            raise bad(f"{name} holds the negative token id {int(tensors[name].min())}")
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(ids.shape) or logits.shape[2] == 0:
        raise bad(f"logits has shape {list(logits.shape)}, not (batch, tokens, vocab) for ids {list(ids.shape)}")
    mask = tensors.get("attention_mask")
    if mask is not None and (mask.shape != ids.shape or not bool(((mask == 0) | (mask == 1)).all())):
        raise bad(f"attention_mask of shape {list(mask.shape)} is not (batch, tokens) of 1 and 0 for ids "
                  f"{list(ids.shape)}")
    if "logits.fp32" in tensors and tensors["logits.fp32"].shape != logits.shape:
        raise bad(f"logits.fp32 has shape {list(tensors['logits.fp32'].shape)}, not logits' {list(logits.shape)}")
    if ("generation.sequences" in tensors) != ("generation.logits" in tensors):
        raise bad("it holds one of generation.sequences and generation.logits without the other")
    if "generation.sequences" in tensors:
        sequences, steps = tensors["generation.sequences"], tensors["generation.logits"]
        new = sequences.shape[-1] - prompt_tokens if sequences.dim() == 2 else -1
        if not 0 < prompt_tokens <= ids.shape[1] or new < 0 or sequences.shape[0] != 1 \
                or not torch.equal(sequences[:, :prompt_tokens], ids[:1, :prompt_tokens]):
            raise bad(f"generation.sequences {list(sequences.shape)} is not the first row's {prompt_tokens}-token "
                      "prompt and its continuation")
        if tuple(steps.shape) != (1, new, logits.shape[2]):
            raise bad(f"generation.logits has shape {list(steps.shape)}, not [1, {new}, {logits.shape[2]}]")


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
    meta = _metadata(file, metadata)
    prompt_tokens = meta.get("prompt_tokens", 0)
    _check_tensors(file, tensors, prompt_tokens)
    tolerance = Tolerance.from_dict(meta["tolerance"])
    reference_error = meta.get("reference_error")
    generation = None
    if "generation.sequences" in tensors:
        generation = (tensors["generation.sequences"], tensors["generation.logits"])
    points = {name.removeprefix("points."): t for name, t in tensors.items() if name.startswith("points.")}
    if not tolerance.exact and ("logits.fp32" not in tensors or reference_error is None):
        raise InputError(f"--golden {file}: a {tolerance.dtype} golden file needs the fp32 reference logits and "
                         "transformers' own error; record it again")
    own = {k: (float(v[0]), float(v[1])) for k, v in meta.get("own_errors", {}).items()}
    return Expected(ids=tensors["ids"], logits=tensors["logits"], points=points, dtype=meta["dtype"],
                    device=meta.get("device", "cpu"), tolerance=tolerance, exact_logits=tensors.get("logits.fp32"),
                    reference_error=reference_error, own=own or None, generation=generation,
                    prompt_tokens=prompt_tokens, info=meta.get("info", {}),
                    attention_mask=tensors.get("attention_mask"))
