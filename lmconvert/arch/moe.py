"""The mixture-of-experts FFN: a router, `n_experts` gated FFNs, and an optional shared expert.

Op for op as transformers 5's experts, so that bf16 results are theirs bit for bit: the router's
logits in the activation dtype, softmax in fp32, top-k, the optional renormalisation in fp32, then
(unless `weights_fp32`) the weights cast back to the activation dtype; each expert on the tokens
routed to it, weighted. How the weighted outputs are summed is transformers' `experts_implementation`,
and both are offered (`Decoder.set_experts`): "grouped_mm", its default on CPU and GPU, sums each
token's top-k at once (accumulated in fp32, rounded once); "eager" (`MixtralExperts.forward`, ...)
casts each to the activation dtype and `index_add_`s them into a zero tensor in increasing expert
order, rounding after every add; "sorted" is JetMoE's own (`_sorted_index_add`). The shared expert's output,
gated by a sigmoid
where `shared="gated"`, is added last, as Qwen2-MoE and DeepSeek add it. DeepSeek's routers
(sigmoid scores, a selection bias, group-limited choice, a scaling factor, fp32 logits) follow
`DeepseekV3TopkRouter` and `DeepseekV2TopkRouter` op for op.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import replace
from functools import partial

import torch
from torch import nn

from .config import ArchConfig, MoeConfig
from .mlp import MLP, SeparateBias
from .norms import Norm


class Router(nn.Linear):
    """Scores -> (logits, top-k weights, top-k expert indices), per token of a flat [tokens, d_model]."""

    def __init__(self, cfg: ArchConfig, moe: MoeConfig) -> None:
        super().__init__(cfg.d_model, moe.n_experts, bias=moe.router_bias)  # gpt-oss's router has a bias
        self.moe = moe
        self.selection_bias = nn.Parameter(torch.zeros(moe.n_experts)) if moe.selection_bias else None
        # DeepSeek's router computes in fp32 from fp32 parameters: transformers keeps them fp32 in
        # any dtype (`_keep_in_fp32_modules_strict`), and so do the loaders (`kept_in_fp32`)
        self.fp32_parameters = ("weight", "selection_bias")[:1 + moe.selection_bias] if moe.router_fp32 else ()
        if moe.kept_fp32 is not None:  # the family says which (Kolibri: the bias alone)
            self.fp32_parameters = moe.kept_fp32
        # Gemma 4: the input normalised (no weight), times `scale` and d_model**-0.5; the chosen weights times
        # `expert_scale`
        self.input_norm = Norm(cfg.d_model, replace(cfg.norm, weight=False, bias=False)) if moe.router_norm else None
        self.scale = nn.Parameter(torch.ones(cfg.d_model)) if moe.router_norm else None
        self.root = cfg.d_model ** -0.5
        self.expert_scale = nn.Parameter(torch.ones(moe.n_experts)) if moe.expert_scale else None

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # type: ignore[override]
        """The logits first, as transformers' routers return them, so that verify compares the
        router's own output."""
        moe = self.moe
        if self.input_norm is not None:  # Gemma4TextRouter: norm, then `* scale * scalar_root_size`, in that order
            h = self.input_norm(h) * self.scale * self.root
        if moe.router_fp32:
            bias = None if self.bias is None else self.bias.float()
            logits = nn.functional.linear(h.float(), self.weight.float(), bias)
        else:
            logits = super().forward(h)
        if moe.router_softcap is not None:  # Laguna: tanh(logits / c) * c on an fp32 copy, which the scores read
            logits = torch.tanh(logits.float() / moe.router_softcap) * moe.router_softcap
        weights, chosen = SCORES[moe.router](self, logits)
        if moe.norm_topk:  # by the sum (ERNIE 4.5's clamped below at norm_min, no guard added), or DBRX's p-norm
            norm = weights.sum(dim=-1, keepdim=True) if moe.norm_p is None else \
                torch.norm(weights, p=moe.norm_p, dim=-1, keepdim=True)
            if moe.norm_min:
                weights = weights / torch.clamp(norm, min=moe.norm_min)
            else:
                weights /= norm + (EPS[moe.router] if moe.norm_eps is None else moe.norm_eps)
        if self.expert_scale is not None:  # fp32 weights times the stored scale: fp32, as Gemma 4 multiplies
            weights = weights * self.expert_scale[chosen]
        if moe.scale != 1.0 and not moe.scale_after_sum:
            weights = weights * moe.scale
        if not moe.weights_fp32:  # to the activation dtype, which fp32 logits are not (ERNIE 4.5)
            weights = weights.to(h.dtype)
        return logits, weights, chosen


