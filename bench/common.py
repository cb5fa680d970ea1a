"""Shared pieces of the benchmarks: a LLaMA-3.2-1B-shaped random checkpoint and a runner that
measures each contender's wall time and peak RSS in its own process.

A child's peak RSS (wait4's ru_maxrss) starts from its parent's RSS at fork, so the process that
measures must stay small: it imports no torch, and the checkpoint is generated in a child too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000,
    "eos_token_id": 128001, "dtype": "bfloat16",
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}


def llama_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    d, ff, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                       p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                       p + "mlp.gate_proj.weight": (ff, d), p + "mlp.up_proj.weight": (ff, d),
                       p + "mlp.down_proj.weight": (d, ff), p + "input_layernorm.weight": (d,),
                       p + "post_attention_layernorm.weight": (d,)})
    return shapes


def make_checkpoint(directory: Path, n_layers: int = 16, shards: int = 3, seed: int = 0) -> Path:
    """Random bf16 weights with the real tensor shapes, sharded like the Hub's files (written by a
    child process, so that this one never holds them)."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from common import _write; "
            f"_write({str(directory)!r}, {n_layers}, {shards}, {seed})")
    subprocess.run([sys.executable, "-c", code], check=True)
    return directory


def _write(directory: str, n_layers: int, shards: int, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    directory = Path(directory)
    config = {**LLAMA_3_2_1B, "num_hidden_layers": n_layers}
    directory.mkdir(parents=True, exist_ok=True)
    shapes = llama_shapes(config)
    total = sum(torch.Size(shape).numel() * 2 for shape in shapes.values())
    budget = total / shards
    generator = torch.Generator().manual_seed(seed)
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        if groups[-1] and size + torch.Size(shape).numel() * 2 > budget and len(groups) < shards:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += torch.Size(shape).numel() * 2
    weight_map = {}
    for i, names in enumerate(groups, start=1):
        file = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: (torch.randn(shapes[n], generator=generator) * 0.02).to(torch.bfloat16) for n in names}
        save_file(tensors, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in names})
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def write_sharded(out: Path, config: dict, make: Callable[[str, tuple[int, ...]], dict], shards: int = 3) -> None:
    """A checkpoint of `config`'s LLaMA shapes in `shards` files (made in the calling child process):
    `make(name, shape)` gives the tensors stored for each weight (itself, or its quantized parts)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    names = list(llama_shapes(config).items())
    per_shard = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for name, shape in names[i * per_shard:(i + 1) * per_shard]:
            tensors.update(make(name, shape))
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in tensors})
        del tensors
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(config, indent=2))


def dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


@dataclass
class Measured:
    label: str
    seconds: float
    peak_rss: int  # bytes
    cpu_seconds: float = 0.0  # user + system, all threads
    output: str = ""  # what it printed, stdout and stderr together


def measure(label: str, argv: list[str], env: dict[str, str] | None = None) -> Measured:
    """Run argv as a child; wall time and the child's own peak RSS (from wait4). Its output (progress
    bars, "wrote ...") is kept aside and shown only if it fails."""
    with tempfile.TemporaryFile() as output:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=output, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        output.seek(0)
        text = output.read().decode(errors="replace")
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"{label} failed: {' '.join(argv)}\n{text}")
    return Measured(label, seconds, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime, text)


# On this project's VMs, memory freed is handed back to the host (virtio-balloon free page
# reporting) about 2 s after it is freed; a step that writes while that happens faults on the host
# for every page it reuses. The same export, run six times in a row, took 0.60-1.56 s; with this
# wait before each run, 0.56-0.60 s.
REPORTING_DELAY = 2.5


def drop(directory: Path) -> None:
    """Take a directory's files out of the page cache (posix_fadvise DONTNEED, which needs no
    privileges; dirty pages must have been written back first, by `sync`)."""
    for p in directory.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def prepare(directory: Path, cached: bool = True, evict: tuple[Path, ...] = ()) -> None:
    """Bring every contender to the same start: earlier steps' dirty pages flushed, memory freed by
    earlier steps already handed back to the host, the memory this step's output will fill
    recently used, and its input either in the page cache (`cached`) or only on disk.

    The recently used memory matters on a VM with free page reporting: writing into memory the
    host has taken back costs a fault on the host per page, which made the same `cp -r` take 0.6 s
    or 3.5 s. So a copy of the input is written and deleted right before each step, whatever the
    step. An input that is not `cached` is then dropped from the page cache (posix_fadvise
    DONTNEED, which needs no privileges), so that the step reads it from the disk. Directories in
    `evict` (other steps' inputs) leave the page cache first, so that a step over several gigabytes
    does not start with the cache full of them, to be reclaimed while it writes."""
    subprocess.run(["sync"], check=True)
    for other in evict:
        if other.exists():
            drop(other)
    time.sleep(REPORTING_DELAY)
    scratch = directory.parent / f".{directory.name}.scratch"
    shutil.copytree(directory, scratch)
    shutil.rmtree(scratch)
    if not cached:
        drop(directory)
        return
    for p in directory.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def measure_rounds(steps: list[tuple[str, list[str], Path, list[Path]]], repeat: int,
                   cached: bool) -> dict[str, list[Measured]]:
    """(label, command, its input, outputs to delete once measured) steps, run `repeat` times in
    rounds, each from the same state (`prepare`): every run's figures, by label."""
    runs: dict[str, list[Measured]] = {label: [] for label, *_ in steps}
    for _ in range(repeat):
        for label, argv, source, outputs in steps:
            prepare(source, cached)
            runs[label].append(measure(label, argv))
            for path in outputs:  # free their page cache: every step starts with the same memory
                shutil.rmtree(path)
    return runs


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
