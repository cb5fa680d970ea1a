"""Every tensor-table transform against its declared inverse, bit for bit, over random shapes,
dtypes and bit patterns (NaN payloads, infinities, -0.0 and subnormals included); then the tables
built from them: names invert, Meta's layout and the GGUF table round-trip whole tensors, and the
GGUF names are the ones llama.cpp's own `TensorNameMap` gives.

What each transform restores, exactly as its docstring (mappings/transforms.py) states it:
- Permute, Fuse, Chain: inverse(forward(x)) == x and forward(inverse(y)) == y for every input
  (Fuse's forward refuses pieces whose copies differ, so "every input" is every input it accepts);
- Trim: forward(inverse(y)) == y always; inverse(forward(x)) == x only when x's padding rows are
  zero: other padding is lost, shown below;
- Row: stacking the rows and taking each back are exact both ways, for every input;
- Offset (float32 arithmetic): inverse(forward(x)) == x whenever the float32 subtraction is exact
  and x is not -0.0, so for every x in [c/2, 2c]; not for all x, shown below.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from fractions import Fraction

import gguf
import pytest
import torch
from examples_budget import examples
from family_specs import SPECS, GgufNaming, family_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmconvert.mappings import FAMILIES, family_for
from lmconvert.mappings.errors import MappingError
from lmconvert.mappings.meta import TENSORS as META_TENSORS
from lmconvert.mappings.meta import Layout
from lmconvert.mappings.registry import ARCHS, BY_NAME
from lmconvert.mappings.tables.gguf import GgufArch
from lmconvert.mappings.tables.table import IDENTITY, Rule, TensorTable
from lmconvert.mappings.tables.transforms import (
    Chain,
    Fuse,
    Groups,
    HeadPart,
    Joined,
    Offset,
    Permute,
    Piece,
    PiecesDiffer,
    Row,
    Scale,
    Trim,
    Unstack,
)

SETTINGS = settings(max_examples=examples(150), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int32)
AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(AS_INT[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def random_bits(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Every bit pattern equally likely: for floats that includes NaNs, infinities, -0.0, subnormals."""
    g = torch.Generator().manual_seed(seed)
    width = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape, width), generator=g, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


dtypes = st.sampled_from(DTYPES)
seeds = st.integers(0, 2 ** 31)
trailing = st.lists(st.integers(1, 3), max_size=2).map(tuple)


# -- Permute: Meta's and llama.cpp's q/k row orders ----------------------------------------------


def script_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """transformers' convert_llama_weights_to_hf.py `permute`: Meta's rows -> HF's."""
    dim1, dim2 = w.shape
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def llama_cpp_permute(w: torch.Tensor, n_head: int, n_head_kv: int | None) -> torch.Tensor:
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py): HF's rows -> GGUF's."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@SETTINGS
@given(heads=st.integers(1, 4), half=st.integers(1, 4), rest=trailing, dtype=dtypes, seed=seeds)
def test_permute_round_trips_bit_for_bit(heads: int, half: int, rest: tuple[int, ...], dtype: torch.dtype,
                                         seed: int) -> None:
    t = Permute("heads").bind({"heads": heads})
    x = random_bits((heads * 2 * half, *rest), dtype, seed)
    assert same_bits(t.inverse(t.forward(x)), x)
    assert same_bits(t.forward(t.inverse(x)), x)
    if len(rest) == 1:  # the two reference permutations, as their sources write them
        assert same_bits(t.forward(x), script_permute(x, heads))
    assert same_bits(t.inverse(x), llama_cpp_permute(x, heads, None))


# -- Fuse: model-parallel pieces ------------------------------------------------------------------


@st.composite
def fusions(draw: st.DrawFn) -> tuple[Fuse, dict[str, int], tuple[int, ...]]:
    """A Fuse, its sizes, and a whole shape the pieces divide."""
    distinct, copies = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    dim = draw(st.sampled_from([None, 0, 1]))
    shape = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    if dim is not None:
        shape[dim] *= distinct
    holders = distinct * copies
    fuse = Fuse(dim, copies="copies") if dim is not None else Fuse(None)
    return fuse, {"shards": holders, "copies": copies}, tuple(shape)


@SETTINGS
@given(fusion=fusions(), dtype=dtypes, seed=seeds)
def test_fuse_round_trips_bit_for_bit(fusion: tuple[Fuse, dict[str, int], tuple[int, ...]], dtype: torch.dtype,
                                      seed: int) -> None:
    fuse, sizes, shape = fusion
    t = fuse.bind(sizes)
    w = random_bits(shape, dtype, seed)
    pieces = t.inverse(w)
    assert len(pieces) == sizes["shards"]
    assert same_bits(t.forward(pieces), w)
    again = t.inverse(t.forward([p.clone() for p in pieces]))
    assert len(again) == len(pieces) and all(same_bits(a, p) for a, p in zip(again, pieces, strict=True))


