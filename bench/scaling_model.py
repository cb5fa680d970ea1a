"""The arithmetic of docs/scaling.md: what a bf16 `verify` of Llama-3.1-405B and DeepSeek-V3 (671B) needs
per rank under lmconvert's tensor-parallel plan (runtime/tensor_parallel.py) on 8 and 16 GPUs of 80 GB,
and how long it takes. Pure arithmetic from the models' configs and the hardware's data-sheet figures
(stated below, with the fraction of each assumed reachable); bench/tensor_parallel.py checks the
per-rank weight bytes of the same plan against measurement at the 1B scale.

    python bench/scaling_model.py
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
BF16 = 2

# H100 SXM 80 GB, data sheet; the fractions are what a well-behaved run reaches (assumptions)
HBM_BYTES, HBM_BW, HBM_FRACTION = 80 * GB, 3.35e12, 0.7
PEAK_FLOPS, MFU = 989e12, 0.35  # bf16 dense; a batch of 128 tokens is far from saturating it
NVLINK_LATENCY, IB_LATENCY = 25e-6, 60e-6  # one small all-reduce inside a node / across nodes (8 GPUs each)
DISK_BW = 5 * GB  # per node: NVMe read of the rank's slices (page cache cold)
HOST_TO_GPU_BW = 25 * GB  # PCIe 5 x16, achievable: accelerate's offloaded blocks cross it each forward
RESERVED = 6 * GB  # per GPU: CUDA context, NCCL buffers, allocator slack, activations of a 128-token batch

# verify's default workload: 2 rows x 64 tokens (no sliding window), then 16 greedy tokens from one prompt
BATCH, SEQ, NEW = 2, 64, 16


@dataclass(frozen=True)
class Model:
    name: str
    vocab: int
    d: int
    layers: int
    heads: int
    kv_heads: int  # KV heads for GQA; 0 for MLA
    head_dim: int
    d_ff: int  # dense layers
    dense_layers: int  # the rest are MoE
    experts: int = 0
    top_k: int = 0
    d_expert: int = 0
    shared: int = 0  # shared experts' total width
    q_lora: int = 0
    kv_lora: int = 0
    nope: int = 0
    rope: int = 0
    v_head: int = 0


LLAMA_405B = Model("Llama-3.1-405B", 128256, 16384, 126, 128, 8, 128, 53248, 126)
DEEPSEEK_V3 = Model("DeepSeek-V3 (671B)", 129280, 7168, 61, 128, 0, 0, 18432, 3, experts=256, top_k=8,
                    d_expert=2048, shared=2048, q_lora=1536, kv_lora=512, nope=128, rope=64, v_head=128)


def attention(m: Model, n: int) -> tuple[float, float]:
    """(split, whole) parameters of one layer's attention, per rank on n ranks."""
    if m.kv_heads:
        q = o = m.d * m.heads * m.head_dim
        kv = 2 * m.d * m.kv_heads * m.head_dim
        kv_per_rank = kv / n if m.kv_heads % n == 0 else kv / m.kv_heads  # one KV head per rank past kv_heads
        return (q + o) / n + kv_per_rank, 2 * m.d  # norms
    q_b = m.q_lora * m.heads * (m.nope + m.rope)
    kv_b = m.kv_lora * m.heads * (m.nope + m.v_head)
    o = m.heads * m.v_head * m.d
    whole = m.d * m.q_lora + m.q_lora + m.d * (m.kv_lora + m.rope) + m.kv_lora + 2 * m.d  # q_a, kv_a, norms
    return (q_b + kv_b + o) / n, whole


def ffn(m: Model, layer: int, n: int) -> tuple[float, float]:
    if layer < m.dense_layers:
        return 3 * m.d * m.d_ff / n, 0
    experts = 3 * m.d * m.d_expert * m.experts + 3 * m.d * m.shared
    return experts / n, (m.d * m.experts + m.experts) * 2  # the router and its bias, kept in fp32 (2x bf16)


def weights_per_rank(m: Model, n: int) -> float:
    total = 2 * m.vocab * m.d / n  # embedding and untied head, split over the vocabulary
    for layer in range(m.layers):
        for split, whole in (attention(m, n), ffn(m, layer, n)):
            total += split + whole
    return total * BF16 + m.d * BF16  # final norm


def parameters(m: Model) -> float:
    return weights_per_rank(m, 1) / BF16


def active_parameters(m: Model) -> float:
    """Per token: the dense layers, and top_k experts plus the shared one on the MoE layers."""
    dense = parameters(m)
    if not m.experts:
        return dense
    idle = (m.layers - m.dense_layers) * 3 * m.d * m.d_expert * (m.experts - m.top_k)
    return dense - idle


