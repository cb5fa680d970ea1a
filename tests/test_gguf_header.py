"""GGUF reading bounded and checked as safetensors reading is (issue 28, class 3): every count
and length in the header against the bytes left, every tensor's extent aligned, inside the data
section and apart from the others, before anything is allocated or read. Real files throughout,
written with gguf's GGUFWriter and then patched in place where a writer would refuse."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from bad_input import Result, assert_clean_failure, lmconvert, write_tiny_gguf

MB = 2**20


def patched(path: Path, tensor: str | None = None, field: str | None = None, part: int = 0, value: int = 0,
            delta: int | None = None) -> Path:
    """`path` with one number of its header changed in place: part `part` of a tensor's table
    entry (2 n_dims, 3 dims, 4 type, 5 offset) or of a metadata field, set to `value` or moved by
    `delta`."""
    reader = gguf.GGUFReader(path, "r+")
    entry = next(t.field for t in reader.tensors if t.name == tensor) if tensor else reader.fields[str(field)]
    number = entry.parts[part]
    number[0] = int(number[0]) + delta if delta is not None else value
    reader.data.flush()
    del reader, entry, number
    return path


def rewritten(src: Path, out: Path, shapes: dict[str, tuple[int, ...]] | None = None, alignment: int | None = None,
              extra: dict[str, Any] | None = None) -> Path:
    """`src` written again by GGUFWriter: tensors given raw shapes, the data aligned to
    `alignment`, `extra` metadata (typed by the writer) added."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(out), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for name, f in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            array = f.types[0] == gguf.GGUFValueType.ARRAY
            writer.add_key_value(name, f.contents(), f.types[0], f.types[-1] if array else None)
    for key, value in (extra or {}).items():
        writer.add_array(key, value) if isinstance(value, (list, bytes)) else writer.add_string(key, value)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_shape=(shapes or {}).get(t.name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def offset_of(path: Path, tensor: str) -> int:
    """The tensor's offset in the data section, as its table entry states it."""
    return next(int(t.field.parts[5][0]) for t in gguf.GGUFReader(path).tensors if t.name == tensor)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "m.gguf")


def refused(path: Path, *fragments: str) -> str:
    out = path.parent / "out"
    return assert_clean_failure(lmconvert("convert", path, out), str(path), *fragments, out=out)


# ---------------------------------------------------------------- tensor extents


def test_misaligned_tensor_offset_is_refused(tiny: Path) -> None:
    """Before: read from 4 bytes further on, every weight shifted by one, and converted."""
    patched(tiny, "blk.0.attn_k.weight", part=5, delta=4)
    refused(tiny, "tensor 'blk.0.attn_k.weight'", "not a multiple of the file's alignment 32")


def test_offset_aligned_to_32_but_not_to_the_stated_alignment(tiny: Path, tmp_path: Path) -> None:
    path = rewritten(tiny, tmp_path / "a64.gguf", alignment=64)
    patched(path, "blk.1.ffn_up.weight", part=5, delta=32)
    refused(path, "tensor 'blk.1.ffn_up.weight'", "alignment 64")


def test_overlapping_tensors_are_refused(tiny: Path) -> None:
    """Before: k read as a copy of part of q."""
    q = offset_of(tiny, "blk.0.attn_q.weight")
    patched(tiny, "blk.0.attn_k.weight", part=5, value=q + 4096)
    err = refused(tiny, "'blk.0.attn_q.weight'", "'blk.0.attn_k.weight'", "overlap")
    assert "bytes 0 to 16384" in err or f"bytes {q} to {q + 16384}" in err, err


def test_tensor_past_the_end_of_the_data_section(tiny: Path) -> None:
    patched(tiny, "output_norm.weight", part=5, value=1 << 30)
    refused(tiny, "tensor 'output_norm.weight'", "of the data section, which holds", "truncated")


@pytest.mark.parametrize("alignment", [48, 0, 1 << 30])
def test_alignment_must_be_a_sane_power_of_two(tiny: Path, tmp_path: Path, alignment: int) -> None:
    path = rewritten(tiny, tmp_path / "a.gguf", alignment=64)
    refused(patched(path, field="general.alignment", part=3, value=alignment),
            f"general.alignment is {alignment}", "power of two")


def test_five_dimensional_tensor_is_refused_by_name(tiny: Path, tmp_path: Path) -> None:
    """Before: refused by a message about rotary pairs that named neither the file nor the tensor."""
    path = rewritten(tiny, tmp_path / "5d.gguf", shapes={"blk.0.attn_q.weight": (1, 1, 1, 64, 64)})
    refused(path, "tensor 'blk.0.attn_q.weight' has 5 dimensions", "at most 4")


@pytest.mark.parametrize(("part", "value", "fragment"), [
    (4, 99, "tensor 'output_norm.weight' has type id 99"),
    (3, 2**40, "tensor 'output_norm.weight' has a dimension of 1099511627776"),
    (2, 2**31, "tensor 'output_norm.weight' has 2147483648 dimensions"),
], ids=["type", "dimension", "n_dims"])
def test_tensor_table_entries_are_checked_by_name(tiny: Path, part: int, value: int, fragment: str) -> None:
    refused(patched(tiny, "output_norm.weight", part=part, value=value), fragment)


def test_row_not_a_whole_number_of_blocks(tiny: Path) -> None:
    patched(tiny, "output_norm.weight", part=4, value=int(gguf.GGMLQuantizationType.Q8_0))
    refused(patched(tiny, "output_norm.weight", part=3, value=48), "tensor 'output_norm.weight' (Q8_0 [48])",
            "not a whole number of Q8_0 blocks of 32")


# ---------------------------------------------------------------- counts and lengths