@SETTINGS
@given(fusion=fusions(), seed=seeds, which=st.integers(0, 100))
def test_fuse_refuses_copies_that_differ_in_any_bit(fusion: tuple[Fuse, dict[str, int], tuple[int, ...]],
                                                    seed: int, which: int) -> None:
    fuse, sizes, shape = fusion
    t = fuse.bind(sizes)
    copies = sizes["shards"] if fuse.dim is None else sizes["copies"]
    if copies == 1:
        return  # nothing is held twice
    pieces = [p.clone() for p in t.inverse(random_bits(shape, torch.float32, seed))]
    bad = [i for i in range(len(pieces)) if i % copies][which % (len(pieces) - len(pieces) // copies)]
    flat = bits(pieces[bad]).view(-1)
    flat[0] ^= 1  # one bit: a NaN payload or the sign of a zero counts too
    with pytest.raises(PiecesDiffer) as info:
        t.forward(pieces)
    assert (info.value.piece, info.value.copy_of) == (bad, bad - bad % copies)


def test_fuse_keeps_a_nan_and_a_negative_zero_that_every_copy_holds() -> None:
    t = Fuse(None).bind({"shards": 3})
    w = torch.tensor([float("nan"), -0.0, 1.0])
    assert same_bits(t.forward([w.clone() for _ in range(3)]), w)


# -- Trim: padded vocabularies --------------------------------------------------------------------


@SETTINGS
@given(keep=st.integers(1, 6), pad=st.integers(1, 6), rest=trailing, dtype=dtypes, seed=seeds)
def test_trim_round_trips_where_it_can(keep: int, pad: int, rest: tuple[int, ...], dtype: torch.dtype,
                                       seed: int) -> None:
    t = Trim("vocab", "rows").bind({"vocab": keep, "rows": keep + pad})
    y = random_bits((keep, *rest), dtype, seed)
    padded = t.inverse(y)
    assert same_bits(t.forward(padded), y)  # always
    assert not bits(padded[keep:]).any()  # the inverse pads with zeros
    assert same_bits(t.inverse(t.forward(padded)), padded)  # so zero padding round-trips
    x = random_bits((keep + pad, *rest), dtype, seed + 1)
    assert same_bits(t.inverse(t.forward(x))[:keep], x[:keep])
    if bits(x[keep:]).any():  # any other padding is not recovered: the claim stops here
        assert not same_bits(t.inverse(t.forward(x)), x)


def test_trim_with_nothing_to_trim_is_the_identity() -> None:
    assert Trim("vocab", "rows").bind({"vocab": 8, "rows": 8}) is IDENTITY


# -- Offset: Gemma's w + 1 in GGUF ----------------------------------------------------------------

floats32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def exact_in_float32(x: float, c: float, result: float) -> bool:
    return Fraction(x) - Fraction(c) == Fraction(result)


@SETTINGS
@given(x=floats32, c=st.sampled_from([1.0]) | floats32)
def test_offset_round_trips_where_the_float32_subtraction_is_exact(x: float, c: float) -> None:
    t = Offset(c).bind({})
    value = torch.tensor([x], dtype=torch.float32)
    stored_minus = t.forward(value)
    assert stored_minus.dtype == torch.float32
    negative_zero = x == 0 and math.copysign(1.0, x) < 0
    if stored_minus.isfinite().all() and exact_in_float32(x, c, stored_minus.item()) and not negative_zero:
        assert same_bits(t.inverse(stored_minus), value)


@SETTINGS
@given(c=st.floats(min_value=2.0 ** -120, max_value=2.0 ** 120, width=32), ratio=st.floats(0.5, 2.0))
def test_offset_round_trips_for_every_value_within_a_factor_of_two_of_the_offset(c: float, ratio: float) -> None:
    """Sterbenz: x - c is exact for x in [c/2, 2c]: stored Gemma norms w + 1 in [0.5, 2] (w in
    [-0.5, 1]) come back bit for bit."""
    x = torch.tensor([c * ratio], dtype=torch.float32)
    x = x.clamp(torch.tensor(c / 2, dtype=torch.float32), torch.tensor(c * 2, dtype=torch.float32))
    t = Offset(c).bind({})
    assert same_bits(t.inverse(t.forward(x)), x)


@pytest.mark.parametrize(("dtype", "bound"), [(torch.bfloat16, 2.0 ** -16), (torch.float16, 2.0 ** -13)])
@pytest.mark.parametrize("stored_first", [True, False], ids=["file-canonical-file", "canonical-file-canonical"])
def test_offset_on_every_half_precision_value(dtype: torch.dtype, bound: float, stored_first: bool) -> None:
    """All 2**16 patterns, through float32 and cast back: exact wherever the float32 step is
    (but -0.0); the values that do not come back are all below `bound` in size, or -0.0, and
    there are such values: the offset is not exact everywhere, and nothing here claims it is."""
    t = Offset(1.0).bind({})
    there, back = (t.forward, t.inverse) if stored_first else (t.inverse, t.forward)
    x = torch.arange(-(2 ** 15), 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    x = x[x.isfinite()]
    middle = there(x)
    came_back = bits(back(middle).to(dtype)) == bits(x)
    sign = -1 if stored_first else 1
    exact = torch.tensor([Fraction(a) + sign * Fraction(1) == Fraction(m)
                          for a, m in zip(x.float().tolist(), middle.tolist(), strict=True)])
    negative_zero = (x == 0) & x.signbit()
    assert came_back[exact & ~negative_zero].all()
    lost = ~came_back
    assert ((x.float().abs() < bound) | negative_zero)[lost].all()
    assert lost.any() and negative_zero[lost].any()


# -- Scale: multipliers folded into a weight (Falcon-H1's muP in GGUF) ------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scale_folds_as_llama_cpp_s_converter_does(dtype: torch.dtype) -> None:
    """The factors one after the other (Falcon-H1's k: key_multiplier, then attention_in_multiplier), then the row
    runs in place (in_proj's [z | x | B | C | dt]), on the tensor as llama.cpp's converter holds it (bfloat16 cast to
    float32 by its prepare_tensors; float16 and float32 kept): bit for bit the expressions of FalconH1Model.
    modify_tensors, here transcribed; the input is left as it was."""
    x = torch.randn(10, 3, generator=torch.Generator().manual_seed(0)).to(dtype)
    before = x.clone()
    tensor = x if dtype in (torch.float16, torch.float32) else x.to(torch.float32)
    expected = tensor * 0.6 * 1.3
    expected[:4, :] *= 0.7
    expected[4:6, :] *= 1.9
    expected[6:, :] *= 0.35
    folded = Scale((0.6, 1.3), ((4, 0.7), (2, 1.9), (None, 0.35))).bind({}).inverse(x)
    assert folded.dtype == expected.dtype and same_bits(folded, expected) and same_bits(x, before)
    runs_only = Scale(runs=((4, 0.7), (None, 0.35))).bind({}).inverse(x)
    assert same_bits(x, before) and not same_bits(runs_only, tensor)


@SETTINGS
@given(seed=seeds)
def test_scale_round_trips_where_every_factor_is_a_power_of_two(seed: int) -> None:
    x = torch.randn(9, 2, generator=torch.Generator().manual_seed(seed))
    t = Scale((2.0, 0.25), ((3, 4.0), (2, 0.5), (None, 8.0))).bind({})
    assert same_bits(t.forward(t.inverse(x)), x) and same_bits(t.inverse(t.forward(x)), x)


def test_scale_by_ones_is_the_identity() -> None:
    """The import's table: a file's model multiplies by 1 (GgufArch.folded), and reads its weights as stored."""
    assert Scale((1.0, 1.0), ((4, 1.0), (None, 1.0))).bind({}) is IDENTITY


# -- Piece ----------------------------------------------------------------------------------------

@SETTINGS
@given(q=st.integers(1, 6), kv=st.integers(1, 6), cols=st.integers(1, 4), dim=st.sampled_from([0, 1]),
       dtype=dtypes, seed=seeds)
def test_pieces_split_and_join_bit_for_bit(q: int, kv: int, cols: int, dim: int, dtype: torch.dtype,
                                           seed: int) -> None:
    """Phi-3's [q | k | v]: each piece is its own rows (or columns), and joining the pieces gives
    back every bit of the stored tensor, and the pieces of the joined one are the pieces."""
    sizes = {"q": q, "kv": kv}
    steps = [Piece(("q", "kv", "kv"), i, dim).bind(sizes) for i in range(3)]
    shape = [cols, cols]
    shape[dim] = q + 2 * kv
    stored = random_bits(tuple(shape), dtype, seed)
    pieces = [t.forward(stored) for t in steps]
    assert [p.shape[dim] for p in pieces] == [q, kv, kv]
    assert same_bits(pieces[1], stored.narrow(dim, q, kv))
    for t in steps:  # every piece's inverse is the same join
        joined = t.inverse(pieces)
        assert same_bits(joined, stored)
        assert all(same_bits(s.forward(joined), p) for s, p in zip(steps, pieces, strict=True))


# -- Groups, Joined ---------------------------------------------------------------------------------

@SETTINGS
@given(groups=st.integers(1, 4), rows=st.lists(st.integers(1, 4), min_size=2, max_size=4), cols=st.integers(1, 4),
       dtype=dtypes, seed=seeds)
def test_groups_regroup_bit_for_bit(groups: int, rows: list[int], cols: int, dtype: torch.dtype, seed: int) -> None:
    """Qwen3-Next's in_proj_qkvz, per key head [q | k | v | z]: each piece's rows of every group in turn,
    and back, every bit; piece p of group g lands where the pieces before it and the groups before g put it."""
    names = tuple(f"p{i}" for i in range(len(rows)))
    step = Groups("groups", names).bind({"groups": groups, **dict(zip(names, rows, strict=True))})
    stored = random_bits((groups * sum(rows), cols), dtype, seed)
    ungrouped = step.forward(stored)
    g, p = groups - 1, len(rows) - 1
    at = groups * sum(rows[:p]) + g * rows[p]
    assert same_bits(ungrouped[at:at + rows[p]], stored[g * sum(rows) + sum(rows[:p]):(g + 1) * sum(rows)])
    assert same_bits(step.inverse(ungrouped), stored)


@SETTINGS
@given(rows=st.lists(st.integers(1, 4), min_size=2, max_size=3), cols=st.integers(1, 4), dtype=dtypes, seed=seeds)
def test_joined_parts_gather_and_split_bit_for_bit(rows: list[int], cols: int, dtype: torch.dtype, seed: int) -> None:
    """OLMo-hybrid's q_proj, k_proj, v_proj as one in_proj_qkv: joined, and each part back, every bit; a part of
    the wrong length refused; `even` (transformers' save of its conv) written in equal parts, read in any split."""
    names = tuple(f"p{i}" for i in range(len(rows)))
    sizes = dict(zip(names, rows, strict=True))
    steps = [Joined(names, i).bind(sizes) for i in range(len(rows))]
    parts = [random_bits((n, cols), dtype, seed + i) for i, n in enumerate(rows)]
    joined = steps[0].forward(parts)
    assert all(same_bits(step.inverse(joined), part) for step, part in zip(steps, parts, strict=True))
    with pytest.raises(MappingError, match="the config contradicts the tensors"):
        steps[0].forward([*parts[:-1], parts[-1][:-1]] if rows[-1] > 1 else [*parts, parts[0]])
    total = sum(rows) * len(rows)  # divisible into equal parts
    even = [Joined(names, i, even=True).bind({n: r * len(rows) for n, r in sizes.items()}) for i in range(len(rows))]
    whole = random_bits((total, cols), dtype, seed)
    written = [step.inverse(whole) for step in even]
    assert {w.shape[0] for w in written} == {total // len(rows)}
    assert same_bits(even[0].forward(written), whole)
    assert same_bits(even[0].forward(list(whole.split([r * len(rows) for r in rows]))), whole)


# -- Row --------------------------------------------------------------------------------------------

@SETTINGS
@given(heads=st.integers(1, 6), rest=st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple), dtype=dtypes,
       seed=seeds)
def test_rows_join_and_split_bit_for_bit(heads: int, rest: tuple[int, ...], dtype: torch.dtype, seed: int) -> None:
    """StableLM's per-head LayerNorm weights: the rows stack into the canonical tensor, row h of
    it is stored tensor h, and each row's inverse gives back every bit of it."""
    canonical = random_bits((heads, *rest), dtype, seed)
    exports = [Row("heads").bind({"heads": heads, "index": h}) for h in range(heads)]
    rows = [t.inverse(canonical) for t in exports]
    assert all(same_bits(row, canonical[h]) for h, row in enumerate(rows))
    assert rows[0].untyped_storage().data_ptr() != canonical.untyped_storage().data_ptr()  # a copy, not a view
    joined = Row("heads").bind({"heads": heads}).forward(rows)
    assert same_bits(joined, canonical)
    with pytest.raises(MappingError, match=f"{heads + 1} tensors are stored for {heads} rows"):
        Row("heads").bind({"heads": heads}).forward([*rows, rows[0]])


ROWS = TensorTable((Rule("layers.{}.norm.weight", "layers.{}.norm.weight"),
                    Rule("layers.{}.q.norms.{}.weight", "layers.{}.q_norm.weight", Row("heads"))))


def test_a_joining_rule_reads_every_row_in_order_and_writes_each_back() -> None:
    """Import gathers the rows of each layer, in row order whatever the stored order, into one
    canonical tensor; export names every row, each bound to its own; the two invert."""
    sizes = {"heads": 3}
    stored = ["layers.1.q.norms.2.weight", "layers.0.norm.weight", "layers.0.q.norms.1.weight",
              "layers.0.q.norms.0.weight", "layers.1.q.norms.0.weight", "layers.0.q.norms.2.weight",
              "layers.1.norm.weight", "layers.1.q.norms.1.weight"]
    canonical = [f"layers.{i}.{n}.weight" for i in range(2) for n in ("norm", "q_norm")]
    plan, dropped = ROWS.plan_import(stored, canonical, sizes)
    assert dropped == [] and set(plan) == set(canonical)
    assert plan["layers.1.q_norm.weight"][0] == tuple(f"layers.1.q.norms.{h}.weight" for h in range(3))
    rows = {name: torch.randn(4) for name in stored}
    name, t = plan["layers.0.q_norm.weight"]
    joined = t.forward([rows[n] for n in name])
    assert torch.equal(joined, torch.stack([rows[f"layers.0.q.norms.{h}.weight"] for h in range(3)]))
    written = ROWS.plan_export(canonical, sizes)
    assert set(written) == set(stored)
    for h in range(3):
        source, back = written[f"layers.0.q.norms.{h}.weight"]
        assert source == "layers.0.q_norm.weight"
        assert torch.equal(back.inverse(joined), rows[f"layers.0.q.norms.{h}.weight"])


# -- HeadPart ---------------------------------------------------------------------------------------

def converter_split(kv_b: torch.Tensor, heads: int, nope: int, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's converter (conversion/deepseek.py, DeepseekV2Model.modify_tensors), line for line."""
    kv = kv_b.view(heads, v + nope, kv_b.shape[-1])
    k_b, v_b = torch.split(kv, [nope, v], dim=1)
    return k_b.transpose(1, 2), v_b


@SETTINGS
@given(heads=st.integers(1, 5), nope=st.integers(1, 4), v=st.integers(1, 4), lora=st.integers(1, 4), dtype=dtypes,
       seed=seeds)
def test_head_parts_gather_and_split_bit_for_bit(heads: int, nope: int, v: int, lora: int, dtype: torch.dtype,
                                                 seed: int) -> None:
    """DeepSeek's kv_b as llama.cpp's converter stores it: each part's inverse is exactly what the
    converter writes (k_b transposed per head), and gathering them gives back every bit of kv_b."""
    sizes = {"heads": heads, "k_nope": nope, "v_head": v}
    steps = [HeadPart(("k_nope", "v_head"), (True, False), i).bind(sizes) for i in range(2)]
    kv_b = random_bits((heads * (nope + v), lora), dtype, seed)
    parts = [t.inverse(kv_b) for t in steps]
    assert all(same_bits(ours, theirs) for ours, theirs in zip(parts, converter_split(kv_b, heads, nope, v),
                                                                strict=True))
    assert same_bits(steps[0].forward(parts), kv_b) and same_bits(steps[1].forward(parts), kv_b)
    with pytest.raises(MappingError, match=f"are not {heads} heads of {nope}\\+{v} rows"):
        steps[0].forward([parts[0], torch.cat([parts[1], parts[1]])])


PARTS = TensorTable((Rule("blk.{}.kv_b.weight", "layers.{}.kv_b.weight"),
                     *(Rule(f"blk.{{}}.{n}_b.weight", "layers.{}.kv_b.weight",
                            HeadPart(("k_nope", "v_head"), (True, False), i)) for i, n in enumerate("kv"))))


def test_a_tensor_stored_as_parts_is_read_whole_and_written_as_the_first_rule_says() -> None:
    """Import gathers k_b and v_b (in the rules' order, whatever the stored order) into kv_b; export
    writes the first rule's layout, kv_b whole, or, in a table of the parts alone, each part; a part
    missing, or kv_b beside its parts, is refused by name."""
    sizes = {"heads": 2, "k_nope": 3, "v_head": 2}
    plan, _ = PARTS.plan_import(["blk.0.v_b.weight", "blk.0.k_b.weight"], ["layers.0.kv_b.weight"], sizes)
    names, t = plan["layers.0.kv_b.weight"]
    assert names == ("blk.0.k_b.weight", "blk.0.v_b.weight")
    kv_b = torch.randn(10, 4)
    assert torch.equal(t.forward(list(converter_split(kv_b, 2, 3, 2))), kv_b)
    assert set(PARTS.plan_export(["layers.0.kv_b.weight"], sizes)) == {"blk.0.kv_b.weight"}
    only_parts = TensorTable(PARTS.rules[1:])
    written = only_parts.plan_export(["layers.0.kv_b.weight"], sizes)
    assert set(written) == {"blk.0.k_b.weight", "blk.0.v_b.weight"}
    assert torch.equal(written["blk.0.k_b.weight"][1].inverse(kv_b), converter_split(kv_b, 2, 3, 2)[0])
    for stored in (["blk.0.k_b.weight"], ["blk.0.kv_b.weight", "blk.0.k_b.weight", "blk.0.v_b.weight"]):
        with pytest.raises(MappingError, match="'layers.0.kv_b.weight' is stored as blk.0.k_b.weight, blk.0.v_b"):
            PARTS.plan_import(stored, ["layers.0.kv_b.weight"], sizes)


@pytest.mark.parametrize(("rows", "fragment"), [
    ((0, 2), "lacks row(s) 1 of 'layers.0.q_norm.weight', which config.json says has 3"),
    ((0, 1, 2, 3), "has row(s) 3 the config does not use"),
    ((1, 2, 3), "lacks row(s) 0"),
])
def test_a_joined_tensor_with_a_row_missing_or_too_many_is_refused_by_name(rows: tuple[int, ...],
                                                                            fragment: str) -> None:
    stored = ["layers.0.norm.weight", *(f"layers.0.q.norms.{h}.weight" for h in rows)]
    with pytest.raises(MappingError, match=re.escape(fragment)):
        ROWS.plan_import(stored, ["layers.0.norm.weight", "layers.0.q_norm.weight"], {"heads": 3})


# -- Chain ----------------------------------------------------------------------------------------


@SETTINGS
@given(heads=st.integers(1, 4), half=st.integers(1, 3), shards=st.sampled_from([1, 2, 4]), dtype=dtypes, seed=seeds)
def test_chain_undoes_its_steps_in_reverse_order(heads: int, half: int, shards: int, dtype: torch.dtype,
                                                 seed: int) -> None:
    t = Chain(Fuse(0), Permute("heads"), IDENTITY).bind({"heads": heads, "shards": shards})
    w = random_bits((heads * 2 * half * shards, 3), dtype, seed)
    pieces = t.inverse(w)
    assert same_bits(t.forward(pieces), w)
    assert all(same_bits(a, b) for a, b in zip(t.inverse(t.forward(pieces)), pieces, strict=True))
    assert Chain(IDENTITY, Chain()).bind({}) is IDENTITY


# -- the tables ------------------------------------------------------------------------------------

GGUF_ARCHS: dict[str, GgufArch] = {**ARCHS, **{f"{base}:{word}": v for base, word, v in BY_NAME},
                                   **{f"{base}:{tensor}": v for base, a in ARCHS.items() for tensor, v in a.variants}}
# what gguf's TensorNameMap does not say of how llama.cpp's converter names a family's tensors: its spec's
# `gguf_naming` (tests/specs/__init__.py GgufNaming), by family
NAMING: dict[str, GgufNaming] = {family_of(name): spec.gguf_naming for name, spec in SPECS.items() if not spec.family}
TABLES: dict[str, TensorTable] = {**{f"family {n}": f.tensors for n, f in FAMILIES.items()}, "meta": META_TENSORS,
                                  **{f"gguf {n}": a.tensors for n, a in GGUF_ARCHS.items()}}


@pytest.mark.parametrize("name", list(TABLES))
@pytest.mark.parametrize("layer", [0, 7, 31])
def test_names_invert(name: str, layer: int) -> None:
    """Rename, the transform every rule has: canonical -> stored -> canonical is the identity,
    and a rule's own stored name is the one export writes (or, for a second spelling such as
    gemma3's multimodal one, reads to the same canonical name; for a fused experts tensor, to each
    expert's). A fused stored tensor (GPT-2's c_attn) reads to each of its pieces."""
    table = TABLES[name]
    for rule in table.rules:
        if rule.canonical is None:
            assert table.drops(rule.stored.replace("*", "x").replace("{}", str(layer)))
            continue
        canonical, stored = (p.replace("{}", str(layer)) for p in (rule.canonical, rule.stored))
        written, _ = table.to_stored_name(canonical)
        if rule.canonical.count("{}") > rule.stored.count("{}"):  # fused experts: one per expert, here expert `layer`
            assert canonical in {p.replace("{}", str(layer)) for p, _ in table.expanding(stored)}
            continue
        if rule.stored.count("{}") > rule.canonical.count("{}"):  # one stored tensor per row, here row `layer`
            assert written == rule.stored.replace("{}", str(layer), 1)  # the rows' name, the row's `{}` left
            assert [c for c, _ in table.to_canonical_names(stored)] == [canonical]
            continue
        for name in (written, stored):  # a fused tensor's pieces (Phi-3, GPT-2; Sarvam-MoE's written, its
            # in-memory q_proj read)
            pieces = sum(r.stored.replace("{}", str(layer)) == name for r in table.rules)
            held = [c for c, _ in table.to_canonical_names(name)]
            assert len(held) == pieces and canonical in held


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    """Valid by construction: head counts that the shards divide, or (KV) repeat over."""
    shards, kv = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2, 4, 8]))
    heads = math.lcm(kv, shards) * draw(st.sampled_from([1, 2]))
    return Layout(dim=heads * 2 * draw(st.integers(1, 2)), n_layers=1, n_heads=heads, n_kv_heads=kv,
                  vocab_size=shards * draw(st.integers(1, 3)), hidden_dim=shards * draw(st.integers(1, 3)),
                  shards=shards, embed_split=draw(st.sampled_from([0, 1])))


@SETTINGS
@given(layout=layouts(), dtype=dtypes, seed=seeds)
def test_meta_layout_round_trips_every_tensor(layout: Layout, dtype: torch.dtype, seed: int) -> None:
    """Meta's table, each rule bound to a layout: the whole HF tensor -> the ranks' pieces ->
    the whole tensor, and back, bit for bit; the pieces have the shapes Meta's files have."""
    for i, (_, _, rule) in enumerate(layout.entries()):
        t = layout.transform(rule)
        w = random_bits(layout.full_shape(rule), dtype, seed + i)
        pieces = t.inverse(w)
        assert len(pieces) == layout.shards
        assert {tuple(p.shape) for p in pieces} == {layout.shard_shape(rule)}
        assert same_bits(t.forward(pieces), w)
        assert all(same_bits(a, b) for a, b in zip(t.inverse(t.forward(pieces)), pieces, strict=True))


# architectures whose tables need the gated delta-net's head sizes (qwen3_5_text.Tiled, Qwen3-Next's ssm_ba), which the
# generic draw below has no consistent set of: their tables go both ways bit for bit in test_export_gguf.py
# (test_families_transformers_cannot_read_come_back_bit_for_bit) and equal llama.cpp's converter's (test_llamacpp.py)
TILED = ("qwen3next", "qwen35", "qwen35moe")


@SETTINGS
@given(arch=st.sampled_from([a for a in GGUF_ARCHS if a not in TILED]), kv=st.integers(1, 3), group=st.integers(1, 2),
       half=st.integers(1, 3), pad=st.integers(0, 3), seed=seeds)
def test_gguf_table_round_trips_what_it_can(arch: str, kv: int, group: int, half: int, pad: int, seed: int) -> None:
    """Each GGUF rule bound to a file's sizes: permutations both ways for any bits; the vocabulary
    trim back from zero padding; Gemma's norm offset for norm weights the file stores in [0.5, 2];
    a fused tensor's pieces (GPT-2's attn_qkv) joined back from all of them, for any bits."""
    entry, heads, vocab = GGUF_ARCHS[arch], kv * group, 5
    sizes = {"vocab": vocab, "heads": heads, "kv_heads": kv, "q": heads * 2 * half, "kv": kv * 2 * half, "ffn": 4,
             "index": 0, "k_nope": 2, "v_head": 1}
    rows = {"attn_q": heads * 2 * half, "attn_k": kv * 2 * half, "token_embd": vocab + pad, "output": vocab + pad,
            "attn_qkv": (heads + 2 * kv) * 2 * half}
    if entry.fused:
        rows["ffn_up"] = 8  # [gate | up], 4 rows each
    for rule in entry.tensors.rules:
        if rule.canonical is None:
            continue
        stored = rule.stored.replace("{}", "0")
        base = stored.removeprefix("blk.0.").rsplit(".", 1)[0]
        mixer = {"mixer.n_groups": rows.get(base, 4)} if base == "ssm_norm" else {}  # Mamba2's: one row per group
        t = rule.transform.bind({**sizes, "rows": rows.get(base, 4), **mixer})
        x = random_bits((rows.get(base, 4), 3) if stored.endswith("weight") else (rows.get(base, 4),), torch.float32,
                        seed)
        if isinstance(rule.transform, Piece):  # fused tensors (Phi-3, GPT-2): every piece of x, joined, is x
            whole = sum(sizes[name] for name in rule.transform.pieces)
            x = random_bits((whole, 3) if stored.endswith("weight") else (whole,), torch.float32, seed)
            pieces = [r.transform.bind(sizes).forward(x) for r in entry.tensors.rules if r.stored == rule.stored]
            assert same_bits(rule.transform.bind(sizes).inverse(pieces), x), stored
            continue
        if isinstance(rule.transform, HeadPart):  # DeepSeek's kv_b gathered from its parts: x again
            x = random_bits((heads * 3, 3), torch.float32, seed)
            parts = [r.transform.bind(sizes).inverse(x) for r in entry.tensors.rules
                     if r.canonical == rule.canonical and isinstance(r.transform, HeadPart)]
            assert len(parts) == 2 and same_bits(t.forward(parts), x), stored
            continue
        if "trailing dimension of 1" in t.name:  # Mamba2's A and D: [heads, 1]
            x = x.reshape(x.shape[0], -1)[:, :1]
        if "-exp(A_log)" in t.name:  # a state-space A, negative; log(-A) and back within float32's eps, not exact
            x = -torch.exp(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)))
            assert bool(((t.inverse(t.forward(x)) - x).abs() <= 2 * torch.finfo(torch.float32).eps * x.abs()).all())
            continue
        if isinstance(rule.transform, Offset):
            x = 0.5 + 1.5 * torch.rand(x.shape, generator=torch.Generator().manual_seed(seed))
        if isinstance(rule.transform, Trim):
            x[vocab:] = 0
        if isinstance(rule.transform, Unstack):  # the one expert of a stack of one (each of its parts, where one
            # stored tensor holds several: granite_swa's ffn_gate_up_exps), and the stack again
            x = x.unsqueeze(0)
            parts = [r.transform.bind({**sizes, "rows": rows.get(base, 4)}).forward(x) for r in entry.tensors.rules
                     if r.stored == rule.stored]
            assert same_bits(t.inverse([[part] for part in parts]), x), stored  # one list per part, of its experts
            continue
        assert same_bits(t.inverse(t.forward(x)), x), stored


