"""`lmconvert verify`: run our decoder and transformers on the same tokens and compare, from the
logits down to every layer and sublayer, and through greedy generation.

fp32 must agree element by element. In bf16 and fp16 both sides round, so agreement between
them is not the criterion; faithfulness is: our error against transformers run in fp32 may be at
most 1.25x transformers' own error in that dtype, for the logits and at every point.

The transformers side is recorded first (an `Expected`), then our side is held to it; a golden
file is the same record stored on disk, so `--golden` runs our side alone, without transformers.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch

from lmconvert.arch import ArchConfig
from lmconvert.mappings import MappingError, family_named
from lmconvert.mappings.table import TensorTable

from . import golden as golden_file
from .agreement import compare_generation, greedy, logit_stats
from .canonical import is_canonical, read_meta
from .dtypes import CASTS, torch_dtype
from .errors import InputError
from .expected import Expected, record, versions
from .load import arch_of, load
from .localize import compare_points
from .prompts import token_batch
from .report import Report
from .streamed import streamed
from .trace import Trace, our_trace

META_HINT = ("Meta's format (params.json + consolidated.*.pth), which transformers cannot load; "
             "pass --reference HF_DIR holding the same model in HF layout")


def resolve_reference(checkpoint: Path, reference: Path | None) -> Path:
    """The reference to compare with: --reference, an HF checkpoint itself, or a canonical
    checkpoint's recorded source."""
    from .formats.meta import is_meta

    if reference is not None:
        if is_meta(reference):
            raise InputError(f"--reference {reference}: is in {META_HINT}")
        return reference
    if not is_canonical(checkpoint):
        if is_meta(checkpoint):
            raise InputError(f"{checkpoint}: is in {META_HINT}")
        return checkpoint
    source = read_meta(checkpoint).source
    if source.get("format") == "meta":
        raise InputError(f"{checkpoint}: was converted from {META_HINT}")
    recorded = source.get("path")
    if not recorded or not Path(recorded).exists():  # a directory, or a single-file format such as GGUF
        raise InputError(f"{checkpoint}: the recorded source {recorded!r} is not available; pass --reference SRC")
    return Path(recorded)


def default_seq_len(arch: ArchConfig) -> int:
    window = arch.sliding_window or 0
    return min(arch.max_positions, max(64, min(2 * window + 1, 512)))


def reference_table(reference: Path, fallback_family: str) -> TensorTable:
    """The tensor table that names transformers' modules: the reference's own family."""
    try:
        _, family = arch_of(reference)
    except (InputError, MappingError):
        family = fallback_family
    return family_named(family).tensors


def check_device(device: str) -> None:
    """A bad --device fails here in one line, not as a traceback from deep inside torch."""
    try:
        target = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f"--device {device!r}: not a torch device; use cpu, cuda or cuda:N") from None
    if target.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"--device {device}: no CUDA device is available to torch {torch.__version__}; "
                             "use --device cpu or a CUDA build of torch")
        if target.index is not None and target.index >= torch.cuda.device_count():
            raise InputError(f"--device {device}: there are {torch.cuda.device_count()} CUDA device(s)")
    elif target.type != "cpu":
        raise InputError(f"--device {device!r}: verify runs on cpu or cuda")


def compute_dtype(dtype: str | None) -> str:
    dtype = dtype or "float32"
    if dtype not in CASTS:
        raise InputError(f"--dtype {dtype!r}: choose float32, bfloat16 or float16")
    return dtype


@torch.no_grad()
def run_ours(checkpoint: Path, expected: Expected, device: str,
             stream: bool) -> tuple[Trace, tuple[torch.Tensor, torch.Tensor] | None]:
    """Our trace on the expected token batch, and our greedy generation from the same prompt."""
    dtype = torch_dtype(expected.dtype)
    ids = expected.ids.to(device)
    context = streamed(checkpoint, dtype, device) if stream else nullcontext(
        load(checkpoint, dtype=dtype, device=device, attention="eager"))
    with context as model:
        root = model.model if stream else model
        trace = our_trace(root, model, ids)
        generation = None
        if expected.generation is not None:
            new = expected.generation[0].shape[1] - expected.prompt_tokens
            generation = greedy(model, ids[:1, :expected.prompt_tokens], new)
    return trace, generation