@pytest.mark.parametrize(("field", "part", "value", "fragment"), [
    ("general.name", 3, 2**62, "metadata 'general.name' at byte"),  # a string's length
    ("general.name", 0, 2**40, "a metadata key at byte"),  # a key's length
], ids=["string-length", "key-length"])
def test_lengths_past_the_end_of_the_file_are_refused(tiny: Path, field: str, part: int, value: int,
                                                      fragment: str) -> None:
    refused(patched(tiny, field=field, part=part, value=value), fragment, f"needs {value} bytes",
            "past the end of the file")


def test_value_type_gguf_does_not_define(tiny: Path) -> None:
    refused(patched(tiny, field="llama.block_count", part=2, value=13), "metadata 'llama.block_count' has value "
            "type 13, which GGUF does not define")


@pytest.mark.parametrize("offset, what", [(8, "tensors"), (16, "metadata entries")])
def test_header_counts_past_the_end_of_the_file_are_refused(tiny: Path, offset: int, what: str) -> None:
    data = bytearray(tiny.read_bytes())
    data[offset:offset + 8] = (2**50).to_bytes(8, "little")
    tiny.write_bytes(bytes(data))
    refused(tiny, f"1125899906842624 {what}", "past the end of the file")


# ---------------------------------------------------------------- memory


def peak(*args: object, timeout: float = 120) -> tuple[Result, int]:
    """bad_input.lmconvert_peak with a deadline (the old reader never returned on one of these
    files): exit code and output, and peak RSS in bytes."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "lmconvert.cli", *map(str, args)], stdout=out, stderr=err,
                                text=True)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Result(proc.returncode, out.read(), err.read()), usage.ru_maxrss * 1024


@pytest.mark.slow
def test_array_claiming_2_40_elements_fails_within_memory(tiny: Path, tmp_path: Path) -> None:
    """Before: gguf's reader looped at the end of the file, memory growing without bound (2 GB
    in a minute)."""
    fine, baseline = peak("inspect", tiny)
    assert fine.returncode == 0, fine.stderr
    path = rewritten(tiny, tmp_path / "huge.gguf", extra={"x.junk": bytes(8)})
    patched(path, field="x.junk", part=4, value=2**40)
    proc, used = peak("inspect", path, timeout=60)
    assert_clean_failure(proc, str(path), "metadata 'x.junk' (an array of 1099511627776 uint8)",
                         "past the end of the file")
    assert used < baseline + 50 * MB, (used, baseline)


@pytest.mark.slow
def test_two_million_element_array_reads_within_memory(tiny: Path, tmp_path: Path) -> None:
    """A 2.2 MB file that holds what it claims: before, 1.65 GB and 83 s to inspect (an object per
    element; the memory tells, where time on a loaded machine would not)."""
    fine, baseline = peak("inspect", tiny)
    assert fine.returncode == 0, fine.stderr
    path = rewritten(tiny, tmp_path / "big.gguf", extra={"x.junk": bytes(2_000_000)})
    assert path.stat().st_size < 2.5 * MB
    proc, used = peak("inspect", path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert used < baseline + 50 * MB, (used, baseline)


READ_HEADER = """
import resource, sys
from lmconvert.formats.gguf import GgufFile
file = GgufFile(sys.argv[1])
print(repr((dict(file.counts), file.meta["tokenizer.ggml.model"], len(file.tensors))))
file.close()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def _header_read(path: Path) -> tuple[Any, int]:
    """What a fresh interpreter reads from `path`'s header, and its peak RSS in bytes: a fresh one, since
    a process's peak only grows and this one's is whatever earlier tests left."""
    proc = subprocess.run([sys.executable, "-c", READ_HEADER, str(path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    read, rss = proc.stdout.splitlines()
    return ast.literal_eval(read), int(rss)


def test_a_tokenizer_s_arrays_read_without_an_object_per_element(tmp_path: Path) -> None:
    """150k tokens, scores, types and merges: gguf's reader made objects per element, 9 s and 800 MB
    here (its peak 586 MB above an empty header's); ours reads each array whole, 0.2 s and ~1 MB more.
    Memory, not time, is asserted: it tells the two apart on a loaded machine too."""
    n = 150_000
    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores", "tokenizer.ggml.merges")
    empty = write_tiny_gguf(tmp_path / "empty.gguf", {"tokenizer.ggml.model": "gpt2"})
    path = write_tiny_gguf(tmp_path / "tok.gguf", {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"tok{i}\u0120x" for i in range(n)],
        "tokenizer.ggml.token_type": [1] * n, "tokenizer.ggml.scores": [float(-i) for i in range(n)],
        "tokenizer.ggml.merges": [f"t{i} o{i}" for i in range(n)]})
    _, baseline = _header_read(empty)
    read, used = _header_read(path)
    assert read == ({key: n for key in keys}, "gpt2", 21), read
    assert used < baseline + 50 * MB, (used, baseline)


# ---------------------------------------------------------------- a file truncated while it is read

TRUNCATE_WHILE_READING = """
import os, sys
from pathlib import Path
from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.formats.errors import InputError
path = Path(sys.argv[1])
with open_checkpoint(path) as checkpoint:
    os.truncate(path, path.stat().st_size // 2)
    try:
        for name, tensor in checkpoint.tensors():
            pass
    except InputError as exc:
        print(exc)
"""


@pytest.mark.slow
def test_a_file_truncated_while_read_is_named_not_a_sigbus(tiny: Path) -> None:
    """Before: the memory map's pages past the new end raised SIGBUS and killed the process."""
    proc = subprocess.run([sys.executable, "-c", TRUNCATE_WHILE_READING, str(tiny)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[1])
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    line = proc.stdout.strip()
    assert len(line.splitlines()) == 1 and str(tiny) in line and "truncated while being read" in line, line
