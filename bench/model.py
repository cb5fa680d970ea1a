"""The canonical model against transformers on CPU: same checkpoint, same dtype, same threads.

Model: SmolLM2-135M's shape (LLaMA family, 30 layers, GQA 9/3, tied 49152 vocab), random
weights. Measures prefill (1 x 512 and 8 x 128 tokens) and greedy decoding of 128 new tokens
with the KV cache (ours: Decoder.generate; theirs: model.generate), in fp32 and bf16, and prints
tokens/s and the ratio ours / transformers (>= 1.0 means we are at least as fast). Both run the
SDPA attention backend, as transformers does by default. Both live in one process, so the two are
timed in alternation (ours, theirs, ours, ...: the allocator and cache states they meet even out)
and each figure is the best of --repeat runs.

    python bench/model.py [--repeat 5] [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import table  # noqa: E402

import lmconvert  # noqa: E402

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
                    tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 100000.0})


def best_of_alternating(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """The best time of each callable, run in alternation (a, b, c, a, b, c, ...)."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, out in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return [min(t) for t in times]


@torch.no_grad()
def run(directory: Path, dtype: torch.dtype, repeat: int) -> list[list[str]]:
    """Ours, transformers, and a second transformers instance: the last column (transformers
    against itself, same kernels, same weights) shows how far apart identical work lands here."""
    theirs = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()  # sdpa, transformers' default
    control = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    ours = lmconvert.load(directory, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    rows = []
    for batch, seq in ((1, 512), (8, 128)):
        ids = torch.randint(0, 49152, (batch, seq), generator=g)
        ours(ids), theirs(ids), control(ids)  # warm-up
        t_ours, t_theirs, t_control = best_of_alternating(
            [lambda ids=ids: ours(ids), lambda ids=ids: theirs(ids, use_cache=False),
             lambda ids=ids: control(ids, use_cache=False)], repeat)
        tokens = batch * seq
        rows.append([f"prefill {batch}x{seq}", str(dtype)[6:], f"{tokens / t_ours:.0f}", f"{tokens / t_theirs:.0f}",
                     f"{t_theirs / t_ours:.2f}", f"{t_theirs / t_control:.2f}"])
    prompt = torch.randint(0, 49152, (1, 16), generator=g)
    new = 128

    def hf_generate(model: torch.nn.Module) -> torch.Tensor:
        return model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    same = torch.equal(ours.generate(prompt, new), hf_generate(theirs))
    t_ours, t_theirs, t_control = best_of_alternating(
        [lambda: ours.generate(prompt, new), lambda: hf_generate(theirs), lambda: hf_generate(control)], repeat)
    rows.append([f"decode {new} tokens", str(dtype)[6:], f"{new / t_ours:.1f}", f"{new / t_theirs:.1f}",
                 f"{t_theirs / t_ours:.2f}" + ("" if same else " (tokens differ)"), f"{t_theirs / t_control:.2f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M))
        model.save_pretrained(tmp)
        del model
        rows = [["workload", "dtype", "ours tok/s", "transformers tok/s", "ours / transformers",
                 "transformers / itself"]]
        for name in args.dtypes.split(","):
            rows += run(Path(tmp), getattr(torch, name), args.repeat)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(table(rows))


if __name__ == "__main__":
    main()