def known_to_gguf(arch: str) -> bool:
    return arch.split(":")[0] in gguf.MODEL_ARCH_NAMES.values()


@pytest.fixture(scope="module")
def vendored_gguf(tmp_path_factory: pytest.TempPathFactory) -> object:
    """The gguf-py llama.cpp's tree vendors (newer than the installed gguf package, which may predate an
    architecture llama.cpp runs: Mellum's), fetched as bench/gguf_export.py fetches it, or from LLAMA_CPP_SOURCE."""
    import importlib
    import os
    from pathlib import Path

    if os.environ.get("LLAMA_CPP_SOURCE"):
        tree = Path(os.environ["LLAMA_CPP_SOURCE"])
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
        from gguf_export import llama_cpp_source

        tree = llama_cpp_source(tmp_path_factory.mktemp("sdist"))
    saved = {name: module for name, module in sys.modules.items() if name == "gguf" or name.startswith("gguf.")}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(tree / "gguf-py"))
    try:
        return importlib.import_module("gguf")
    finally:
        sys.path.remove(str(tree / "gguf-py"))
        sys.modules.update(saved)


@pytest.mark.parametrize("arch", [a if known_to_gguf(a) else pytest.param(a, marks=pytest.mark.llamacpp)
                                  for a in GGUF_ARCHS])
