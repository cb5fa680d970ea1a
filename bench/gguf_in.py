"""GGUF in at disk speed: dequantization throughput per type, and GGUF -> canonical against `cp`.

Part 1 (a child process, so this one stays small for the RSS figures): for each type
ggml_dequant.py handles, random blocks with finite scales (as in a real file) dequantized through
the reader's own banded path (`gguf._dequantized`) into an array already written once (so that
the figure is the dequantization's, not the page faults of fresh memory: on this VM those cost
~2 s a GB, see docs/performance.md), ours against gguf's numpy code on the same path (the reader
before), in GB/s of input; the two results are checked bit for bit.

Part 2: the LLaMA-3.2-1B-shaped random checkpoint of bench/convert.py with a small tokenizer,
written as Q8_0 by `convert --to gguf`, and as Q4_K_M (Q4_K with Q6_K for some tensors) by
llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize, from an F16 export); then
`cp` of each file and `lmconvert convert FILE.gguf OUT` (every tensor dequantized to float32,
checked, hashed and written), each in its own process, alternating in rounds, with the input in
the page cache and read from the disk (bench/common.py's protocol). `--before` adds one round of
the conversion with gguf's numpy dequantization (the reader before ggml_dequant.py).

    python bench/gguf_in.py [--work DIR] [--repeat 3] [--input disk|cache|both] [--before] [--micro-mb 64]
"""

from __future__ import annotations

import argparse
import compileall
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import Measured, make_checkpoint, measure, prepare, table
from convert import cpu
from gguf_export import add_tokenizer

MICRO = r"""
import json, statistics, sys, time
import numpy as np, gguf
from lmconvert.formats import ggml_dequant
from lmconvert.formats import gguf as reader

mb, repeat = float(sys.argv[1]), int(sys.argv[2])
kernels = dict(ggml_dequant.LAYOUT)
rng = np.random.default_rng(0)
for kind in sorted(kernels, key=lambda k: (k[-1] != "0", k)):
    block, size, fields = ggml_dequant.LAYOUT[kind]
    row_bytes = 4096 // block * size  # rows of 4096 values, as a 1B model's
    rows = max(1, int(mb * 1e6) // row_bytes)
    raw = rng.integers(0, 256, size=(rows, row_bytes), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    for at in fields:
        blocks[:, at + 1] &= 0xBB  # finite scales of a real file's range: exponent < 16, even
    get = lambda first, n: raw[first:first + n]
    out = np.ones((rows, row_bytes // size * block), dtype=np.float32)  # its pages already faulted in
    def run(n):
        t, c = time.perf_counter(), time.process_time()
        reader._dequantized(get, n, row_bytes, gguf.GGMLQuantizationType[kind], out=out[:n])
        return time.perf_counter() - t, time.process_time() - c, out[:n].copy()
    timed = [run(rows)[:2] for _ in range(repeat)]
    ours, cpu = [t for t, _ in timed], [c for _, c in timed]
    few = max(1, rows // 4)  # gguf's numpy on a quarter of the rows: it is slow
    ggml_dequant.LAYOUT.clear()
    theirs_s, theirs_cpu, theirs = run(few)
    ggml_dequant.LAYOUT.update(kernels)
    _, _, check = run(few)
    same = bool(np.array_equal(check.view(np.uint32), theirs.view(np.uint32)))
    print(json.dumps({"type": kind, "ours": rows * row_bytes / statistics.median(ours) / 1e9,
                      "spread": [rows * row_bytes / max(ours) / 1e9, rows * row_bytes / min(ours) / 1e9],
                      "cpu": rows * row_bytes / statistics.median(cpu) / 1e9,
                      "gguf": few * row_bytes / theirs_s / 1e9, "gguf_cpu": few * row_bytes / theirs_cpu / 1e9,
                      "mb": rows * row_bytes / 1e6, "same_bits": same}),
          flush=True)
"""

QUANTIZE = r"""
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
params.nthread = 2
if llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params) != 0:
    sys.exit("llama_model_quantize failed")
"""

# the reader before ggml_dequant.py: every quantized type through gguf's numpy code
BEFORE = ("import sys; from lmconvert.formats import ggml_dequant; ggml_dequant.LAYOUT.clear(); "
          "from lmconvert.cli import entry; sys.argv[0] = 'lmconvert'; entry()")


