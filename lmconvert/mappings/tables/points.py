"""The vocabulary of verify's point layouts (lmconvert/verify/layouts.py explains the language), for
the layouts a family declares for transformers' side (`Family.reference_layouts`): where its modules
lay a point out otherwise than llama's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Layout = str


@dataclass(frozen=True)
class Piece:
    """A point that is one piece of a fused module's output (GPT-2's c_attn): the whole output is
    laid out as `layout`, and the point is entry `index` of its axis `axis`."""

    layout: Layout
    axis: str
    index: int


@dataclass(frozen=True)
class Summed:
    """A point transformers computes once per entry of axis `axis`, which ours is the sum of, in that axis's
    order: Llama 4's experts module returns every expert's output on every token (`X*B*T d`, the unchosen
    experts' zero), ours their sum. Such an experts module also takes every expert's input stacked, so
    verify runs each expert alone on the input of the module around it (the mixture's)."""

    layout: Layout
    axis: str


@dataclass(frozen=True)
class Returned:
    """A point that is entry `index` of the tuple a module returns, laid out as `layout` (Llama 4's router
    returns its scores, then its logits)."""

    index: int
    layout: Layout


@dataclass(frozen=True)
class Parallel:
    """A mixture's experts point where transformers has no experts module: its mixture module runs them
    inline as two parallel-expert products (JetMoE's `input_linear` and `output_linear`, each expert on
    its rows), and its output, laid out as `layout`, is the experts' weighted sum (with its bias). verify
    runs each expert alone through those two modules, on every token of the mixture's input."""

    layout: Layout


RESIDUAL: Layout = "B T d"

# Our latent attention (MLA), by attention kind: its projections and norms are (B, T, features), q
# is a whole query head per head; kv_b runs on the latent viewed as one head, (B, 1, T, C).
LATENT: Mapping[str, Layout] = {
    "attn.q": "B T H*QK", "attn.q_a": "B T Q", "attn.q_a_norm": "B T Q", "attn.q_b": "B T H*QK",
    "attn.kv_a": "B T CR", "attn.kv_a_norm": "B T C", "attn.kv_b": "B one T H*NV",
}
# DSA's indexer (the "sparse" kind, MLA besides): its query projection per index head, its one key
# head before and after its norm, and the per-head weights
SPARSE: Mapping[str, Layout] = {**LATENT, "attn.index_q": "B T IH*ID", "attn.index_k": "B T ID",
                                "attn.index_k_norm": "B T ID", "attn.index_weights": "B T IH"}

# one fused qkv output [q | k | v] (Phi-3's qkv_proj, MPT's Wqkv)
FUSED_QKV = {"attn.q": "B T [H*D]|KV*D|KV*DV", "attn.k": "B T H*D|[KV*D]|KV*DV", "attn.v": "B T H*D|KV*D|[KV*DV]"}
# q and k normalised per head on the (B, T, H, D) view, transposed afterwards (Qwen3's q_norm)
QK_NORM_PER_HEAD: Mapping[str, Layout] = {"attn.q_norm": "B T H D", "attn.k_norm": "B T KV D"}
# q and k normalised per head after the heads move before time (Gemma 3's q_norm, Phi's q_layernorm)
QK_NORM_HEADS_FIRST: Mapping[str, Layout] = {"attn.q_norm": "B H T D", "attn.k_norm": "B KV T D"}
# q and k normalised over the whole projection, viewed afterwards (OLMo 2's q_norm)
QK_NORM_PROJECTION: Mapping[str, Layout] = {"attn.q_norm": "B T H*D", "attn.k_norm": "B T KV*D"}
# DeepseekV2Moe/V3MoE run the shared experts on the unflattened input
SHARED_UNFLATTENED: Mapping[str, Layout] = {"mlp.shared.gate": "B T S", "mlp.shared.up": "B T S",
                                           "mlp.shared.down": RESIDUAL}