def test_gguf_names_are_llama_cpps(arch: str, request: pytest.FixtureRequest) -> None:
    """Our GGUF table names every tensor of the family exactly as gguf's TensorNameMap (the table
    llama.cpp converts with, and transformers' GGUF loader reads with) does, and names nothing
    TensorNameMap leaves out (Gemma 2 has no `output`), nor what it refuses (Falcon's biases). An
    architecture the installed gguf package predates is checked against llama.cpp's own gguf-py (with
    the llamacpp tests, which fetch llama.cpp's tree)."""
    names = gguf if known_to_gguf(arch) else request.getfixturevalue("vendored_gguf")
    entry = GGUF_ARCHS[arch]
    family = family_for(entry.model_type)
    llama_cpp_arch, _, variant = arch.partition(":")
    naming = NAMING.get(family.name, GgufNaming())
    layout = naming.variant_layouts.get(variant)
    table = family.tensors_for(family.arch_config({"model_type": entry.model_type, **layout})) \
        if layout is not None else family.tensors
    key = next(k for k, v in names.MODEL_ARCH_NAMES.items() if v == llama_cpp_arch)  # type: ignore[attr-defined]
    name_map = names.get_tensor_name_map(key, 2)  # type: ignore[attr-defined]
    canonicals = {r.canonical.replace("{}", "1") for r in table.rules if r.canonical}
    for canonical in sorted(canonicals):
        hf_name, _ = table.to_hf_name(canonical)
        for ours_name, theirs_name in naming.aliases:
            hf_name = hf_name.replace(ours_name, theirs_name)
        base, _, suffix = hf_name.removeprefix(naming.stripped).rpartition(".")
        if suffix.endswith("_bias"):  # DeepSeek-V3's `gate.e_score_correction_bias`: gguf maps its stem
            base, suffix = f"{base}.{suffix.removesuffix('_bias')}", "bias"
        # one expert's: llama.cpp names the stack of every expert's (its merged HF name)
        theirs = name_map.get_name(re.sub(r"\.experts\.\d+\.", ".experts.", base))
        named = naming.converter_names.get((re.sub(r"^(model\.layers|transformer\.blocks|backbone\.layers)\.\d+\.", "",
                                                   hf_name), canonical.split(".")[-2]))
        if named:
            theirs, suffix = f"blk.1.{named}".rsplit(".", 1)
        elif suffix not in ("weight", "bias"):  # a bare parameter (a state-space A_log, D): gguf maps its whole name
            theirs, suffix = name_map.get_name(hf_name.removeprefix(naming.stripped)), ""
        if theirs and f"{theirs}.{suffix}".replace("blk.1.", "blk.0.") in entry.refused:
            theirs = None
        try:
            ours: str | None = entry.tensors.to_stored_name(canonical)[0]
        except MappingError:
            ours = None
        assert ours == (f"{theirs}.{suffix}".removesuffix(".") if theirs else None), canonical


