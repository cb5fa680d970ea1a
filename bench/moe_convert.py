"""Mixture-of-experts conversion: time and peak RSS against `cp -r`, beside a dense checkpoint of
the same bytes, as the expert count doubles.

Generates random bf16 Qwen3-MoE-shaped checkpoints (hidden 1024, experts 256 wide, 32000-token
vocabulary) with E and 2E experts per layer, in the Hub's layout (one tensor per expert and
projection) and in transformers 5's fused layout (one [experts, 2 * width, hidden] gate_up_proj and
one down_proj per layer), and a dense Qwen3 whose FFN is as wide as all the experts together (the
same bytes in ~9 tensors per layer), then times, each in its own process with its input in the
page cache: cp -r, lmconvert HF -> canonical, lmconvert canonical -> HF; the three layouts take
turns in every round, so that the machine's drift hits each alike. Tensors are laid out in the
order their source bytes lie and moved as runs of bytes (an expert's rows of a fused tensor are
part of a run too), a chunk per worker thread at a time, so peak RSS follows neither the
checkpoint nor the expert count, and the time per byte not the tensor count.

    python bench/moe_convert.py [--work DIR] [--experts 64] [--layers 8] [--repeat 3]

Shards of 1 GB, in and out, as bench/convert.py writes them.
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

from common import Measured, dir_bytes, measure, prepare, table

HIDDEN, WIDTH, VOCAB, HEADS, KV, HEAD_DIM = 1024, 256, 32000, 16, 4, 64
SHARDS = ["--max-shard-size", "1GB"]  # as bench/convert.py writes, so that the ratios compare
LAYOUTS = ("hub", "fused", "dense")


def config(layers: int, experts: int, dense: bool = False) -> dict:
    """Qwen3-MoE's, or (`dense`) Qwen3's with one FFN as wide as all the experts: the same bytes in
    ~9 tensors per layer instead of ~3 per expert, to compare against in the same run."""
    moe = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "intermediate_size": 4 * HIDDEN,
           "moe_intermediate_size": WIDTH, "num_experts": experts, "num_experts_per_tok": 8, "norm_topk_prob": True}
    return {**({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "intermediate_size": experts * WIDTH}
               if dense else moe),
            "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": layers, "num_attention_heads": HEADS,
            "num_key_value_heads": KV, "head_dim": HEAD_DIM, "max_position_embeddings": 4096,
            "tie_word_embeddings": False, "dtype": "bfloat16", "rope_parameters": {"rope_type": "default",
                                                                                "rope_theta": 1e6}}


def shapes(layers: int, experts: int, layout: str) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}"
        out.update({f"{p}.input_layernorm.weight": (HIDDEN,), f"{p}.post_attention_layernorm.weight": (HIDDEN,),
                    f"{p}.self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
                    f"{p}.self_attn.k_proj.weight": (KV * HEAD_DIM, HIDDEN),
                    f"{p}.self_attn.v_proj.weight": (KV * HEAD_DIM, HIDDEN),
                    f"{p}.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
                    f"{p}.self_attn.q_norm.weight": (HEAD_DIM,), f"{p}.self_attn.k_norm.weight": (HEAD_DIM,)})
        if layout == "dense":
            out.update({f"{p}.mlp.gate_proj.weight": (experts * WIDTH, HIDDEN),
                        f"{p}.mlp.up_proj.weight": (experts * WIDTH, HIDDEN),
                        f"{p}.mlp.down_proj.weight": (HIDDEN, experts * WIDTH)})
            continue
        out[f"{p}.mlp.gate.weight"] = (experts, HIDDEN)
        if layout == "fused":
            out[f"{p}.mlp.experts.gate_up_proj"] = (experts, 2 * WIDTH, HIDDEN)
            out[f"{p}.mlp.experts.down_proj"] = (experts, HIDDEN, WIDTH)
        else:
            for e in range(experts):
                out.update({f"{p}.mlp.experts.{e}.gate_proj.weight": (WIDTH, HIDDEN),
                            f"{p}.mlp.experts.{e}.up_proj.weight": (WIDTH, HIDDEN),
                            f"{p}.mlp.experts.{e}.down_proj.weight": (HIDDEN, WIDTH)})
    out.update({"model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)})
    return out


def write(directory: Path, layers: int, experts: int, layout: str) -> None:
    """In a child process, so that this one never holds the weights: shards of about 1 GB."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from moe_convert import _write; "
            f"_write({str(directory)!r}, {layers}, {experts}, {layout!r})")
    subprocess.run([sys.executable, "-c", code], check=True)


