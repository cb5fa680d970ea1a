"""Feed-forward sublayer: plain `down(act(up(x)))` or gated `down(act(gate(x)) * up(x))`."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions.normal import Normal

from .activations import ACTIVATIONS, PARAMETRIC
from .config import ArchConfig
from .norms import Norm


class SeparateBias(nn.Linear):
    """A linear layer whose bias is added after the matmul (`x @ W.T + b`), as Falcon's
    FalconLinear does (and gpt-oss's experts: `x @ W + b`); `nn.Linear` fuses the two, which rounds
    once in bf16 instead of twice."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x @ self.weight.T
        return out if self.bias is None else out + self.bias


def gaussian_top_k(g: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Gemma 3n's `_gaussian_topk`: the gate's values above mean + std * icdf_N(0,1)(sparsity) over the width, less
    that cutoff, the rest 0; the icdf in fp32 cast to g's dtype, the statistics (biased std) in g's dtype."""
    multiplier = Normal(0, 1).icdf(torch.tensor(sparsity, dtype=torch.float32, device=g.device)).type(g.dtype)
    cutoff = torch.mean(g, dim=-1, keepdim=True) + torch.std(g, dim=-1, keepdim=True, unbiased=False) * multiplier
    return torch.relu(g - cutoff)


class MLP(nn.Module):
    def __init__(self, cfg: ArchConfig, width: int | None = None, bias: bool | None = None,
                 sparsity: float = 0.0) -> None:
        """`width`: the hidden width when it is not d_ff (an expert's, a shared expert's); `bias`: whether
        its linears have biases when that is not `mlp_bias` (gpt-oss's routed experts); `sparsity`: the
        layer's gate sparsity (ArchConfig.gate_sparsity)."""
        super().__init__()
        d_ff = cfg.d_ff if width is None else width
        bias = cfg.mlp_bias if bias is None else bias
        self.gate = nn.Linear(cfg.d_model, d_ff, bias=bias) if cfg.gated else None
        self.up = nn.Linear(cfg.d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, cfg.d_model, bias=bias)
        self.fused = cfg.mlp_fused
        # BitNet's ffn_sub_norm: the product normalised before `down`
        self.sub_norm = Norm(d_ff, cfg.norm) if cfg.sub_norms else None
        # a plain function, or (xIELU) a module with the layer's own parameters, registered last
        self.act = PARAMETRIC[cfg.activation]() if cfg.activation in PARAMETRIC else ACTIVATIONS[cfg.activation]
        self.glu_fp32 = cfg.glu_fp32  # Beam: act(gate) * up from fp32 copies, cast back
        # muP (Falcon-H1): the gate's projection times one before the activation, the output times the other
        self.gate_multiplier, self.down_multiplier = cfg.mlp_gate_multiplier, cfg.mlp_down_multiplier
        self.sparsity = sparsity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is None:
            h = self.act(self.up(x))
        elif self.fused:  # ArchConfig.mlp_fused (ModernBERT's Wi): the activation on the strided half of one output
            gate, up = torch.cat([self.gate(x), self.up(x)], dim=-1).chunk(2, dim=-1)
            h = self.act(gate) * up
        elif self.glu_fp32:
            gate = self.gate(x)
            h = (self.act(gate.float()) * self.up(x).float()).to(gate.dtype)
        elif self.gate_multiplier != 1.0:
            h = self.act(self.gate(x) * self.gate_multiplier) * self.up(x)
        elif self.sparsity:
            h = self.act(gaussian_top_k(self.gate(x), self.sparsity)) * self.up(x)
        else:
            h = self.act(self.gate(x)) * self.up(x)
        out = self.down(h if self.sub_norm is None else self.sub_norm(h))
        return out if self.down_multiplier == 1.0 else out * self.down_multiplier
