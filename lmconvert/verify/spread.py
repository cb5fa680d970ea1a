"""How much of transformers' reference each GPU takes when it is spread over several: the
`max_memory` that accelerate's own placement (`infer_auto_device_map`) is given. Pure arithmetic on
sizes, kept apart from loading so that it is tested on CPU with a real model's module sizes.

accelerate fills devices in order with whole blocks (a decoder layer is never split), so a budget
of the free memory on every GPU would put a model that fits one GPU all on the first, and leave the
others idle. Each GPU but the last is therefore held to an equal share of the weights plus one
block, the largest indivisible module: accelerate keeps that much free on the first GPU (the one
that runs offloaded modules), so the first takes about one share and the next ones no more than a
share and a block. The last GPU takes whatever is left, up to its own free memory, before anything
spills to the CPU or disk.

What each GPU can give is its free memory when the reference loads, less `reserve`, the
activations the reference computes there (logits and attention scores, `budget.needed`). Under
torchrun the reference is recorded before any rank loads its slices of our model, and freed
before they do, so the slices (1/N of the model per GPU) need no room beside it: only the other
ranks' CUDA contexts, which the free memory already counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def spread_memory(free: Sequence[int], sizes: Mapping[str, int], blocks: Iterable[str], reserve: int = 0,
                  max_memory: int | None = None) -> dict[int | str, int]:
    """accelerate's `max_memory` for a reference spread over `len(free)` GPUs (indices 0..n-1).

    free: bytes free on each GPU; sizes: module sizes in bytes by name ("" the whole model, as
    `compute_module_sizes` gives them); blocks: the names of the modules that cannot be split;
    reserve: bytes each GPU keeps for activations; max_memory (`--max-memory`): at most this on
    each GPU and this much of CPU RAM, the rest offloaded to disk. Without it nothing goes to the
    CPU: what does not fit the GPUs lands on disk in the map, and the caller refuses it."""
    if not free:
        raise ValueError("spread_memory needs at least one GPU")
    caps = [max(0, f - reserve) if max_memory is None else max(0, min(f - reserve, max_memory)) for f in free]
    largest = max((sizes[name] for name in blocks), default=0)
    share = -(-sizes[""] // len(free)) + largest
    budgets: dict[int | str, int] = {i: min(cap, share) for i, cap in enumerate(caps)}
    budgets[len(caps) - 1] = caps[-1]
    if max_memory is not None:
        budgets["cpu"] = max_memory
    return budgets
