"""GPTQ dequantization throughput against `cp`: a LLaMA-3.2-1B-shaped set of GPTQ 4-bit tensors
(every projection of the 16 layers: qweight, qzeros, fp16 scales, g_idx; group_size 128; random
words, as a real file's fields are), written to one safetensors file; then in the same run, each in
its own process, alternating in rounds with the input in the page cache (bench/common.py's protocol):

- `cp` of the file;
- read + dequantize: every linear's four tensors read from the file (safetensors) and dequantized by
  `lmconvert.formats.gptq.dequantize` to the fp16 weight [out, in], the result dropped;
- dequantize alone: the same with the tensors already in memory (read before the clock starts);
- the same into output buffers reused from one linear to the next of the same shape (`out=`), as a
  writer that has written the last weight can: no page faults of fresh memory.

Throughput is in GB/s of packed input (the file's bytes). `--desc-act` gives every linear a permuted
g_idx (act-order), which takes the gather path; `--dtype float32` casts the scales first.

    python bench/gptq_dequant.py [--work DIR] [--repeat 3] [--desc-act] [--dtype float16|float32]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import LLAMA_3_2_1B, Measured, llama_shapes, measure, prepare, table
from convert import cpu

WRITE = r"""
import sys, torch
from safetensors.torch import save_file
shapes, desc_act, path = eval(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
g = torch.Generator().manual_seed(0)
tensors = {}
for name, (out_f, in_f) in shapes.items():
    m = name.removesuffix(".weight")
    groups = in_f // 128
    tensors[m + ".qweight"] = torch.randint(-2**31, 2**31 - 1, (in_f // 8, out_f), dtype=torch.int32, generator=g)
    tensors[m + ".qzeros"] = torch.randint(-2**31, 2**31 - 1, (groups, out_f // 8), dtype=torch.int32, generator=g)
    tensors[m + ".scales"] = (torch.rand(groups, out_f, generator=g) * 0.01 + 1e-4).half()
    order = torch.randperm(in_f, generator=g) if desc_act else torch.arange(in_f)
    g_idx = torch.empty(in_f, dtype=torch.int32)
    g_idx[order] = (torch.arange(in_f) // 128).to(torch.int32)
    tensors[m + ".g_idx"] = g_idx
save_file(tensors, path)
"""

DEQUANT = r"""
import json, sys, time, torch
from safetensors import safe_open
from lmconvert.formats import gptq
path, mode, dtype, desc_act, report = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5]
preload = mode != "read"
recipe = gptq.GptqRecipe(bits=4, group_size=128, sym=False, desc_act=desc_act, checkpoint_format="gptq")
cast = None if dtype == "float16" else getattr(torch, dtype)
with safe_open(path, "pt") as f:
    names = sorted({k.rsplit(".", 1)[0] for k in f.keys()})
    read = lambda m: {p: f.get_tensor(f"{m}.{p}") for p in gptq.PARTS}
    held = {m: read(m) for m in names} if preload else None
    start = time.perf_counter()
    values = 0
    buffers = {}  # "reuse": one output buffer per shape, as a writer that has written the last one would
    for m in names:
        parts = held[m] if preload else read(m)
        shape = (parts["qweight"].shape[1], parts["qweight"].shape[0] * 8)
        out = buffers.setdefault(shape, torch.empty(shape, dtype=cast or torch.float16)) if mode == "reuse" else None
        weight = gptq.dequantize(recipe, m, parts, path, cast, out=out)
        values += weight.numel()
        del weight
    seconds = time.perf_counter() - start
open(report, "w").write(json.dumps({"seconds": seconds, "values": values, "threads": torch.get_num_threads()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="where the file goes (default: a temporary directory)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--desc-act", action="store_true", help="permuted g_idx (act-order)")
    parser.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gptq-bench-", dir=args.work))
    try:
        shapes = {n: s for n, s in llama_shapes(LLAMA_3_2_1B).items() if len(s) == 2 and "embed" not in n}
        path = work / "gptq" / "model.safetensors"
        path.parent.mkdir()
        subprocess.run([sys.executable, "-c", WRITE, repr(shapes), "1" if args.desc_act else "0", str(path)],
                       check=True)
        size = path.stat().st_size
        print(f"CPU: {cpu()}")
        print(f"{len(shapes)} GPTQ 4-bit linears (LLaMA-3.2-1B shapes, group_size 128"
              f"{', desc_act' if args.desc_act else ''}): {size / 1e9:.3f} GB packed; output {args.dtype}")
        copy = work / "copy.safetensors"
        root = Path(__file__).resolve().parent.parent
        runs: dict[str, list[Measured]] = {}
        timed: dict[str, list[float]] = {}
        report = work / "report.json"
        flags = ["1" if args.desc_act else "0", str(report)]
        for _ in range(args.repeat):
            for label, argv in (
                    ("cp", ["cp", str(path), str(copy)]),
                    ("read + dequantize", [sys.executable, "-c", DEQUANT, str(path), "read", args.dtype, *flags]),
                    ("dequantize alone", [sys.executable, "-c", DEQUANT, str(path), "held", args.dtype, *flags]),
                    ("dequantize alone, reused output buffers",
                     [sys.executable, "-c", DEQUANT, str(path), "reuse", args.dtype, *flags])):
                prepare(path.parent, cached=True)
                copy.unlink(missing_ok=True)
                runs.setdefault(label, []).append(measure(label, argv, env={"PYTHONPATH": str(root)}))
                if label != "cp":
                    timed.setdefault(label, []).append(json.loads(report.read_text())["seconds"])
                    threads = json.loads(report.read_text())["threads"]
        cp = statistics.median(m.seconds for m in runs["cp"])
        rows = [["step", "median s", "GB/s of packed input", "time / cp", "peak RSS MB"]]
        for label, measured in runs.items():
            seconds = cp if label == "cp" else statistics.median(timed[label])
            rows.append([label, f"{seconds:.3f}", f"{size / seconds / 1e9:.2f}", f"{seconds / cp:.2f}",
                         f"{max(m.peak_rss for m in measured) / 1e6:.0f}"])
        print(f"median of {args.repeat} rounds; torch threads {threads}; dequantize: the loop's own clock (not "
              "the interpreter's start), peak RSS: the whole process")
        print(table(rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