def _write(directory: str, layers: int, experts: int, layout: str) -> None:
    import numpy as np
    from safetensors.torch import save

    root = Path(directory)
    root.mkdir(parents=True)
    generator = np.random.default_rng(0)
    groups: list[dict[str, tuple[int, ...]]] = [{}]
    size = 0
    for name, shape in shapes(layers, experts, layout).items():
        if size > 10**9:
            groups.append({})
            size = 0
        groups[-1][name] = shape
        size += int(np.prod(shape)) * 2
    weight_map, total = {}, 0
    for i, group in enumerate(groups, start=1):
        file = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: _random_bf16(generator, s) for n, s in group.items()}
        # one write of the whole file, as a download writes it: safetensors' save_file writes tensor by
        # tensor, and this kernel's page cache then holds thousands of small tensors' files in small
        # folios, which read back ~35% slower (cat of the 64-expert files: 0.40 s, against 0.29 s for
        # the same bytes written at once), a cost of how the benchmark made its input, not of conversion
        (root / file).write_bytes(save(tensors, metadata={"format": "pt"}))
        total += sum(t.numel() * 2 for t in tensors.values())
        weight_map.update(dict.fromkeys(group, file))
        del tensors
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}, indent=2))
    (root / "config.json").write_text(json.dumps(config(layers, experts, layout == "dense"), indent=2))


def _random_bf16(generator, shape: tuple[int, ...]):  # noqa: ANN001, ANN202 - numpy/torch, imported in the child
    """Random finite bf16 values, |x| < 2: random bits with the exponent's top bit cleared. A
    conversion that copies bytes does not care what they mean, and this is 4-5x faster than
    torch.randn, which decides how long a 6 GB checkpoint takes to make."""
    import numpy as np
    import torch

    bits = generator.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    bits &= 0xBFFF
    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    py = sys.executable
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "lmconvert", quiet=1)  # as bench/convert.py does
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="lmconvert-moe-bench-"))
    rows = [["layout", "experts", "tensors", "size", "step", "median s", "min-max s", "CPU s", "x cp",
             "peak RSS MB"]]
    try:
        for experts in (args.experts, 2 * args.experts):
            sources = {layout: work / layout for layout in LAYOUTS}
            for layout, src in sources.items():
                write(src, args.layers, experts, layout)
            inputs = (*sources.values(), work / "canon")
            runs: dict[tuple[str, str], list[Measured]] = {}
            for _ in range(args.repeat):  # the layouts alternate too, so that the machine's drift hits all
                for layout, src in sources.items():
                    for label, argv, source, output in steps(py, src, work):
                        prepare(source, True, evict=tuple(set(inputs) - {source}))
                        runs.setdefault((layout, label), []).append(measure(label, argv))
                        if label != "HF -> canonical":
                            shutil.rmtree(output)
                    shutil.rmtree(work / "canon")
            for layout, src in sources.items():
                cp = statistics.median(r.seconds for r in runs[layout, "cp -r"])
                tensors = len(json.loads((src / "model.safetensors.index.json").read_text())["weight_map"])
                for label in ("cp -r", "HF -> canonical", "canonical -> HF"):
                    measured = runs[layout, label]
                    seconds = statistics.median(r.seconds for r in measured)
                    spread = f"{min(r.seconds for r in measured):.2f}-{max(r.seconds for r in measured):.2f}"
                    rows.append([layout, str(experts), str(tensors), f"{dir_bytes(src) / 1e9:.2f} GB", label,
                                 f"{seconds:.2f}", spread, f"{statistics.median(r.cpu_seconds for r in measured):.2f}",
                                 f"{seconds / cp:.2f}", f"{max(r.peak_rss for r in measured) / 1e6:.0f}"])
                shutil.rmtree(src)
            print(table(rows), flush=True)  # so far, in case a later configuration fails
        print(table(rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def steps(py: str, src: Path, work: Path) -> list[tuple[str, list[str], Path, Path]]:
    """(label, argv, input, output) of each timed step."""
    canon, back = work / "canon", work / "back"
    return [("cp -r", ["cp", "-r", str(src), str(work / "copy")], src, work / "copy"),
            ("HF -> canonical", [py, "-m", "lmconvert.cli", "convert", str(src), str(canon), *SHARDS], src, canon),
            ("canonical -> HF", [py, "-m", "lmconvert.cli", "convert", str(canon), str(back), "--to", "hf", *SHARDS],
             canon, back)]


if __name__ == "__main__":
    main()