def kv_cache_per_rank(m: Model, n: int, tokens: int) -> float:
    """bf16 bytes: GQA keys and values of the rank's KV heads; MLA's latent and rotary key, whole on every rank."""
    if m.kv_heads:
        heads = m.kv_heads / n if m.kv_heads % n == 0 else 1
        per_token = 2 * heads * m.head_dim
    else:
        per_token = m.kv_lora + m.rope
    return per_token * m.layers * tokens * BF16


def collectives_per_forward(m: Model, tokens: int) -> float:
    """All-reduces: 2 per attention, 2 per dense MLP, 2 per expert that receives a token (all of them
    once tokens x top_k >= experts, as in a 128-token prefill), 2 per shared expert; plus the
    embedding's all-reduce and the head's all-gather."""
    moe_layers = m.layers - m.dense_layers
    hit = min(m.experts, tokens * m.top_k) if m.experts else 0
    return 2 * m.layers + 2 * m.dense_layers + moe_layers * 2 * (hit + (1 if m.shared else 0)) + 2


def report(m: Model, n: int) -> list[str]:
    nodes = max(1, n // 8)
    w = weights_per_rank(m, n)
    kv = kv_cache_per_rank(m, n, SEQ + NEW)  # the largest cache verify builds: one row's prompt and its tokens
    fits = w + kv + RESERVED <= HBM_BYTES
    latency = NVLINK_LATENCY if nodes == 1 else IB_LATENCY
    prefill_tokens = BATCH * SEQ
    flops = 2 * active_parameters(m) * prefill_tokens
    prefill = max(flops / (n * PEAK_FLOPS * MFU), w / (HBM_BW * HBM_FRACTION)) + \
        collectives_per_forward(m, prefill_tokens) * latency
    step = w / (HBM_BW * HBM_FRACTION) + collectives_per_forward(m, 1) * latency
    load = w * n / nodes / DISK_BW  # each node reads its ranks' slices
    ours = load + 2 * prefill + NEW * step  # the traced forward, the generation's prompt, its steps
    return [m.name, f"{n} x 80 GB ({nodes} node{'s' if nodes > 1 else ''})", f"{w / GB:.1f}",
            f"{kv / GB * 1000:.0f} MB", f"{(w + kv + RESERVED) / GB:.1f}", "yes" if fits else "NO",
            f"{load:.0f} s", f"{prefill * 1000:.0f} ms", f"{step * 1000:.0f} ms", f"{ours / 60:.1f} min"]


def reference_lines(m: Model) -> list[str]:
    """transformers' side through accelerate on one node's 8 GPUs plus host RAM: a bf16 verify runs it
    in bf16 (the trace and the generation: 18 forwards) and once in fp32 (the trace it is judged against)."""
    lines = []
    for dtype, size, forwards in (("bf16", BF16, 2 + NEW), ("fp32", 2 * BF16, 1)):
        total = parameters(m) * size
        on_gpus = 8 * (HBM_BYTES - RESERVED)
        offloaded = max(0.0, total - on_gpus)
        per_forward = offloaded / HOST_TO_GPU_BW
        lines.append(f"{m.name} reference in {dtype}: {total / GB:.0f} GB of weights; one node's 8 GPUs hold "
                     f"{on_gpus / GB:.0f} GB, {offloaded / GB:.0f} GB stay in host RAM and cross PCIe every forward "
                     f"({per_forward:.0f} s each, {forwards} forward(s): {forwards * per_forward / 60:.1f} min)")
    return lines


def main() -> None:
    rows = [["model", "GPUs", "weights/rank GB", "KV cache/rank", "total/rank GB", "fits", "load", "prefill 128 tok",
             "decode step", "our side"]]
    for m in (LLAMA_405B, DEEPSEEK_V3):
        print(f"{m.name}: {parameters(m) / 1e9:.1f} B parameters, {active_parameters(m) / 1e9:.1f} B active per token")
        for n in (8, 16):
            rows.append(report(m, n))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows))
    for m in (LLAMA_405B, DEEPSEEK_V3):
        print("\n".join(reference_lines(m)))
    print("\nthe 1B-shaped check (bench/tensor_parallel.py) uses the same split; its planned bytes per rank are")
    tiny = Model("LLaMA-3.2-1B", 128256, 2048, 16, 32, 8, 64, 8192, 16)
    for n in (1, 2, 4):  # tied embeddings: the head is the embedding, counted once
        print(f"  {n} rank(s): {(weights_per_rank(tiny, n) - tiny.vocab * tiny.d * BF16 / n) / 2**30:.3f} GiB")


if __name__ == "__main__":
    main()
