"""What one `verify` run was asked for, as one value: built once from the caller's options and
handed down whole, so the single-process and the torchrun paths cannot read it differently."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lmconvert.formats.errors import InputError

from .layer_progress import Stages


@dataclass(frozen=True)
class Request:
    checkpoint: Path
    reference: Path | None = None  # --reference; None: the checkpoint itself, or the source it records
    dtype: str | None = None  # both sides compute in it; None: float32
    device: str | None = None  # None: the CPU, or under torchrun where the ranks run
    seq_len: int | None = None  # None: default_seq_len (past every window)
    batch: int = 2
    seed: int = 0
    generate: int = 16  # greedy tokens compared after the prompt
    max_memory: int | None = None  # bytes: our side streams a block at a time, transformers offloads
    golden: Path | None = None  # check against this record, without transformers
    save_golden: Path | None = None  # store what transformers computed
    padded: bool = False  # rows of different lengths, left-padded under an attention mask
    force: bool = False  # replace an output lmconvert wrote
    writes: Mapping[str, Path | None] = field(default_factory=dict)  # files the caller writes from the report
    stages: Stages | None = field(default=None, compare=False)  # the progress line's stages (layer_progress.py)

    def __post_init__(self) -> None:
        if self.golden is not None and (self.reference is not None or self.save_golden is not None or self.padded):
            raise InputError("--golden checks against a recorded file (its own batch); drop --reference, "
                             "--save-golden and --padded")

    @property
    def stream(self) -> bool:
        return self.max_memory is not None
