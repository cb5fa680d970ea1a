"""`lmconvert verify`: run our decoder and transformers on the same tokens and compare, from the
logits down to every layer and sublayer, and through greedy generation.

fp32 must agree element by element. In bf16 and fp16 both sides round, so agreement between
them is not the criterion; faithfulness is: our error against transformers run in fp32 may be at
most 1.25x transformers' own error in that dtype, for the logits and at every point.

The transformers side is recorded first (an `Expected`), then our side is held to it; a golden
file is the same record stored on disk, so `--golden` runs our side alone, without transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lmconvert.arch import ArchConfig
from lmconvert.formats.checkpoint import Checkpoint, open_checkpoint, opened
from lmconvert.formats.dtypes import torch_dtype
from lmconvert.formats.errors import InputError
from lmconvert.formats.jsonfile import read_json_object
from lmconvert.formats.source import Loadable, directory_tokenizer
from lmconvert.mappings import MappingError, family_named
from lmconvert.runtime.load import load_checkpoint
from lmconvert.runtime.streamed import streamed

from . import golden as golden_file
from .agreement import Steppable, compare_generation, greedy, logit_stats
from .budget import check_request
from .dequantized import materialized
from .expected import Expected, record, versions
from .layer_progress import Stages, counting_layers
from .localize import compare_points
from .outputs import check_outputs
from .prompts import token_batch
from .report import Report
from .request import Request
from .trace import Trace, our_trace

REFERENCE_JSON = ("config.json", "generation_config.json")  # what transformers reads beside the weights


def reference_side(checkpoint: Checkpoint, reference: Path | None) -> tuple[Loadable, str]:
    """How transformers loads the reference, and the family whose table names its modules: the
    checkpoint itself (for a canonical one, its recorded source), or --reference."""
    if reference is None:
        where, family = checkpoint.reference(), checkpoint.family.name
    else:
        try:
            with open_checkpoint(reference) as other:
                where, family = other.reference(), other.family.name
        except (InputError, MappingError):  # transformers may load what we cannot map: name it by ours
            where, family = Loadable(reference), checkpoint.family.name
        if where.refusal is not None:
            where = replace(where, refusal=f"--reference {where.refusal}")
    if where.refusal is not None:
        raise InputError(where.refusal)
    for name in REFERENCE_JSON:  # through our reader first: transformers' raises RecursionError on deep nesting
        if where.where is not None and (where.where / name).is_file():
            read_json_object(where.where / name, name)
    return where, family


def default_seq_len(arch: ArchConfig) -> int:
    window = arch.sliding_window or 0
    return min(arch.max_positions, max(64, min(2 * window + 1, 512)))


@torch.no_grad()
def run_ours(checkpoint: Checkpoint, expected: Expected, device: str, stream: bool,
             stages: Stages | None = None) -> tuple[Trace, tuple[torch.Tensor, torch.Tensor] | None]:
    """Our trace on the expected token batch, and our greedy generation from the same prompt."""
    dtype = torch_dtype(expected.dtype)
    context = streamed(checkpoint, dtype, device) if stream else nullcontext(
        load_checkpoint(checkpoint, dtype=dtype, device=device, attention="eager"))
    with context as model:
        return run_model(model, model.model if stream else model, expected, device, stages)


@torch.no_grad()
def run_model(model: Steppable, root: torch.nn.Module, expected: Expected, device: str | torch.device,
              stages: Stages | None = None) -> tuple[Trace, tuple[torch.Tensor, torch.Tensor] | None]:
    """`model`'s trace (its modules are `root`'s) and greedy generation on the expected batch."""
    ids = expected.ids.to(device)
    mask = None if expected.attention_mask is None else expected.attention_mask.to(device)
    new = 0 if expected.generation is None else expected.generation[0].shape[1] - expected.prompt_tokens
    with counting_layers(stages, f"lmconvert, {expected.dtype}", root, len(root.layers), 1 + new):
        trace = our_trace(root, lambda x: model(x, attention_mask=mask), ids)
        generation = None if expected.generation is None else greedy(model, ids[:1, :expected.prompt_tokens], new)
    return trace, generation


def judge(checkpoint: Path, expected: Expected, trace: Trace, generation: tuple[torch.Tensor, torch.Tensor] | None,
          device: str, stream: bool, max_memory: int | None, golden: Path | None) -> Report:
    """Our run held to the record, with the record's tolerance (a golden file keeps the bar it was
    recorded with): logits, every point, generation."""
    tolerance = expected.tolerance
    ours = trace.logits.cpu()
    stats = logit_stats(ours, expected.logits)
    points = compare_points(trace.points, expected.points, tolerance, expected.own,
                            expected.info.get("layout_problems"))
    found = versions()
    if golden is not None:
        found["reference"] = expected.info.get("versions", {})
    report = Report(checkpoint=str(checkpoint), reference=None if golden else expected.info.get("reference"),
                    golden=str(golden) if golden else None, dtype=expected.dtype, device=device,
                    batch=expected.ids.shape[0], seq_len=expected.ids.shape[1],
                    tokens=expected.info.get("tokens", "?"), streamed=stream, max_memory=max_memory,
                    logits=stats, logits_passed=True, points=points, tolerance=tolerance, versions=found)
    if generation is not None and expected.generation is not None:
        report.generation = compare_generation(generation, expected.generation, expected.prompt_tokens, tolerance)
    if tolerance.exact:
        report.logits_passed = stats["max_abs"] <= tolerance.logits_limit(float(expected.logits.abs().max()))
    else:
        exact = expected.exact_logits.float()
        report.ours_error = float((ours.float() - exact).abs().mean())
        report.reference_error = expected.reference_error
        report.logits_passed = report.ours_error <= tolerance.faithfulness * expected.reference_error
        report.vs_fp32 = {"ours": logit_stats(ours, exact), "reference": logit_stats(expected.logits, exact)}
    if not points:
        report.notes.append("no hidden state could be compared; only the logits were")
    return report


def record_reference(checkpoint: Path | Checkpoint, reference: Path | None = None, dtype: str | None = None,
                     device: str = "cpu", seq_len: int | None = None, batch: int = 2, seed: int = 0,
                     generate: int = 16, max_memory: int | None = None, padded: bool = False,
                     side: tuple[Loadable, str] | None = None, stages: Stages | None = None) -> Expected:
    """The transformers half of `verify`: pick the token batch (real prompts when the checkpoint
    has a tokenizer; with `padded`, rows of different lengths left-padded under an attention mask)
    and record what transformers computes on it. `side`: `reference_side`'s answer, if known."""
    with opened(checkpoint) as ckpt:
        arch = ckpt.arch
        seq_len = seq_len or default_seq_len(arch)
        check_request(arch, batch, seq_len, generate, device)  # before anything is allocated for them
        where, family = side or reference_side(ckpt, reference)
        with materialized(where, ckpt) as where:  # a quantized GGUF's own weights, where transformers cannot read it
            tokenizers = [ckpt.tokenizer, where if where.kwargs else directory_tokenizer(where.where)]
            ids, mask, tokens = token_batch(tokenizers, arch.vocab_size, batch, seq_len, seed, padded)
            return record(where, arch, family_named(family).tensors_for(arch), ids, dtype or "float32", device,
                          max_memory, generate, info={"tokens": tokens, "checkpoint": str(ckpt.path)},
                          attention_mask=mask, stages=stages)


