"""Verifying a model under a memory cap: each side's peak RSS beside the checkpoint's size.

Generates a LLaMA-3.2-1B-shaped random bf16 checkpoint (1.24 B parameters, ~2.5 GB, the real
128256 x 2048 tied embedding), converts it to canonical, and verifies it in bf16 with
`--max-memory`, each side in its own process, its peak RSS taken from wait4:

1. transformers, the bf16 run alone (forward with every point hooked, then greedy generation),
   its weights placed by accelerate under the cap and the rest offloaded to disk;
2. transformers, the whole reference side of a bf16 verify: that run plus the fp32 run that the
   faithfulness criterion measures against, written as a golden file;
3. `lmconvert verify CANONICAL --golden FILE --max-memory CAP`: the canonical side, streamed one
   block at a time, judged against that file.

Target: every peak below half the checkpoint's size. Needs ~5 GB in the scratch directory.

    python bench/verify_memory.py [--work DIR] [--max-memory 512MB] [--batch 1] [--seq-len 32] [--generate 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import dir_bytes, make_checkpoint, measure, prepare, table

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Sampled:
    label: str
    seconds: float
    peak_rss: int  # bytes, exact: the child's ru_maxrss from wait4
    peak_anon: int  # bytes, sampled every 20 ms from /proc: anonymous memory (tensors, heap)
    peak_file: int  # bytes, sampled: file-backed pages mapped into the process (mmapped checkpoint files)


def _status(pid: int) -> dict[str, int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)
                    if k in ("RssAnon", "RssFile")}
    except (OSError, ValueError):
        return {}


def measure_sampled(label: str, argv: list[str]) -> Sampled:
    """bench/common.measure (wall time, peak RSS from wait4), plus what the peak was made of:
    ru_maxrss counts file-backed mapped pages too, which the kernel can drop under pressure."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv)
    anon = file = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        now = _status(proc.pid)
        anon, file = max(anon, now.get("RssAnon", 0)), max(file, now.get("RssFile", 0))
        time.sleep(0.02)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{label} failed: {' '.join(argv)}")
    return Sampled(label, time.perf_counter() - start, usage.ru_maxrss * 1024, anon, file)


def side_bf16_run(args: argparse.Namespace) -> None:
    """transformers in bf16 only, as a bf16 verify runs it (points hooked, greedy generation)."""
    import torch

    from lmconvert.cli.args import parse_memory
    from lmconvert.formats.source import Loadable
    from lmconvert.mappings import family_named
    from lmconvert.runtime.load import arch_of
    from lmconvert.verify.expected import generation_plan
    from lmconvert.verify.prompts import random_batch
    from lmconvert.verify.reference import reference_greedy, reference_model, reference_trace

    arch, family = arch_of(args.hf)
    ids = random_batch(arch.vocab_size, args.batch, args.seq_len, 0)
    prompt, new = generation_plan(arch, args.seq_len, args.generate)
    with reference_model(Loadable(args.hf), torch.bfloat16, "cpu", parse_memory(args.max_memory)) as model:
        reference_trace(model, ids, arch, family_named(family).tensors)
        if new:
            reference_greedy(model, ids[:1, :prompt], new)


def side_reference(args: argparse.Namespace) -> None:
    """The reference half of `lmconvert verify --dtype bfloat16 --max-memory CAP`, to a golden file."""
    from lmconvert.cli.args import parse_memory
    from lmconvert.convert import golden
    from lmconvert.verify.run import record_reference

    expected = record_reference(args.canonical, None, "bfloat16", "cpu", args.seq_len, args.batch, 0, args.generate,
                                parse_memory(args.max_memory))
    golden.save(expected, args.golden)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--max-memory", default="512MB", help="verify's --max-memory")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--generate", type=int, default=4, help="greedy tokens each side generates")
    parser.add_argument("--side", choices=["bf16-run", "reference"], help=argparse.SUPPRESS)  # child processes
    parser.add_argument("--hf", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--canonical", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--golden", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        {"bf16-run": side_bf16_run, "reference": side_reference}[args.side](args)
        return

    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-verify-memory-"))
    try:
        hf = make_checkpoint(work / "hf")
        canonical, golden, report = work / "canonical", work / "golden.safetensors", work / "report.json"
        py = sys.executable
        convert = measure("convert", [py, "-m", "lmconvert.cli", "convert", str(hf), str(canonical),
                                      "--max-shard-size", "1GB"])
        size = dir_bytes(canonical)
        common = [py, __file__, "--max-memory", args.max_memory, "--batch", str(args.batch), "--seq-len",
                  str(args.seq_len), "--generate", str(args.generate), "--hf", str(hf), "--canonical", str(canonical),
                  "--golden", str(golden)]
        runs = []
        for label, argv, warmed in [
            ("transformers bf16 run alone", [*common, "--side", "bf16-run"], hf),
            ("transformers reference side (bf16 + fp32 runs)", [*common, "--side", "reference"], hf),
            ("lmconvert verify --golden (streamed)",
             [py, "-m", "lmconvert.cli", "verify", str(canonical), "--golden", str(golden), "--max-memory",
              args.max_memory, "--json", str(report)], canonical),
        ]:
            prepare(warmed)
            runs.append(measure_sampled(label, argv))
        verdict = json.loads(report.read_text())
        rows = [["process", "wall s", "peak RSS MB", "RSS / checkpoint", "below half?",
                 "sampled peak anon / file-backed MB"]]
        for r in runs:
            below = "yes" if r.peak_rss < size / 2 else "NO"
            rows.append([r.label, f"{r.seconds:.1f}", f"{r.peak_rss / 1e6:.0f}", f"{r.peak_rss / size:.2f}", below,
                         f"{r.peak_anon / 1e6:.0f} / {r.peak_file / 1e6:.0f}"])
        print(f"\ncheckpoint: {size / 1e9:.2f} GB canonical ({dir_bytes(hf) / 1e9:.2f} GB HF), bf16, 16 layers; "
              f"half: {size / 2e6:.0f} MB; --max-memory {args.max_memory}; tokens {args.batch} x {args.seq_len}, "
              f"{args.generate} generated; conversion {convert.seconds:.1f} s, {convert.peak_rss / 1e6:.0f} MB")
        print(table(rows))
        print(f"verify: {verdict['verdict']} (max |Δlogit| {verdict['max_abs']:.3e}, ours / transformers error vs "
              f"fp32 {verdict['ratio']:.3f}, {len(verdict['points'])} points)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
