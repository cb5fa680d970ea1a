"""Tensor transforms, each declared with its exact inverse: the vocabulary every tensor table
(the HF families, Meta's layout, llama.cpp's GGUF names) is written in.

`forward` is always the import direction (stored layout -> what the next stage reads), `inverse`
the export direction. A transform is declared with symbolic sizes ("heads", "vocab", ...) and
bound to numbers with `bind(sizes)` once a config is known, giving a `Transform` (two functions).
What each inverse restores exactly, and what it does not, is said at each kind and checked bit for
bit by tests/test_table_transforms.py.

- renaming is a table rule's job (table.py); its transform is IDENTITY;
- Permute: rotary rows from interleaved pairs to rotate-half halves, per head;
- Fuse: the pieces model-parallel ranks hold -> one tensor (inverse: split);
- Piece: one of several canonical tensors stored end to end in one (Phi-3's qkv_proj, GPT-2's
  c_attn); the table's rules that share a stored name are its pieces, in order, and export hands
  the inverse all of them, which concatenates them;
- Row: the reverse, one canonical tensor stored as one tensor per row (StableLM's per-head
  LayerNorms); import hands forward all of them, which stacks them, export writes each row;
- HeadPart: the reverse of Piece per head, one canonical tensor stored as several, each holding
  a block of every head's rows (llama.cpp's DeepSeek k_b and v_b); import hands forward all of
  them, export writes each;
- Joined: the reverse of Piece, one canonical tensor stored as several end to end (OLMo-hybrid's
  q_proj, k_proj, v_proj as our in_proj_qkv); import hands forward all of them, export writes each;
- Offset: a constant added on disk (Gemma's norms as w + 1 in GGUF);
- Scale: multipliers folded into a weight on disk (Falcon-H1's muP in GGUF), as llama.cpp's converter folds them;
- Trim: padding rows past the vocabulary dropped;
- Transpose: a matrix stored [in, out] (GPT-2's Conv1D);
- QkvGroups: a fused qkv projection laid out per KV group -> q, k, v concatenated (NeoX, BLOOM, Falcon);
- Groups: rows stored as runs of pieces, one run per group -> each piece's rows of every group, the
  pieces in turn (Qwen3-Next's in_proj_qkvz and in_proj_ba, per key head);
- Unstack: one expert's matrix out of a fused 3-D experts tensor (inverse: stack them all);
- Unsqueeze: a leading dimension of size 1 the file leaves out;
- Chain: several in order.

A transform that only moves whole rows of a matrix (selects, reorders or regroups its leading
dimensions) or swaps its last two dimensions also declares what it does to a quantized weight's
stored parts (`Packed`): the same moves made on the rows of every part, or, for a swap, the weight
marked as read transposed. So a weight whose parts hold its inputs in groups (MXFP4's 32 values
per exponent) goes through its family's table as it is, every group whole. A transform without
that declaration (`packed_forward` None: Offset, Scale, Trim, Fuse, Row, HeadPart) cannot keep a
quantized weight. Checked against dequantizing by tests/test_packed_transforms.py.

torch is imported only inside the functions: reading a table must not load it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from math import prod
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..errors import MappingError

if TYPE_CHECKING:
    import torch

TensorFn = Callable[[Any], Any]  # a tensor (or, for Fuse, a list of pieces) in, the same out
Sizes = Mapping[str, int]


def _identity(t: Any) -> Any:  # noqa: ANN401 - passes whatever it gets
    return t


@dataclass(frozen=True)
class Transform:
    """A bound transform: two functions, each the exact inverse of the other where its kind says."""

    name: str
    forward: TensorFn = _identity
    inverse: TensorFn = _identity
    # the same two on a quantized weight's parts (`Packed`), None where the transform cannot act on them
    packed_forward: TensorFn | None = None
    packed_inverse: TensorFn | None = None
    gathers: bool = False  # forward takes parts that may differ in shape (Joined, HeadPart), not a joined tensor's rows

    def bind(self, sizes: Sizes) -> Transform:  # already bound: a table may hold either
        return self


IDENTITY = Transform("identity", packed_forward=_identity, packed_inverse=_identity)


class Step(Protocol):
    """A declared transform: binds to sizes (head counts, vocabulary, shard count...)."""

    def bind(self, sizes: Sizes) -> Transform: ...


def out_shape(fn: TensorFn, shape: tuple[int, ...] | list[tuple[int, ...]]) -> tuple[int, ...]:
    """The shape `fn` gives a tensor of `shape` (or a list of pieces of these shapes), found on the
    meta device without reading data (and without torch at all for the identity, so that a
    rename-only conversion never loads it). Transforms other than Offset keep the dtype."""
    if fn is _identity:
        return tuple(shape)  # type: ignore[arg-type]
    if isinstance(fn, ExpertRows) and not isinstance(shape, list):
        return fn.out_shape(shape)
    import torch

    if isinstance(shape, list):
        return tuple(fn([torch.empty(s, device="meta") for s in shape]).shape)
    return tuple(fn(torch.empty(shape, device="meta")).shape)


def _size(sizes: Sizes, name: str) -> int:
    if name not in sizes:
        raise MappingError(f"this transform needs the size {name!r}, which the table was not given")
    return sizes[name]


# ---- Packed: a quantized weight's stored parts, moved as the weight they stand for


@dataclass(frozen=True)
class Packed:
    """A quantized weight as its stored parts (role -> tensor: MXFP4's blocks [*rows, groups, 16]
    and scales [*rows, groups]), which share the weight's first `row_dims` dimensions (its rows)
    and hold its inputs, in groups, in dimensions of their own. The weight the parts dequantize to
    is [*rows, inputs]; `transposed`: the weight stands read with its last two dimensions swapped,
    [*rows[:-1], inputs, rows[-1]] (the layout transformers gives gpt-oss's fused experts).

    Moving rows moves no part yet: `index` ([*this weight's rows, 1], int64) says which stored row
    (over the parts' row dimensions, flattened) is each row now, and `parts()` gathers them once at
    the end, so one expert taken out of a fused tensor reads that expert's rows, not the whole."""

    stored: Mapping[str, Any]
    row_dims: int
    index: Any
    transposed: bool = False

    @classmethod
    def of(cls, stored: Mapping[str, Any], row_dims: int, transposed: bool = False) -> Packed:
        import torch

        first = next(iter(stored.values()))
        rows = tuple(first.shape[:row_dims])
        return cls(stored, row_dims, torch.arange(prod(rows), device=first.device).reshape(*rows, 1), transposed)

    def free(self) -> int:
        """How many leading dimensions of the weight (as it stands) are rows of the parts."""
        return self.index.dim() - 1 - self.transposed

    def parts(self) -> dict[str, Any]:
        """Each part with the rows this weight holds, in its order."""
        rows = self.index.reshape(-1)
        out = {}
        for role, t in self.stored.items():
            own = tuple(t.shape[self.row_dims:])
            flat = t.reshape(-1, *own)
            unmoved = rows.shape[0] == flat.shape[0] and tuple(self.index.shape[:-1]) == tuple(t.shape[:self.row_dims])
            same = unmoved and (t.device.type == "meta" or bool((rows == _arange_like(rows)).all()))
            out[role] = t if same else flat.index_select(0, rows).reshape(*self.index.shape[:-1], *own)
        return out


def _arange_like(rows: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.arange(rows.shape[0], device=rows.device)


class CannotMoveGroups(MappingError):
    """A transform would move a quantized weight's inputs, which its parts store in groups."""


def on_rows(name: str, fn: TensorFn, depth: int) -> TensorFn:
    """`fn`, a move of whole rows that reads the weight's first `depth` dimensions only and leaves
    the rest as they are, made on a Packed weight's rows."""

    def moved(p: Packed) -> Packed:
        if depth > p.free():
            raise CannotMoveGroups(f"{name} moves the inputs of a quantized weight, whose parts hold them in "
                                   "groups")
        return replace(p, index=fn(p.index))

    return moved


def swapped(p: Packed) -> Packed:
    """The weight's last two dimensions swapped: the parts stay, the weight now reads them transposed."""
    if not p.transposed and p.index.dim() - 1 < 1:
        raise CannotMoveGroups("a transpose of a quantized weight without rows")
    return replace(p, transposed=not p.transposed)


def packed_pieces(pieces: Sequence[Packed], depth: int, join: Callable[[list[Any]], Any]) -> Packed:
    """Several Packed weights joined into one by `join` (the rows of each part in turn), which moves
    the joined weight's first `depth` dimensions; each piece's parts gathered first."""
    first = pieces[0]
    if any(p.transposed != first.transposed or p.index.dim() != first.index.dim() for p in pieces) or \
            depth > first.free() + 1:
        raise CannotMoveGroups("joining quantized weights along their inputs")
    gathered = [p.parts() for p in pieces]
    stored = {role: join([g[role] for g in gathered]) for role in gathered[0]}
    rows_after = stored[next(iter(stored))].dim() - (gathered[0][next(iter(stored))].dim() - (first.index.dim() - 1))
    return Packed.of(stored, rows_after, first.transposed)


# ---- Permute: rotary rows


def pairs_to_halves(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Per head, rows (0, 1), (2, 3), ... (Meta's complex pairs, llama.cpp's `LlamaModel.permute`
    output) -> rows 0..d/2-1 then d/2..d-1 (transformers' rotate-half). transformers'
    `convert_llama_weights_to_hf.py` `permute` and its GGUF loader's `_reverse_permute_weights`."""
    dim = _half_head(t, heads)
    return t.reshape(heads, dim, 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def halves_to_pairs(t: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of pairs_to_halves: llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py)."""
    dim = _half_head(t, heads)
    return t.reshape(heads, 2, dim, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def _half_head(t: torch.Tensor, heads: int) -> int:
    """Half a head's rows: a head count the rows do not split into rotary pairs is refused by name
    (a config that contradicts its tensors), not met as a reshape error."""
    if heads <= 0 or t.shape[0] % (2 * heads):
        raise MappingError(f"{t.shape[0]} rows do not split into {heads} heads of rotary pairs; the head "
                           "count contradicts the tensors")
    return t.shape[0] // heads // 2


@dataclass(frozen=True)
class Permute:
    """q/k rows (weights or biases) from interleaved pairs to halves, per head; `heads` names the
    head count. A permutation of rows: exact both ways, for every dtype and every bit pattern."""

    heads: str

    def bind(self, sizes: Sizes) -> Transform:
        n = _size(sizes, self.heads)
        forward, inverse = (lambda t: pairs_to_halves(t, n)), (lambda t: halves_to_pairs(t, n))
        return Transform(f"permute({n} heads)", forward, inverse, on_rows("permute", forward, 1),
                         on_rows("permute", inverse, 1))


# ---- Fuse: model-parallel pieces


class PiecesDiffer(MappingError):
    """Two holders of the same piece hold different data; the reader names the tensor and files."""

    def __init__(self, piece: int, copy_of: int) -> None:
        super().__init__(f"piece {piece} differs from piece {copy_of}, which should hold the same copy")
        self.piece, self.copy_of = piece, copy_of


@dataclass(frozen=True)
class Fuse:
    """`sizes["shards"]` pieces -> one tensor, concatenated along `dim` (a number, or the name of
    a size that holds it); `dim` None: every holder has the whole tensor. With `copies`, each
    distinct piece is held by that many consecutive holders (Meta's KV heads when ranks outnumber
    them). Forward checks that copies agree bit for bit (PiecesDiffer if not); inverse splits and
    repeats. Exact both ways: forward(inverse(t)) is t, and inverse(forward(pieces)) is pieces
    whenever forward accepts them."""

    dim: int | str | None
    copies: str | None = None

    def bind(self, sizes: Sizes) -> Transform:
        holders = _size(sizes, "shards")
        dim = _size(sizes, self.dim) if isinstance(self.dim, str) else self.dim
        copies = holders if dim is None else _size(sizes, self.copies) if self.copies else 1
        return Transform(f"fuse({holders} pieces, dim {dim})", lambda pieces: fuse(pieces, dim, copies),
                         lambda t: split(t, dim, holders, copies))


def fuse(pieces: Sequence[torch.Tensor], dim: int | None, copies: int) -> torch.Tensor:
    import torch

    for i, piece in enumerate(pieces):
        if i % copies and not same_bits(piece, pieces[i - i % copies]):
            raise PiecesDiffer(i, i - i % copies)
    distinct = pieces[::copies]
    return torch.cat(list(distinct), dim) if dim is not None and len(distinct) > 1 else distinct[0]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Copies agree when their bytes do: NaNs that are the same NaN agree, -0.0 and 0.0 do not
    (torch.equal says the opposite of both), so the copy kept is every copy."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(a.element_size())
    return torch.equal(a.view(as_int), b.view(as_int)) if as_int is not None else torch.equal(a, b)


def split(t: torch.Tensor, dim: int | None, holders: int, copies: int) -> list[torch.Tensor]:
    """Views of `t`, one per holder: clone before saving."""
    if dim is None:
        return [t] * holders
    parts = t.split(t.shape[dim] // (holders // copies), dim)
    return [p for p in parts for _ in range(copies)]


# ---- Piece: several canonical tensors stored end to end in one


@dataclass(frozen=True)
class Piece:
    """Piece `index` of a stored tensor that holds `pieces` (names of sizes) end to end along `dim`:
    Phi-3's `qkv_proj` rows [q | k | v], its `gate_up_proj` rows [gate | up]. Every piece of one
    stored tensor has a rule of its own; forward takes this piece (a view), and the inverse, given
    every piece in order (the table groups them), concatenates them. Exact both ways: slicing and
    concatenating copy bits."""

    pieces: tuple[str, ...]
    index: int
    dim: int = 0

    def bind(self, sizes: Sizes) -> Transform:
        lengths = [_size(sizes, name) for name in self.pieces]
        start, length, dim = sum(lengths[:self.index]), lengths[self.index], self.dim
        name = f"piece {self.index} of {'|'.join(self.pieces)}"
        forward = lambda t: t.narrow(dim, start, length)  # noqa: E731
        return Transform(name, forward, lambda pieces: join(pieces, dim), on_rows(name, forward, dim + 1),
                         lambda pieces: packed_pieces(pieces, dim + 1, lambda ts: join(ts, dim)))


def join(pieces: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    import torch

    return torch.cat(list(pieces), dim)


# ---- Row: one canonical tensor stored as one tensor per row


@dataclass(frozen=True)
class Row:
    """One of `count` (the name of a size) stored tensors that are the rows of one canonical
    [count, ...] tensor: StableLM's per-head LayerNorms, `q_layernorm.norms.{h}.weight` each [head_dim],
    are the canonical [heads, head_dim] weight. The table's joining rule (its stored side has one `{}`
    more, the row's) hands forward every row in order, which stacks them; the inverse is row
    `sizes["index"]` (a copy, so that one row written never holds the whole). Exact both ways:
    stacking and selecting copy bits."""

    count: str

    def rows(self, sizes: Sizes) -> int:
        """How many stored tensors one canonical tensor is: the table names each on export."""
        return _size(sizes, self.count)

    def bind(self, sizes: Sizes) -> Transform:
        count, index = self.rows(sizes), sizes.get("index")
        where = f"row {index} of {count}" if index is not None else f"{count} rows"
        return Transform(f"{where} stored one per tensor", lambda rows: stack_rows(rows, count),
                         lambda t: t[index].clone())


def stack_rows(rows: Sequence[torch.Tensor], count: int) -> torch.Tensor:
    import torch

    if len(rows) != count:
        raise MappingError(f"{len(rows)} tensors are stored for {count} rows; the config contradicts the tensors")
    return torch.stack(list(rows))


# ---- HeadPart: one canonical tensor stored as several, each a block of rows of every head


@dataclass(frozen=True)
class HeadPart:
    """Part `index` of a canonical [heads * (sum of the parts), cols] tensor whose every head's rows
    are the parts' blocks in order, stored as one [heads, rows, cols] tensor per part ([heads, cols,
    rows] for a part `transposed`): llama.cpp's converter stores DeepSeek's kv_b ([heads * (nope + v),
    kv_lora], per head its k rows then its v rows) as `attn_k_b` [heads, kv_lora, nope] (transposed,
    for its absorbed MLA path) and `attn_v_b` [heads, v, kv_lora]. Each part has a rule of its own
    naming the same canonical tensor (the table gathers them); forward, given every part in order,
    builds the canonical tensor; the inverse is this part (a copy). `parts` name the sizes of each
    part's rows; `transposed` says it of every part. Exact both ways: transposing, slicing and
    concatenating copy bits."""

    parts: tuple[str, ...]
    transposed: tuple[bool, ...]
    index: int
    gathers: ClassVar[bool] = True  # the table hands forward every part

    def bind(self, sizes: Sizes) -> Transform:
        heads, lengths = _size(sizes, "heads"), [_size(sizes, name) for name in self.parts]
        start, length, flips = sum(lengths[:self.index]), lengths[self.index], self.transposed

        def inverse(t: torch.Tensor) -> torch.Tensor:
            part = t.reshape(heads, sum(lengths), -1).narrow(1, start, length)
            return (part.transpose(1, 2) if flips[self.index] else part).contiguous()

        return Transform(f"part {self.index} of {'|'.join(self.parts)} per head",
                         lambda parts: join_heads(parts, flips, heads, lengths), inverse, gathers=True)


def join_heads(parts: Sequence[torch.Tensor], transposed: Sequence[bool], heads: int,
               lengths: Sequence[int]) -> torch.Tensor:
    """Every head's blocks, one from each part, in order: [heads * sum(lengths), cols]."""
    import torch

    blocks = [p.transpose(1, 2) if flip else p for p, flip in zip(parts, transposed, strict=True)]
    shapes = [tuple(b.shape) for b in blocks]
    if any(len(s) != 3 or s[0] != heads or s[1] != n or s[2] != shapes[0][2] for s, n in zip(shapes, lengths,
                                                                                            strict=True)):
        raise MappingError(f"parts of shapes {[list(p.shape) for p in parts]} are not {heads} heads of "
                           f"{'+'.join(map(str, lengths))} rows; the config contradicts the tensors")
    return torch.cat(blocks, 1).reshape(heads * sum(lengths), shapes[0][2])


@dataclass(frozen=True)
class Joined:
    """Part `index` of a canonical tensor stored as several differently named tensors end to end
    along dim 0 (OLMo-hybrid's q_proj, k_proj and v_proj are our in_proj_qkv's rows): `parts` name the
    sizes of each part's rows. Each part has a rule of its own naming the same canonical tensor (the
    table gathers them); forward, given every part in order, concatenates them; the inverse is this
    part (a copy). Exact both ways: concatenating and slicing copy bits."""

    parts: tuple[str, ...]
    index: int
    # the parts written as equal thirds (halves, ...) of the rows whatever `parts` says, and read in any split
    # that adds up: transformers' save splits OLMo-hybrid's conv1d so (its Concatenate's reverse), the Hub's files
    # as q | k | v
    even: bool = False
    gathers: ClassVar[bool] = True  # the table hands forward every part
    interleaves: ClassVar[bool] = True  # no one transformers module computes the canonical tensor's output

    def bind(self, sizes: Sizes) -> Transform:
        lengths = [_size(sizes, name) for name in self.parts]
        if self.even:
            lengths = [sum(lengths) // len(lengths)] * len(lengths)
        start, length = sum(lengths[:self.index]), lengths[self.index]

        def forward(parts: Sequence[torch.Tensor]) -> torch.Tensor:
            rows = [p.shape[0] for p in parts]
            if (sum(rows) != sum(lengths)) if self.even else (rows != lengths):
                raise MappingError(f"parts of {rows} rows are not {'+'.join(map(str, lengths))} rows; the config "
                                   "contradicts the tensors")
            return join(parts, 0)

        return Transform(f"part {self.index} of {'|'.join(self.parts)}", forward,
                         lambda t: t.narrow(0, start, length).contiguous(), gathers=True)


# ---- Offset: a constant added on disk


@dataclass(frozen=True)
class Offset:
    """The file stores w + `value`. Both directions compute in float32 and return float32 (as
    transformers does: rounding to a half type first would cost precision); the reader casts.
    Exact where the float32 subtraction is: for every x other than -0.0 whose x - value is a
    float32, inverse(forward(x)) is x bit for bit; so for all x in [value/2, 2*value] (Sterbenz).
    With value 1, a bf16 (f16) x cast back comes back unless it is -0.0 or smaller than 2**-16
    (2**-13) in size. Not in general: x = 1e-10 with value 1 comes back as 0."""

    value: float

    def bind(self, sizes: Sizes) -> Transform:
        c = self.value
        return Transform(f"offset({c:+g})", lambda t: t.float() - c, lambda t: t.float() + c)


# ---- Scale: multipliers folded into a weight


@dataclass(frozen=True)
class Scale:
    """The file stores the weight times constant multipliers, folded in as llama.cpp's converter folds
    Falcon-H1's muP multipliers (FalconH1Model.modify_tensors): the inverse (export) multiplies the whole
    tensor by each of `factors` in turn, then each run of `runs` ((rows, factor) in order, the last run's rows
    None: the rest) in place, as its converter does them: a tensor neither float16 nor float32 cast to float32
    first (its prepare_tensors casts it before modify_tensors), each factor a Python float (torch's multiply
    rounds it to the tensor's type). Already bound: a family builds it from its config (GgufArch.layout). The
    forward divides in the reverse order, exact only where every factor is a power of two; an import reads the
    weights as stored, its config's factors being 1 (GgufArch.folded). Every factor 1: IDENTITY."""

    factors: tuple[float, ...] = ()
    runs: tuple[tuple[int | None, float], ...] = ()

    def bind(self, sizes: Sizes) -> Transform:
        if all(f == 1 for f in (*self.factors, *(f for _, f in self.runs))):
            return IDENTITY
        return Transform(f"times {' x '.join(map(str, self.factors)) or 1}"
                         + (f", row runs times {[f for _, f in self.runs]}" if self.runs else ""),
                         self._divided, self._folded)

    def _folded(self, t: torch.Tensor) -> torch.Tensor:
        import torch

        t = t if t.dtype in (torch.float16, torch.float32) else t.float()
        for factor in self.factors:
            t = t * factor
        t = t.clone() if self.runs and not self.factors else t
        for start, (rows, factor) in zip(self._starts(), self.runs, strict=True):
            t[start:None if rows is None else start + rows] *= factor
        return t

    def _divided(self, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        for start, (rows, factor) in reversed(list(zip(self._starts(), self.runs, strict=True))):
            t[start:None if rows is None else start + rows] /= factor
        for factor in reversed(self.factors):
            t = t / factor
        return t

    def _starts(self) -> list[int]:
        starts, at = [], 0
        for rows, _ in self.runs:
            starts.append(at)
            at += rows or 0
        return starts


# ---- Trim: padded vocabularies


@dataclass(frozen=True)
class Trim:
    """Keep the first `keep` of `stored` rows (a padded vocabulary); both name sizes. Inverse pads
    with zero rows. forward(inverse(y)) is y always; inverse(forward(x)) is x only when x's padding
    rows are zero: any other padding is dropped on import and not recovered. Nothing to trim
    (stored <= keep) binds to IDENTITY."""

    keep: str
    stored: str

    def bind(self, sizes: Sizes) -> Transform:
        keep, stored = _size(sizes, self.keep), _size(sizes, self.stored)
        if stored <= keep:
            return IDENTITY
        return Transform(f"trim({stored} -> {keep} rows)", lambda t: t[:keep], lambda t: pad_rows(t, stored))


def pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    import torch

    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


# ---- Transpose: [in, out] matrices


def _transposed(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous()


@dataclass(frozen=True)
class Transpose:
    """A matrix stored [in, out] (GPT-2's Conv1D: `addmm(b, x, W)`) <-> nn.Linear's [out, in]. Its
    own inverse; a permutation of elements, so exact for every dtype and bit pattern."""

    def bind(self, sizes: Sizes) -> Transform:
        return Transform("transpose", _transposed, _transposed, swapped, swapped)


# ---- QkvGroups: fused qkv projections


@dataclass(frozen=True)
class QkvGroups:
    """Rows of a fused qkv projection stored per KV group, each group its q heads then its k and
    v head, `head_dim` rows each (GPT-NeoX and BLOOM: one q head per group; Falcon's grouped and
    multi-query layouts) -> all q rows, then all k, then all v (the concatenation a group rule
    names). Weights and biases alike; a permutation of rows, exact both ways. With one KV head per
    q head it is NeoX's per-head [q_h; k_h; v_h]; with one group, Falcon-7B's [q...; k; v]."""

    interleaves: ClassVar[bool] = True  # no slice of the stored tensor (or its module's output) is q, k or v

    def bind(self, sizes: Sizes) -> Transform:
        heads, kv, dim = _size(sizes, "heads"), _size(sizes, "kv_heads"), _size(sizes, "head_dim")
        name = f"qkv per group ({kv} groups of {heads // kv} q heads)"
        forward, inverse = (lambda t: groups_to_qkv(t, heads, kv, dim)), (lambda t: qkv_to_groups(t, heads, kv, dim))
        return Transform(name, forward, inverse, on_rows(name, forward, 1), on_rows(name, inverse, 1))


def groups_to_qkv(t: torch.Tensor, heads: int, kv: int, dim: int) -> torch.Tensor:
    import torch

    grouped = t.reshape(kv, heads // kv + 2, dim, *t.shape[1:])
    q, k, v = grouped[:, :-2], grouped[:, -2], grouped[:, -1]
    return torch.cat([q.reshape(heads * dim, *t.shape[1:]), k.reshape(kv * dim, *t.shape[1:]),
                      v.reshape(kv * dim, *t.shape[1:])])


def qkv_to_groups(t: torch.Tensor, heads: int, kv: int, dim: int) -> torch.Tensor:
    import torch

    rest = t.shape[1:]
    q = t[:heads * dim].reshape(kv, heads // kv, dim, *rest)
    k = t[heads * dim:(heads + kv) * dim].reshape(kv, 1, dim, *rest)
    v = t[(heads + kv) * dim:].reshape(kv, 1, dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(t.shape)


@dataclass(frozen=True)
class Groups:
    """Rows stored as `groups` runs (the name of a size), each the pieces `pieces` (names of sizes:
    each piece's rows per group) end to end -> every group's rows of piece 0, then of piece 1, ...
    Qwen3-Next's in_proj_qkvz holds, per key head, [q | k | v | z] of that head (its value heads'
    v and z), which become [all q | all k | all v | all z]; a Piece then takes the canonical tensors
    out. A permutation of rows, exact both ways."""

    interleaves: ClassVar[bool] = True

    groups: str
    pieces: tuple[str, ...]

    def bind(self, sizes: Sizes) -> Transform:
        groups, rows = _size(sizes, self.groups), [_size(sizes, name) for name in self.pieces]
        return Transform(f"{groups} groups of {'|'.join(self.pieces)}", lambda t: ungroup(t, groups, rows),
                         lambda t: regroup(t, groups, rows))


def ungroup(t: torch.Tensor, groups: int, rows: list[int]) -> torch.Tensor:
    import torch

    rest = t.shape[1:]
    runs = t.reshape(groups, sum(rows), *rest).split(rows, 1)
    return torch.cat([run.reshape(-1, *rest) for run in runs])


def regroup(t: torch.Tensor, groups: int, rows: list[int]) -> torch.Tensor:
    import torch

    rest = t.shape[1:]
    pieces = t.split([groups * r for r in rows])
    return torch.cat([p.reshape(groups, r, *rest) for p, r in zip(pieces, rows, strict=True)], 1).reshape(t.shape)


@dataclass(frozen=True)
class QkvShards:
    """Rows of a fused qkv projection stored as `shards` model-parallel shards, each its share of
    the three projections in `order` (CodeGen's `qkv_proj`: 4 shards of [q_s | v_s | k_s], each a
    quarter of the model width) -> all q rows, then all k, then all v. MHA only (q, k and v equally
    wide). Weights and biases alike; a permutation of rows, exact both ways."""

    shards: int = 4
    order: tuple[str, ...] = ("q", "v", "k")

    interleaves: ClassVar[bool] = True  # no slice of the stored tensor (or its module's output) is q, k or v

    def bind(self, sizes: Sizes) -> Transform:
        shards, order = self.shards, self.order
        name = f"qkv in {shards} shards of {'|'.join(order)}"
        forward, inverse = (lambda t: shards_to_qkv(t, shards, order)), (lambda t: qkv_to_shards(t, shards, order))
        return Transform(name, forward, inverse, on_rows(name, forward, 1), on_rows(name, inverse, 1))


def _check_shards(t: torch.Tensor, shards: int) -> None:
    if t.shape[0] % (3 * shards):
        raise MappingError(f"{t.shape[0]} rows of q, k and v do not split into {shards} shards of each")


def shards_to_qkv(t: torch.Tensor, shards: int, order: tuple[str, ...]) -> torch.Tensor:
    import torch

    rest = t.shape[1:]
    _check_shards(t, shards)
    grouped = t.reshape(shards, 3, t.shape[0] // (3 * shards), *rest)
    return torch.cat([grouped[:, order.index(name)].reshape(t.shape[0] // 3, *rest) for name in "qkv"])


def qkv_to_shards(t: torch.Tensor, shards: int, order: tuple[str, ...]) -> torch.Tensor:
    import torch

    _check_shards(t, shards)
    parts = t.reshape(3, shards, t.shape[0] // (3 * shards), *t.shape[1:])  # q, k, v, each by shard
    return torch.stack([parts["qkv".index(name)] for name in order], dim=1).reshape(t.shape)


# ---- Unstack: fused experts


@dataclass(frozen=True)
class Unstack:
    """Expert `sizes["index"]`'s matrix out of a fused [experts, rows, cols] tensor (transformers
    5's `experts.gate_up_proj` / `experts.down_proj`), and of its rows the `part`-th of `parts`
    equal blocks (gate rows, then up rows). Forward returns a copy, so that holding one expert
    never holds the fused tensor. Inverse: the whole fused tensor from every expert's blocks, a
    list (one per part) of lists (one per expert, in order); `stack`. Exact both ways: forward of
    each (expert, part) of `stack(pieces)` is that piece, and stacking every forward of t is t."""

    part: int = 0
    parts: int = 1

    def bind(self, sizes: Sizes) -> Transform:
        e, part, parts = _size(sizes, "index"), self.part, self.parts
        where = f" (part {part + 1} of {parts})" if parts > 1 else ""
        name, rows = f"expert {e} of a fused tensor{where}", ExpertRows(e, part, parts)
        return Transform(name, rows, stack, on_rows(name, rows, 1 if parts == 1 else 2), packed_stack)


@dataclass(frozen=True)
class ExpertRows:
    """Unstack's forward, which also says where its result lies in its input: one expert's block
    of rows is one run of the fused tensor's elements, so a conversion copies it byte for byte
    from the file (`span`), as it does an unchanged tensor, instead of reading the whole fused
    tensor and splitting it in memory."""

    expert: int
    part: int
    parts: int

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t[self.expert].chunk(self.parts, 0)[self.part].clone()

    def _rows(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """(first row, row count) of the block within its expert, as `chunk` cuts them."""
        if len(shape) < 2 or not 0 <= self.expert < shape[0]:
            raise MappingError(f"expert {self.expert} of a fused tensor of shape {list(shape)}: no such expert")
        per = -(-shape[1] // self.parts)
        first = self.part * per
        if first >= shape[1]:
            raise MappingError(f"part {self.part + 1} of {self.parts} of a fused tensor of shape {list(shape)}: "
                               "no such rows")
        return first, min(per, shape[1] - first)

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (self._rows(shape)[1], *shape[2:])

    def span(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """[start, stop) of the elements, in the input's C order, that forward returns."""
        first, count = self._rows(shape)
        inner = prod(shape[2:])
        start = (self.expert * shape[1] + first) * inner
        return start, start + count * inner


def stack(pieces: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
    import torch

    return torch.cat([torch.stack(list(experts)) for experts in pieces], dim=1)


def packed_stack(pieces: Sequence[Sequence[Packed]]) -> Packed:
    """`stack` on Packed weights: each part's experts stacked, then the parts' rows joined."""
    import torch

    stacked = [packed_pieces(experts, 1, torch.stack) for experts in pieces]
    return stacked[0] if len(stacked) == 1 else packed_pieces(stacked, 2, lambda ts: torch.cat(ts, dim=1))


# ---- ExpertsTransposed: fused experts stored [experts, in, out]


def _swap_last(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-1, -2).contiguous()


@dataclass(frozen=True)
class ExpertsTransposed:
    """Fused experts stored [experts, in, out] (Aria's `experts.fc1` / `fc2`, multiplied as
    `x @ W`) <-> [experts, out, in], each expert as nn.Linear holds it; chained before Unstack. Its
    own inverse; a permutation of elements, so exact for every dtype and bit pattern."""

    def bind(self, sizes: Sizes) -> Transform:
        return Transform("experts stored [in, out]", _swap_last, _swap_last, swapped, swapped)


# ---- PairedRows: each expert's gate and up rows interleaved


def _pairs_to_halves(t: torch.Tensor) -> torch.Tensor:
    return t.unflatten(1, (-1, 2)).transpose(1, 2).flatten(1, 2)


def _halves_to_pairs(t: torch.Tensor) -> torch.Tensor:
    return t.unflatten(1, (2, -1)).transpose(1, 2).flatten(1, 2)


@dataclass(frozen=True)
class PairedRows:
    """Fused experts whose gate and up rows alternate, [experts, g0 u0 g1 u1 ..., ...] (gpt-oss's
    `gate_up_proj` once transposed, and its `gate_up_proj_bias`: gate = [..., ::2], up = [..., 1::2])
    <-> every gate row, then every up row, as Unstack(part=..., parts=2) takes them; chained before
    Unstack. A permutation of elements, so exact for every dtype and bit pattern."""

    def bind(self, sizes: Sizes) -> Transform:
        name = "gate and up rows interleaved"
        return Transform(name, _pairs_to_halves, _halves_to_pairs, on_rows(name, _pairs_to_halves, 2),
                         on_rows(name, _halves_to_pairs, 2))


# ---- ExpertBlocks: every expert's matrix stacked as rows of one 2-D tensor


@dataclass(frozen=True)
class ExpertBlocks:
    """Fused experts stored as one [experts * rows, cols] matrix (DBRX's `w1`, `v1`, `w2`, each
    expert a block of `rows` rows) <-> [experts, rows, cols]; chained before Unstack. A view both
    ways, so exact for every dtype and bit pattern."""

    rows: str

    def bind(self, sizes: Sizes) -> Transform:
        rows = _size(sizes, self.rows)
        name = f"experts as blocks of {rows} rows"
        return Transform(name, lambda t: t.reshape(-1, rows, t.shape[-1]), lambda t: t.reshape(-1, t.shape[-1]),
                         on_rows(name, lambda t: t.reshape(-1, rows, *t.shape[1:]), 1),
                         on_rows(name, lambda t: t.reshape(-1, *t.shape[2:]), 2))


# ---- Unsqueeze


@dataclass(frozen=True)
class Unsqueeze:
    """A leading dimension of size 1 that the file leaves out (llama.cpp stores Qwen2-MoE's
    shared-expert gate, a [1, hidden] matrix, as a vector). Exact both ways."""

    def bind(self, sizes: Sizes) -> Transform:
        forward, inverse = (lambda t: t.unsqueeze(0)), (lambda t: t.squeeze(0))
        return Transform("a leading dimension of 1", forward, inverse, on_rows("unsqueeze", forward, 0),
                         on_rows("squeeze", inverse, 1))


# ---- Squeeze


@dataclass(frozen=True)
class Squeeze:
    """A leading dimension of size 1 that the file has and the canonical tensor does not (ERNIE
    4.5's `e_score_correction_bias`, [1, experts]: one group of experts). Exact both ways."""

    def bind(self, sizes: Sizes) -> Transform:
        forward, inverse = (lambda t: t.squeeze(0)), (lambda t: t.unsqueeze(0))
        return Transform("a leading dimension of 1 left out", forward, inverse, on_rows("squeeze", forward, 1),
                         on_rows("unsqueeze", inverse, 0))


# ---- EqualPart: one canonical tensor stored as equal parts, each its own tensor


@dataclass(frozen=True)
class EqualPart:
    """Part `index` of `count` equal blocks along dim 0 of one canonical tensor, each stored as its own
    tensor: Kimi Linear's q_conv1d, k_conv1d and v_conv1d are the rows of its one conv1d over q | k | v.
    Each part has a rule of its own naming the same canonical tensor (the table gathers them); forward,
    given every part in order, concatenates them; the inverse is this part (a copy). `unit_first`: each
    part is stored with a leading dimension of 1 (llama.cpp's ssm_conv1d_q/k/v, [1, channels, 1, kernel]
    where ours are [channels, 1, kernel]). Exact both ways."""

    count: int
    index: int
    unit_first: bool = False
    gathers: ClassVar[bool] = True  # the table hands forward every part

    def bind(self, sizes: Sizes) -> Transform:
        count, index, unit = self.count, self.index, self.unit_first
        if unit:
            return Transform(f"part {index} of {count} equal blocks, stored [1, ...]",
                             lambda parts: join([p.squeeze(0) for p in parts], 0),
                             lambda t: t.chunk(count, 0)[index].unsqueeze(0).clone(), gathers=True)
        return Transform(f"part {index} of {count} equal blocks", lambda parts: join(parts, 0),
                         lambda t: t.chunk(count, 0)[index].clone(), gathers=True)


# ---- Shaped: a vector stored with unit dimensions around it


@dataclass(frozen=True)
class Shaped:
    """A canonical vector stored as a tensor of `shape` (one -1, the rest 1s): Kimi Linear's A_log,
    one value per head, stored [1, 1, heads, 1]. Exact both ways."""

    shape: tuple[int, ...]

    def bind(self, sizes: Sizes) -> Transform:
        shape = self.shape
        return Transform(f"stored as {list(shape)}", lambda t: t.reshape(-1), lambda t: t.reshape(shape))


# ---- Chain


@dataclass(frozen=True)
class Chain:
    """Steps in order: forward runs them first to last, inverse undoes them last to first."""

    @property
    def interleaves(self) -> bool:
        return any(getattr(step, "interleaves", False) for step in self.steps)

    steps: tuple[Step | Transform, ...]

    def __init__(self, *steps: Step | Transform) -> None:
        object.__setattr__(self, "steps", steps)

    def bind(self, sizes: Sizes) -> Transform:
        bound = [s.bind(sizes) for s in self.steps]
        bound = [b for b in bound if b is not IDENTITY]
        if not bound:
            return IDENTITY
        if len(bound) == 1:
            return bound[0]

        def forward(t: Any) -> Any:  # noqa: ANN401
            for b in bound:
                t = b.forward(t)
            return t

        def inverse(t: Any) -> Any:  # noqa: ANN401
            for b in reversed(bound):
                t = b.inverse(t)
            return t

        movable = all(b.packed_forward is not None and b.packed_inverse is not None for b in bound)

        def packed_forward(p: Packed) -> Packed:
            for b in bound:
                p = b.packed_forward(p)  # type: ignore[misc]
            return p

        def packed_inverse(p: Any) -> Packed:  # noqa: ANN401 - a Packed, or the pieces the last step joins
            for b in reversed(bound):
                p = b.packed_inverse(p)  # type: ignore[misc]
            return p

        return Transform(" then ".join(b.name for b in bound), forward, inverse,
                         packed_forward if movable else None, packed_inverse if movable else None)


# ---- NEG_EXP


def _log_of_negated(t: Any) -> Any:  # noqa: ANN401 - a tensor
    import torch

    return torch.log(-t)


def _negated_exp(t: Any) -> Any:  # noqa: ANN401 - a tensor
    import torch

    return -torch.exp(t)


# a state-space model's A stored as A = -exp(A_log), as llama.cpp's converters write it (mamba, mamba2, jamba, the
# granite hybrids, nemotron_h): import takes log(-A). Not exact: log(-(-exp(x))) comes back within a few ulps of
# x, not bit for bit, so a GGUF's A_log is compared to its source at that bar (tests/test_export_gguf.py)
NEG_EXP = Transform("A_log stored as A = -exp(A_log)", _log_of_negated, _negated_exp)