def micro(mb: float, repeat: int) -> str:
    proc = subprocess.run([sys.executable, "-c", MICRO, str(mb), str(repeat)], check=True, capture_output=True,
                          text=True)
    rows = [["type", "ours GB/s (min-max)", "ours GB/CPU s", "gguf numpy GB/s", "gguf GB/CPU s", "x (CPU)",
             "bits equal", "input MB"]]
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        rows.append([r["type"], f"{r['ours']:.2f} ({r['spread'][0]:.2f}-{r['spread'][1]:.2f})", f"{r['cpu']:.2f}",
                     f"{r['gguf']:.3f}", f"{r['gguf_cpu']:.3f}", f"{r['cpu'] / r['gguf_cpu']:.0f}",
                     "yes" if r["same_bits"] else "NO", f"{r['mb']:.0f}"])
    return table(rows)


def rounds(steps: list[tuple[str, list[str], Path, Path, str]], repeat: int, cached: bool,
           inputs: tuple[Path, ...]) -> str:
    runs: dict[str, list[Measured]] = {label: [] for label, *_ in steps}
    for i in range(repeat):
        for label, argv, source, output, _ in steps:
            if label.startswith("before") and i > 0:
                continue
            prepare(source.parent, cached=cached, evict=tuple(p for p in inputs if p != source.parent))
            runs[label].append(measure(label, argv))
            if output.is_dir():
                shutil.rmtree(output)
            elif output.exists():
                output.unlink()
    rows = [["step", "median s", "min-max s", "MB/s of input", "time / cp", "CPU s", "peak RSS MB"]]
    seconds = {label: statistics.median(r.seconds for r in rs) for label, rs in runs.items()}
    for label, _, source, _, peer in steps:
        rs = runs[label]
        size = source.stat().st_size
        spread = f"{min(r.seconds for r in rs):.2f}-{max(r.seconds for r in rs):.2f}"
        rows.append([label, f"{seconds[label]:.2f}", spread,
                     f"{size / seconds[label] / 1e6:.0f}", f"{seconds[label] / seconds[peer]:.2f}",
                     f"{statistics.median(r.cpu_seconds for r in rs):.2f}",
                     f"{max(r.peak_rss for r in rs) / 1e6:.0f}"])
    return table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each step's median is reported")
    parser.add_argument("--input", choices=["disk", "cache", "both"], default="both",
                        help="where each step's input is read from")
    parser.add_argument("--before", action="store_true", help="one round with gguf's numpy dequantization too")
    parser.add_argument("--micro-mb", type=float, default=64, help="input MB per type in part 1 (0: skip it)")
    parser.add_argument("--no-convert", action="store_true", help="part 1 only")
    args = parser.parse_args()
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "lmconvert", quiet=1)
    print(f"CPU: {cpu()}")
    if args.micro_mb > 0:
        print(f"\ndequantization through the reader's bands, GB/s of input (median of {args.repeat}):")
        print(micro(args.micro_mb, args.repeat))
    if args.no_convert:
        return
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-bench-gguf-in-"))
    py = sys.executable
    try:
        src = make_checkpoint(work / "src", n_layers=16)
        add_tokenizer(src)
        files = {}
        for name, quant in (("q8_0", "q8_0"), ("f16", "f16")):
            (work / name).mkdir()
            files[name] = work / name / "model.gguf"
            subprocess.run([py, "-m", "lmconvert.cli", "convert", str(src), str(files[name]), "--to", "gguf",
                            "--quant", quant], check=True, capture_output=True)
        shutil.rmtree(src)
        (work / "q4_k_m").mkdir()
        files["q4_k_m"] = work / "q4_k_m" / "model.gguf"
        subprocess.run([py, "-c", QUANTIZE, str(files["f16"]), str(files["q4_k_m"])], check=True,
                       capture_output=True)
        shutil.rmtree(files.pop("f16").parent)
        steps = []
        for name, label in (("q8_0", "Q8_0"), ("q4_k_m", "Q4_K_M")):
            path = files[name]
            size = f"{label} ({path.stat().st_size / 1e9:.2f} GB)"
            out = work / "out"
            steps.append((f"cp {size}", ["cp", str(path), str(work / "copy.gguf")], path, work / "copy.gguf",
                          f"cp {size}"))
            steps.append((f"lmconvert {size} -> canonical", [py, "-m", "lmconvert.cli", "convert", str(path), str(out)],
                          path, out, f"cp {size}"))
            if args.before:
                steps.append((f"before: gguf numpy {size}", [py, "-c", BEFORE, "convert", str(path), str(out)],
                              path, out, f"cp {size}"))
        inputs = tuple(p.parent for p in files.values())
        print(f"\nGGUF -> canonical (float32) against cp; median of {args.repeat} rounds"
              + ("; 'before': one round" if args.before else ""))
        for cached in {"disk": [False], "cache": [True], "both": [False, True]}[args.input]:
            where = "in the page cache" if cached else "read from the disk (dropped from the page cache first)"
            print(f"\ninput {where}:")
            print(rounds(steps, args.repeat, cached, inputs))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
