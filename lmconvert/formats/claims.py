"""What a config may claim, bounded by what the files hold.

Everything built from a config grows with what it claims: the expected-tensor map, per-layer
tables, gguf's tensor-name map. A config.json claiming 1,000,000 layers beside the weights of two
made a conversion build nine million expected names (4 GB) before it found that they were
missing. So the claimed layer count is compared with the tensors that exist first, and refused
when the files cannot hold that many layers, before anything proportional to the claim is built.
Memory then stays proportional to the files' own tensor tables.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from .errors import InputError

# A layer's index is the first number between dots in its tensors' names, in every layout lmconvert
# reads: `model.layers.3.mlp...` (HF), `layers.3.attn...` (canonical, Meta), `blk.3.attn_q...` (GGUF).
_LAYER_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def layers_held(names: Iterable[str]) -> tuple[int, bool]:
    """(how many layers these tensors can hold, whether that is exact). Exact: one more than the
    highest layer index present. Never more than the number of tensors either, since every layer
    owns tensors of its own; a lone `layers.999999.x` does not buy a million layers."""
    count, highest = 0, -1
    for name in names:
        count += 1
        match = _LAYER_INDEX.search(name)
        if match:
            highest = max(highest, int(match.group(1)))
    return (highest + 1, True) if highest + 1 <= count else (count, False)


def check_layer_claim(claimed: object, held: tuple[int, bool], weights: Path | str, config: str, key: str) -> None:
    """Refuse a claimed layer count the tensors in `weights` cannot hold. A claim that is not an
    integer is left to the config reader, which names the type it wants. `held` is what
    `layers_held` found in the tensors' names."""
    if isinstance(claimed, bool) or not isinstance(claimed, int):
        return
    count, exact = held
    if claimed > count:
        amount = f"{count} layer{'s' if count != 1 else ''}"
        raise InputError(f"{weights}: holds {amount if exact else 'tensors for at most ' + amount}, but {config} says "
                         f"{key}={claimed}; check that they match")
