"""ArchConfig: every architectural choice of a decoder-only LM as one frozen value.

A family mapping translates a model's own config into this, and the canonical `Decoder` is built
from it alone, so two checkpoints with equal ArchConfigs compute the same function. Per-layer
choices (positions, local/global attention) are tuples of length `n_layers`; `None` in the
constructor means "the same for every layer" and is normalised in `__post_init__`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from .attention_kinds import AttentionKind, attention_kind
from .augment_config import AltUpConfig, PleConfig, SharedBlocksConfig
from .errors import ConfigError
from .mixer_kinds import MixerKind, mixer_kind

NORM_KINDS = ("rms", "layer")
NORM_PLACEMENTS = ("pre", "post", "sandwich", "output", "parallel_shared", "parallel_separate")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "relu2", "gelu_new", "gelu_bloom", "xielu")
# activations with learned parameters of their own (each MLP's `act.<name>`), by name -> shape
ACTIVATION_PARAMETERS: dict[str, dict[str, tuple[int, ...]]] = {
    "xielu": {"alpha_p": (1,), "alpha_n": (1,), "beta": (), "eps": ()},  # Apertus' XIELUActivation
}
ROPE_LAYOUTS = ("half", "interleaved")
ROPE_SCALINGS = ("none", "linear", "dynamic", "yarn", "llama3", "longrope", "ntk_alpha", "proportional")
ABSOLUTE_POSITIONS = ("none", "sinusoidal", "learned", "sinusoidal_fairseq", "sinusoidal_halves")
LAYER_POSITIONS = ("rope", "alibi", "relative", "none")
LAYER_KINDS = ("global", "local")
# what mixes a layer's tokens: attention, `mixer`, nothing, or attention and `mixer` side by side on the same normed
# input, their outputs summed (Falcon-H1's parallel hybrid: arch/block.py's Block.mixing)
PARALLEL_MIXING = "attention+mixer"
LAYER_MIXERS = ("attention", "mixer", "none", PARALLEL_MIXING)
LAYER_FFNS = ("ffn", "none")  # whether a layer has its FFN (dense or MoE) after its mixer
# placements whose sublayers each add to the residual in turn, so either may be left out of a layer
SEQUENTIAL_PLACEMENTS = ("pre", "sandwich", "output")
QK_NORMS = ("none", "head", "projection")
SINK_FORMS = ("column", "scale")  # how a learned sink joins the softmax (ArchConfig.sink_form)
# ArchConfig.attn_output_gate: "none"; "projection": the attention output (B, T, H*D), before `o`, times the
# sigmoid of a projection of the attention's input of its own (AFMoE's gate_proj, `attn.out_gate`), elementwise;
# "q_heads": the same gate emitted by `q` beside each head's query, q's rows per head [query | gate] (Qwen3-Next's
# q_proj, H * 2D wide); "projection_head_bias": "projection" plus a learned bias per head (`attn.out_gate_bias`,
# [H]) added to the projection over each head's D elements (Beam's gate_proj + gate_bias). The sigmoid and the
# product in the activation dtype either way
# "projection_head": one gate per head from a projection of width H (`attn.out_gate`, [H, d_model]), broadcast over
# the head's D elements (Laguna's per-head g_proj; Ling 3's g_proj on its latent attention, the one gate the "latent"
# kind takes, there over each head's v_head_dim elements)
ATTN_OUTPUT_GATES = ("none", "projection", "q_heads", "projection_head_bias", "projection_head")
# ArchConfig.attn_gate_activation: how the gate becomes a factor: "sigmoid" in the activation dtype (AFMoE, Beam,
# Qwen3-Next); "softplus_fp32", softplus of an fp32 copy cast back to the activation dtype (Laguna); "sigmoid_fp32",
# the sigmoid of an fp32 copy cast back (Ling 3's latent attention)
GATE_ACTIVATIONS = ("sigmoid", "softplus_fp32", "sigmoid_fp32")
# ArchConfig.sink_layers: the layers whose attention has a sink of its own: every layer, or the local (sliding) ones
# (MiMo-V2-Flash). "none" is what layer_config gives a layer left without one: no sink parameter, but its softmax
# still taken as the sink layers' (the row max subtracted in the scores' dtype, the softmax in that dtype)
SINK_LAYERS = ("all", "local", "none")
QK_NORM_WEIGHTS = ("shared", "per_head")
DTYPE_ORDERS = ("cast_then_scale", "scale_then_cast")
PARALLEL_SUMS = ("h+attn+mlp", "mlp+attn+h", "attn+mlp+h")  # left to right: the order a parallel block adds
ALIBI_KINDS = ("distance", "bloom", "mpt", "falcon")  # how ALiBi is built and added: see positions.ALIBI_KINDS
ROUTERS = ("softmax", "sigmoid", "sparsemixer", "topk_softmax", "topk_sigmoid", "sigmoid_fp32", "logits",
           "topk_sigmoid_fp32", "sigmoid_fp32_sorted", "sigmoid_sorted", "sigmoid_grouped_sorted")
# the routers that take a selection bias
BIASED_ROUTERS = ("softmax", "sigmoid", "sigmoid_fp32", "logits", "sigmoid_fp32_sorted", "sigmoid_sorted",
                  "sigmoid_grouped_sorted")
# the routers that limit the choice to groups (n_group > 1)
GROUPED_ROUTERS = ("softmax", "sigmoid", "sigmoid_grouped_sorted")
KEPT_FP32 = ("weight", "selection_bias")  # router parameters a model may keep in fp32 (MoeConfig.kept_fp32)
SHARED_EXPERTS = ("none", "gated", "plain", "averaged")
SUM_ORDERS = ("grouped_mm", "eager", "sorted")  # arch/moe.py's SUMS
GLUS = ("halves", "clamped_swiglu")  # arch/moe.py's GLUS: how a routed expert gates its gate and up outputs
# how ArchConfig.attn_temperature scales a query at position p (arch/context.py's query_temperature), and on
# which layers (arch/attention.py)
TEMPERATURE_FORMS = ("ministral3", "llama4", "beam")
# ArchConfig.k_eq_v: the layers whose v is k's projection, with no v of their own: none, the global ones (Gemma 4's
# attention_k_eq_v), or every layer (what layer_config gives a global layer's own config)
K_EQ_V = ("none", "global", "all")
# ArchConfig.residual_form (arch/block.py's Block.add): "plain", h + sublayer; "depth_scaled" (Beam's
# depth_scaled_residual_add): the k-th residual add of the stack (k = 2(layer + 1) for the attention, + 1 for the
# FFN) is sublayer * (1 / sqrt(k)) + h * sqrt((k - 1) / k), each a Python float, in the activation dtype
RESIDUAL_FORMS = ("plain", "depth_scaled")
# ArchConfig's muP multipliers (Falcon-H1), each 1 where a model has none
MULTIPLIERS = ("attn_in_multiplier", "attn_out_multiplier", "mixer_out_multiplier", "key_multiplier",
               "mlp_gate_multiplier", "mlp_down_multiplier")


def _fail(owner: str, name: str, value: Any, why: str) -> None:
    raise ConfigError(f"{owner}.{name}={value!r}: {why}")


def _choice(owner: str, name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        _fail(owner, name, value, f"must be one of {', '.join(allowed)}")


def _positive(owner: str, name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        _fail(owner, name, value, "must be a positive, finite number")


def _integer(owner: str, name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _fail(owner, name, value, "must be a positive integer")


@dataclass(frozen=True)
class NormConfig:
    """How a norm computes. Statistics are always in fp32; `dtype_order` says where the weight
    is applied: after casting back to the activation dtype (LLaMA) or in fp32 before the cast
    (Gemma, OLMo 2). `weight_offset` is 1.0 for Gemma's `(1 + w)` with zero-centred weights."""

    kind: str = "rms"
    eps: float = 1e-6
    weight: bool = True
    bias: bool = False
    weight_offset: float = 0.0
    dtype_order: str = "cast_then_scale"
    written_out: bool = False  # LayerNorm as fp32 mean/variance ops, not torch's kernel (Cohere's LayerNorm)
    power: bool = False  # RMSNorm's 1/sqrt as torch.pow(mean + eps, -0.5), not rsqrt (Gemma 4): rounds otherwise

    def __post_init__(self) -> None:
        _choice("norm", "kind", self.kind, NORM_KINDS)
        if self.written_out and self.kind != "layer":
            _fail("norm", "written_out", self.written_out, "only a LayerNorm (kind='layer') is written out")
        _positive("norm", "eps", self.eps)
        _choice("norm", "dtype_order", self.dtype_order, DTYPE_ORDERS)
        if self.kind == "rms" and self.bias:
            _fail("norm", "bias", self.bias, "RMSNorm has no bias; use kind='layer'")
        if self.weight_offset and not self.weight:
            _fail("norm", "weight_offset", self.weight_offset, "needs a learned weight (weight=True)")
        if self.power and self.kind != "rms":
            _fail("norm", "power", self.power, "is an RMSNorm's (kind='rms') way of taking 1/sqrt")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one layer kind. `fraction` < 1 rotates only the first dims of a head.
    Scaling keys follow the names transformers uses in `rope_parameters`."""

    theta: float = 10000.0
    layout: str = "half"
    fraction: float = 1.0
    scaling: str = "none"
    factor: float = 1.0
    original_max_positions: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    fp32_tables: bool = False  # OLMo keeps cos/sin in fp32 and rotates in fp32
    # DeepSeek-V2 (transformers' `apply_rotary_emb`): each pair is a complex number multiplied by
    # torch.polar(1, angle) in fp32. The tables are polar's (libm's scalar cosf/sinf, not Tensor.cos/sin's
    # vectorised kernels: 1 ulp apart on some angles) and stay fp32, and the rotation is that complex product
    # (its CPU kernel fuses multiply-adds where it runs scalar). Interleaved layout only
    complex_product: bool = False
    # longrope (Phi-3): one rescale per rotary frequency pair, `short_factor` while the sequence fits
    # in original_max_positions, `long_factor` once it does not (chosen per forward call)
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    fp32_rotation: bool = False  # Cohere: q and k rotate in fp32 with cos/sin already rounded to their dtype
    rotary_dims: int | None = None  # an absolute rotary width (GPT-J's rotary_dim); None: head_dim * fraction
    # ntk_alpha (HunYuan's "dynamic" with an `alpha`): a static base theta * alpha ** (d / (d - 2)), d the rotary
    # width, computed in Python floats as transformers' compute_ntk_alpha_rope_parameters does
    alpha: float | None = None
    # nanochat's rotate_half = [x2, -x1]: every pair turns by minus its angle (half layout only)
    reverse: bool = False

    def __post_init__(self) -> None:
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        _positive("rope", "theta", self.theta)
        _choice("rope", "layout", self.layout, ROPE_LAYOUTS)
        _choice("rope", "scaling", self.scaling, ROPE_SCALINGS)
        if not 0 < self.fraction <= 1:
            _fail("rope", "fraction", self.fraction, "must be in (0, 1]")
        _positive("rope", "factor", self.factor)
        _integer("rope", "original_max_positions", self.original_max_positions, allow_none=True)
        if self.scaling in ("yarn", "llama3") and self.original_max_positions is None:
            _fail("rope", "original_max_positions", None, f"required by scaling={self.scaling!r}")
        # llama3 with high_freq_factor == low_freq_factor (Llama-4-Scout: 1.0 and 1.0) is allowed, as transformers
        # allows it: the smoothed band is then empty, every frequency either kept or divided by factor
        _positive("rope", "attention_factor", self.attention_factor, allow_none=True)
        if self.complex_product and self.layout != "interleaved":
            _fail("rope", "complex_product", True, "rotates pairs of adjacent dims: needs layout='interleaved'")
        _integer("rope", "rotary_dims", self.rotary_dims, allow_none=True)
        if self.rotary_dims is not None and self.fraction != 1:
            _fail("rope", "rotary_dims", self.rotary_dims, "give the rotary width once: rotary_dims or fraction")
        _positive("rope", "alpha", self.alpha, allow_none=True)
        if (self.scaling == "ntk_alpha") != (self.alpha is not None):
            _fail("rope", "alpha", self.alpha, "is set exactly when scaling='ntk_alpha'")
        if self.reverse and (self.layout != "half" or self.complex_product):
            _fail("rope", "reverse", True, "reverses the half rotation (rotate_half = [x2, -x1]): needs layout='half'")
        self._check_longrope()

    def _check_longrope(self) -> None:
        factors = ("short_factor", "long_factor")
        if self.scaling != "longrope":
            for name in factors:
                if getattr(self, name) is not None:
                    _fail("rope", name, getattr(self, name), "is read only by scaling='longrope'")
            return
        if self.original_max_positions is None:
            _fail("rope", "original_max_positions", None, "required by scaling='longrope'")
        for name in factors:
            value = getattr(self, name)
            if not isinstance(value, tuple) or not value:
                _fail("rope", name, value, "required by scaling='longrope': one number per rotary frequency")
            for item in value:
                _positive("rope", name, item)
        if len(self.short_factor) != len(self.long_factor):
            _fail("rope", "long_factor", self.long_factor, "must have as many entries as short_factor")

    def rotary_dim(self, head_dim: int) -> int:
        """The rotated width. An absolute width is kept as given: `int(head_dim * fraction)`
        truncates (head_dim 44 with 30 rotary dims would become 29). "proportional" (Gemma 4) rotates
        the whole head, its fraction zeroing the frequencies past the first `fraction` of the angles."""
        if self.scaling == "proportional":
            return head_dim
        return self.rotary_dims if self.rotary_dims is not None else int(head_dim * self.fraction)

    def longrope_attention_factor(self) -> float:
        """transformers' longrope default (in Python floats): sqrt(1 + ln(factor) / ln(original))
        once the context is extended (`factor` > 1), else 1. It scales cos/sin in both regimes."""
        if self.attention_factor is not None:
            return self.attention_factor
        if self.factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_positions))


@dataclass(frozen=True)
class MoeConfig:
    """A mixture-of-experts FFN (arch/moe.py): a router scores every expert, each token goes to its
    `top_k` best, and their gated FFNs (width `d_expert`, the model's activation) are summed with
    the router's weights. `router="softmax"`: softmax over all experts in fp32, then top-k
    (Mixtral, Qwen-MoE, OLMoE). `norm_topk`: the chosen weights are renormalised to sum to 1.
    `weights_fp32`: they stay fp32, so each expert's output is weighted in fp32 before the cast
    back (Mixtral); else they are cast to the activation dtype first (Qwen-MoE, OLMoE).
    `shared`: no shared expert, one whose output is scaled by sigmoid(a learned gate) (Qwen2-MoE),
    or one added as it is (DeepSeek's n_shared_experts, as one FFN of their summed width
    `d_shared`). `dense_layers`: the layers that keep the dense FFN of width d_ff.

    DeepSeek's routers: `router="sigmoid"` scores each expert with a sigmoid (V3); `n_group` /
    `topk_group` limit the choice to the best `topk_group` of `n_group` equal groups of experts
    (a group scored by its best score under softmax, V2, by its best two under sigmoid, V3);
    `selection_bias` adds a learned per-expert bias to the scores for choosing only (V3's
    e_score_correction_bias); `scale` multiplies the chosen weights (routed_scaling_factor);
    `router_fp32` computes the logits from fp32 input and weight.

    `router="topk_softmax"`: the top-k chosen on the logits, their weights the softmax over the k
    chosen alone (GraniteMoE, Aria, Cohere2-MoE), which already sum to 1, so `norm_topk` is off;
    `"topk_sigmoid"`: the top-k chosen on the logits, weighted by their sigmoids in the activation
    dtype (Cohere2-MoE's other choice). `shared="averaged"`: the routed and shared experts' outputs
    are summed and halved (Cohere2-MoE's "average" combination).
    `softmax_fp32`: the softmax (either router's) is taken in fp32; False: in the activation dtype
    (Aria's router, DBRX's). `norm_p`: the chosen weights are divided by their p-norm (DBRX's
    moe_normalize_expert_weights) instead of their sum.

    `router="sigmoid_sorted"`: sigmoid scores in the activation dtype, a sorted top-k on them plus the
    selection bias, renormalised by their sum plus 1e-6 (LFM2-MoE's `Lfm2MoeTopKRouter`).
    `router="topk_sigmoid_fp32"`: the top-k chosen on the logits, every other logit set to -inf, the
    sigmoid of them all taken in fp32 and cast to the activation dtype (Llama 4's `Llama4Router`).
    `weight_input`: each routed expert's input is multiplied by its router weight, not its output
    (Llama 4's `routed_in = hidden * score`)."""

    n_experts: int
    top_k: int
    d_expert: int
    router: str = "softmax"
    norm_topk: bool = True
    weights_fp32: bool = False
    shared: str = "none"
    d_shared: int | None = None  # None: no shared expert
    dense_layers: tuple[int, ...] = ()
    n_group: int = 1  # group-limited routing (DeepSeek): experts in n_group groups, the best topk_group considered
    topk_group: int = 1
    selection_bias: bool = False  # a learned per-expert bias on the scores, for choosing only (DeepSeek-V3)
    scale: float = 1.0  # the chosen weights multiplied by it (routed_scaling_factor)
    router_fp32: bool = False  # the router's logits from fp32 input and weight (DeepSeek)
    aux_loss: float = 0.0  # the load-balancing loss's weight in the training loss (moe.balance_loss); 0: off
    # router="sparsemixer" (Phi-3.5-MoE's SparseMixer, its inference path): top-1 then top-2, each weighted by a
    # softmax over the experts whose scores lie within a relative 2 * sparsemixer_eps of the chosen one's (its
    # router_jitter_noise); set exactly for that router
    sparsemixer_eps: float | None = None
    softmax_fp32: bool = True  # the router's softmax in fp32; False: in the activation dtype (Aria)
    # the shared expert's gate and up side by side as one fused projection's halves (GraniteMoeShared's
    # input_linear), its activation on the strided gate half, as the routed experts' (moe.Expert)
    shared_fused: bool = False
    norm_p: float | None = None  # renormalise by the chosen weights' p-norm (torch.norm; DBRX); None: by their sum
    # the routed experts' gate and up as two products, the activation on a contiguous gate (DBRX's w1, v1);
    # else side by side as one fused projection's halves (moe.Expert: transformers 5's gate_up_proj). Split experts
    # are MLPs of the model's own kind without biases: ungated (up, activation, down) in a model whose FFN is
    # (gated=False: Nemotron-H's relu2 experts), whose mlp_bias is then its dense MLPs' and shared expert's alone
    experts_split: bool = False
    # how the reference sums the routed experts' weighted outputs unless told otherwise (Decoder.set_experts):
    # "grouped_mm", transformers' default (each token's top-k at once, in fp32), or "eager" (expert by expert,
    # index_add_ in the activation dtype) where its experts module has no other (DBRX), or "sorted" (JetMoE's: the
    # (token, slot) rows sorted by expert, each expert one matmul, all added by one index_add, in fp32 on CPU)
    sum_order: str = "grouped_mm"
    # the renormalisation divides by the chosen weights' sum clamped below at norm_min (ERNIE 4.5's
    # moe_norm_min), not by the sum plus the router's guard; 0: the guard
    norm_min: float = 0.0
    # the router parameters kept in fp32 whatever the model's dtype (transformers' `_keep_in_fp32_modules`);
    # None: the weight and the selection bias when router_fp32 (DeepSeek), none otherwise. Kolibri keeps only
    # the bias: its weight is rounded to the model's dtype, then cast to fp32 for the logits
    kept_fp32: tuple[str, ...] | None = None
    # the mixture's output (shared experts included) normalised by a norm of the block's kind, on the sparse
    # layers only (A.X-K1's post_mlp_layernorm): `mlp.norm`
    output_norm: bool = False
    router_bias: bool = False  # the router's linear has a bias (gpt-oss's GptOssTopKRouter)
    # every routed expert's gate, up and down have a bias, added after each product (gpt-oss's
    # gate_up_proj_bias and down_proj_bias: `x @ W + b`, rounded twice in bf16, not one fused addmm)
    expert_bias: bool = False
    # how a routed expert gates (moe.GLUS): "halves", act(gate) * up over the two halves of one [gate | up] output
    # (transformers' default _apply_gate); "clamped_swiglu", gpt-oss's over an interleaved [g0, u0, g1, u1, ...]
    # output: gate clamped above at glu_limit, up to +-glu_limit, (up + 1) * gate * sigmoid(glu_alpha * gate)
    glu: str = "halves"
    glu_alpha: float | None = None  # set exactly when glu="clamped_swiglu" (gpt-oss's swiglu_alpha)
    glu_limit: float | None = None  # set exactly when glu="clamped_swiglu" (gpt-oss's swiglu_limit)
    weight_input: bool = False  # the router weight multiplies each routed expert's input, not its output (Llama 4)
    # `scale` multiplies the routed experts' weighted sum (in the activation dtype), not the router weights (Beam)
    scale_after_sum: bool = False
    sum_bias: bool = False  # a learned bias [d_model] added to the routed experts' weighted sum (JetMoE's MoE bias)
    # the router's input normalised by a weightless norm of the block's kind, times a learned [d_model] scale
    # (`router.scale`) and d_model**-0.5, each in the activation dtype, before its linear (Gemma 4's router)
    router_norm: bool = False
    # a learned per-expert scale (`router.expert_scale`) multiplies each chosen weight after the renormalisation
    # (Gemma 4's per_expert_scale)
    expert_scale: bool = False
    # the mixture runs beside the layer's dense MLP instead of replacing it (Gemma 4's enable_moe_block,
    # moe.BesideDense): the dense MLP on the FFN norm's output, its output normalised (`mlp.dense_norm`); the
    # router on the block's input stream itself, the experts on that stream normalised (`mlp.input_norm`),
    # their weighted sum normalised (`mlp.norm`, output_norm); the two summed, then the block's FFN output norm
    beside_dense: bool = False
    # the router's logits soft-capped, tanh(logits / c) * c on an fp32 copy, before they are scored (Laguna's
    # moe_router_logit_softcapping); None: no cap
    router_softcap: float | None = None
    # what the renormalisation adds to the chosen weights' sum; None: the router's own guard (moe.EPS: DeepSeek-V3's
    # and AFMoE's 1e-20, LFM2-MoE's 1e-6, none for the others). Laguna's sorted fp32 sigmoid router adds none: 0
    norm_eps: float | None = None

    def __post_init__(self) -> None:
        for name in ("weight_input", "sum_bias", "router_norm", "expert_scale", "beside_dense"):
            if not isinstance(getattr(self, name), bool):
                _fail("moe", name, getattr(self, name), "must be true or false")
        if self.weight_input and self.weights_fp32:
            _fail("moe", "weight_input", True, "weights the input in the activation dtype; needs weights_fp32=False")
        for name in ("n_experts", "top_k", "d_expert", "n_group", "topk_group"):
            _integer("moe", name, getattr(self, name))
        _positive("moe", "scale", self.scale)
        _positive("moe", "router_softcap", self.router_softcap, allow_none=True)
        if self.norm_eps is not None and (isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float))
                                          or not 0 <= self.norm_eps < math.inf):
            _fail("moe", "norm_eps", self.norm_eps, "must be a finite number >= 0")
        if isinstance(self.aux_loss, bool) or not isinstance(self.aux_loss, (int, float)) or not \
                0 <= self.aux_loss < math.inf:
            _fail("moe", "aux_loss", self.aux_loss, "must be a finite number >= 0")
        if self.n_experts % self.n_group:
            _fail("moe", "n_group", self.n_group, f"must divide n_experts={self.n_experts}")
        if self.topk_group > self.n_group:
            _fail("moe", "topk_group", self.topk_group, f"cannot exceed n_group={self.n_group}")
        if self.router == "sigmoid" and self.n_group > 1 and self.n_experts // self.n_group < 2:
            _fail("moe", "n_group", self.n_group, "sigmoid routing scores a group by its best two experts; "
                                                   "each group needs two")
        if self.selection_bias and self.router not in BIASED_ROUTERS:
            _fail("moe", "selection_bias", True, f"router={self.router!r} takes no selection bias")
        grouped = self.router in GROUPED_ROUTERS and not (self.router == "softmax" and self.selection_bias)
        if self.n_group > 1 and not grouped:
            _fail("moe", "n_group", self.n_group, f"router={self.router!r} does not limit its choice to groups"
                  + (" with a selection bias" if self.router == "softmax" else ""))
        if isinstance(self.norm_min, bool) or not isinstance(self.norm_min, (int, float)) or \
                not 0 <= self.norm_min < math.inf:
            _fail("moe", "norm_min", self.norm_min, "must be a finite number >= 0")
        if self.norm_min and not self.norm_topk:
            _fail("moe", "norm_min", self.norm_min, "clamps the renormalisation, which norm_topk=False leaves out")
        if isinstance(self.kept_fp32, list):
            object.__setattr__(self, "kept_fp32", tuple(self.kept_fp32))
        if self.kept_fp32 is not None and (not isinstance(self.kept_fp32, tuple) or
                                           not set(self.kept_fp32) <= set(KEPT_FP32)):
            _fail("moe", "kept_fp32", self.kept_fp32, f"must list some of {', '.join(KEPT_FP32)}")
        if not isinstance(self.output_norm, bool):
            _fail("moe", "output_norm", self.output_norm, "must be true or false")
        if self.kept_fp32 is not None and "selection_bias" in self.kept_fp32 and not self.selection_bias:
            _fail("moe", "kept_fp32", self.kept_fp32, "keeps a selection bias the router does not have")
        _choice("moe", "router", self.router, ROUTERS)
        self._check_sparsemixer()
        self._check_glu()
        if self.norm_p is not None:
            _positive("moe", "norm_p", self.norm_p)
            if not self.norm_topk:
                _fail("moe", "norm_p", self.norm_p, "is the renormalisation's norm; it needs norm_topk=True")
        if self.shared_fused and self.d_shared is None:
            _fail("moe", "shared_fused", True, "needs a shared expert (d_shared)")
        if self.beside_dense:
            self._check_beside_dense()
        if self.router == "topk_softmax" and self.norm_topk:
            _fail("moe", "norm_topk", True, "topk_softmax's weights are a softmax over the chosen: they sum to 1")
        _choice("moe", "shared", self.shared, SHARED_EXPERTS)
        _choice("moe", "sum_order", self.sum_order, SUM_ORDERS)
        if self.top_k > self.n_experts:
            _fail("moe", "top_k", self.top_k, f"cannot exceed n_experts={self.n_experts}")
        _integer("moe", "d_shared", self.d_shared, allow_none=True)
        if (self.shared == "none") != (self.d_shared is None):
            _fail("moe", "d_shared", self.d_shared, f"is set exactly when shared={self.shared!r} is not 'none'")
        layers = self.dense_layers
        if not isinstance(layers, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0
                                                        for i in layers):
            _fail("moe", "dense_layers", layers, "must be a list of layer indices")
        object.__setattr__(self, "dense_layers", tuple(sorted(set(layers))))

    def _check_sparsemixer(self) -> None:
        if (self.router == "sparsemixer") != (self.sparsemixer_eps is not None):
            _fail("moe", "sparsemixer_eps", self.sparsemixer_eps, "is set exactly when router='sparsemixer'")
        if self.router != "sparsemixer":
            return
        eps = self.sparsemixer_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
            _fail("moe", "sparsemixer_eps", eps, "must be a finite number >= 0")
        for name, value, why in (("top_k", 2, "SparseMixer chooses exactly two experts"),
                                 ("norm_topk", False, "SparseMixer's weights are not renormalised"),
                                 ("n_group", 1, "SparseMixer has no expert groups")):
            if getattr(self, name) != value:
                _fail("moe", name, getattr(self, name), why)

    def _check_glu(self) -> None:
        for name in ("router_bias", "expert_bias"):
            if not isinstance(getattr(self, name), bool):
                _fail("moe", name, getattr(self, name), "must be true or false")
        _choice("moe", "glu", self.glu, GLUS)
        clamped = self.glu == "clamped_swiglu"
        for name in ("glu_alpha", "glu_limit"):
            value = getattr(self, name)
            if clamped != (value is not None):
                _fail("moe", name, value, "is set exactly when glu='clamped_swiglu'")
            _positive("moe", name, value, allow_none=True)
        if self.experts_split and (clamped or self.expert_bias):
            _fail("moe", "experts_split", True, "split experts have neither biases nor the clamped SwiGLU")

    def _check_beside_dense(self) -> None:
        """Beside the dense MLP the mixture is Gemma 4's: routed experts and their output norm, nothing else."""
        for name, value, why in (("output_norm", True, "the experts' sum is normalised before it joins the dense "
                                                      "MLP's output"),
                                 ("shared", "none", "a shared expert beside the dense MLP is not a layout lmconvert "
                                                    "knows"),
                                 ("scale_after_sum", False, "the experts' sum is not scaled beside the dense MLP"),
                                 ("sum_bias", False, "the experts' sum has no bias beside the dense MLP")):
            if getattr(self, name) != value:
                _fail("moe", name, getattr(self, name), f"must be {value!r} with beside_dense: {why}")

    def sparse(self, layer: int) -> bool:
        return layer not in self.dense_layers


@dataclass(frozen=True)
class ArchConfig:
    """The canonical description of a decoder-only transformer."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    n_kv_heads: int | None = None  # None: MHA
    head_dim: int | None = None  # None: d_model // n_heads
    max_positions: int = 2048
    # norms
    norm: NormConfig = field(default_factory=NormConfig)
    norm_placement: str = "pre"
    final_norm: bool = True
    qk_norm: str = "none"
    qk_norm_weight: str = "shared"  # "per_head": a QK-norm weight per head, [heads, head_dim] (Cohere)
    qk_norm_bias: bool | None = None  # whether the QK norms have a bias; None: as the block norms (`norm.bias`).
    #   False where they have one: StableLM's per-head LayerNorms. Always False without a QK norm
    # per-head QK norm after RoPE, not before (HunYuan, nanochat: q and k are rotated, then normalised)
    qk_norm_after_rope: bool = False
    # BitNet's sub-norms: a norm (the block norms' settings) on the attention output before `o`
    # (`attn.sub_norm`, over q_dim) and on the gated product before `down` (`mlp.sub_norm`, over d_ff)
    sub_norms: bool = False
    embed_norm: bool = False  # a norm on the embeddings, before the first block (BLOOM's word_embeddings_layernorm)
    residual_after_norm: bool = False  # pre-norm blocks take the residual after the norm (BLOOM's
    # apply_residual_connection_post_layernorm)
    residual_fp32: bool = False  # pre-norm blocks keep the residual stream in fp32: each norm reads it cast to the
    #   model dtype, each sublayer's output adds to it in fp32, the head reads the final norm's fp32 output cast
    #   back (Mamba's, Mamba2's and FalconMamba's residual_in_fp32)
    unnormed_attn_layers: tuple[int, ...] = ()  # pre-norm layers whose attention reads the residual stream without
    #   a norm: ModernBERT decoder's layer 0 (its attn_norm an nn.Identity; the embeddings are normed already)
    # biases
    q_bias: bool = False
    k_bias: bool = False
    v_bias: bool = False
    o_bias: bool = False
    o_bias_layers: tuple[int, ...] | None = None  # the layers whose o projection has the bias o_bias switches on;
    #   None: every layer. GPT-NeoX-Japanese gives only its last layer one (`use_bias=layer_number ==
    #   num_hidden_layers - 1`); see `layer_config`
    mlp_bias: bool = False
    lm_head_bias: bool = False  # with tied embeddings, a bias of the head's own (CTRL, ModernBERT decoder)
    # feed-forward
    activation: str = "silu"
    gated: bool = True
    mlp_fused: bool = False  # gate and up computed side by side in one tensor and split, the activation on its
    #   strided first half (ModernBERT decoder's Wi): the same values, but the activation of a strided tensor
    #   rounds otherwise in its last bit than a contiguous one's (torch's vectorised loop), 1 ulp in fp32
    moe: MoeConfig | None = None  # a mixture of experts in place of the dense FFN (on its sparse layers)
    # positions
    absolute_positions: str = "none"
    position_offset: int = 0
    layer_positions: tuple[str, ...] | None = None
    rope: RopeConfig = field(default_factory=RopeConfig)
    rope_local: RopeConfig | None = None  # None: local layers use `rope`
    relative_buckets: int = 32
    relative_max_distance: int = 128
    alibi: str = "distance"  # ALIBI_KINDS: how ALiBi layers build their bias and add it (BLOOM's, MPT's)
    positions_from_mask: bool = False  # given an attention mask and no positions, the forward numbers each row
    # from its first real token, padding -1 (OPT's embed_positions); else from the sequence start
    # attention
    attention: str = "standard"  # a kind declared in attention_kinds
    attention_settings: Any = None  # that kind's own fields (its `settings` dataclass); None: it has none
    layer_kinds: tuple[str, ...] | None = None
    # a token mixer other than attention (mixer_kinds.py) and its own fields; `layer_mixers` says, per layer,
    # whether attention, that mixer or nothing mixes the tokens (None: attention everywhere, or the mixer everywhere
    # when it is set), `layer_ffns` whether an FFN follows (None: everywhere). Hybrids interleave them; Nemotron-H
    # has single-sublayer blocks
    mixer: str | None = None
    mixer_settings: Any = None
    layer_mixers: tuple[str, ...] | None = None
    layer_ffns: tuple[str, ...] | None = None
    # the norm placement of the mixer layers where it is not `norm_placement`'s (OLMo-hybrid: its gated delta-net
    # layers pre-norm, its attention layers normalising each sublayer's output); both sequential, so one wiring.
    # None: the same for every layer
    mixer_norm_placement: str | None = None
    sliding_window: int | None = None
    attn_scale: float | None = None  # None: head_dim ** -0.5
    attn_softcap: float | None = None
    # a learned logit per head joining every query's softmax as one more column, dropped after it (gpt-oss's
    # `sinks`, `layers.{i}.attn.sinks` [n_heads]): the scores and the sink less their row max, softmaxed in the
    # scores' dtype. Such layers run eager (transformers has no SDPA for them)
    attn_sinks: bool = False
    # how a sink joins: "column" as above (gpt-oss); "scale": the plain softmax's output times
    # sigmoid(logsumexp(scores) - sink), the same function rounded otherwise (GraniteSWA)
    sink_form: str = "column"
    sinks_fp32: bool = False  # the sinks kept in fp32 in any dtype (Flint's `_keep_in_fp32_modules_strict`)
    attn_output_gate: str = "none"  # ATTN_OUTPUT_GATES: a gate on the attention output (AFMoE's gate_proj)
    attn_gate_activation: str = "sigmoid"  # GATE_ACTIVATIONS: the gate's activation; "sigmoid" without a gate
    sink_layers: str = "all"  # SINK_LAYERS: the layers with a sink of their own, with attn_sinks; "all" without
    # the value heads' width where it is not head_dim (MiMo-V2-Flash's v_head_dim: v is KV x v_head_dim, o reads
    # H x v_head_dim); None: head_dim
    v_head_dim: int | None = None
    attn_value_scale: float = 1.0  # v multiplied by this Python float after its projection (MiMo-V2-Flash)
    # the query heads of each layer where they differ (Laguna's num_attention_heads_per_layer); None: n_heads
    # everywhere. layer_config gives each layer its own
    layer_heads: tuple[int, ...] | None = None
    residual_scale: float = 1.0  # each sublayer's output is multiplied by this before the residual add (Granite)
    # muP multipliers (Falcon-H1), each a Python float on the activation dtype, skipped at 1: the attention's input
    # and output (`attention_in_multiplier`, `attention_out_multiplier`) and the mixer's output
    # (`ssm_out_multiplier`) around their modules, in the block (arch/block.py), so the modules' own outputs are
    # the reference's; k as it comes out of its projection (`key_multiplier`, arch/attention.py); the FFN's gate
    # before the activation and its output after `down` (`mlp_multipliers`, arch/mlp.py)
    attn_in_multiplier: float = 1.0
    attn_out_multiplier: float = 1.0
    mixer_out_multiplier: float = 1.0
    key_multiplier: float = 1.0
    mlp_gate_multiplier: float = 1.0
    mlp_down_multiplier: float = 1.0
    residual_form: str = "plain"  # RESIDUAL_FORMS: how a sublayer's output joins the residual (Beam: depth_scaled)
    # a gated FFN's (dense or routed expert) act(gate) * up from fp32 copies, cast back (Beam's SwiGLU)
    glu_fp32: bool = False
    clip_qkv: float | None = None  # q, k and v clamped to [-clip_qkv, clip_qkv] after projection (OLMo, MPT)
    # attention temperature (Ministral 3's llama_4_scaling_beta): after RoPE, every query at position p is
    # multiplied by 1 + attn_temperature * log(1 + floor(p / attn_temperature_floor)), computed in fp32 and cast
    # to the activation dtype; p is the token's absolute position (the cache's numbering), so cached decoding
    # scales as the full forward does. None: no temperature
    attn_temperature: float | None = None
    attn_temperature_floor: int | None = None  # the position period of attn_temperature (Ministral 3: YaRN's
    #   original_max_position_embeddings); set exactly when attn_temperature is
    # TEMPERATURE_FORMS: "ministral3", above, on every layer; "llama4" (Llama 4's attn_temperature_tuning), on the
    # layers without positions (layer_positions "none") only: 1 + attn_temperature * log1p(floor((p + 1) / floor)),
    # in fp32, the query multiplied in fp32 and cast back. Always "ministral3" without a temperature
    attn_temperature_form: str = "ministral3"
    # chunked local attention (Llama 4's attention_chunk_size): on the layers `chunked_layers` lists, a query sees
    # only the keys of its own chunk of `attention_chunk` positions (k // chunk == q // chunk, numbered from each
    # row's first real token), causally. The cache keeps every key, as for sliding windows. Set together
    attention_chunk: int | None = None
    chunked_layers: tuple[int, ...] = ()
    # a weightless RMS norm of each rotated head of q and k (Llama 4's L2 norm, use_qk_norm), after RoPE and on the
    # rotary layers only, eps norm.eps, computed in fp32 and cast back
    qk_l2_norm: bool = False
    scale_query: bool = False  # the score scale multiplies q after its projection, not q.k (OPT, XGLM)
    scale_by_inverse_layer: bool = False  # layer i's score scale is further divided by i + 1 (GPT-2)
    scores_fp32: bool = False  # q.k from fp32 copies of q and k, up to the softmax (GPT-J, GPT-Neo, GPT-2's
    #   reorder_and_upcast_attn); such layers run eager
    scale_in_product: bool = False  # the score scale inside q.k's product, a baddbmm's alpha (GPT-2's
    #   reorder_and_upcast_attn), which rounds otherwise than q @ k^T * scale; eager
    parallel_sum: str = "h+attn+mlp"  # PARALLEL_SUMS: the order a parallel block adds (bf16 rounds differently)
    bias_separate: bool = False  # a block's linear biases added after the matmul, not fused in it (Falcon's
    # FalconLinear: `x @ W.T + b`, rounded twice in bf16)
    conv1d_linears: bool = False  # a block's linears computed as GPT-2's Conv1D: `addmm(bias, x2d, W)` with W held
    #   [in, out] in memory (the canonical tensor stays [out, in]); CPU GEMM kernels (oneDNN's bf16 one on AVX2)
    #   round otherwise over the two layouts
    # output
    tie_embeddings: bool = False
    output_vocab: int | None = None  # None: vocab_size; else the LM head's rows, the first output_vocab ids
    #   (Apertus 1.5's pruned head, output_vocab_size): an untied head narrower than the embedding table
    embed_scale: float | None = None
    final_softcap: float | None = None
    softcap_fp32: bool = False  # the final soft-cap on fp32 copies of the logits, which stay fp32 (Beam)
    logit_scale: float = 1.0
    head_divisor: float = 1.0  # the final hidden state divided by this before the LM head (MiniCPM3's
    #   hidden_size / dim_model_base): a division of the head's input, which rounds otherwise than a logit scale
    embed_dim: int | None = None  # None: d_model; else the embedding (and tied LM head) width, projected in and
    #   out of d_model by bias-free linears (OPT-350m's project_in / project_out)
    head_transform: str | None = None  # an activation: the final hidden state goes through dense + it + a norm
    #   (the block norms') before the LM head, BERT's prediction transform (ModernBERT decoder); None: none
    head_transform_bias: bool = False  # the transform's dense has a bias (ModernBERT's classifier_bias)
    embed_scale_unrounded: bool = False  # embed_scale multiplies as a Python float, rounded once (XGLM); False:
    #   rounded to the weight dtype before the multiply (Gemma). Always False without an embed_scale
    # training
    embed_dropout: float = 0.0
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0
    z_loss: float = 0.0
    # -- Gemma 4 (gemma4_text, gemma4_unified_text): per-layer attention geometry, K = V, the V norm and
    #    cross-layer KV sharing. `layer_config(layer)` turns them into each layer's own config (its head_dim,
    #    KV heads, d_ff and parts), from which its modules and tensors are both built.
    global_head_dim: int | None = None  # the global layers' head_dim; None: head_dim
    global_kv_heads: int | None = None  # the global layers' KV heads; None: n_kv_heads
    k_eq_v: str = "none"  # K_EQ_V: the layers with no v projection, whose v is k's projection (before k's norm)
    v_norm: bool = False  # v normalised per head by a weightless RMSNorm (norm.eps, norm's dtype order)
    kv_shared_layers: int = 0  # the last this many layers take K and V from the last earlier layer of their kind
    #   (layer_kinds) and have no k, v or k_norm of their own; the KV cache holds the other layers only
    kv_reused: bool = False  # set by layer_config on a KV-shared layer's own config; never in a model's config
    shared_ffn_factor: int = 1  # the FFN width of the KV-shared layers, in d_ff (Gemma 4's double-wide MLP: 2)
    layer_scalar: bool = False  # each block's output times a learned scalar of its own (`layers.{}.scalar`, [1])
    # -- Gemma 3n (gemma3n_text): AltUp's residual streams, per-layer embeddings (Gemma 4's too), LAuReL, sparse
    #    gates and per-layer FFN widths (augment_config.py for the first two)
    altup: AltUpConfig | None = None
    ple: PleConfig | None = None
    # LAuReL (Gemma3nTextLaurelBlock): beside attention, the normed input x gives x + norm(right(left(x))) (rank this),
    # and the attention's residual sum h becomes (h + that) / sqrt(2) before the FFN; None: none
    laurel_rank: int | None = None
    # per layer, the FFN gate's activation sparsity s (Gemma 3n's activation_sparsity_pattern): where s > 0, the gate
    # projection g becomes relu(g - (mean(g) + std(g) * icdf_normal(s))), its statistics over the width in its own
    # dtype, the icdf in fp32 cast to it; None: dense everywhere
    gate_sparsity: tuple[float, ...] | None = None
    d_ff_layers: tuple[int, ...] | None = None  # each layer's FFN width (Gemma 3n's intermediate_size list); None: d_ff
    # -- Zamba2: transformer blocks held once and called from the layers it lists (augment_config.py); None: none
    shared_blocks: SharedBlocksConfig | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions"):
            _integer("ArchConfig", name, getattr(self, name))
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                _fail("ArchConfig", "head_dim", None,
                      f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; set head_dim")
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        _integer("ArchConfig", "n_kv_heads", self.n_kv_heads)
        _integer("ArchConfig", "head_dim", self.head_dim)
        if self.n_heads % self.n_kv_heads:
            _fail("ArchConfig", "n_kv_heads", self.n_kv_heads,
                  f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        for name, allowed in (("norm_placement", NORM_PLACEMENTS), ("qk_norm", QK_NORMS),
                              ("qk_norm_weight", QK_NORM_WEIGHTS),
                              ("activation", ACTIVATIONS), ("absolute_positions", ABSOLUTE_POSITIONS),
                              ("parallel_sum", PARALLEL_SUMS), ("alibi", ALIBI_KINDS)):
            _choice("ArchConfig", name, getattr(self, name), allowed)
        kind = attention_kind(self.attention)
        self._normalise_attention_settings(kind)
        self._normalise_layers("layer_positions", "rope", LAYER_POSITIONS)
        self._normalise_layers("layer_kinds", "global", LAYER_KINDS)
        mixer = self._normalise_mixers()
        for name, sub in (("rope", RopeConfig), ("rope_local", RopeConfig), ("norm", NormConfig),
                          ("moe", MoeConfig), ("shared_blocks", SharedBlocksConfig)):
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, sub(**value))
        if self.moe is not None:
            self._check_moe(self.moe)
        for rope in (self.rope, self.rope_local):
            if rope is not None and rope.rotary_dim(self.head_dim) % 2:
                _fail("ArchConfig", "head_dim", self.head_dim,
                      f"rotary dims {rope.rotary_dim(self.head_dim)} must be even")
            if rope is not None and rope.short_factor is not None \
                    and len(rope.short_factor) != rope.rotary_dim(self.head_dim) // 2:
                _fail("ArchConfig", "rope.short_factor", rope.short_factor,
                      f"needs one entry per rotary frequency ({rope.rotary_dim(self.head_dim) // 2})")
            if rope is not None and rope.rotary_dim(self.head_dim) > self.head_dim:
                _fail("ArchConfig", "head_dim", self.head_dim,
                      f"is smaller than the rotary dims {rope.rotary_dim(self.head_dim)}")
        _integer("ArchConfig", "sliding_window", self.sliding_window, allow_none=True)
        if "local" in self.layer_kinds and self.sliding_window is None:
            _fail("ArchConfig", "sliding_window", None, "local layers need a sliding window")
        for name in ("attn_scale", "attn_softcap", "embed_scale", "final_softcap", "clip_qkv"):
            _positive("ArchConfig", name, getattr(self, name), allow_none=True)
        _positive("ArchConfig", "logit_scale", self.logit_scale)
        _positive("ArchConfig", "head_divisor", self.head_divisor)
        _positive("ArchConfig", "clip_qkv", self.clip_qkv, allow_none=True)
        self._check_temperature()
        self._check_chunks()
        if self.qk_norm_weight == "per_head" and self.qk_norm != "head":
            _fail("ArchConfig", "qk_norm_weight", self.qk_norm_weight, "a weight per head needs qk_norm='head'")
        self._normalise_qk_norm_bias()
        self._normalise_o_bias_layers()
        self._normalise_head_options()
        if self.mlp_fused and not self.gated:
            _fail("ArchConfig", "mlp_fused", True, "fuses a gated FFN's gate and up; needs gated=True")
        _positive("ArchConfig", "residual_scale", self.residual_scale)
        for name in MULTIPLIERS:
            _positive("ArchConfig", name, getattr(self, name))
        if self.moe is not None and (self.mlp_gate_multiplier != 1.0 or self.mlp_down_multiplier != 1.0):
            _fail("ArchConfig", "mlp_gate_multiplier", self.mlp_gate_multiplier, "the FFN multipliers are a dense "
                  "FFN's; a mixture of experts needs both at 1")
        if self.mlp_gate_multiplier != 1.0 and (not self.gated or self.mlp_fused or self.glu_fp32):
            _fail("ArchConfig", "mlp_gate_multiplier", self.mlp_gate_multiplier, "multiplies a gated FFN's gate "
                  "projection: needs gated=True, mlp_fused=False and glu_fp32=False")
        _choice("ArchConfig", "residual_form", self.residual_form, RESIDUAL_FORMS)
        if self.residual_form != "plain" and (self.norm_placement not in SEQUENTIAL_PLACEMENTS
                                              or self.residual_after_norm or self.residual_scale != 1.0):
            _fail("ArchConfig", "residual_form", self.residual_form, "scales sequential sublayers' adds only "
                  "(norm_placement 'pre', 'sandwich' or 'output', residual_after_norm off, residual_scale 1)")
        if self.parallel_sum != PARALLEL_SUMS[0] and not self.norm_placement.startswith("parallel"):
            _fail("ArchConfig", "parallel_sum", self.parallel_sum, "only parallel blocks have a parallel sum")
        if self.residual_after_norm and self.norm_placement != "pre":
            _fail("ArchConfig", "residual_after_norm", True, "only pre-norm blocks take the residual after the norm")
        if self.residual_fp32 and (self.norm_placement != "pre" or self.residual_after_norm
                                   or self.residual_form != "plain" or self.unnormed_attn_layers
                                   or not self.norm.weight
                                   or self.mixer_norm_placement not in (None, "pre")):
            _fail("ArchConfig", "residual_fp32", True, "keeps the residual stream of pre-norm blocks in fp32, each "
                  "norm reading it in its weight's dtype: needs pre-norm on every layer (no mixer_norm_placement other "
                  "than pre, no unnormed_attn_layers), plain adds, no residual_after_norm and weighted norms")
        for name in ("embed_dropout", "attn_dropout", "resid_dropout"):
            if not 0 <= getattr(self, name) < 1:
                _fail("ArchConfig", name, getattr(self, name), "must be in [0, 1)")
        if self.z_loss < 0:
            _fail("ArchConfig", "z_loss", self.z_loss, "must be >= 0")
        if isinstance(self.position_offset, bool) or not isinstance(self.position_offset, int) \
                or self.position_offset < 0:
            _fail("ArchConfig", "position_offset", self.position_offset, "must be an integer >= 0")
        if not isinstance(self.positions_from_mask, bool):
            _fail("ArchConfig", "positions_from_mask", self.positions_from_mask, "must be true or false")
        if self.position_offset and self.absolute_positions == "none":
            _fail("ArchConfig", "position_offset", self.position_offset,
                  "offsets an absolute position table, and absolute_positions='none' has none; leave it 0")
        if self.absolute_positions == "sinusoidal_fairseq" and self.d_model < 4:
            _fail("ArchConfig", "d_model", self.d_model, "fairseq's sinusoidal table divides by d_model / 2 - 1; "
                  "it needs d_model >= 4")
        if self.embed_scale is None:  # nothing to round: one spelling of "no embedding scale"
            object.__setattr__(self, "embed_scale_unrounded", False)
        if self.embed_dim is None:
            object.__setattr__(self, "embed_dim", self.d_model)
        _integer("ArchConfig", "embed_dim", self.embed_dim)
        # T5 bucketing divides by log(max_distance / (buckets // 2)): anything else yields
        # out-of-range bucket indices (or a ZeroDivisionError) at the first forward, not here.
        _integer("ArchConfig", "relative_buckets", self.relative_buckets)
        _integer("ArchConfig", "relative_max_distance", self.relative_max_distance)
        if self.relative_buckets < 2:
            _fail("ArchConfig", "relative_buckets", self.relative_buckets, "must be at least 2")
        if self.relative_max_distance <= self.relative_buckets // 2:
            _fail("ArchConfig", "relative_max_distance", self.relative_max_distance,
                  f"must exceed relative_buckets // 2 = {self.relative_buckets // 2}, the exactly-bucketed range")
        if self.bias_separate and self.conv1d_linears:
            _fail("ArchConfig", "conv1d_linears", True, "a Conv1D adds its bias inside the addmm; bias_separate "
                  "adds it after the matmul: set one")
        if self.qk_norm_after_rope and (self.qk_norm != "head" or self.qk_norm_weight != "shared"
                                        or self.attention != "standard"):
            _fail("ArchConfig", "qk_norm_after_rope", True, "normalises each rotated head with one shared weight: "
                  "needs qk_norm='head', qk_norm_weight='shared' and attention='standard'")
        if self.sink_form not in SINK_FORMS:
            _fail("ArchConfig", "sink_form", self.sink_form, f"one of {', '.join(SINK_FORMS)}")
        _choice("ArchConfig", "attn_output_gate", self.attn_output_gate, ATTN_OUTPUT_GATES)
        if self.attn_output_gate != "none" and self.attention != "standard" \
                and (self.attention, self.attn_output_gate) != ("latent", "projection_head"):
            _fail("ArchConfig", "attn_output_gate", self.attn_output_gate, "gates the standard attention's output "
                  f"(latent attention's with 'projection_head' only), not attention={self.attention!r}'s")
        if self.attn_output_gate == "q_heads" and (self.qk_norm == "projection" or self.scale_query
                                                    or self.clip_qkv is not None):
            _fail("ArchConfig", "attn_output_gate", self.attn_output_gate, "splits each head's query from its gate "
                  "as q comes out: needs qk_norm other than 'projection', no scale_query and no clip_qkv")
        if self.attn_sinks and self.attention != "standard":
            _fail("ArchConfig", "attn_sinks", True, "sinks join the standard attention's softmax only")
        if self.rope.reverse and self.attention != "standard":
            _fail("ArchConfig", "rope.reverse", True, "the reversed rotation is the standard attention's only")
        if self.sub_norms and self.moe is not None:
            _fail("ArchConfig", "sub_norms", True, "experts have no sub-norm; a mixture of experts needs "
                  "sub_norms=False")
        if self.sub_norms and self.attention != "standard":
            _fail("ArchConfig", "sub_norms", True, "the attention sub-norm sits in the standard attention only")
        if self.activation in ACTIVATION_PARAMETERS and self.moe is not None:
            _fail("ArchConfig", "activation", self.activation, "has parameters of its own in each MLP; "
                  "experts with it are not supported")
        if self.output_vocab is None or self.output_vocab == self.vocab_size:
            object.__setattr__(self, "output_vocab", None)  # one spelling of "the whole vocabulary"
        else:
            _integer("ArchConfig", "output_vocab", self.output_vocab)
            if self.output_vocab > self.vocab_size:
                _fail("ArchConfig", "output_vocab", self.output_vocab, f"cannot exceed vocab_size={self.vocab_size}")
            if self.tie_embeddings:
                _fail("ArchConfig", "output_vocab", self.output_vocab, "a tied LM head is the whole embedding table")
        if self.norm_placement == "post" and self.final_norm:
            _fail("ArchConfig", "final_norm", True, "post-norm blocks already end in a norm")
        self._check_gemma4()
        self._check_geometry()
        self._check_gemma3n()
        self._check_shared_blocks()
        if kind.check is not None:
            kind.check(self)
        if mixer is not None and mixer.check is not None:
            mixer.check(self)

    def _check_shared_blocks(self) -> None:
        """Zamba2's shared blocks: called from pre-norm mixer layers without an FFN, the standard attention's heads
        reading 2 d_model, adapters as wide as q, k and v."""
        shared = self.shared_blocks
        if shared is None:
            return
        late = [i for i in shared.layers if i >= self.n_layers]
        if late:
            _fail("ArchConfig", "shared_blocks.layers", list(shared.layers), f"layer {late[0]} is past n_layers="
                  f"{self.n_layers}")
        if shared.n_blocks > len(shared.layers):
            _fail("ArchConfig", "shared_blocks.n_blocks", shared.n_blocks, f"exceeds the {len(shared.layers)} "
                  "calling layers: a block no layer calls")
        plain = [i for i in shared.layers if self.layer_mixers[i] != "mixer" or self.layer_ffns[i] != "none"]
        if plain:
            _fail("ArchConfig", "shared_blocks.layers", list(shared.layers), f"layer {plain[0]} is not a mixer layer "
                  "without an FFN (layer_mixers, layer_ffns), the only layers a shared block's output joins")
        if self.norm_placement != "pre" or self.mixer_norm_placement not in (None, "pre") or self.residual_fp32 \
                or self.residual_form != "plain" or self.residual_scale != 1.0:
            _fail("ArchConfig", "shared_blocks", shared, "joins a pre-norm layer's input before its norm: needs "
                  "norm_placement 'pre', a plain residual in the activation dtype")
        if self.attention != "standard" or not self.gated or self.moe is not None or self.altup is not None \
                or self.ple is not None or self.qk_norm != "none" or self.attn_output_gate != "none":
            _fail("ArchConfig", "shared_blocks", shared, "a shared block is the standard attention (no QK norm or "
                  "output gate) and a dense gated FFN; no mixture of experts, AltUp or per-layer embeddings")
        if shared.attn_adapters and not self.q_dim == self.kv_dim == 2 * self.d_model:
            _fail("ArchConfig", "shared_blocks.attn_adapters", True, f"adapters 2 x d_model={2 * self.d_model} wide "
                  f"are added to q ({self.q_dim}), k and v ({self.kv_dim}): they must be as wide")

    def shared_attention_config(self) -> ArchConfig:
        """The config a shared block's attention is built from: this one, reading 2 d_model (its `o` still writes
        d_model: arch/shared_blocks.py)."""
        return dataclasses.replace(self, d_model=2 * self.d_model, embed_dim=None, shared_blocks=None)

    def _check_gemma4(self) -> None:
        """Gemma 4's per-layer geometry and KV sharing: the standard attention's, and sane."""
        _integer("ArchConfig", "global_head_dim", self.global_head_dim, allow_none=True)
        _integer("ArchConfig", "global_kv_heads", self.global_kv_heads, allow_none=True)
        _choice("ArchConfig", "k_eq_v", self.k_eq_v, K_EQ_V)
        if self.global_head_dim == self.head_dim:  # one spelling of "the same head_dim everywhere"
            object.__setattr__(self, "global_head_dim", None)
        if self.global_kv_heads == self.n_kv_heads:
            object.__setattr__(self, "global_kv_heads", None)
        if self.global_kv_heads is not None and self.n_heads % self.global_kv_heads:
            _fail("ArchConfig", "global_kv_heads", self.global_kv_heads,
                  f"n_heads={self.n_heads} must be a multiple of it")
        n = self.kv_shared_layers
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < self.n_layers:
            _fail("ArchConfig", "kv_shared_layers", n, f"must be an integer in [0, n_layers={self.n_layers})")
        if self.kv_reused and not n:
            _fail("ArchConfig", "kv_reused", True, "marks a KV-shared layer's own config; set kv_shared_layers")
        missing = sorted(set(self.layer_kinds[n and -n:]) - set(self.layer_kinds[:self.n_layers - n])) if n else []
        if missing:
            _fail("ArchConfig", "kv_shared_layers", n, f"shares the K/V of {missing[0]} layers, and no earlier "
                  f"layer of that kind has its own")
        _integer("ArchConfig", "shared_ffn_factor", self.shared_ffn_factor)
        used = (self.global_head_dim is not None or self.global_kv_heads is not None or self.k_eq_v != "none"
                or self.v_norm or n)
        if used and (self.attention != "standard" or self.qk_norm == "projection" or self.attn_output_gate != "none"
                     or self.qk_norm_weight != "shared"):
            _fail("ArchConfig", "attention", self.attention, "per-layer geometry, K = V, the V norm and KV sharing "
                  "are the standard attention's, with no output gate and per-head QK norms if any")
        if n and set(self.layer_mixers) != {"attention"}:
            _fail("ArchConfig", "kv_shared_layers", n, "shares K/V between attention layers: every layer must be one "
                  "(layer_mixers)")
        if self.k_eq_v != "none" and (self.k_bias != self.v_bias or self.clip_qkv is not None):
            _fail("ArchConfig", "k_eq_v", self.k_eq_v, "takes v from k's projection: needs k_bias == v_bias and "
                  "no clip_qkv")
        if self.layer_scalar not in (True, False):
            _fail("ArchConfig", "layer_scalar", self.layer_scalar, "must be true or false")

    def _check_geometry(self) -> None:
        """MiMo-V2-Flash's value width, value scale and sinks on the sliding layers; Laguna's heads per layer and
        the gate's activation: the standard attention's, and sane."""
        _integer("ArchConfig", "v_head_dim", self.v_head_dim, allow_none=True)
        if self.v_head_dim == self.head_dim:  # one spelling of "values as wide as keys"
            object.__setattr__(self, "v_head_dim", None)
        if self.v_head_dim is not None and (self.attention != "standard" or self.k_eq_v != "none" or self.v_norm
                                            or self.attn_output_gate in ("q_heads", "projection_head_bias")):
            _fail("ArchConfig", "v_head_dim", self.v_head_dim, "values of their own width are the standard "
                  "attention's, without K = V, a V norm, or a gate shaped by the query heads (q_heads, "
                  "projection_head_bias)")
        _positive("ArchConfig", "attn_value_scale", self.attn_value_scale)
        if self.attn_value_scale != 1.0 and self.attention != "standard":
            _fail("ArchConfig", "attn_value_scale", self.attn_value_scale, "scales the standard attention's v only")
        _choice("ArchConfig", "attn_gate_activation", self.attn_gate_activation, GATE_ACTIVATIONS)
        if self.attn_output_gate == "none":  # one spelling of "no gate"
            object.__setattr__(self, "attn_gate_activation", GATE_ACTIVATIONS[0])
        _choice("ArchConfig", "sink_layers", self.sink_layers, SINK_LAYERS)
        if not self.attn_sinks:  # one spelling of "no sinks"
            object.__setattr__(self, "sink_layers", SINK_LAYERS[0])
        if self.sink_layers != "all" and self.sink_form != "column":
            _fail("ArchConfig", "sink_layers", self.sink_layers, "sinks on some layers only are the column form's "
                  "(sink_form='column')")
        heads = self.layer_heads
        if heads is None:
            return
        if not isinstance(heads, (list, tuple)) or len(heads) != self.n_layers:
            _fail("ArchConfig", "layer_heads", heads, f"needs one head count per layer (n_layers={self.n_layers})")
        for count in heads:
            _integer("ArchConfig", "layer_heads", count)
        heads = tuple(heads)
        if set(heads) == {self.n_heads}:  # one spelling of "the same heads everywhere"
            object.__setattr__(self, "layer_heads", None)
            return
        object.__setattr__(self, "layer_heads", heads)
        kv = {self.n_kv_heads} | ({self.global_kv_heads} if self.global_kv_heads is not None else set())
        if any(h % k for h in heads for k in kv):
            _fail("ArchConfig", "layer_heads", list(heads), f"each layer's heads must be a multiple of its KV heads "
                  f"({', '.join(map(str, sorted(kv)))})")
        if self.attention != "standard" or self.attn_output_gate in ("q_heads", "projection_head_bias") \
                or self.qk_norm_weight != "shared" or "alibi" in self.layer_positions \
                or "relative" in self.layer_positions:
            _fail("ArchConfig", "layer_heads", list(heads), "query heads per layer are the standard attention's, "
                  "with no per-head parameters beside q's (a per-head QK-norm weight, a head-bias gate, ALiBi or "
                  "relative slopes)")

    def _check_gemma3n(self) -> None:
        """AltUp, PLE, LAuReL, sparse gates and per-layer widths: sane, and where they are computed."""
        for name, sub in (("altup", AltUpConfig), ("ple", PleConfig)):
            if isinstance(getattr(self, name), dict):
                object.__setattr__(self, name, sub(**getattr(self, name)))
        _integer("ArchConfig", "laurel_rank", self.laurel_rank, allow_none=True)
        for name in ("gate_sparsity", "d_ff_layers"):
            value = getattr(self, name)
            if value is not None:
                value = tuple(value)
                object.__setattr__(self, name, value)
                if len(value) != self.n_layers:
                    _fail("ArchConfig", name, value, f"needs one entry per layer (n_layers={self.n_layers})")
        if self.gate_sparsity is not None:
            if any(isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s < 1
                   for s in self.gate_sparsity):
                _fail("ArchConfig", "gate_sparsity", self.gate_sparsity, "each entry must be in [0, 1)")
            if not any(self.gate_sparsity):  # one spelling of "dense everywhere"
                object.__setattr__(self, "gate_sparsity", None)
            elif not self.gated or self.moe is not None:
                _fail("ArchConfig", "gate_sparsity", self.gate_sparsity, "sparsifies a dense gated FFN's gate: "
                      "needs gated=True and no mixture of experts")
        if self.d_ff_layers is not None:
            for width in self.d_ff_layers:
                _integer("ArchConfig", "d_ff_layers", width)
            if set(self.d_ff_layers) == {self.d_ff}:  # one spelling of "d_ff everywhere"
                object.__setattr__(self, "d_ff_layers", None)
            elif self.moe is not None or self.shared_ffn_factor != 1:
                _fail("ArchConfig", "d_ff_layers", self.d_ff_layers, "sets dense FFN widths per layer: needs no "
                      "mixture of experts and shared_ffn_factor 1")
        extras = self.altup is not None or self.ple is not None or self.laurel_rank is not None
        if extras and (self.norm_placement != "sandwich" or set(self.layer_mixers) != {"attention"}
                       or set(self.layer_ffns) != {"ffn"} or self.residual_form != "plain"
                       or self.residual_scale != 1.0 or self.residual_fp32):
            _fail("ArchConfig", "altup" if self.altup is not None else "ple" if self.ple is not None
                  else "laurel_rank", "set", "AltUp, per-layer embeddings and LAuReL wrap Gemma's sandwich blocks: "
                  "need norm_placement 'sandwich', attention and an FFN on every layer and plain residual adds")
        if self.altup is not None and self.layer_scalar:
            _fail("ArchConfig", "layer_scalar", True, "scales a single residual stream; AltUp has several")

    def sparsity_for(self, layer: int) -> float:
        """The layer's gate sparsity (0: dense)."""
        return 0.0 if self.gate_sparsity is None else float(self.gate_sparsity[layer])

    def kv_source(self, layer: int) -> int | None:
        """The layer whose K/V a KV-shared layer takes (the last non-shared one of its kind); None for others."""
        first = self.n_layers - self.kv_shared_layers
        if layer < first:
            return None
        return max(i for i in range(first) if self.layer_kinds[i] == self.layer_kinds[layer])

    def _normalise_mixers(self) -> MixerKind | None:
        """The per-layer schedule in one spelling, and the mixer's settings as its dataclass."""
        kind = None if self.mixer is None else mixer_kind(self.mixer)
        self._normalise_layers("layer_mixers", "attention" if kind is None else "mixer", LAYER_MIXERS)
        self._normalise_layers("layer_ffns", "ffn", LAYER_FFNS)
        empty = [i for i, (m, f) in enumerate(zip(self.layer_mixers, self.layer_ffns, strict=True)) if m == f == "none"]
        if empty:
            _fail("ArchConfig", "layer_ffns", self.layer_ffns, f"layer {empty[0]} has neither a mixer nor an FFN")
        partial = "none" in self.layer_mixers or "none" in self.layer_ffns
        if partial and (self.norm_placement not in SEQUENTIAL_PLACEMENTS or self.residual_after_norm):
            _fail("ArchConfig", "norm_placement", self.norm_placement,
                  "a layer without a mixer or an FFN needs sequential sublayers (norm_placement 'pre', 'sandwich' or "
                  "'output', residual_after_norm off)")
        self._normalise_mixer_norm_placement(kind)
        if kind is None:
            if {"mixer", PARALLEL_MIXING} & set(self.layer_mixers):
                _fail("ArchConfig", "layer_mixers", self.layer_mixers, "names 'mixer' layers; set mixer")
            if self.mixer_settings is not None:
                _fail("ArchConfig", "mixer_settings", self.mixer_settings, "has no mixer to set; set mixer")
            return None
        if kind.settings is None:
            if self.mixer_settings is not None:
                _fail("ArchConfig", "mixer_settings", self.mixer_settings,
                      f"mixer={kind.name!r} has no settings of its own; leave it unset")
        else:
            try:
                object.__setattr__(self, "mixer_settings", _sub(kind.settings, self.mixer_settings, "mixer_settings"))
            except TypeError as exc:  # a settings field without a default, left out
                raise ConfigError(f"ArchConfig.mixer_settings: {exc}") from None
        return kind

    def _normalise_mixer_norm_placement(self, kind: MixerKind | None) -> None:
        placement = self.mixer_norm_placement
        if placement is None or placement == self.norm_placement:  # one spelling of "the same everywhere"
            object.__setattr__(self, "mixer_norm_placement", None)
            return
        _choice("ArchConfig", "mixer_norm_placement", placement, SEQUENTIAL_PLACEMENTS)
        if self.norm_placement not in SEQUENTIAL_PLACEMENTS or self.residual_after_norm:
            _fail("ArchConfig", "mixer_norm_placement", placement, "differs from norm_placement on the mixer "
                  "layers only where both are sequential (norm_placement 'pre', 'sandwich' or 'output', "
                  "residual_after_norm off)")
        if kind is None:
            _fail("ArchConfig", "mixer_norm_placement", placement, "places the mixer layers' norms; set mixer")

    def _check_moe(self, moe: MoeConfig) -> None:
        if not self.gated and not moe.experts_split:
            _fail("ArchConfig", "gated", False, "experts are gated FFNs unless split (moe.experts_split); a mixture "
                  "of experts needs gated=True or split experts")
        if self.mlp_bias and not moe.experts_split:
            _fail("ArchConfig", "mlp_bias", True, "experts have no biases; a mixture of experts needs mlp_bias=False "
                  "unless its experts are split (moe.experts_split: built without biases)")
        if moe.dense_layers and moe.dense_layers[-1] >= self.n_layers:
            _fail("ArchConfig", "moe.dense_layers", list(moe.dense_layers),
                  f"names a layer >= n_layers={self.n_layers}")
        if moe.beside_dense and (self.norm_placement not in SEQUENTIAL_PLACEMENTS or self.residual_after_norm
                                 or self.residual_fp32):
            _fail("ArchConfig", "moe.beside_dense", True, "reads the block's input stream beside the FFN norm's "
                  "output: needs sequential sublayers (norm_placement 'pre', 'sandwich' or 'output', plain residuals)")

    def _check_temperature(self) -> None:
        value = self.attn_temperature
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            _fail("ArchConfig", "attn_temperature", value, "must be a finite number")
        _integer("ArchConfig", "attn_temperature_floor", self.attn_temperature_floor, allow_none=True)
        if (value is None) != (self.attn_temperature_floor is None):
            _fail("ArchConfig", "attn_temperature_floor", self.attn_temperature_floor,
                  "is set exactly when attn_temperature is")
        if value is not None and self.attention != "standard":
            _fail("ArchConfig", "attn_temperature", value, f"scales the queries of standard attention only, not "
                  f"attention={self.attention!r}'s")
        _choice("ArchConfig", "attn_temperature_form", self.attn_temperature_form, TEMPERATURE_FORMS)
        if value is None:  # one spelling of "no temperature"
            object.__setattr__(self, "attn_temperature_form", TEMPERATURE_FORMS[0])

    def _check_chunks(self) -> None:
        _integer("ArchConfig", "attention_chunk", self.attention_chunk, allow_none=True)
        layers = self.chunked_layers
        if not isinstance(layers, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int)
                                                        or not 0 <= i < self.n_layers for i in layers):
            _fail("ArchConfig", "chunked_layers", layers,
                  f"must be a list of layer indices below n_layers={self.n_layers}")
        layers = tuple(sorted(set(layers)))
        object.__setattr__(self, "chunked_layers", layers)
        if bool(layers) != (self.attention_chunk is not None):
            _fail("ArchConfig", "attention_chunk", self.attention_chunk, "is set exactly when chunked_layers "
                  "names layers")
        if any(self.layer_kinds[i] == "local" for i in layers):
            _fail("ArchConfig", "chunked_layers", list(layers), "names a sliding-window (local) layer; a layer is "
                  "chunked or local, not both")
        if layers and self.attention != "standard":
            _fail("ArchConfig", "attention_chunk", self.attention_chunk, "chunks the standard attention only")
        if not isinstance(self.qk_l2_norm, bool):
            _fail("ArchConfig", "qk_l2_norm", self.qk_l2_norm, "must be true or false")
        if self.qk_l2_norm and (self.attention != "standard" or self.qk_norm != "none"):
            _fail("ArchConfig", "qk_l2_norm", True, "is the standard attention's only QK norm: needs "
                  "attention='standard' and qk_norm='none'")

    def _normalise_qk_norm_bias(self) -> None:
        """One spelling per model: the block norms' bias where unset, False where there is no QK norm."""
        value = self.norm.bias if self.qk_norm_bias is None else self.qk_norm_bias
        if not isinstance(value, bool):
            _fail("ArchConfig", "qk_norm_bias", value, "must be true, false or null")
        if value and self.norm.kind != "layer":
            _fail("ArchConfig", "qk_norm_bias", value,
                  "an RMSNorm has no bias; QK norms with one need norm.kind='layer'")
        object.__setattr__(self, "qk_norm_bias", value and self.qk_norm != "none")

    def _normalise_o_bias_layers(self) -> None:
        """One spelling: sorted layer indices, None where every layer has the o bias."""
        layers = self.o_bias_layers
        if layers is None:
            return
        if not isinstance(layers, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int)
                                                        or not 0 <= i < self.n_layers for i in layers):
            _fail("ArchConfig", "o_bias_layers", layers,
                  f"must be a list of layer indices below n_layers={self.n_layers}")
        if not self.o_bias:
            _fail("ArchConfig", "o_bias_layers", layers, "names the layers o_bias gives a bias; set o_bias=True")
        layers = tuple(sorted(set(layers)))
        object.__setattr__(self, "o_bias_layers", None if len(layers) == self.n_layers else layers)

    def _normalise_head_options(self) -> None:
        """`unnormed_attn_layers` as sorted indices of pre-norm layers; no transform bias without a transform."""
        layers = self.unnormed_attn_layers
        if not isinstance(layers, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int)
                                                        or not 0 <= i < self.n_layers for i in layers):
            _fail("ArchConfig", "unnormed_attn_layers", layers,
                  f"must be a list of layer indices below n_layers={self.n_layers}")
        if layers and self.norm_placement != "pre":
            _fail("ArchConfig", "unnormed_attn_layers", layers, "leaves out a pre-norm block's attention norm; "
                  "needs norm_placement='pre'")
        object.__setattr__(self, "unnormed_attn_layers", tuple(sorted(set(layers))))
        if self.head_transform is not None:
            _choice("ArchConfig", "head_transform", self.head_transform, ACTIVATIONS)
        elif self.head_transform_bias:
            object.__setattr__(self, "head_transform_bias", False)  # one spelling of "no transform"

    def layer_config(self, layer: int) -> ArchConfig:
        """The config one layer's attention and FFN are built from (their parts, so their tensors): this
        one, but without the o bias on a layer `o_bias_layers` leaves out, and with Gemma 4's per-layer
        geometry resolved (a global layer's head_dim and KV heads, K = V, a KV-shared layer's missing k and v
        and wider FFN). `AttentionKind.build`, `Block` and `shapes` read a layer through it, so they cannot
        disagree. Idempotent: a layer's config is its own layer config."""
        changes: dict[str, Any] = {}
        if self.o_bias_layers is not None and layer not in self.o_bias_layers:
            changes |= {"o_bias": False, "o_bias_layers": None}
        glob = self.layer_kinds[layer] == "global"
        if glob and self.global_head_dim is not None:
            changes["head_dim"] = self.global_head_dim
        if glob and self.global_kv_heads is not None:
            changes["n_kv_heads"] = self.global_kv_heads
        if self.global_head_dim is not None or self.global_kv_heads is not None:
            changes |= {"global_head_dim": None, "global_kv_heads": None}
        if self.k_eq_v == "global":
            changes["k_eq_v"] = "all" if glob else "none"
        if self.layer_heads is not None:  # Laguna: this layer's query heads
            changes |= {"n_heads": self.layer_heads[layer], "layer_heads": None}
        if self.sink_layers == "local":  # MiMo-V2-Flash: a sink on the sliding layers only
            changes["sink_layers"] = "none" if glob else "all"
        if self.d_ff_layers is not None:  # Gemma 3n: its own width
            changes |= {"d_ff": self.d_ff_layers[layer], "d_ff_layers": None}
        if self.kv_shared_layers and not self.kv_reused and layer >= self.n_layers - self.kv_shared_layers:
            changes |= {"kv_reused": True, "d_ff": changes.get("d_ff", self.d_ff) * self.shared_ffn_factor,
                        "shared_ffn_factor": 1}
        return dataclasses.replace(self, **changes) if changes else self

    def _normalise_attention_settings(self, kind: AttentionKind) -> None:
        """None or a JSON object becomes the kind's settings (defaults where None)."""
        value = self.attention_settings
        if kind.settings is None:
            if value is not None:
                _fail("ArchConfig", "attention_settings", value,
                      f"attention={kind.name!r} has no settings of its own; leave it unset")
            return
        try:
            object.__setattr__(self, "attention_settings", _sub(kind.settings, value, "attention_settings"))
        except TypeError as exc:  # a settings field without a default, left out
            raise ConfigError(f"ArchConfig.attention_settings: {exc}") from None

    def _normalise_layers(self, name: str, default: str, allowed: tuple[str, ...]) -> None:
        value = getattr(self, name)
        value = (default,) * self.n_layers if value is None else tuple(value)
        if len(value) != self.n_layers:
            _fail("ArchConfig", name, value, f"needs one entry per layer (n_layers={self.n_layers})")
        for item in value:
            _choice("ArchConfig", name, item, allowed)
        object.__setattr__(self, name, value)

    # ----------------------------------------------------------------------------- derived
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        """One value head's width: v_head_dim where set, else head_dim."""
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def o_dim(self) -> int:
        """What the output projection reads: every query head's value-sized output."""
        return self.n_heads * self.value_dim

    @property
    def score_scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim ** -0.5

    def score_scale_for(self, layer: int) -> float:
        """The score scale of one layer: GPT-2's `scaling /= float(layer_idx + 1)`, in its order."""
        return self.score_scale / float(layer + 1) if self.scale_by_inverse_layer else self.score_scale

    @property
    def head_vocab(self) -> int:
        """The LM head's rows: output_vocab where it is narrower, else vocab_size."""
        return self.vocab_size if self.output_vocab is None else self.output_vocab

    @property
    def projects_embeddings(self) -> bool:
        return self.embed_dim != self.d_model

    def rope_for(self, layer: int) -> RopeConfig | None:
        if self.layer_positions[layer] != "rope":
            return None
        if self.layer_kinds[layer] == "local" and self.rope_local is not None:
            return self.rope_local
        return self.rope

    def window_for(self, layer: int) -> int | None:
        return self.sliding_window if self.layer_kinds[layer] == "local" else None

    def chunk_for(self, layer: int) -> int | None:
        return self.attention_chunk if layer in self.chunked_layers else None

    def layers_mixed_by(self, mixing: str) -> list[int]:
        """The layers whose tokens `mixing` ("attention", "mixer" or "none") mixes (`layer_mixers`); a parallel
        layer ("attention+mixer") is mixed by both, so it counts among the attention layers and the mixer layers
        (its KV cache, its state, its points)."""
        both = mixing in ("attention", "mixer")
        return [i for i, m in enumerate(self.layer_mixers) if m == mixing or (both and m == PARALLEL_MIXING)]

    def kv_cache_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """What the attention layers cache per token, each with its own geometry (Gemma 4); a KV-shared layer
        keeps none, and a mixer's state does not grow with the sequence."""
        kind = attention_kind(self.attention)
        layers = [i for i in self.layers_mixed_by("attention") if i < self.n_layers - self.kv_shared_layers]
        calls = 0 if self.shared_blocks is None else len(self.shared_blocks.layers)  # each call its own (Zamba2)
        return (sum(kind.cache_elements(self.layer_config(i)) for i in layers)
                + calls * kind.cache_elements(self)) * bytes_per_element

    def state_bytes_per_sequence(self, bytes_per_element: int = 2) -> int:
        """The fixed state the mixer layers carry per sequence (`MixerKind.state_elements`), 0 without one."""
        layers = len(self.layers_mixed_by("mixer"))
        return layers * mixer_kind(self.mixer).state_elements(self) * bytes_per_element if layers else 0

    def cache_bytes(self, tokens: int, bytes_per_element: int = 2) -> int:
        """What decoding one sequence of `tokens` holds: the KV cache and the mixers' state."""
        return tokens * self.kv_cache_bytes_per_token(bytes_per_element) + \
            self.state_bytes_per_sequence(bytes_per_element)

    # ----------------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """Every field; `attention_settings` only where the kind has settings and `moe` only for a
        mixture of experts, so the lmconvert.json of other models reads as it did before."""
        data = dataclasses.asdict(self)
        for name in ("attention_settings", "moe"):  # as files written before these fields read
            if data[name] is None:
                del data[name]
        for name, unset in UNSTATED_WHEN_UNSET.items():  # likewise: a model without them reads as before
            if data[name] == unset:
                del data[name]
        # per layer, so not above; the schedule's default is the mixer everywhere when one is set
        for name, everywhere in (("layer_mixers", "attention" if self.mixer is None else "mixer"),
                                 ("layer_ffns", "ffn")):
            if set(data[name]) == {everywhere}:
                del data[name]
        for part, unstated in (("rope", ROPE_UNSTATED_WHEN_UNSET), ("rope_local", ROPE_UNSTATED_WHEN_UNSET),
                               ("moe", MOE_UNSTATED_WHEN_UNSET), ("norm", NORM_UNSTATED_WHEN_UNSET)):
            if data.get(part) is not None:
                for name, unset in unstated.items():
                    if data[part][name] == unset:
                        del data[part][name]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArchConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"ArchConfig: unknown field(s) {', '.join(unknown)}")
        data = dict(data)
        data["norm"] = _sub(NormConfig, data.get("norm"), "norm")
        data["rope"] = _sub(RopeConfig, data.get("rope"), "rope")
        if data.get("rope_local") is not None:
            data["rope_local"] = _sub(RopeConfig, data["rope_local"], "rope_local")
        if data.get("moe") is not None:
            data["moe"] = _sub(MoeConfig, data["moe"], "moe")
        for name, sub in (("altup", AltUpConfig), ("ple", PleConfig), ("shared_blocks", SharedBlocksConfig)):
            if data.get(name) is not None:
                data[name] = _sub(sub, data[name], name)
        try:
            return cls(**data)
        except TypeError as exc:  # missing required fields
            raise ConfigError(f"ArchConfig: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> ArchConfig:
        return cls.from_dict(json.loads(text))


# fields added after lmconvert.json files were first written, left out of them where unset
UNSTATED_WHEN_UNSET: dict[str, Any] = {"attn_sinks": False, "sink_form": "column", "sinks_fp32": False,
                                       "qk_norm_after_rope": False,
                                       "sub_norms": False, "output_vocab": None, "attn_temperature_form": "ministral3",
                                       "attention_chunk": None, "chunked_layers": (), "qk_l2_norm": False,
                                       "attn_output_gate": "none", "mixer": None, "mixer_settings": None,
                                       "mixer_norm_placement": None, "residual_form": "plain", "glu_fp32": False,
                                       "softcap_fp32": False, "attn_gate_activation": "sigmoid", "sink_layers": "all",
                                       "v_head_dim": None, "attn_value_scale": 1.0, "layer_heads": None,
                                       # Falcon-H1's muP multipliers
                                       **dict.fromkeys(MULTIPLIERS, 1.0),
                                       # Gemma 4
                                       "global_head_dim": None, "global_kv_heads": None, "k_eq_v": "none",
                                       "v_norm": False, "kv_shared_layers": 0, "kv_reused": False,
                                       "shared_ffn_factor": 1, "layer_scalar": False,
                                       # Gemma 3n
                                       "altup": None, "ple": None, "laurel_rank": None, "gate_sparsity": None,
                                       "d_ff_layers": None,
                                       # Zamba2
                                       "shared_blocks": None}
ROPE_UNSTATED_WHEN_UNSET: dict[str, Any] = {"alpha": None, "reverse": False}
MOE_UNSTATED_WHEN_UNSET: dict[str, Any] = {"weight_input": False, "sum_bias": False, "scale_after_sum": False,
                                           "router_norm": False, "expert_scale": False, "beside_dense": False,
                                           "router_softcap": None, "norm_eps": None}
NORM_UNSTATED_WHEN_UNSET: dict[str, Any] = {"power": False}


def _sub(kind: type, value: Any, name: str) -> Any:
    if value is None:
        return kind()
    if isinstance(value, kind):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"ArchConfig.{name}={value!r}: must be an object")
    unknown = sorted(set(value) - {f.name for f in fields(kind)})
    if unknown:
        raise ConfigError(f"ArchConfig.{name}: unknown field(s) {', '.join(unknown)}")
    return kind(**value)

