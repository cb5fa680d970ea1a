"""Feed-forward sublayer: plain `down(act(up(x)))` or gated `down(act(gate(x)) * up(x))`."""

from __future__ import annotations

import torch
from torch import nn

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


class MLP(nn.Module):
    def __init__(self, cfg: ArchConfig, width: int | None = None, bias: bool | None = None) -> None:
        """`width`: the hidden width when it is not d_ff (an expert's, a shared expert's); `bias`: whether
        its linears have biases when that is not `mlp_bias` (gpt-oss's routed experts)."""
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
        else:
            h = self.act(self.gate(x)) * self.up(x)
        out = self.down(h if self.sub_norm is None else self.sub_norm(h))
        return out if self.down_multiplier == 1.0 else out * self.down_multiplier
