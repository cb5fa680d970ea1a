"""Where a mixture of experts' conversion spends the time a dense one of the same bytes does not:
opening and planning, writing the shards, writing the description, in one process.

Generates the Hub-layout Qwen3-MoE checkpoint and the dense Qwen3 of the same bytes that
bench/moe_convert.py times (E experts per layer), then converts each HF -> canonical in this
process, alternating them, input in the page cache, and prints each phase's median and range and
the process CPU time. In one process, imports and start-up are out of the picture: what differs
is what is done per tensor.

    python bench/moe_phases.py [--work DIR] [--experts 64] [--layers 28] [--repeat 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import table
from moe_convert import write

PHASES = ("total", "open and plan", "shards", "description", "CPU")


def convert_once(src: Path, out: Path) -> tuple[float, ...]:
    """(total, open and plan, shards, description, CPU) seconds of one HF -> canonical."""
    import lmconvert.convert.ingest as ingest

    marks: dict[str, float] = {}
    write_shards = ingest.write_shards

    def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - write_shards' own
        marks["start"] = time.perf_counter()
        try:
            return write_shards(*args, **kwargs)
        finally:
            marks["end"] = time.perf_counter()

    ingest.write_shards = timed
    try:
        start, cpu = time.perf_counter(), time.process_time()
        ingest.to_canonical(src, out, max_shard_bytes=10**9)
        end = time.perf_counter()
    finally:
        ingest.write_shards = write_shards
    return (end - start, marks["start"] - start, marks["end"] - marks["start"], end - marks["end"],
            time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-moe-phases-"))
    try:
        sources = {layout: work / layout for layout in ("hub", "dense")}
        for layout, src in sources.items():
            write(src, args.layers, args.experts, layout)
        runs: dict[str, list[tuple[float, ...]]] = {layout: [] for layout in sources}
        for _ in range(args.repeat):
            for layout, src in sources.items():
                for shard in src.glob("*.safetensors"):  # into the page cache
                    shard.read_bytes()
                subprocess.run(["sync"], check=True)
                time.sleep(2.5)  # earlier writeback and free page reporting settle
                runs[layout].append(convert_once(src, work / "out"))
                shutil.rmtree(work / "out")
        rows = [["layout", *(f"{p} s" for p in PHASES)]]
        for layout, measured in runs.items():
            columns = list(zip(*measured, strict=True))
            rows.append([layout, *(f"{statistics.median(c):.3f} ({min(c):.2f}-{max(c):.2f})" for c in columns)])
        print(table(rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
