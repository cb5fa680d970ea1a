"""`verify`'s progress in decoder layers run, for the CLI's progress line: a 7B model on a CPU runs a
layer in seconds, and a verify runs the stack 1 + N times on each side (the batch, then one pass per
generated token), plus once more in fp32 for a low-precision reference's error bar."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn

Progress = Callable[[int, int], None]  # (layers run, layers in all)
Stages = Callable[[str], Progress]  # a stage's label -> its progress callback


def decoder_blocks(model: nn.Module, layers: int) -> list[nn.Module]:
    """The stack: the first module list of `layers` modules (transformers' `model.layers`, ours'
    `layers`, whatever a family calls it); none where a model has no such list."""
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == layers:
            return list(module)
    return []


@contextmanager
def counting_layers(stages: Stages | None, label: str, model: nn.Module, layers: int, passes: int) -> Iterator[None]:
    """While inside, each block of `model` that finishes counts one layer of the stage `label`, out of
    `layers` x `passes` (a count that runs past it raises the total rather than showing over 100%)."""
    if stages is None:
        yield
        return
    progress, total, done = stages(label), layers * passes, [0]

    def finished(_module: nn.Module, _args: object, _output: object) -> None:
        done[0] += 1
        progress(done[0], max(total, done[0]))

    handles = [block.register_forward_hook(finished) for block in decoder_blocks(model, layers)]
    progress(0, total)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
