"""FP8 import speed and memory against `cp -r` of the same input, in one run.

Generates a LLaMA-3.2-1B-shaped block-wise FP8 checkpoint as the Hub ships them (every projection
float8_e4m3fn with a float32 `weight_scale_inv` per 128x128 block, `quantization_config.quant_method
= "fp8"`; embeddings and norms bf16; 3 shards), then times, each in its own process: cp -r;
lmconvert FP8 -> canonical kept as it is (no --dtype); that canonical -> HF (written back as
FP8); and FP8 -> canonical dequantized (--dtype bfloat16). Prints each step's median wall time,
CPU time, peak RSS and time / cp. `--depth 2` doubles the layers, to show peak RSS stays flat.

    python bench/fp8_import.py [--work DIR] [--depth 1|2] [--repeat 5] [--input disk|cache]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import LLAMA_3_2_1B, dir_bytes, measure_rounds, table, write_sharded
from convert import cpu

BLOCK = 128


def make_fp8_checkpoint(directory: Path, n_layers: int) -> Path:
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from fp8_import import _write; "
            f"_write({str(directory)!r}, {n_layers})")
    subprocess.run([sys.executable, "-c", code], check=True)
    return directory


def _write(directory: str, n_layers: int, shards: int = 3) -> None:
    import torch

    config = {**LLAMA_3_2_1B, "num_hidden_layers": n_layers,
              "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                      "weight_block_size": [BLOCK, BLOCK]}}
    generator = torch.Generator().manual_seed(0)

    def make(name: str, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
        if "proj" not in name:
            return {name: (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)}
        return {name: (torch.randn(shape, generator=generator) * 64).to(torch.float8_e4m3fn),
                name + "_scale_inv": torch.rand((shape[0] // BLOCK, shape[1] // BLOCK), generator=generator) * 1e-3}

    write_sharded(Path(directory), config, make, shards)


def rounds(steps: list[tuple[str, list[str], Path, list[Path]]], repeat: int, cached: bool) -> str:
    runs = measure_rounds(steps, repeat, cached)
    cp = statistics.median(r.seconds for r in runs["cp -r"])
    rows = [["step", "median s", "min-max s", "CPU s", "peak RSS MB", "time / cp"]]
    for label, rs in runs.items():
        t = statistics.median(r.seconds for r in rs)
        rows.append([label, f"{t:.2f}", f"{min(r.seconds for r in rs):.2f}-{max(r.seconds for r in rs):.2f}",
                     f"{statistics.median(r.cpu_seconds for r in rs):.2f}",
                     f"{max(r.peak_rss for r in rs) / 1e6:.0f}", f"{t / cp:.2f}"])
    return table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--depth", type=int, default=1, help="multiply the 16 layers by this")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; each step's median is reported")
    parser.add_argument("--input", choices=["disk", "cache"], default="cache", help="where each step's input is")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-bench-fp8-"))
    try:
        src = make_fp8_checkpoint(work / "src", 16 * args.depth)
        py = sys.executable
        lm = [py, "-m", "lmconvert.cli", "convert"]
        steps = [
            ("cp -r", ["cp", "-r", str(src), str(work / "copy")], src, [work / "copy"]),
            ("lmconvert FP8 -> canonical (kept)", [*lm, str(src), str(work / "canonical"), "--max-shard-size", "1GB"],
             src, []),
            ("lmconvert canonical -> HF (FP8)", [*lm, str(work / "canonical"), str(work / "hf"), "--to", "hf",
                                                 "--max-shard-size", "1GB"], work / "canonical",
             [work / "hf", work / "canonical"]),
            ("lmconvert FP8 -> canonical --dtype bfloat16", [*lm, str(src), str(work / "bf16"), "--dtype", "bfloat16",
                                                            "--max-shard-size", "1GB"], src, [work / "bf16"]),
        ]
        print(f"CPU: {cpu()}")
        print(f"checkpoint: {dir_bytes(src) / 1e9:.2f} GB, {16 * args.depth} layers, block-wise FP8; "
              f"median of {args.repeat} rounds, input {'in the page cache' if args.input == 'cache' else 'on disk'}")
        print(rounds(steps, args.repeat, args.input == "cache"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
