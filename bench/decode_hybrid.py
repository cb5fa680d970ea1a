"""Decoding a gated delta-net hybrid on CPU: lmconvert's decoder against transformers' own torch path.

Model: Qwen3-Next's shape scaled down (random fp32 weights, written by transformers'
Qwen3NextForCausalLM and converted to canonical by `lmconvert convert`): d_model 512, 8 layers,
three gated delta-net layers to one gated attention layer, 8 attention heads x 128 over 2 KV heads,
delta-net 4 q/k heads x 128 and 8 value heads x 128 with a conv of 4, a mixture of 16 experts (2 a
token, 256 wide) with a 256-wide shared expert, a 32000-token vocabulary. transformers runs its torch
fallbacks (no `fla`, no `causal_conv1d`), sdpa attention and its own hybrid cache; lmconvert runs
`lmconvert.load` and the decoder's cached forward (sdpa).

Each (contender, context) runs in its own process: prefill --context random tokens once (the logits
of the last token only, as `generate` does), then --new greedy decoding steps through the cache,
each step timed. The rounds alternate the contenders, each run starting from the same state
(`common.prepare`: dirty pages written, freed memory handed back, the checkpoint in the page cache).
The table gives medians over the rounds with their spread (min-max): decode tokens/s, the prefill's
seconds, the process's peak RSS (prefill included) and its RSS after decoding; then the bytes the
decoding state holds at that context, counted on each contender's live cache and from the card
(`ArchConfig.cache_bytes`), against the same model with attention on all 8 layers.

    python bench/decode_hybrid.py [--contexts 4096 16384] [--new 32] [--repeat 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]  # this tree's lmconvert, not an installed one
from common import measure_rounds, table  # noqa: E402

L, F = "linear_attention", "full_attention"
SHAPE = dict(
    architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", vocab_size=32000, hidden_size=512,
    num_hidden_layers=8, layer_types=[L, L, L, F] * 2, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
    linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=256,
    shared_expert_intermediate_size=256, intermediate_size=1024, decoder_sparse_step=1, mlp_only_layers=[],
    max_position_embeddings=32768, tie_word_embeddings=False, rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    bos_token_id=0, eos_token_id=1,
)
CONTENDERS = ("transformers", "lmconvert")


def write_checkpoint(directory: Path) -> None:
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    config = Qwen3NextConfig(**{k: v for k, v in SHAPE.items() if k not in ("architectures", "model_type")})
    Qwen3NextForCausalLM(config).to(torch.float32).save_pretrained(directory)


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def live_bytes(tensors: object) -> int:
    """The bytes of every tensor reachable through lists, tuples and dicts (a cache's layers)."""
    import torch

    if isinstance(tensors, torch.Tensor):
        return tensors.nbytes
    if isinstance(tensors, dict):
        tensors = tensors.values()
    if isinstance(tensors, (list, tuple, type({}.values()))):
        return sum(live_bytes(t) for t in tensors)
    return 0


def hf_cache_bytes(cache: object) -> int:
    return sum(live_bytes(list(vars(layer).values())) for layer in cache.layers)


def run(contender: str, directory: Path, context: int, new: int) -> dict[str, object]:
    import torch

    ids = torch.randint(2, SHAPE["vocab_size"], (1, context), generator=torch.Generator().manual_seed(1))
    if contender == "transformers":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(directory / "hf", dtype=torch.float32).eval()
        from importlib.util import find_spec

        if find_spec("fla") or find_spec("causal_conv1d"):
            sys.exit("fla or causal_conv1d is installed: transformers would not run its torch path")
        cache = None

        def step(tokens: torch.Tensor, first: bool = False) -> torch.Tensor:
            nonlocal cache
            out = model(input_ids=tokens, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            return out.logits[:, -1]

        def held() -> int:
            return hf_cache_bytes(cache)
    else:
        from collections import deque

        import lmconvert

        assert Path(lmconvert.__file__).is_relative_to(ROOT), lmconvert.__file__
        model = lmconvert.load(directory / "canonical")
        cache = model.new_cache()

        def step(tokens: torch.Tensor, first: bool = False) -> torch.Tensor:
            (last,) = deque(model.states(tokens, cache=cache), maxlen=1)  # the last token's logits only
            return model.logits(last[:, -1:])[:, -1]

        def held() -> int:
            return live_bytes([cache.keys, cache.values, cache.index_keys, cache.states])
    with torch.inference_mode():
        start = time.perf_counter()
        logits = step(ids, first=True)
        prefill = time.perf_counter() - start
        rss_prefill = rss_now()
        tokens, times = [], []
        for _ in range(new):
            token = logits.argmax(-1, keepdim=True)
            tokens.append(int(token))
            start = time.perf_counter()
            logits = step(token)
            times.append(time.perf_counter() - start)
    result = {"prefill_s": prefill, "decode_tok_s": new / sum(times), "step_ms_median": statistics.median(times) * 1e3,
              "rss_prefill": rss_prefill, "rss_end": rss_now(), "state_bytes": held(), "tokens": tokens}
    if contender == "lmconvert":  # the card's figures, and the same shape with attention on every layer
        import dataclasses

        cfg = model.cfg
        every = dataclasses.replace(cfg, mixer=None, mixer_settings=None, layer_mixers=("attention",) * cfg.n_layers)
        result["card"] = {"hybrid": cfg.cache_bytes(context + new, 4),
                          "hybrid_kv_per_token": cfg.kv_cache_bytes_per_token(4),
                          "hybrid_state_per_sequence": cfg.state_bytes_per_sequence(4),
                          "all_attention": every.cache_bytes(context + new, 4),
                          "all_attention_kv_per_token": every.kv_cache_bytes_per_token(4)}
    return result


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch's threads in each contender (OMP_NUM_THREADS)")
    parser.add_argument("--workdir", type=Path, help="keep the checkpoints here (default: a temporary directory)")
    parser.add_argument("--child", nargs=3, metavar=("CONTENDER", "DIR", "CONTEXT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        contender, directory, context = args.child
        print("RESULT " + json.dumps(run(contender, Path(directory), int(context), args.new)))
        return
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        code = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); from decode_hybrid import "
                f"write_checkpoint; from pathlib import Path; write_checkpoint(Path({str(work / 'hf')!r}))")
        subprocess.run([sys.executable, "-c", code], check=True)
        subprocess.run([sys.executable, "-m", "lmconvert.cli", "convert", str(work / "hf"), str(work / "canonical")],
                       check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        steps = [(f"{c}@{n}", [sys.executable, __file__, "--new", str(args.new), "--child", c, str(work), str(n)],
                  work, []) for n in args.contexts for c in CONTENDERS]
        runs = measure_rounds(steps, args.repeat, cached=True)
    load = os.getloadavg()
    print(f"{args.threads} thread(s) per contender, {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f} at the end; {args.new} decoded tokens after each context; medians of {args.repeat} "
          f"rounds (min-max)")
    rows = [["context", "contender", "decode tok/s", "prefill s", "peak RSS MiB", "RSS after MiB", "state MiB"]]
    results = {}
    for label, measured in runs.items():
        contender, n = label.split("@")
        found = [json.loads(m.output.split("RESULT ", 1)[1]) for m in measured]
        results[label] = found
        rows.append([n, contender, spread([r["decode_tok_s"] for r in found], ".2f"),
                     spread([r["prefill_s"] for r in found], ".1f"),
                     spread([m.peak_rss / 2**20 for m in measured], ",.0f"),
                     mib(statistics.median(r["rss_end"] for r in found)), mib(found[0]["state_bytes"])])
    print(table(rows))
    print()
    for n in args.contexts:
        ours, theirs = results[f"lmconvert@{n}"], results[f"transformers@{n}"]
        speed = statistics.median(r["decode_tok_s"] for r in ours) / \
            statistics.median(r["decode_tok_s"] for r in theirs)
        rss = statistics.median(m.peak_rss for m in runs[f"lmconvert@{n}"]) / \
            statistics.median(m.peak_rss for m in runs[f"transformers@{n}"])
        same = sum(a == b for a, b in zip(ours[0]["tokens"], theirs[0]["tokens"], strict=True))
        card = ours[0]["card"]
        print(f"context {n}: lmconvert / transformers decode tok/s {speed:.2f}x, peak RSS {rss:.2f}x; "
              f"greedy tokens equal {same}/{args.new}")
        print(f"  state at {n + args.new} tokens (fp32): hybrid {mib(card['hybrid'])} MiB on the card "
              f"({card['hybrid_kv_per_token']:,} B/token KV + {card['hybrid_state_per_sequence']:,} B fixed), "
              f"live {mib(ours[0]['state_bytes'])} MiB ours, {mib(theirs[0]['state_bytes'])} MiB transformers'; "
              f"all-attention {mib(card['all_attention'])} MiB ({card['all_attention_kv_per_token']:,} B/token): "
              f"{card['all_attention'] / card['hybrid']:.2f}x the hybrid's")


if __name__ == "__main__":
    main()