def check_golden(checkpoint: Checkpoint, golden: Path, dtype: str | None = None, device: str = "cpu") -> Expected:
    """A golden file's record, once it is known to fit this checkpoint, dtype and machine."""
    expected = golden_file.load(golden)
    arch = checkpoint.arch
    if dtype is not None and dtype != expected.dtype:
        raise InputError(f"--golden {golden}: recorded in {expected.dtype}; pass --dtype {expected.dtype} "
                         "or record a new golden file")
    vocab = expected.logits.shape[-1]
    if int(expected.ids.max()) >= arch.vocab_size or vocab != arch.vocab_size:
        raise InputError(f"--golden {golden}: its token ids or {vocab}-wide logits do not fit {checkpoint.path}'s "
                         f"vocabulary of {arch.vocab_size}; it was recorded for another model")
    new = 0 if expected.generation is None else expected.generation[0].shape[1] - expected.prompt_tokens
    batch, seq_len = expected.ids.shape
    check_request(arch, batch, seq_len, new, device, golden=golden)
    return expected


def verify(checkpoint: Path, reference: Path | None = None, **options: Any) -> Report:  # noqa: ANN401
    """Verify `checkpoint` against transformers (or against a golden file), and optionally store
    what transformers computed as a golden file; `options` are `Request`'s fields. With `max_memory`
    (bytes) our side streams one block at a time and transformers offloads through accelerate. The
    checkpoint is opened once. (`parallel.verify` is the same under torchrun.)"""
    return verify_request(Request(checkpoint, reference, **options))


def verify_request(request: Request) -> Report:
    device = request.device or "cpu"
    with open_checkpoint(request.checkpoint) as ckpt:
        expected = expected_of(ckpt, request, device)
        trace, generation = run_ours(ckpt, expected, device, request.stream, request.stages)
    return judge(request.checkpoint, expected, trace, generation, device, request.stream, request.max_memory,
                 request.golden)


def expected_of(ckpt: Checkpoint, request: Request, device: str) -> Expected:
    """What our side is held to: the golden file's record, or transformers' (stored as a golden file
    with --save-golden). The run's outputs (--save-golden, `writes`) are checked against everything it
    reads first, and held to the output rule (`outputs.py`; `force` replaces one lmconvert wrote)."""
    side = check_written(ckpt, request.reference, request.golden, request.save_golden, request.writes,
                         request.force)
    if request.golden is not None:
        return check_golden(ckpt, request.golden, request.dtype, device)
    expected = record_reference(ckpt, request.reference, request.dtype, device, request.seq_len, request.batch,
                                request.seed, request.generate, request.max_memory, request.padded, side,
                                request.stages)
    if request.save_golden is not None:
        golden_file.save(expected, request.save_golden, request.force)
    return expected


def check_written(ckpt: Checkpoint, reference: Path | None, golden: Path | None, save_golden: Path | None,
                  writes: Mapping[str, Path | None] | None, force: bool) -> tuple[Loadable, str] | None:
    """The outputs of this run (--save-golden, and `writes`) checked against everything it reads;
    returns the reference side found on the way (None with a golden file), so it is looked up once."""
    outputs = {**(writes or {}), "--save-golden": save_golden}
    if not any(path is not None for path in outputs.values()):
        return None
    side = None if golden is not None else reference_side(ckpt, reference)
    loads = None if side is None else side[0].origin or side[0].where
    read = tuple(p for p in (ckpt.path, reference, golden, loads) if p is not None)
    check_outputs(outputs, read, force)
    return side
