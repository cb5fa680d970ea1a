"""Kimi delta attention (`mixer="kimi_delta"`): Kimi Linear's linear-attention layers (KDA), a gated
delta-net whose decay is per key channel instead of per head (`mixer_kinds.KimiDeltaSettings`).

Numerics follow transformers' torch path op for op (`KimiLinearDeltaAttention`,
`KimiLinearForgetGate`, `chunk_kimi_delta_attention`, `recurrent_kimi_delta_attention`), not the
`fla` / `causal_conv1d` kernels it takes when they are installed. What it shares with the gated
delta-net is shared, not copied: the frame (`gated_deltanet.DeltaRuleMixer`: the padding mask, the
q | k | v causal conv with SiLU over the kept window, which rule runs when, the state kept), the
token-by-token delta rule (`gated_deltanet.delta_steps`, whose decay may be per head or per channel),
the gated RMSNorm with the weight in fp32 (`mamba2.falcon_h1_gated_norm`, here with a sigmoid gate).
What differs is KDA's own and follows its own code:
  - q, k, v from three projections, concatenated, then conved (one depthwise conv over q | k | v);
  - the forget gate: f_b_proj(f_a_proj(x)) plus dt_bias in fp32, per key channel; softplus written as
    `where(g > 20, g, log(1 + exp(g)))`; times -exp(A_log) of its head;
  - beta = sigmoid(b_proj(x)) in the activation dtype;
  - the rule in fp32, q and k L2-normed as x / sqrt(sum(x^2) + 1e-6) (not Qwen's rsqrt), q times
    1 / sqrt(head_dim): chunked (chunks of 64, the intra-chunk system solved by forward substitution
    and every product over the key channels written out as a sum, as transformers does) for a prefill
    or any multi-token forward; token by token for one token after a cached state;
  - the output RMSNorm per head, weight in fp32, times sigmoid(g_b_proj(g_a_proj(x))), cast back, o_proj.
Ling 3 (BailingHybridDeltaAttention) differs by settings only (`mixer_kinds.KimiDeltaSettings`): one
f_proj and one g_proj in place of the low-rank pairs, a forget gate bounded below (or torch's softplus)
cast to the activation dtype (`FORGET_GATES`), and the conv and A_log kept in fp32 (the conv then runs
in fp32, as transformers' causal_conv1d_fn does with an fp32 weight).
The state, in `cache.states[layer]`: "conv", the last conv_kernel inputs of the conv (B, q|k|v,
conv_kernel) in the activation dtype, and "recurrent", (B, heads, head_dim, head_dim) in fp32, as
transformers' cache keeps them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .gated_deltanet import CHUNK, DeltaRuleMixer, delta_steps
from .mamba2 import falcon_h1_gated_norm


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Kimi Linear's l2norm: x / sqrt(sum(x^2) + eps) over the last axis (the gated delta-net's
    multiplies by rsqrt instead, which rounds differently)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _wide(*xs: torch.Tensor) -> list[torch.Tensor]:
    """(B, T, H, ...) -> (B, H, T, ...), in fp32 (float64 stays float64, as in `gated_deltanet._prepare`)."""
    wide = torch.promote_types(xs[0].dtype, torch.float32)
    return [x.transpose(1, 2).contiguous().to(wide) for x in xs]


def chunk_kimi_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                          state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' chunk_kimi_delta_attention (with use_qk_l2norm_in_kernel): q, k, v, g (B, T, H, D),
    beta (B, T, H), state (B, H, D, D) or None. Returns the output (B, T, H, D) in q's dtype and the
    final state in fp32 (float64 for float64 inputs)."""
    dtype = q.dtype
    q, k, v, beta, g = _wide(q, k, v, beta, g)
    q, k = l2norm(q), l2norm(k)
    B, H, T, Dk = k.shape
    scale = 1 / (q.shape[-1] ** 0.5)
    pad = (CHUNK - T % CHUNK) % CHUNK
    q = F.pad(q, (0, 0, 0, pad)) * scale
    k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (k, v, g))
    beta = F.pad(beta, (0, pad))
    v_beta = v * beta.unsqueeze(-1)
    k_beta = k * beta.unsqueeze(-1)
    q, k, v, g, k_beta, v_beta = (x.reshape(B, H, -1, CHUNK, x.shape[-1]) for x in (q, k, v, g, k_beta, v_beta))
    g = g.cumsum(dim=-2)
    ones = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device)
    upper, strict = ones.triu(0), ones.triu(1)
    decay = (g.unsqueeze(-2) - g.unsqueeze(-3)).masked_fill(strict[..., None], float("-inf")).exp().to(q.dtype)
    system = -(k_beta.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(dim=-1).masked_fill(upper, 0)
    for i in range(1, CHUNK):
        row = system[..., i, :i].clone()
        sub = system[..., :i, :i].clone()
        system[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    system = system + torch.eye(CHUNK, dtype=system.dtype, device=system.device)
    v = system @ v_beta
    k_cumdecay = system @ (k_beta * g.exp())
    if state is None:
        state = torch.zeros((B, H, Dk, v.shape[-1]), dtype=v.dtype, device=v.device)
    else:
        state = state.to(v)
    out = torch.zeros_like(v)
    for i in range(v.shape[2]):
        q_i, k_i, v_i, g_i = q[:, :, i], k[:, :, i], v[:, :, i], g[:, :, i]
        inter = (q_i * g_i.exp()) @ state
        intra = (q_i.unsqueeze(-2) * k_i.unsqueeze(-3) * decay[:, :, i]).sum(dim=-1).masked_fill(strict, 0)
        v_new = v_i - k_cumdecay[:, :, i] @ state
        out[:, :, i] = inter + intra @ v_new
        state = (state * g_i[:, :, -1].exp().unsqueeze(-1)
                 + (k_i * (g_i[:, :, -1:] - g_i).exp()).transpose(-1, -2) @ v_new)
    out = out.reshape(B, H, -1, out.shape[-1])[:, :, :T]
    return out.transpose(1, 2).contiguous().to(dtype), state


def recurrent_kimi_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                              state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' recurrent_kimi_delta_attention (with use_qk_l2norm_in_kernel), token by token;
    the arguments and results of `chunk_kimi_delta_rule`."""
    dtype = q.dtype
    q, k, v, beta, g = _wide(q, k, v, beta, g)
    q, k = l2norm(q), l2norm(k)
    out, state = delta_steps(q * (1 / (q.shape[-1] ** 0.5)), k, v, g, beta, state)
    return out.transpose(1, 2).contiguous().to(dtype), state


FORGET_GATES = {  # (g + dt_bias in fp32, exp(A_log) per head, the lower bound, the activation dtype) -> decay
    # KimiLinearForgetGate: softplus written out, the decay left in fp32
    "softplus": lambda g, rate, _bound, _dtype: -rate * torch.where(g > 20.0, g, torch.log(1.0 + torch.exp(g))),
    # BailingHybridForgetGate, kda_safe_gate: bounded below, cast to the activation dtype
    "bounded": lambda g, rate, bound, dtype: (bound * torch.sigmoid(rate * g)).to(dtype),
    # BailingHybridForgetGate without it: torch's softplus, cast
    "softplus_cast": lambda g, rate, _bound, dtype: (-rate * F.softplus(g)).to(dtype),
}


class KimiDeltaAttention(DeltaRuleMixer):
    """Kimi delta attention; its settings are `mixer_kinds.KimiDeltaSettings`."""

    chunk_rule = staticmethod(chunk_kimi_delta_rule)
    recurrent_rule = staticmethod(recurrent_kimi_delta_rule)

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        # transformers keeps them fp32 (_keep_in_fp32_modules_strict): Kimi dt_bias; Ling also A_log and the conv
        self.forget_gate.fp32_parameters = ("dt_bias",) if self.s.fp32_kept == "dt_bias" else ("dt_bias", "A_log")
        if self.s.fp32_kept != "dt_bias":
            self.conv1d.fp32_parameters = ("weight",)
        # holders of parameters read by `gates` and `output`, never called: no output to compare (verify)
        self.forget_gate.uncalled = self.o_norm.uncalled = True

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s, (B, T, _) = self.s, qkv.shape
        return tuple(t.reshape(B, T, s.heads, s.head_dim) for t in torch.split(qkv, [s.dim] * 3, dim=-1))

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The forget gate (per key channel, in fp32; `settings.forget_gate`) and beta."""
        s, f, (B, T, _) = self.s, self.forget_gate, x.shape
        low_rank = s.gate_projections == "low_rank"
        g = (f.f_b_proj(f.f_a_proj(x)) if low_rank else f.f_proj(x)).float()
        g = (g + f.dt_bias.float().view(1, 1, -1)).view(B, T, s.heads, s.head_dim)
        rate = f.A_log.float().exp().view(1, 1, -1, 1)
        return FORGET_GATES[s.forget_gate](g, rate, s.gate_lower_bound, x.dtype), torch.sigmoid(self.b_proj(x))

    def output(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """KimiLinearRMSNormGated per head (weight in fp32, sigmoid gate), o_proj."""
        s, (B, T, _) = self.s, x.shape
        gate = self.g_b_proj(self.g_a_proj(x)) if s.gate_projections == "low_rank" else self.g_proj(x)
        out = falcon_h1_gated_norm(out.reshape(B, T * s.heads, s.head_dim), gate.reshape(B, T * s.heads, s.head_dim),
                                   self.o_norm.weight, 1, s.norm_eps, True, torch.sigmoid)
        return self.o_proj(out.reshape(B, T, -1))
