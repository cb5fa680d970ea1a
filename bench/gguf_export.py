"""GGUF out against llama.cpp's own converter, in one run.

Generates the LLaMA-3.2-1B-shaped random bf16 checkpoint of bench/convert.py (1.24 B parameters,
~2.5 GB) with a small SentencePiece tokenizer, converts it to canonical once (not timed;
`bench/convert.py` times that), then times, each in its own process and alternating in rounds:
lmconvert canonical -> GGUF and llama.cpp's `convert_hf_to_gguf.py` HF -> GGUF, each as f16 and
as q8_0. Prints the median wall time (and
spread), CPU time, peak RSS and the ratios lmconvert / llama.cpp.

llama.cpp's converter is taken from the llama-cpp-python sdist (it vendors llama.cpp, the converter
and its own gguf-py); `--llama-cpp DIR` points at an unpacked llama.cpp instead.

    python bench/gguf_export.py [--work DIR] [--repeat 3] [--llama-cpp DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from common import Measured, dir_bytes, make_checkpoint, measure, prepare, table

SDIST = "llama-cpp-python==0.3.36"


def llama_cpp_source(work: Path) -> Path:
    """llama.cpp's tree as the sdist vendors it (convert_hf_to_gguf.py, conversion/, gguf-py/)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d",
                    str(work), SDIST], check=True)
    archive = next(work.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name and (
            "convert_hf_to_gguf.py" in m.name or "/conversion/" in m.name or "/gguf-py/" in m.name)]
        tar.extractall(work, members=members, filter="data")
    return next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))


def add_tokenizer(directory: Path) -> None:
    """Both converters need a tokenizer: a small SentencePiece one, padded by each to the 128256
    rows of the embedding as llama.cpp's converter pads it."""
    import json

    import sentencepiece as spm

    corpus = directory.parent / "corpus.txt"
    corpus.write_text("\n".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(200)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(directory / "tokenizer"), vocab_size=400,
                                   model_type="bpe", byte_fallback=True, minloglevel=2)
    (directory / "tokenizer.vocab").unlink()
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))


def rounds(steps: list[tuple[str, list[str], Path, Path]], repeat: int) -> str:
    runs: dict[str, list[Measured]] = {label: [] for label, *_ in steps}
    for _ in range(repeat):
        for label, argv, source, output in steps:
            prepare(source, cached=True)
            runs[label].append(measure(label, argv))
            output.unlink()
    rows = [["step", "median s", "min-max s", "CPU s", "peak RSS MB", "time / llama.cpp", "RSS / llama.cpp"]]
    seconds = {label: statistics.median(r.seconds for r in rs) for label, rs in runs.items()}
    rss = {label: max(r.peak_rss for r in rs) for label, rs in runs.items()}
    for label, rs in runs.items():
        peer = f"llama.cpp {label.split()[-1]}"
        spread = f"{min(r.seconds for r in rs):.2f}-{max(r.seconds for r in rs):.2f}"
        rows.append([label, f"{seconds[label]:.2f}", spread,
                     f"{statistics.median(r.cpu_seconds for r in rs):.2f}", f"{rss[label] / 1e6:.0f}",
                     f"{seconds[label] / seconds[peer]:.2f}", f"{rss[label] / rss[peer]:.2f}"])
    return table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each step's median is reported")
    parser.add_argument("--llama-cpp", type=Path, help="an unpacked llama.cpp tree (default: from the sdist)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-bench-gguf-"))
    try:
        tree = args.llama_cpp or llama_cpp_source(work / "sdist")
        src = make_checkpoint(work / "src")
        add_tokenizer(src)
        subprocess.run([sys.executable, "-m", "lmconvert.cli", "convert", str(src), str(work / "canonical")],
                       check=True, capture_output=True)
        py, steps = sys.executable, []
        for quant in ("f16", "q8_0"):
            ours, theirs = work / f"lmconvert-{quant}.gguf", work / f"llama-cpp-{quant}.gguf"
            steps += [
                (f"lmconvert {quant}", [py, "-m", "lmconvert.cli", "convert", str(work / "canonical"), str(ours),
                                        "--to", "gguf", "--quant", quant], work / "canonical", ours),
                (f"llama.cpp {quant}", [py, str(tree / "convert_hf_to_gguf.py"), str(src), "--outfile", str(theirs),
                                        "--outtype", quant], src, theirs),
            ]
        print(f"checkpoint: {dir_bytes(src) / 1e9:.2f} GB bf16, 16 layers; inputs in the page cache; "
              f"median of {args.repeat} rounds")
        print(rounds(steps, args.repeat))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
