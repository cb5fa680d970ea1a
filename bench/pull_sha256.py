"""What checking a pull's files against the sha256 the Hub announces costs a conversion.

`pull` converts with `announced=`: the workers that move tensors feed each chunk they read to its
file's sha256 when it comes next in the file, and re-read (from the page cache) what came too
early (lmconvert/formats/whole_file.py). This times HF -> canonical of bench/common.py's
LLaMA-3.2-1B-shaped bf16 checkpoint (2.47 GB) without and with the check, from the page cache,
in 3 shards (one worker per file, mostly) and in 1 (workers share the file, so runs come out of
order and are read again), beside hashlib's sha256 of the same files in one pass: a separate
pass's floor.

    python bench/pull_sha256.py [--work DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from common import Measured, make_checkpoint, measure, prepare, table

ROOT = Path(__file__).resolve().parents[1]
CONVERT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from lmconvert.convert import to_canonical
from lmconvert.formats.whole_file import Announced
src, out = Path(sys.argv[2]), Path(sys.argv[3])
announced = [Announced(src / name, sha, name) for name, sha in json.loads(sys.argv[4]).items()]
to_canonical(src, out, announced=announced)
"""

SHA256 = """
import hashlib, sys
from pathlib import Path
for path in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
"""


def sha256s(src: Path) -> dict[str, str]:
    sums = {}
    for path in sorted(src.glob("*.safetensors")):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
        sums[path.name] = h.hexdigest()
    return sums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each step's median is reported")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-bench-"))
    try:
        rows = [["shards", "step", "median s", "min-max s", "CPU s"]]
        for shards in (3, 1):
            src = make_checkpoint(work / f"src{shards}", shards=shards)
            sums = json.dumps(sha256s(src))
            out = work / "out"
            steps = [("HF -> canonical", [sys.executable, "-c", CONVERT, str(ROOT), str(src), str(out), "{}"]),
                     ("HF -> canonical, sha256 checked", [sys.executable, "-c", CONVERT, str(ROOT), str(src),
                                                          str(out), sums]),
                     ("sha256 of the shards, one pass", [sys.executable, "-c", SHA256, str(src)])]
            runs: dict[str, list[Measured]] = {label: [] for label, _ in steps}
            for _ in range(args.repeat):
                for label, argv in steps:
                    prepare(src, cached=True)
                    runs[label].append(measure(label, argv))
                    shutil.rmtree(out, ignore_errors=True)
            for label, rs in runs.items():
                seconds = [r.seconds for r in rs]
                rows.append([str(shards), label, f"{statistics.median(seconds):.2f}",
                             f"{min(seconds):.2f}-{max(seconds):.2f}",
                             f"{statistics.median(r.cpu_seconds for r in rs):.2f}"])
            shutil.rmtree(src)
        print(table(rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
