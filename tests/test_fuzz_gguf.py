"""Fuzzing the GGUF reader (issue 28, class 3), as test_fuzz.py fuzzes the safetensors one: a
real tiny GGUF file (a tokenizer's string arrays included) with numbers of its header changed
(counts, lengths, types, dimensions, offsets: to edge values or moved by a few bytes), bytes
flipped, the file cut short or lengthened. The only outcomes allowed are a header that holds
what the reader promises (every tensor at most 4-D, aligned, inside the data section, apart from
the others) and tensors that read back in the shapes the architecture needs, or a one-line lmconvert error; and the
header costs memory in proportion to the file, never to what it claims.

About 300 examples run in the suite; LMCONVERT_FUZZ_SCALE=20 (or more) runs longer.
"""

from __future__ import annotations

import tempfile
import tracemalloc
from functools import cache
from pathlib import Path

import gguf
import pytest
from bad_input import write_tiny_gguf
from hypothesis import event, given
from hypothesis import strategies as st
from numpy.lib.array_utils import byte_bounds
from test_fuzz import fuzz, opens_cleanly

from lmconvert.formats.errors import InputError
from lmconvert.formats.gguf import HUGE_ARRAYS
from lmconvert.formats.gguf_header import MAX_DIMS, read_header

MB = 2**20
TOKENS = [f"t{i}" for i in range(128)]


@cache
def base() -> tuple[bytes, tuple[tuple[int, int], ...]]:
    """The good file's bytes, and where each number of its header lies: (offset, 4 or 8 bytes),
    found by gguf's own reader (on a good file it is right)."""
    path = write_tiny_gguf(Path(tempfile.mkdtemp(prefix="lmconvert-fuzz-gguf-")) / "m.gguf", {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.token_type": [1] * 128,
        "x.strings": ["a", "bc", ""], "x.floats": [0.5, 1.5]})
    reader = gguf.GGUFReader(path)
    start = byte_bounds(reader.data)[0]
    fields = [*reader.fields.values(), *(t.field for t in reader.tensors)]
    slots = {(byte_bounds(part)[0] - start, part.nbytes) for f in fields for part in f.parts
             if part.nbytes in (4, 8) and part.size == 1}
    return path.read_bytes(), tuple(sorted(slots))


EDGES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 31, 32, 33, 48, 63, 64, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
         2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
mutations = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 10**6), st.one_of(st.sampled_from(EDGES), st.integers(0, 2**64 - 1))),
    st.tuples(st.just("move"), st.integers(0, 10**6), st.sampled_from([-4096, -64, -32, -8, -4, -1, 1, 4, 8, 32, 64])),
    st.tuples(st.just("byte"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("append"), st.integers(1, 4096), st.just(0)),
)


def mutated(changes: list[tuple[str, int, int]]) -> bytes:
    data, slots = base()
    out = bytearray(data)
    header_end = slots[-1][0] + slots[-1][1]
    for kind, where, value in changes:
        if kind in ("set", "move"):
            at, size = slots[where % len(slots)]
            if at + size > len(out):  # cut off by an earlier change
                continue
            old = int.from_bytes(out[at:at + size], "little")
            new = value if kind == "set" else old + value
            out[at:at + size] = (new % 2**(8 * size)).to_bytes(size, "little")
        elif kind == "byte" and out:
            out[where % min(header_end, len(out))] = value
        elif kind == "cut" and out:
            del out[where % len(out):]
        elif kind == "append":
            out += bytes(where)
    return bytes(out)


def held(path: Path, size: int) -> None:
    """What an accepted header promises the tensor reads."""
    header = read_header(path, HUGE_ARRAYS)
    spans = []
    for t in header.tensors.values():
        assert len(t.dims) <= MAX_DIMS, t
        assert (t.offset - header.data_offset) % header.alignment == 0, t
        assert header.data_offset <= t.offset and t.offset + t.n_bytes <= size, t
        spans.append((t.offset, t.offset + t.n_bytes))
    spans = sorted(s for s in spans if s[0] < s[1])
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False)), spans


@pytest.mark.slow
@fuzz(300)
@given(changes=st.lists(mutations, min_size=1, max_size=3))
def test_gguf_reader_fails_cleanly(changes: list[tuple[str, int, int]]) -> None:
    data = mutated(changes)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        path.write_bytes(data)
        tracemalloc.start()
        try:
            held(path, len(data))
        except InputError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc), exc
            event("header refused")
            return
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 2 * MB + 16 * len(data), (peak, len(data), changes)
        opens_cleanly(path)  # every tensor read, in the shapes the architecture needs, or one clean line
