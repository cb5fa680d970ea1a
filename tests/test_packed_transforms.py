"""Each table transform's counterpart on a quantized weight's stored parts (`Packed`,
mappings/tables/transforms.py): moving the parts and then dequantizing gives, bit for bit, the
float weight dequantized and then transformed, both ways; a move of the inputs (which the parts
hold in groups) is refused, and so is every transform declared without a counterpart. The parts
are random MXFP4 blocks and scales (formats/mxfp4.py dequantizes them)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lmconvert.formats.mxfp4 import dequantize
from lmconvert.mappings.tables.transforms import (
    CannotMoveGroups,
    Chain,
    ExpertBlocks,
    ExpertsTransposed,
    Offset,
    Packed,
    PairedRows,
    Permute,
    Piece,
    QkvGroups,
    QkvShards,
    Squeeze,
    Transpose,
    Trim,
    Unsqueeze,
    Unstack,
)

SIZES = {"heads": 4, "kv_heads": 2, "head_dim": 4, "index": 1, "q": 16, "kv": 8, "rows": 6, "vocab": 10,
         "padded": 12}


def random_parts(*rows: int, groups: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"blocks": torch.randint(0, 256, (*rows, groups, 16), dtype=torch.uint8, generator=g),
            "scales": torch.randint(100, 140, (*rows, groups), dtype=torch.uint8, generator=g)}


def weight(p: Packed) -> torch.Tensor:
    """The float weight a Packed weight stands for, as it stands."""
    parts = p.parts()
    w = dequantize(parts["blocks"], parts["scales"])
    return w.transpose(-1, -2) if p.transposed else w


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and torch.equal(a.view(torch.int32), b.contiguous().view(torch.int32))


# (transform, stored parts' rows, transposed as stored)
MOVES: list[tuple[Any, tuple[int, ...], bool]] = [
    (Permute("heads"), (32,), False),
    (Piece(("q", "kv", "kv"), 1), (32,), False),
    (Transpose(), (8,), False),
    (Transpose(), (8,), True),
    (QkvGroups(), (32,), False),
    (QkvShards(shards=2), (24,), False),
    (Unstack(), (3, 8), False),
    (Unstack(), (3, 8), True),  # one expert of a transposed fused tensor: the experts are rows either way
    (Unstack(part=1, parts=2), (3, 8), False),
    (Chain(ExpertsTransposed(), PairedRows(), Unstack(part=0, parts=2)), (3, 8), True),  # gpt-oss's gate_up
    (Chain(ExpertsTransposed(), Unstack()), (3, 8), True),  # gpt-oss's down
    (Chain(ExpertBlocks("rows"), Unstack()), (18,), False),
    (Unsqueeze(), (8,), False),
    (Squeeze(), (1, 8), False),
]


@pytest.mark.parametrize(("step", "rows", "transposed"), MOVES, ids=lambda x: type(x).__name__)
def test_moving_parts_is_moving_the_weight(step: Any, rows: tuple[int, ...], transposed: bool) -> None:
    t = step.bind(SIZES)
    stored = Packed.of(random_parts(*rows), len(rows), transposed)
    moved = t.packed_forward(stored)
    same(weight(moved), t.forward(weight(stored)))
    back = t.packed_inverse(moved) if not isinstance(step, (Piece, Unstack, Chain)) else None
    if back is not None:
        same(weight(back), weight(stored))


def test_inverses_that_join_pieces() -> None:
    """Unstack's inverse stacks every expert's pieces (gate, then up), Piece's joins the pieces:
    the parts joined are the parts of the weights joined."""
    sizes = dict(SIZES)
    gate_up = Chain(ExpertsTransposed(), PairedRows(), Unstack(part=0, parts=2)).bind({**sizes, "index": 0})
    pieces = [[Packed.of(random_parts(8, groups=3, seed=3 * p + e), 1) for e in range(3)] for p in range(2)]
    joined = gate_up.packed_inverse(pieces)
    same(weight(joined), gate_up.inverse([[weight(p) for p in experts] for experts in pieces]))
    assert joined.transposed
    piece = Piece(("q", "kv", "kv"), 0).bind(sizes)
    parts = [Packed.of(random_parts(n, seed=n + i), 1) for i, n in enumerate((16, 8, 8))]
    same(weight(piece.packed_inverse(parts)), piece.inverse([weight(p) for p in parts]))


@pytest.mark.parametrize(("step", "rows", "transposed"), [
    (Permute("heads"), (32,), True),  # the rows of a transposed weight are its inputs
    (PairedRows(), (3, 8), True),
    (Unstack(part=0, parts=2), (3, 8), True),
], ids=["permute", "paired", "unstack-part"])
def test_moving_the_inputs_is_refused(step: Any, rows: tuple[int, ...], transposed: bool) -> None:
    with pytest.raises(CannotMoveGroups):
        step.bind(SIZES).packed_forward(Packed.of(random_parts(*rows, groups=2), len(rows), transposed))


@pytest.mark.parametrize("step", [Offset(1.0), Trim("vocab", "padded")], ids=["offset", "trim"])
def test_value_changes_have_no_counterpart(step: Any) -> None:
    t = step.bind(SIZES)
    assert t.packed_forward is None and t.packed_inverse is None
    assert Chain(Transpose(), step).bind(SIZES).packed_forward is None
