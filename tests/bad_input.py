"""Helpers for the bad-input tests: run the CLI as a user does and check the failure is clean."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from lmconvert.cli import main


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def lmconvert(*args: object) -> Result:
    """In-process, as the console script runs it (fast)."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # an escaped exception is a bug, not a clean failure
    return Result(result.exit_code, result.stdout, result.stderr)


def lmconvert_process(*args: object, env: dict[str, str] | None = None, **kwargs: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lmconvert.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, **kwargs)


def assert_clean_failure(proc: Result, *fragments: str, out: Path | None = None, code: int = 2) -> str:
    """Exit code, one line on stderr naming what is wrong, no traceback, nothing at OUT."""
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err and err.startswith("lmconvert: error: ")
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    if out is not None:
        assert not out.exists()
        assert not list(out.parent.glob(f".{out.name}.lmconvert-*")), "temporary files left behind"
    return err


def lmconvert_run(*args: object, umask: int | None = None, **kwargs: object) -> Result:
    """A real `lmconvert` process, run to the end (with `umask`, if given)."""
    if umask is not None:
        kwargs["preexec_fn"] = lambda: os.umask(umask)
    proc = lmconvert_process(*args, **kwargs)
    stdout, stderr = proc.communicate()
    return Result(proc.returncode, stdout, stderr)


def dead_pid() -> int:
    """The pid of a process that has ended: what a killed run leaves in its temporary names."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def lmconvert_peak(*args: object) -> tuple[Result, int]:
    """As a separate process, as the console script runs it; also its peak RSS in bytes (the
    child's ru_maxrss from wait4, as bench/verify_memory.py measures it)."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "lmconvert.cli", *map(str, args)], stdout=out, stderr=err,
                                text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        return Result(proc.returncode, out.read(), err.read()), usage.ru_maxrss * 1024


# A tiny llama as llama.cpp would describe it: 2 layers, d_model 64, 4 heads (2 KV), d_ff 96, vocab 128.
TINY_GGUF: dict[str, object] = {
    "general.name": "tiny", "llama.context_length": 128, "llama.embedding_length": 64, "llama.block_count": 2,
    "llama.feed_forward_length": 96, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
    "llama.attention.layer_norm_rms_epsilon": 1e-6, "llama.rope.freq_base": 10000.0, "llama.vocab_size": 128,
}
_GGUF_LAYER = {"attn_norm": (64,), "attn_q": (64, 64), "attn_k": (32, 64), "attn_v": (32, 64),
               "attn_output": (64, 64), "ffn_norm": (64,), "ffn_gate": (96, 64), "ffn_up": (96, 64),
               "ffn_down": (64, 96)}


def gguf_value(writer: object, key: str, value: object) -> None:
    """Add one metadata value in the GGUF type a Python value of its kind gets (ints beyond int32
    as 64-bit), or in an explicit type given as (value, GGUFValueType)."""
    import gguf

    if isinstance(value, tuple):
        value, kind = value
    elif isinstance(value, bool):
        kind = gguf.GGUFValueType.BOOL
    elif isinstance(value, int):
        kind = gguf.GGUFValueType.INT32 if -2**31 <= value < 2**31 else \
            gguf.GGUFValueType.UINT64 if value >= 0 else gguf.GGUFValueType.INT64
    elif isinstance(value, float):
        kind = gguf.GGUFValueType.FLOAT32
    elif isinstance(value, list):
        writer.add_array(key, value)  # type: ignore[attr-defined]
        return
    else:
        kind = gguf.GGUFValueType.STRING
    writer.add_key_value(key, value, kind)  # type: ignore[attr-defined]


def write_tiny_gguf(path: Path, changes: dict[str, object] | None = None, seed: int = 0) -> Path:
    """TINY_GGUF's metadata with `changes` (None deletes a key), and random F32 tensors under
    llama.cpp's names and shapes for the original metadata."""
    import gguf
    import numpy as np

    meta = {**TINY_GGUF, **(changes or {})}
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in meta.items():
        if value is not None:
            gguf_value(writer, key, value)
    rng = np.random.default_rng(seed)
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (128, 64), "output_norm.weight": (64,),
                                          "output.weight": (128, 64)}
    for i in range(2):
        shapes.update({f"blk.{i}.{name}.weight": shape for name, shape in _GGUF_LAYER.items()})
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# A tiny Meta LLaMA checkpoint, one rank: dim 64, 2 layers, 4 heads (2 KV), vocab 128, multiple_of 32
# (Meta's FFN size int(8 * 64 / 3) = 170, rounded up to 192).
TINY_PARAMS: dict[str, object] = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 128,
                                  "multiple_of": 32, "norm_eps": 1e-5}
_META_LAYER = {"attention.wq": (64, 64), "attention.wk": (32, 64), "attention.wv": (32, 64),
               "attention.wo": (64, 64), "feed_forward.w1": (192, 64), "feed_forward.w2": (64, 192),
               "feed_forward.w3": (192, 64), "attention_norm": (64,), "ffn_norm": (64,)}


def write_tiny_meta(directory: Path, params: object = None, seed: int = 0) -> Path:
    """consolidated.00.pth with random tensors in Meta's names and shapes for TINY_PARAMS, and
    params.json holding `params` (default TINY_PARAMS) as JSON."""
    import json

    import torch

    generator = torch.Generator().manual_seed(seed)
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (128, 64), "norm.weight": (64,),
                                          "output.weight": (128, 64)}
    for i in range(2):
        shapes.update({f"layers.{i}.{name}.weight": shape for name, shape in _META_LAYER.items()})
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({n: torch.randn(s, generator=generator) for n, s in shapes.items()}, directory / "consolidated.00.pth")
    (directory / "params.json").write_text(json.dumps(TINY_PARAMS if params is None else params))
    return directory


LEAVE = """
import os, shutil, signal, sys
from pathlib import Path
from lmconvert.formats.temporary import PAYLOAD, create
out, kind, how = Path(sys.argv[1]).resolve(), sys.argv[2], sys.argv[3]
tmp = create(out, kind, str(out))
if how == "move":  # killed between moving OUT aside and renaming the new one in
    os.rename(out, tmp / PAYLOAD)
elif how == "copy":  # killed before the replaced OUT was removed
    shutil.copytree(out, tmp / PAYLOAD)
elif how == "file":  # killed while writing a one-file output
    (tmp / PAYLOAD).write_bytes(b"half")
print(tmp, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def left_by_a_killed_run(out: Path, kind: str, how: str) -> Path:
    """The temporary a run of lmconvert leaves beside `out` when it is killed (SIGKILL, so nothing
    of it cleans up): made by lmconvert's own code in a process that is then gone. `how`: move or
    copy OUT into it, write a half file, or nothing."""
    proc = subprocess.run([sys.executable, "-c", LEAVE, str(out), kind, how], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    return Path(proc.stdout.strip())
