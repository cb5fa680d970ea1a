"""Tensor parallelism at small scale: the LLaMA-3.2-1B-shaped checkpoint on 1, 2 and 4 gloo ranks (CPU),
against the single-process load in the same run. Per rank: the bytes of weights it holds, its peak RSS,
the time to load its slices, a forward pass and a cached decoding step; the ratios to the single process.

These are the small-scale checks of docs/scaling.md: weights per rank should be (sharded)/N +
(replicated), measured here on every rank; time on CPU shows the collectives' cost, not a GPU's speed
(the VM has 2 cores, so 4 ranks share them two to a core: their times are an upper bound).

    python bench/tensor_parallel.py [--work DIR] [--tokens 32] [--steps 8] [--repeat 3] [--ranks 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import LLAMA_3_2_1B, llama_shapes, make_checkpoint, table

ROOT = Path(__file__).resolve().parents[1]


def rank_job(path: str, tokens: int, steps: int, repeat: int, parallel: bool) -> None:
    """One rank's measurements (or the single process's), printed by rank 0 as one JSON line."""
    import resource
    import time

    import torch
    import torch.distributed as dist

    import lmconvert
    from lmconvert.runtime.tensor_parallel import local_bytes

    size = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    sync = dist.barrier if parallel else (lambda: None)
    start = time.perf_counter()
    model = lmconvert.load(path, dtype=torch.bfloat16, tp=parallel or None)
    sync()
    load_s = time.perf_counter() - start
    ids = torch.randint(0, LLAMA_3_2_1B["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(0))
    forward, decode = [], []
    with torch.no_grad():
        for _ in range(repeat):
            sync()
            start = time.perf_counter()
            model(ids)
            sync()
            forward.append(time.perf_counter() - start)
        cache = model.new_cache()
        model(ids, cache=cache)
        token = ids[:, -1:]
        for _ in range(steps):
            sync()
            start = time.perf_counter()
            token = model(token, cache=cache)[:, -1:].argmax(-1)
            sync()
            decode.append(time.perf_counter() - start)
    mine = {"bytes": local_bytes(model), "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "load_s": load_s, "forward_s": statistics.median(forward), "forward_spread": max(forward) - min(forward),
            "decode_s": statistics.median(decode), "decode_spread": max(decode) - min(decode)}
    every = [mine]
    if parallel:
        every = [None] * size
        dist.all_gather_object(every, mine)
    if not parallel or dist.get_rank() == 0:
        print("RESULT " + json.dumps(every), flush=True)
    if parallel:  # leave without the interpreter's teardown, as the CLI's ranks do (docs/scaling.md)
        dist.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)


def run(path: Path, ranks: int | None, args: argparse.Namespace) -> list[dict]:
    """The single process (`ranks` None) or `torchrun` over `ranks` ranks; each rank's figures."""
    job = [str(Path(__file__).resolve()), "--rank-job", str(path), "--tokens", str(args.tokens), "--steps",
           str(args.steps), "--repeat", str(args.repeat)]
    launcher = [sys.executable] if ranks is None else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                       "--nproc-per-node", str(ranks)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // (ranks or 1)))}
    out = subprocess.run([*launcher, *job, *(["--parallel"] if ranks else [])], capture_output=True, text=True,
                         env=env, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise SystemExit(f"{'single' if ranks is None else f'{ranks} ranks'} failed:\n{out.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def planned_bytes(ranks: int) -> int:
    """Weights per rank by the plan: every matrix and the (tied) embedding split, the norms whole."""
    config = LLAMA_3_2_1B
    total = sharded = 0
    for shape in llama_shapes(config).values():
        n = 2
        for s in shape:
            n *= s
        total += n
        sharded += n if len(shape) == 2 else 0
    return sharded // ranks + (total - sharded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rank-job")
    parser.add_argument("--parallel", action="store_true")
    args = parser.parse_args()
    if args.rank_job:
        rank_job(args.rank_job, args.tokens, args.steps, args.repeat, args.parallel)
        return
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        path = make_checkpoint(Path(tmp) / "llama-1b")
        single = run(path, None, args)[0]
        rows = [["ranks", "weights/rank", "planned", "peak RSS/rank", "load s", "forward s (spread)",
                 "decode s/token (spread)", "weights x", "forward x", "decode x"]]

        def row(label: str, r: dict, planned: int) -> list[str]:
            return [label, f"{r['bytes'] / 2**30:.3f} GiB", f"{planned / 2**30:.3f} GiB",
                    f"{r['peak_rss'] / 2**30:.2f} GiB", f"{r['load_s']:.1f}",
                    f"{r['forward_s']:.2f} ({r['forward_spread']:.2f})",
                    f"{r['decode_s']:.3f} ({r['decode_spread']:.3f})", f"{r['bytes'] / single['bytes']:.3f}",
                    f"{r['forward_s'] / single['forward_s']:.2f}", f"{r['decode_s'] / single['decode_s']:.2f}"]

        rows.append(row("1 (no TP)", single, planned_bytes(1)))
        for ranks in args.ranks:
            every = run(path, ranks, args)
            worst = max(every, key=lambda r: r["peak_rss"])
            rows.append(row(f"{ranks} (gloo)", {**worst, "bytes": max(r["bytes"] for r in every),
                                                "forward_s": max(r["forward_s"] for r in every),
                                                "decode_s": max(r["decode_s"] for r in every)}, planned_bytes(ranks)))
        print(f"LLaMA-3.2-1B shape, bf16, {args.tokens} tokens forward, {args.steps} cached decoding steps; "
              f"{os.cpu_count()} CPU cores; each TP row: the worst rank")
        print(table(rows))


if __name__ == "__main__":
    main()
