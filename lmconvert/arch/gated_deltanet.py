"""The gated delta-net token mixer (`mixer="gated_deltanet"`): Qwen3-Next's, Qwen3.5's and
OLMo-hybrid's linear-attention layers, one module whose differences are settings
(`mixer_kinds.GatedDeltaNetSettings`) over one layout, Qwen3.5's (in_proj_qkv, in_proj_z,
in_proj_b, in_proj_a, conv1d, norm, out_proj, A_log, dt_bias).

Numerics follow transformers' torch path op for op (`Qwen3NextGatedDeltaNet`, which Qwen3.5 and
OLMo-hybrid repeat), not the `fla` / `causal_conv1d` kernels it takes when they are installed:
  - padding tokens zeroed at the input (`apply_mask_to_padding_states`), on multi-token forwards;
  - q | k | v projected, a depthwise causal conv with SiLU over them (`causal_conv.causal_conv`:
    `causal_conv1d_fn`, or `causal_conv1d_update` for one cached token);
  - beta = sigmoid(b) (x 2 with `neg_eigval`), decay g = -exp(A_log) * softplus(a + dt_bias) in fp32;
  - the gated delta rule in fp32 with q, k L2-normed and q scaled by key_head_dim ** -0.5: chunked
    (`torch_chunk_gated_delta_rule`, chunks of 64) for a prefill or any multi-token forward, token by
    token (`torch_recurrent_gated_delta_rule`) for one token after a cached state;
  - an RMSNorm over each value head (weight after the cast back; LaraMini's in fp32, not cast back)
    times silu(z) in fp32, cast back,
    then the output projection.
The state, in `cache.states[layer]`: "conv", the last conv_kernel inputs of the conv (B, q|k|v,
conv_kernel) in the activation dtype, and "recurrent", (B, value_heads, key_head_dim,
value_head_dim) in fp32, as transformers' cache keeps them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .cache import KVCache
from .causal_conv import causal_conv, padding_mask, zero_padding
from .context import Context
from .mamba import StateSpaceMixer
from .norms import Norm
from .parts import Part

if TYPE_CHECKING:
    from .config import ArchConfig

CHUNK = 64  # torch_chunk_gated_delta_rule's chunk_size, which transformers never overrides


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """transformers' l2norm (FLA's): x * rsqrt(sum(x^2) + eps) over the last axis."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
             ) -> tuple[torch.Tensor, ...]:
    """Both rules' common start: q, k repeated over the value heads they serve, everything
    (B, heads, T, ...) in fp32 (transformers' dtype; float64 stays float64, so that a float64 model
    checks the cached path against the full forward beyond fp32 rounding), q and k L2-normed."""
    key_heads, value_heads = k.shape[2], v.shape[2]
    if key_heads != value_heads:
        q = q.repeat_interleave(value_heads // key_heads, dim=2)
        k = k.repeat_interleave(value_heads // key_heads, dim=2)
    wide = torch.promote_types(q.dtype, torch.float32)
    q, k, v, beta, g = (x.transpose(1, 2).to(wide, memory_format=torch.contiguous_format)
                        for x in (q, k, v, beta, g))
    return l2norm(q), l2norm(k), v, beta, g


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' torch_chunk_gated_delta_rule (with use_qk_l2norm_in_kernel): q, k (B, T, Hk, Dk),
    v (B, T, Hv, Dv), g and beta (B, T, Hv), state (B, Hv, Dk, Dv) or None. Returns the output
    (B, T, Hv, Dv) in q's dtype and the final state in fp32 (float64 for float64 inputs)."""
    dtype = q.dtype
    B, T, _, Dk = k.shape
    Hv, Dv = v.shape[-2:]
    q, k, v, beta, decay = _prepare(q, k, v, g, beta)
    q = q * Dk ** -0.5
    pad = (CHUNK - T % CHUNK) % CHUNK
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, decay = (F.pad(x, (0, pad)) for x in (beta, decay))
    n_chunks = (T + pad) // CHUNK
    v_beta = v * beta.unsqueeze(-1)
    k_beta = k * beta.unsqueeze(-1)
    q, k, k_beta, v_beta = (x.reshape(x.shape[0], x.shape[1], -1, CHUNK, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    decay = decay.reshape(decay.shape[0], decay.shape[1], -1, CHUNK)
    upper = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1)
    cum = decay.cumsum(dim=3)
    pairwise = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, float("-inf")).exp()
    system = (k_beta @ k.transpose(-1, -2)) * pairwise
    intra = (q @ k.transpose(-1, -2)) * pairwise
    decayed_k_beta = k_beta * cum.exp().unsqueeze(-1)
    new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(system, decayed_k_beta, upper=False, unitriangular=True)
    if state is None:
        state = torch.zeros((B, Hv, Dk, Dv), dtype=new_values.dtype, device=new_values.device)
    else:
        state = state.to(new_values)
    out = torch.zeros_like(new_values)
    q = q * cum.exp().unsqueeze(-1)
    k = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]
    for i in range(n_chunks):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ state
        out[:, :, i] = q[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
    out = out.reshape(B, Hv, -1, Dv)[:, :, :T]
    return out.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format), state


def delta_steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor, beta: torch.Tensor,
                state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule token by token, the loop of transformers' torch_recurrent_gated_delta_rule and
    recurrent_kimi_delta_attention: q, k (B, H, T, Dk) normed and q scaled, v (B, H, T, Dv), beta
    (B, H, T), all in the rule's dtype; `decay` the log decay, one per head (B, H, T: gated delta-net)
    or one per key channel (B, H, T, Dk: Kimi delta attention), applied to the state's rows as exp(decay).
    Returns the output (B, H, T, Dv) and the final state (B, H, Dk, Dv)."""
    B, H, T, Dk = k.shape
    if state is None:
        state = torch.zeros((B, H, Dk, v.shape[-1]), dtype=v.dtype, device=v.device)
    else:
        state = state.to(v)
    out = torch.zeros_like(v)
    for i in range(T):
        q_t, k_t, v_t = q[:, :, i], k[:, :, i], v[:, :, i]
        factor = decay[:, :, i].exp()
        state = state * (factor[..., None, None] if factor.dim() == 2 else factor[..., None])
        kv_mem = (state * k_t.unsqueeze(-1)).sum(dim=-2)
        delta = (v_t - kv_mem) * beta[:, :, i].unsqueeze(-1)
        state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        out[:, :, i] = (state * q_t.unsqueeze(-1)).sum(dim=-2)
    return out, state


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                               state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' torch_recurrent_gated_delta_rule (with use_qk_l2norm_in_kernel), token by token;
    the arguments and results of `chunk_gated_delta_rule`."""
    dtype, Dk = q.dtype, k.shape[-1]
    q, k, v, beta, decay = _prepare(q, k, v, g, beta)
    out, state = delta_steps(q / (Dk ** 0.5), k, v, decay, beta, state)
    return out.transpose(1, 2).contiguous().to(dtype), state


class GatedNorm(Norm):
    """The output norm and its gate as one module, as transformers' RMSNormGated is: the RMSNorm over
    each value head, times silu(gate) in fp32, cast back; so its output is the point verify compares
    with transformers' `norm`. With the weight in fp32 (`scale_then_cast`, LaraMini's) the normed
    value is not cast back before the gate: one rounding, at the end."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self.cfg.dtype_order == "scale_then_cast":
            normed = self.weight.float() * self.normalise(x.float(), self.cfg.eps)
        else:
            normed = super().forward(x)
        return (normed * F.silu(gate.to(torch.float32))).to(x.dtype)


class DeltaRuleMixer(StateSpaceMixer):
    """The frame the delta-rule mixers share (the gated delta-net, Kimi delta attention): padding
    zeroed at the input, q | k | v through the causal conv with SiLU over the kept window, the chunked
    rule for a multi-token forward and the recurrent one for one token after a cached state, the
    recurrent state kept. A kind brings its own `project` (x -> q | k | v, the conv's input),
    `split` (the conv's output -> q, k, v as (B, T, heads, dim)), `gates` (x -> g, beta), `output`
    (the rule's output and x -> the layer's output) and its two rules."""

    chunk_rule: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    recurrent_rule: Callable[..., tuple[torch.Tensor, torch.Tensor]]

    def forward(self, x: torch.Tensor, ctx: Context, cache: KVCache | None) -> torch.Tensor:
        T = x.shape[1]
        x = zero_padding(x, padding_mask(ctx, T))
        state = None if cache is None else cache.states[self.layer]
        recurrent = None if state is None else state.get("recurrent")
        qkv = causal_conv(self.project(x).transpose(1, 2), self.conv1d.weight, None, state).transpose(1, 2)
        q, k, v = self.split(qkv)
        g, beta = self.gates(x)
        rule = self.recurrent_rule if recurrent is not None and T == 1 else self.chunk_rule
        out, recurrent = rule(q, k, v, g, beta, recurrent)
        if state is not None:
            state["recurrent"] = recurrent
        return self.output(out, x)


class GatedDeltaNet(DeltaRuleMixer):
    """The gated delta-net mixer; its settings are `mixer_kinds.GatedDeltaNetSettings`."""

    chunk_rule = staticmethod(chunk_gated_delta_rule)
    recurrent_rule = staticmethod(recurrent_gated_delta_rule)

    def __init__(self, cfg: ArchConfig, parts: dict[str, Part], layer: int) -> None:
        super().__init__(cfg, parts, layer)
        self.norm.__class__ = GatedNorm  # the same weight, the gate taken in

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return self.in_proj_qkv(x)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s, (B, T, _) = self.s, qkv.shape
        q, k, v = torch.split(qkv, [s.key_dim, s.key_dim, s.value_dim], dim=-1)
        return (q.reshape(B, T, -1, s.key_head_dim), k.reshape(B, T, -1, s.key_head_dim),
                v.reshape(B, T, -1, s.value_head_dim))

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        beta = self.in_proj_b(x).sigmoid()
        if self.s.neg_eigval:
            beta = beta * 2.0
        return -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias), beta

    def output(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        s, (B, T, _) = self.s, x.shape
        z = self.in_proj_z(x).reshape(-1, s.value_head_dim)
        out = self.norm(out.reshape(-1, s.value_head_dim), z)
        return self.out_proj(out.reshape(B, T, -1))
