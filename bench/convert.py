"""Conversion speed and memory against `cp -r` and transformers, in one run.

Generates a LLaMA-3.2-1B-shaped random bf16 checkpoint (1.24 B parameters, ~2.5 GB, 3 shards,
the real 128256 x 2048 tied embedding), then times, each in its own process: cp -r;
transformers from_pretrained + save_pretrained; lmconvert HF -> canonical; and lmconvert
canonical -> HF. Prints wall time, peak RSS and the ratios. `--depth 2` doubles the number of
layers (and so the model size) to show that peak memory does not grow with it.

It does so twice: with each step's input read from the disk (dropped from the page cache first),
where `cp -r` is the disk's own speed; and with it in the page cache, where `cp -r` is the speed of
copying memory, and a conversion's own work (hashing every byte, checking every float) has
nothing to hide behind.

Each step starts from the same state (see common.prepare: on a VM, writing into memory the host
has taken back costs up to 5x more). The four steps run --repeat times in rounds, and each table
shows each step's median time (and the spread), its CPU time, and its highest peak RSS.

    python bench/convert.py [--work DIR] [--depth 1|2] [--repeat 5] [--input disk|cache|both]
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from common import dir_bytes, make_checkpoint, measure_rounds, table

HF_ROUND_TRIP = """
import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
m.save_pretrained(sys.argv[2], max_shard_size="1GB")
"""


def rounds(steps: list[tuple[str, list[str], Path, list[Path]]], repeat: int, cached: bool) -> str:
    runs = measure_rounds(steps, repeat, cached)
    seconds = {label: statistics.median(r.seconds for r in rs) for label, rs in runs.items()}
    rss = {label: max(r.peak_rss for r in rs) for label, rs in runs.items()}
    cp, hf = seconds["cp -r"], seconds["transformers load+save"]
    rows = [["step", "median s", "min-max s", "CPU s", "peak RSS MB", "time / cp", "time / transformers",
             "RSS / transformers"]]
    for label, rs in runs.items():
        spread = f"{min(r.seconds for r in rs):.2f}-{max(r.seconds for r in rs):.2f}"
        t = seconds[label]
        cpu = statistics.median(r.cpu_seconds for r in rs)
        rows.append([label, f"{t:.2f}", spread, f"{cpu:.2f}", f"{rss[label] / 1e6:.0f}", f"{t / cp:.2f}",
                     f"{t / hf:.2f}", f"{rss[label] / rss['transformers load+save']:.2f}"])
    return table(rows)


def cpu() -> str:
    """The CPU the figures come from: its model and widest SIMD level (BLAKE3 and the NaN/Inf check
    run on it, and the conversion's speed depends on it), and any level torch is held to."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown CPU"
    flags = set(fields.get("flags", "").split())
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    held = os.environ.get("ATEN_CPU_CAPABILITY")
    return (f"{fields.get('model name', 'unknown CPU')}, {os.cpu_count()} cores, {simd}"
            + (f" (torch held to {held})" if held else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--depth", type=int, default=1, help="multiply the 16 layers by this")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; each step's median is reported")
    parser.add_argument("--input", choices=["disk", "cache", "both"], default="both",
                        help="where each step's input is read from")
    args = parser.parse_args()
    # An installed lmconvert has its bytecode compiled (pip does that); a checkout run with
    # PYTHONDONTWRITEBYTECODE set would compile its ~30 modules again in every run (25 ms here).
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "lmconvert", quiet=1)
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-bench-"))
    try:
        src = make_checkpoint(work / "src", n_layers=16 * args.depth)
        size = dir_bytes(src)
        py = sys.executable
        steps = [  # (label, command, its input, outputs to delete once measured)
            ("cp -r", ["cp", "-r", str(src), str(work / "copy")], src, [work / "copy"]),
            ("transformers load+save", [py, "-c", HF_ROUND_TRIP, str(src), str(work / "hf-saved")], src,
             [work / "hf-saved"]),
            ("lmconvert HF -> canonical", [py, "-m", "lmconvert.cli", "convert", str(src), str(work / "canonical"),
                                           "--max-shard-size", "1GB"], src, []),
            ("lmconvert canonical -> HF", [py, "-m", "lmconvert.cli", "convert", str(work / "canonical"),
                                           str(work / "hf-export"), "--to", "hf", "--max-shard-size", "1GB"],
             work / "canonical", [work / "hf-export", work / "canonical"]),
        ]
        print(f"CPU: {cpu()}")
        print(f"checkpoint: {size / 1e9:.2f} GB, {16 * args.depth} layers, bf16; median of {args.repeat} rounds")
        for cached in {"disk": [False], "cache": [True], "both": [False, True]}[args.input]:
            where = "in the page cache" if cached else "read from the disk (dropped from the page cache first)"
            print(f"\ninput {where}:")
            print(rounds(steps, args.repeat, cached))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
