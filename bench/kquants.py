"""K-quant encoding against llama.cpp's own, in one run.

Generates the LLaMA-3.2-1B-shaped random bf16 checkpoint of bench/convert.py (1.24 B parameters),
writes it once as an f32 GGUF (not timed), then times, each in its own process and alternating in
rounds, the same f32 GGUF quantized to each K type by lmconvert (`convert F32.gguf OUT.gguf --quant
q4_k`: 2 encoder threads on this machine's 2 cores) and by llama.cpp (`llama_model_quantize`,
`pure`, 2 threads: what `llama-quantize --pure F32.gguf OUT.gguf Q4_K_S 2` runs). Before each step
the earlier outputs are synced, freed memory settles and the input is in the page cache
(common.prepare). Prints the median wall time (and spread), CPU time, peak RSS and the ratios
lmconvert / llama.cpp, and checks that the two files hold the same tensor bytes.

    python bench/kquants.py [--work DIR] [--repeat 3] [--types q4_k,q6_k] [--layers 16]
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

FTYPES = {"q2_k": 10, "q3_k": 11, "q4_k": 14, "q5_k": 16, "q6_k": 18}  # llama_ftype: Q2_K, Q3_K_S, Q4_K_S, ...
LLAMA_QUANTIZE = """import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.pure, p.nthread = int(sys.argv[3]), True, 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
"""
SAME_BYTES = """import sys, gguf, numpy as np
a, b = (gguf.GGUFReader(p) for p in sys.argv[1:3])
tb = {t.name: t for t in b.tensors}
bad = [t.name for t in a.tensors if t.tensor_type != tb[t.name].tensor_type
       or not np.array_equal(np.asarray(t.data).view(np.uint8), np.asarray(tb[t.name].data).view(np.uint8))]
sys.exit(f"tensors differ: {bad[:5]}" if bad or len(a.tensors) != len(b.tensors) else 0)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each step's median is reported")
    parser.add_argument("--types", default=",".join(FTYPES), help="K types to time, comma-separated")
    parser.add_argument("--layers", type=int, default=16, help="decoder layers of the checkpoint")
    args = parser.parse_args()
    kinds = args.types.split(",")
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-bench-kquants-"))
    py = sys.executable
    try:
        src = make_checkpoint(work / "src", n_layers=args.layers)
        f32 = work / "in" / "f32.gguf"
        f32.parent.mkdir()
        subprocess.run([py, "-m", "lmconvert.cli", "convert", str(src), str(f32), "--quant", "f32"], check=True,
                       capture_output=True)
        shutil.rmtree(src)
        runs: dict[str, list[Measured]] = {}
        for _ in range(args.repeat):
            for kind in kinds:
                ours, theirs = work / f"lmconvert-{kind}.gguf", work / f"llama-cpp-{kind}.gguf"
                for label, argv in (
                        (f"lmconvert {kind}", [py, "-m", "lmconvert.cli", "convert", str(f32), str(ours), "--quant",
                                               kind]),
                        (f"llama.cpp {kind}", [py, "-c", LLAMA_QUANTIZE, str(f32), str(theirs), str(FTYPES[kind])])):
                    prepare(f32.parent, cached=True)
                    m = measure(label, argv, env={"OMP_NUM_THREADS": "1"})
                    runs.setdefault(label, []).append(m)
                    print(f"  {label}: {m.seconds:.2f} s, CPU {m.cpu_seconds:.2f} s, "
                          f"peak RSS {m.peak_rss / 1e6:.0f} MB", flush=True)
                subprocess.run([py, "-c", SAME_BYTES, str(ours), str(theirs)], check=True)
                ours.unlink()
                theirs.unlink()
        rows = [["step", "median s", "min-max s", "CPU s", "peak RSS MB", "time / llama.cpp", "CPU / llama.cpp",
                 "RSS / llama.cpp"]]
        seconds = {label: statistics.median(r.seconds for r in rs) for label, rs in runs.items()}
        cpu = {label: statistics.median(r.cpu_seconds for r in rs) for label, rs in runs.items()}
        rss = {label: max(r.peak_rss for r in rs) for label, rs in runs.items()}
        for label, rs in runs.items():
            peer = f"llama.cpp {label.split()[-1]}"
            rows.append([label, f"{seconds[label]:.2f}",
                         f"{min(r.seconds for r in rs):.2f}-{max(r.seconds for r in rs):.2f}",
                         f"{cpu[label]:.2f}", f"{rss[label] / 1e6:.0f}", f"{seconds[label] / seconds[peer]:.2f}",
                         f"{cpu[label] / cpu[peer]:.2f}", f"{rss[label] / rss[peer]:.2f}"])
        print(f"input: {f32.stat().st_size / 1e9:.2f} GB f32 GGUF, {args.layers} layers, in the page cache; "
              f"median of {args.repeat} rounds; every pair of files byte-identical")
        print(table(rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
