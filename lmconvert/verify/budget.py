"""What a verify run may ask for: the token batch (--batch x --seq-len) and the greedy tokens
(--generate), held to the model's positions and to the memory they need, before anything is
allocated.

`--seq-len 10**9` used to try for 16 GB of random ids before anything said no, and a large
`--batch` or `--generate` ran until the machine gave out. The memory is estimated from the
ArchConfig: a lower bound, counting only what a run certainly holds at once, so a refusal never
stops a run that would have fit:

- the logits, B x T x vocab, in fp32 on both sides and once more as the comparison's difference;
- every hidden state recorded at every point of every layer (`trace.py`), on both sides (8 bytes
  per value in every dtype: fp32 twice, or low precision twice plus the fp32 reference);
- eager attention's score matrix, B x heads x T x T in fp32, one layer at a time;
- greedy generation's step logits, new tokens x vocab, on both sides.

The limit is the memory available now (`runtime.memory.available_memory`); on CUDA, the device's
free memory for the part that lives there.
"""

from __future__ import annotations

from pathlib import Path

from lmconvert.arch import ArchConfig
from lmconvert.formats.errors import InputError
from lmconvert.runtime.memory import available_memory, size_text

FP32 = 4
POINT_BYTES = 8  # per recorded value, both sides together (see above)


def device_free(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.mem_get_info(torch.device(device))[0]


def needed(arch: ArchConfig, batch: int, seq_len: int, new_tokens: int) -> tuple[int, int]:
    """(bytes held in host memory, bytes on the compute device at the peak) for a verify run; a
    lower bound (see the module docstring)."""
    tokens = batch * seq_len
    mlp = arch.d_ff * (3 if arch.gated else 2)
    per_layer = 5 * arch.d_model + arch.q_dim + 2 * arch.kv_dim + mlp  # norms, q/k/v/o, MLP, block output
    points = tokens * arch.n_layers * per_layer * POINT_BYTES
    logits = tokens * arch.vocab_size * FP32
    generation = 2 * new_tokens * arch.vocab_size * FP32
    scores = batch * arch.n_heads * seq_len * seq_len * FP32
    return points + 3 * logits + generation, logits + scores


def check_request(arch: ArchConfig, batch: int, seq_len: int, new_tokens: int, device: str = "cpu",
                  golden: Path | None = None) -> None:
    """Refuse, in one line naming the limit, a batch or generation the model's positions or this
    machine's memory cannot hold; with `golden`, the shapes came from that file, not from options."""
    asked = f"--golden {golden}" if golden else f"--batch {batch} x --seq-len {seq_len}"
    if seq_len > arch.max_positions:
        fix = "it was recorded for another model" if golden else f"use at most {arch.max_positions}"
        raise InputError(f"{f'--golden {golden}' if golden else f'--seq-len {seq_len}'}: {seq_len} tokens per "
                         f"sequence, more than the model's max_positions {arch.max_positions}; {fix}")
    if new_tokens > arch.max_positions:
        raise InputError(f"--generate {new_tokens}: more tokens than the model's max_positions "
                         f"{arch.max_positions}; use fewer")
    fix = "record it with a smaller batch" if golden else "lower --seq-len, --batch or --generate"
    host, on_device = needed(arch, batch, seq_len, new_tokens)
    free = device_free(device)
    if free is None:
        host += on_device
    elif on_device > free:
        raise InputError(f"{asked}: verify needs at least {size_text(on_device)} on {device} for logits and attention "
                         f"scores, more than its {size_text(free)} free; {fix}")
    available = available_memory()
    if available is not None and host > available:
        raise InputError(f"{asked}, --generate {new_tokens}: verify needs at least {size_text(host)} of memory for "
                         f"logits and hidden states, more than the {size_text(available)} available; {fix}")