def _softmax(router: Router, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixtral, Qwen-MoE, OLMoE; DeepSeek-V2, whose groups are scored by their best expert and
    whose experts outside the best groups score 0 (`group_limited_greedy`); ERNIE 4.5, whose
    experts are chosen on the probabilities plus the selection bias and weighted by the
    probabilities alone (no groups)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float) if router.moe.softmax_fp32 else torch.softmax(logits, -1)
    if router.selection_bias is not None:
        chosen = torch.topk(probs + router.selection_bias, router.moe.top_k, dim=-1)[1]
        return probs.gather(1, chosen), chosen
    if router.moe.n_group > 1:
        groups = probs.view(-1, router.moe.n_group, router.moe.n_experts // router.moe.n_group).max(dim=-1).values
        probs = probs.masked_fill(~_group_mask(router.moe, groups), 0.0)
    return torch.topk(probs, router.moe.top_k, dim=-1, sorted=router.moe.n_group == 1)


def _sigmoid(router: Router, logits: torch.Tensor, ordered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3: experts chosen on sigmoid scores plus the selection bias, within the groups
    whose best two such scores sum highest; weighted by the unbiased scores. `ordered` (LFM2-MoE's
    `Lfm2MoeTopKRouter`, no groups; Beam's `BeamTopKRouter`, "sigmoid_grouped_sorted", with DeepSeek-V3's groups
    and guard): a sorted top-k, the order each token's experts are summed in."""
    moe = router.moe
    scores = logits.sigmoid()
    choice = scores if router.selection_bias is None else scores + router.selection_bias
    if moe.n_group > 1:
        groups = choice.view(-1, moe.n_group, moe.n_experts // moe.n_group).topk(2, dim=-1)[0].sum(dim=-1)
        choice = choice.masked_fill(~_group_mask(moe, groups), float("-inf"))
    chosen = torch.topk(choice, moe.top_k, dim=-1, sorted=ordered)[1]
    return scores.gather(1, chosen), chosen


def _topk_softmax(router: Router, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GraniteMoE, Cohere2-MoE (softmax in fp32) and Aria (in the activation dtype): the top-k
    chosen on the logits, weighted by the softmax over the k chosen alone (the renormalised softmax
    over all experts, in other roundings). GraniteMoE takes the top-k of the logits cast to fp32:
    the same values, so the same choice."""
    top, chosen = torch.topk(logits, router.moe.top_k, dim=-1)
    weights = torch.softmax(top, dim=-1, dtype=torch.float) if router.moe.softmax_fp32 else torch.softmax(top, -1)
    return weights, chosen


def _topk_sigmoid(router: Router, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cohere2-MoE's `expert_selection_fn="sigmoid"`: the top-k chosen on the logits, weighted by
    their sigmoids, in the activation dtype (renormalised by the Router where norm_topk)."""
    top, chosen = torch.topk(logits, router.moe.top_k, dim=-1)
    return torch.sigmoid(top), chosen


def _topk_sigmoid_fp32(router: Router, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's `Llama4Router`: the top-k chosen on the logits, every other logit set to -inf, the
    sigmoid of the whole row taken in fp32 and cast to the logits' dtype (the others 0), not renormalised.
    The chosen are returned in increasing expert order: Llama 4's experts are summed in that order (every
    expert's output, the others' zeros, `sum(dim=0)`), so the top-k sum adds them in it too."""
    top, chosen = torch.topk(logits, router.moe.top_k, dim=1)
    scores = torch.full_like(logits, float("-inf")).scatter_(1, chosen, top)
    scores = torch.sigmoid(scores.float()).to(scores.dtype)
    chosen = torch.sort(chosen, dim=1).values
    return scores.gather(1, chosen), chosen


def _group_mask(moe: MoeConfig, groups: torch.Tensor) -> torch.Tensor:
    """[tokens, experts]: True for the experts of each token's best `topk_group` groups."""
    best = torch.topk(groups, k=moe.topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(groups).scatter_(1, best, 1)
    size = moe.n_experts // moe.n_group
    return mask.unsqueeze(-1).expand(-1, moe.n_group, size).reshape(-1, moe.n_experts).bool()


def _sparsemixer(router: Router, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Phi-3.5-MoE's SparseMixer as transformers' `sparsemixer` runs it outside training: the best expert,
    weighted by its softmax over the experts whose logits lie within a relative 2 * eps of its own (the
    others masked to -inf), then the best of the rest, weighted the same way over the logits without the
    first; both softmaxes in the logits' dtype."""
    eps = router.moe.sparsemixer_eps

    def best(masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        threshold, chosen = masked.max(dim=-1, keepdim=True)
        far = ((threshold - logits) / logits.abs().clamp(min=threshold)) > (2 * eps)
        return torch.softmax(masked.masked_fill(far, float("-inf")), dim=-1).gather(dim=-1, index=chosen), chosen

    first, one = best(logits)
    second, two = best(torch.scatter(logits, -1, one, float("-inf")))
    return torch.concat((first, second), dim=-1), torch.concat((one, two), dim=-1)


def _sigmoid_fp32(router: Router, logits: torch.Tensor, ordered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """MiniMax-M2: the sigmoid of the logits cast to fp32 (the logits themselves in the
    activation dtype), experts chosen on those scores plus the selection bias (in its dtype),
    weighted by the unbiased scores. `ordered` (AFMoE's `AfmoeTokenChoiceRouter`): the chosen in
    decreasing order of that choice, a sorted top-k, the order each token's experts are summed in
    (its renormalisation guarded by 1e-20: EPS)."""
    scores = logits.float().sigmoid()
    choice = scores if router.selection_bias is None else scores + router.selection_bias
    chosen = torch.topk(choice, router.moe.top_k, dim=-1, sorted=ordered)[1]
    return scores.gather(1, chosen), chosen


def _logits(router: Router, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kolibri: experts chosen on the logits plus the selection bias, weighted by the sigmoid of
    their own logits."""
    choice = logits if router.selection_bias is None else logits + router.selection_bias
    chosen = torch.topk(choice, router.moe.top_k, dim=-1)[1]
    return logits.gather(1, chosen).sigmoid(), chosen


SCORES = {"softmax": _softmax, "sigmoid": _sigmoid, "sparsemixer": _sparsemixer, "topk_softmax": _topk_softmax,
          "topk_sigmoid": _topk_sigmoid, "sigmoid_fp32": _sigmoid_fp32, "logits": _logits,
          "topk_sigmoid_fp32": _topk_sigmoid_fp32, "sigmoid_fp32_sorted": partial(_sigmoid_fp32, ordered=True),
          "sigmoid_sorted": partial(_sigmoid, ordered=True), "sigmoid_grouped_sorted": partial(_sigmoid, ordered=True)}
# DeepSeek-V3 and AFMoE guard their renormalisation, LFM2-MoE by 1e-6; the others do not (SparseMixer does not
# renormalise)
EPS = {"softmax": 0.0, "sigmoid": 1e-20, "sparsemixer": 0.0, "topk_softmax": 0.0, "topk_sigmoid": 0.0,
       "sigmoid_fp32": 0.0, "logits": 0.0, "topk_sigmoid_fp32": 0.0, "sigmoid_fp32_sorted": 1e-20,
       "sigmoid_sorted": 1e-6, "sigmoid_grouped_sorted": 1e-20}


def _halves(expert: Expert, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """transformers' default `_apply_gate`: act(gate) * up over the two halves of one [gate | up] output."""
    gate, up = torch.cat([gate, up], dim=-1).chunk(2, dim=-1)
    if expert.glu_fp32:  # Beam's _apply_gate: from fp32 copies of the halves, cast back
        return (expert.act(gate.float()) * up.float()).to(gate.dtype)
    return expert.act(gate) * up


def _clamped_swiglu(expert: Expert, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`GptOssExperts._apply_gate` op for op, over the interleaved [g0, u0, g1, u1, ...] output its
    gate_up_proj gives (so both halves are strided as there): the gate clamped above at the limit,
    up clamped to +-limit, then (up + 1) * (gate * sigmoid(gate * alpha)), each op in the activation dtype."""
    fused = torch.stack([gate, up], dim=-1).flatten(-2)
    gate, up = fused[..., ::2], fused[..., 1::2]
    gate = gate.clamp(min=None, max=expert.glu_limit)
    up = up.clamp(min=-expert.glu_limit, max=expert.glu_limit)
    glu = gate * torch.sigmoid(gate * expert.glu_alpha)
    return (up + 1) * glu


GLUS = {"halves": _halves, "clamped_swiglu": _clamped_swiglu}  # MoeConfig.glu


class Expert(MLP):
    """A gated FFN computed as transformers 5's experts compute it: gate and up side by side in one
    [tokens, 2 * width] tensor, the activation on its gate half. The values are the two
    projections' own; the layout matters because the activation of a strided half rounds
    differently in its last bit from that of a contiguous tensor (torch's vectorised loop covers
    other elements), so a contiguous gate would be 1 ulp off transformers in fp32. How the two are
    gated is the routed experts' `MoeConfig.glu` (GLUS); their biases, `expert_bias`, are added
    after each product (SeparateBias: gpt-oss's `x @ W + b` and grouped_mm's `out.add_(bias)`, where
    nn.Linear's one fused addmm rounds once in bf16). `moe` None: a shared expert (halves, no biases)."""

    def __init__(self, cfg: ArchConfig, width: int, moe: MoeConfig | None = None) -> None:
        super().__init__(cfg, width, bias=moe is not None and moe.expert_bias)
        if moe is not None and moe.expert_bias:
            for linear in (self.gate, self.up, self.down):
                linear.__class__ = SeparateBias  # the same parameters, the bias added after the product
        self.glu = GLUS["halves" if moe is None else moe.glu]
        self.glu_alpha, self.glu_limit = (None, None) if moe is None else (moe.glu_alpha, moe.glu_limit)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.gate is not None  # experts are gated (ArchConfig checks it)
        return self.down(self.glu(self, self.gate(x), self.up(x)))


class Experts(nn.ModuleList):
    """The routed experts, each an MLP run on the tokens routed to it; their weighted sum is one
    point for verify (`one_point`), as transformers 5 computes all experts in one module."""

    one_point = True

    def __init__(self, experts: Iterable[nn.Module], sum_order: str, weight_input: bool = False,
                 bias: int | None = None) -> None:
        super().__init__(experts)
        self.implementation = sum_order  # MoeConfig.sum_order; Decoder.set_experts
        self.weight_input = weight_input  # MoeConfig.weight_input
        # MoeConfig.sum_bias (JetMoE): a bias of this width added to the weighted sum, `experts.bias`
        self.bias = nn.Parameter(torch.zeros(bias)) if bias is not None else None

    def forward(self, h: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = SUMS[self.implementation](self, h, weights, chosen)
        return out if self.bias is None else out + self.bias


def _weighted(experts: Experts, e: int, h: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Expert e on its tokens, its output weighted, or, where `weight_input` (Llama 4), its input."""
    return experts[e](h * weights) if experts.weight_input else experts[e](h) * weights


def _index_add(experts: Experts, h: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """transformers' eager experts: in increasing expert order, each expert's weighted output
    rounded to the activation dtype and `index_add_`-ed."""
    out = torch.zeros_like(h)
    with torch.no_grad():  # [expert, top-k slot, token]
        mask = nn.functional.one_hot(chosen, num_classes=len(experts)).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit[:, 0].tolist():
        slot, token = torch.where(mask[e])
        y = _weighted(experts, e, h[token], weights[token, slot, None])
        out.index_add_(0, token, y.to(out.dtype))
    return out


def _grouped_sum(experts: Experts, h: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """transformers' grouped_mm experts: the (token, slot) pairs sorted by expert as it sorts them
    (each expert's rows one matmul, in its row order, which a GEMM's bits can depend on), each
    weighted (in fp32 where the weights are), then each token's top-k summed at once and cast."""
    top_k = chosen.shape[1]
    with torch.no_grad():
        ids, perm = torch.sort(chosen.reshape(-1))
        counts = torch.bincount(ids, minlength=len(experts)).tolist()
    flat = weights.reshape(-1)
    out: torch.Tensor | None = None
    for e, end in enumerate(itertools.accumulate(counts)):
        if counts[e]:
            pairs = perm[end - counts[e]:end]
            y = _weighted(experts, e, h[pairs // top_k], flat[pairs, None])
            out = y.new_zeros(chosen.numel(), h.shape[1]) if out is None else out
            out[pairs] = y
    if out is None:
        return torch.zeros_like(h)
    return out.view(h.shape[0], top_k, h.shape[1]).sum(dim=1).to(h.dtype)


def _sorted_index_add(experts: Experts, h: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """JetMoE's `JetMoeMoE`: the (token, slot) pairs sorted by expert, each expert one matmul over its rows
    (every expert, none skipped), weighted, then all added into zeros by one `index_add` in that order (which
    on CPU accumulates a bf16 or fp16 sum in fp32 and rounds once, unlike an index_add_ per expert)."""
    top_k = chosen.shape[1]
    with torch.no_grad():
        _, order = chosen.flatten().sort(0)
        counts = torch.bincount(chosen.flatten(), minlength=len(experts)).tolist()
    tokens = order.div(top_k, rounding_mode="trunc")
    gates = weights.flatten()[order, None]
    rows = h[tokens].split(counts, dim=0)
    y = torch.cat([_weighted(experts, e, rows[e], gates[end - counts[e]:end])
                   for e, end in enumerate(itertools.accumulate(counts))], dim=0)
    return torch.zeros_like(h).index_add(0, tokens, y.to(h.dtype))


SUMS = {"eager": _index_add, "grouped_mm": _grouped_sum, "sorted": _sorted_index_add}


class MoE(nn.Module):
    """Registered as `router`, `experts.{e}` (each an MLP of width d_expert), then `shared`,
    `shared_gate` and the output's `norm`: the canonical tensors `layers.{i}.mlp.experts.{e}.gate.weight` and so on, one
    tensor per expert so that conversion streams one expert at a time."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        moe = cfg.moe
        assert moe is not None
        self.router = Router(cfg, moe)
        self.experts = routed_experts(cfg, moe)
        self.shared = (Expert if moe.shared_fused else MLP)(cfg, moe.d_shared) if moe.d_shared is not None else None
        self.shared_gate = nn.Linear(cfg.d_model, 1, bias=False) if moe.shared == "gated" else None
        self.norm = Norm(cfg.d_model, cfg.norm) if moe.output_norm else None  # A.X-K1's post_mlp_layernorm
        self.router_logits: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, x.shape[-1])
        logits, weights, chosen = self.router(h)
        self.router_logits = logits if self.router.moe.aux_loss else None  # for balance_loss
        out = self.experts(h, weights, chosen)
        if self.router.moe.scale_after_sum:  # Beam: the weighted sum times routed_scaling_factor
            out = out * self.router.moe.scale
        if self.shared is not None:
            shared = self.shared(h)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(h)) * shared
            out = out + shared
            if self.router.moe.shared == "averaged":  # Cohere2-MoE's "average" combination
                out = out / 2
        out = out.reshape(x.shape)
        return out if self.norm is None else self.norm(out)


def routed_experts(cfg: ArchConfig, moe: MoeConfig) -> Experts:
    return Experts((MLP(cfg, moe.d_expert, bias=False) if moe.experts_split else Expert(cfg, moe.d_expert, moe)
                    for _ in range(moe.n_experts)), moe.sum_order, moe.weight_input,
                   cfg.d_model if moe.sum_bias else None)


class BesideDense(MLP):
    """A mixture of experts beside the layer's dense MLP (`MoeConfig.beside_dense`), as Gemma4TextDecoderLayer
    computes its `enable_moe_block` FFN: the dense MLP (`gate`, `up`, `down`, named as on a dense layer) on the FFN
    norm's output x, its output normalised (`dense_norm`: post_feedforward_layernorm_1); the router on the block's
    input stream itself, the experts on that stream normalised (`input_norm`: pre_feedforward_layernorm_2), their
    weighted sum normalised (`norm`: post_feedforward_layernorm_2); returned summed, dense first. The block's FFN
    output norm and residual add follow, as on any sandwich layer. `reads_stream`: Block passes the stream too."""

    reads_stream = True

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__(cfg)
        moe = cfg.moe
        assert moe is not None
        self.router = Router(cfg, moe)
        self.experts = routed_experts(cfg, moe)
        self.input_norm = Norm(cfg.d_model, cfg.norm)
        self.dense_norm = Norm(cfg.d_model, cfg.norm)
        self.norm = Norm(cfg.d_model, cfg.norm)
        self.router_logits: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        dense = self.dense_norm(super().forward(x))
        h = stream.reshape(-1, stream.shape[-1])
        logits, weights, chosen = self.router(h)
        self.router_logits = logits if self.router.moe.aux_loss else None  # for balance_loss
        routed = self.experts(self.input_norm(h), weights, chosen).reshape(stream.shape)
        return dense + self.norm(routed)


def balance_loss(model: nn.Module, moe: MoeConfig) -> torch.Tensor:
    """The Switch Transformer load-balancing loss over every sparse layer's router logits of the
    last forward pass, as transformers' `load_balancing_loss_func` computes it (no attention mask):
    n_experts * sum over experts of (the share of top-k choices it got) * (its mean probability)."""
    # every router that kept its logits: the mixtures', and a mixture of attention heads' (JetMoE counts both)
    logits = [m.router_logits for m in model.modules() if getattr(m, "router_logits", None) is not None]
    chosen = torch.zeros(moe.n_experts, dtype=torch.float32, device=logits[0].device)
    probs = torch.zeros(moe.n_experts, dtype=torch.float32, device=logits[0].device)
    rows = 0.0
    for layer in logits:
        p = torch.softmax(layer, dim=-1)
        top = torch.topk(p, moe.top_k, dim=-1)[1]
        chosen = chosen + torch.histc(top.reshape(-1).float(), bins=moe.n_experts, min=0, max=moe.n_experts)
        probs = probs + p.float().sum(dim=0)
        rows = rows + p.shape[0]
    return torch.sum((chosen / rows) * (probs / rows).unsqueeze(0)) * moe.n_experts


def kept_in_fp32(model: nn.Module) -> set[str]:
    """The parameters a model keeps in fp32 whatever dtype it is loaded in (a loader casts all
    others): DeepSeek's router weight and selection bias. A file storing them in fp32 (as
    DeepSeek-V3's does the bias) keeps every bit, which choosing the experts needs."""
    return {f"{name}.{p}" for name, m in model.named_modules() for p in getattr(m, "fp32_parameters", ())}


def ffn(cfg: ArchConfig, layer: int) -> nn.Module:
    """The FFN of one layer: the mixture of experts on its sparse layers (in place of the dense MLP, or beside
    it), else the dense MLP."""
    if cfg.moe is None or not cfg.moe.sparse(layer):
        return MLP(cfg, sparsity=cfg.sparsity_for(layer))
    return BesideDense(cfg) if cfg.moe.beside_dense else MoE(cfg)
