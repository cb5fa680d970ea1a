"""The reference of a quantized GGUF file that transformers' GGUF loader cannot read: the file's own
weights, as our reader dequantizes them (with the `gguf` package's `dequantize`, as transformers'
loader does for the architectures it reads), written out in the family's HF layout in a temporary
directory for transformers to load. Both sides then hold the same weights, so verify measures the
computation, not the quantization."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors.torch import save_file

from lmconvert.formats.checkpoint import Checkpoint
from lmconvert.formats.source import Loadable
from lmconvert.mappings.family import tensor_sizes


@contextmanager
def materialized(where: Loadable, checkpoint: Checkpoint) -> Iterator[Loadable]:
    """`where` itself, or for a dequantized reference a directory transformers loads, for the run."""
    if not where.dequantized:
        yield where
        return
    family, arch = checkpoint.family, checkpoint.arch
    with tempfile.TemporaryDirectory(prefix="lmconvert-dequantized-") as tmp:
        directory = Path(tmp)
        canonical = dict(checkpoint.tensors())
        plan = family.tensors_for(arch).plan_export(canonical, tensor_sizes(arch))
        state = {}
        for stored, (source, transform) in plan.items():
            pieces = [canonical[s] for s in source] if isinstance(source, tuple) else canonical[source]
            state[stored] = transform.inverse(pieces).contiguous()
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
        (directory / "config.json").write_text(json.dumps(family.hf_config(arch, family.name), indent=2))
        yield Loadable(directory, origin=where.origin)