def test_reading_the_tables_imports_no_torch() -> None:
    """Tables are data: building and binding them needs no torch (a rename-only conversion never
    loads it); only running a transform does."""
    script = ("import sys\n"
              "from lmconvert.mappings import FAMILIES\n"
              "from lmconvert.mappings.tables.gguf import tensor_sizes\nfrom lmconvert.mappings.registry import ARCHS\n"
              "from lmconvert.mappings.gguf.metadata import hf_config\n"
              "from lmconvert.mappings.meta import Layout\n"
              "from lmconvert.mappings.meta_params import params_for\n"
              "sizes = {'heads': 2, 'kv_heads': 1, 'vocab': 4, 'rows': 6, 'index': 0, 'q': 4, 'kv': 2, 'ffn': 3,\n"
              "         'k_nope': 2, 'v_head': 1, 'mixer.key_heads': 1, 'mixer.value_heads': 1,\n"
              "         'mixer.heads_per_key': 1, 'mixer.key_dim': 1, 'mixer.values_per_key': 1}\n"
              "for a in ARCHS.values(): [r.transform.bind(sizes) for r in a.tensors.rules]\n"
              "layout = Layout(8, 2, 2, 1, 16, 32, 2)\n"
              "[layout.transform(rule) for _, _, rule in layout.entries()]\n"
              "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False", proc.stderr