def judge(checkpoint: Path, expected: Expected, trace: Trace, generation: tuple[torch.Tensor, torch.Tensor] | None,
          device: str, stream: bool, max_memory: int | None, golden: Path | None) -> Report:
    """Our run held to the record, with the record's tolerance (a golden file keeps the bar it was
    recorded with): logits, every point, generation."""
    tolerance = expected.tolerance
    ours = trace.logits.cpu()
    stats = logit_stats(ours, expected.logits)
    points = compare_points(trace.points, expected.points, tolerance, expected.own)
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
        report.logits_passed = stats["max_abs"] <= tolerance.logits_max_abs
    else:
        exact = expected.exact_logits.float()
        report.ours_error = float((ours.float() - exact).abs().mean())
        report.reference_error = expected.reference_error
        report.logits_passed = report.ours_error <= tolerance.faithfulness * expected.reference_error
        report.vs_fp32 = {"ours": logit_stats(ours, exact), "reference": logit_stats(expected.logits, exact)}
    if not points:
        report.notes.append("no hidden state could be compared; only the logits were")
    return report


def record_reference(checkpoint: Path, reference: Path | None = None, dtype: str | None = None, device: str = "cpu",
                     seq_len: int | None = None, batch: int = 2, seed: int = 0, generate: int = 16,
                     max_memory: int | None = None) -> Expected:
    """The transformers half of `verify`: pick the token batch (real prompts when the checkpoint
    has a tokenizer) and record what transformers computes on it."""
    dtype = compute_dtype(dtype)
    reference = resolve_reference(checkpoint, reference)
    arch, family = arch_of(checkpoint)
    seq_len = seq_len or default_seq_len(arch)
    ids, tokens = token_batch([checkpoint, reference], arch.vocab_size, batch, seq_len,
                              seed)
    return record(reference, arch, reference_table(reference, family), ids, dtype, device, max_memory, generate,
                  info={"tokens": tokens, "checkpoint": str(checkpoint)})


def check_golden(checkpoint: Path, golden: Path, dtype: str | None = None) -> Expected:
    """A golden file's record, once it is known to fit this checkpoint and dtype."""
    expected = golden_file.load(golden)
    if dtype is not None and dtype != expected.dtype:
        raise InputError(f"--golden {golden}: recorded in {expected.dtype}; pass --dtype {expected.dtype} "
                         "or record a new golden file")
    arch, _ = arch_of(checkpoint)
    if int(expected.ids.max()) >= arch.vocab_size:
        raise InputError(f"--golden {golden}: its token ids exceed {checkpoint}'s vocabulary of "
                         f"{arch.vocab_size}; it was recorded for another model")
    return expected


def verify(checkpoint: Path, reference: Path | None = None, dtype: str | None = None, device: str = "cpu",
           seq_len: int | None = None, batch: int = 2, seed: int = 0, generate: int = 16,
           max_memory: int | None = None, golden: Path | None = None,
           save_golden: Path | None = None) -> Report:
    """Verify `checkpoint` against transformers (or against a golden file), and optionally store
    what transformers computed as a golden file. With `max_memory` (bytes) our side streams one
    block at a time and transformers offloads through accelerate."""
    check_device(device)
    if golden is not None:
        if reference is not None or save_golden is not None:
            raise InputError("--golden checks against a recorded file; drop --reference and --save-golden")
        expected = check_golden(checkpoint, golden, dtype)
    else:
        expected = record_reference(checkpoint, reference, dtype, device, seq_len, batch, seed, generate, max_memory)
        if save_golden is not None:
            golden_file.save(expected, save_golden)
    stream = max_memory is not None
    trace, generation = run_ours(checkpoint, expected, device, stream)
    return judge(checkpoint, expected, trace, generation, device, stream, max_memory, golden)


def parse_memory(text: str | None) -> int | None:
    """--max-memory's size in bytes (e.g. 1GB, 512MiB)."""
    from .shards import parse_size

    if text is None:
        return None
    try:
        size = parse_size(text)
    except InputError:
        raise InputError(f"--max-memory {text!r}: expected a size such as 1GB or 512MB") from None
    if size <= 0:
        raise InputError(f"--max-memory {text!r}: must be more than 0")
    return size
