"""Latent attention (MLA) decoding, expanded against absorbed, on CPU.

Model: a DeepSeek-V2-Lite-like latent decoder scaled down (random weights, the canonical Decoder
alone): 8 layers, d_model 1024, 16 heads, kv_lora_rank 256, head dims 64 + 32 (rotary), v 64, no
q LoRA. Prefills --context tokens, then decodes --new tokens greedily with the latent KV cache.
"expanded" is transformers' way (kv_b expands every cached token into per-head keys and values
at each step); "absorbed" folds kv_b into the query and the output and attends in latent space.
The prefill runs expanded in both modes. Each mode runs in its own process so that its peak
resident memory is its own (prefill included, so only growth past it shows decoding's cost); the
table gives decode tokens/s, the peak RSS, and the logits' largest difference between the modes.

    python bench/mla_decode.py [--context 4096] [--new 32]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import table  # noqa: E402

from lmconvert.arch import ArchConfig, Decoder  # noqa: E402
from lmconvert.arch.latent_attention import absorb  # noqa: E402

SHAPE = dict(vocab_size=32000, d_model=1024, n_layers=8, n_heads=16, d_ff=2816, head_dim=32, max_positions=8192,
             attention="latent", attention_settings=dict(kv_lora_rank=256, qk_nope_head_dim=64, v_head_dim=64))


@torch.no_grad()
def measure(mode: str, context: int, new: int) -> dict[str, object]:
    torch.manual_seed(0)
    model = Decoder(ArchConfig(**SHAPE)).eval()
    ids = torch.randint(0, SHAPE["vocab_size"], (1, context), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache()
    logits = model(ids, cache=cache)[:, -1:]  # prefill expanded in both modes: the same peak so far
    absorb(model, mode == "absorbed")
    seen = []
    start = time.perf_counter()
    for _ in range(new):
        logits = model(logits.argmax(-1), cache=cache)
        seen.append(logits)
    elapsed = time.perf_counter() - start
    return {"tok_s": new / elapsed, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "logits": torch.cat(seen, 1)[..., :256].flatten().tolist()}  # each decoded step's first logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--mode", choices=("expanded", "absorbed"), help=argparse.SUPPRESS)  # one child process
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(measure(args.mode, args.context, args.new)))
        return
    results = {}
    for mode in ("expanded", "absorbed"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--context", str(args.context),
                              "--new", str(args.new)], capture_output=True, text=True, check=True).stdout
        results[mode] = json.loads(out)
    diff = max(abs(a - b) for a, b in zip(results["expanded"]["logits"], results["absorbed"]["logits"], strict=True))
    cfg = ArchConfig(**SHAPE)
    rows = [["mode", f"decode tok/s at {args.context}", "peak RSS MiB"]]
    rows += [[mode, f"{r['tok_s']:.1f}", f"{r['rss_mib']:.0f}"] for mode, r in results.items()]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; latent cache "
          f"{cfg.kv_cache_bytes_per_token(4):,} bytes per token (fp32); max |logit difference| {diff:.2e}")
    print(table(rows))


if __name__ == "__main__":
    main()
