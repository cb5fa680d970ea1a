"""Conversion speed and memory against `cp -r` and transformers, in one run.

Generates a LLaMA-3.2-1B-shaped random bf16 checkpoint (1.24 B parameters, ~2.5 GB, 3 shards,
the real 128256 x 2048 tied embedding), then times, each in its own process from a warm page
cache, with the outputs of earlier steps deleted (their page cache would otherwise slow later
steps' writes): cp -r; transformers from_pretrained + save_pretrained; lmconvert HF -> canonical;
and lmconvert canonical -> HF. Prints wall time, peak RSS and the ratios. `--depth 2` doubles the
number of layers (and so the model size) to show that peak memory does not grow with it.

    python bench/convert.py [--work DIR] [--depth 1|2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from common import dir_bytes, make_checkpoint, measure, table, warm

HF_ROUND_TRIP = """
import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
m.save_pretrained(sys.argv[2], max_shard_size="1GB")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--depth", type=int, default=1, help="multiply the 16 layers by this")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-bench-"))
    try:
        src = make_checkpoint(work / "src", n_layers=16 * args.depth)
        size = dir_bytes(src)
        py = sys.executable
        runs = []
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
        for label, argv, source, outputs in steps:
            warm(source)
            runs.append(measure(label, argv))
            for path in outputs:  # free their page cache: every step starts with the same memory
                shutil.rmtree(path)
        cp, hf = runs[0], runs[1]
        rows = [["step", "wall s", "peak RSS MB", "time / cp", "time / transformers", "RSS / transformers"]]
        for r in runs:
            rows.append([r.label, f"{r.seconds:.2f}", f"{r.peak_rss / 1e6:.0f}", f"{r.seconds / cp.seconds:.2f}",
                         f"{r.seconds / hf.seconds:.2f}", f"{r.peak_rss / hf.peak_rss:.2f}"])
        print(f"checkpoint: {size / 1e9:.2f} GB, {16 * args.depth} layers, bf16")
        print(table(rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
