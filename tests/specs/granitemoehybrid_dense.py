"""The granitemoehybrid_dense test model (see tests/specs/__init__.py): a dense Granite 4 (num_local_experts 0, no
top-k: Granite-4.0-H-Micro's layout), the shared MLP alone each layer's FFN (96 wide, as intermediate_size, which
sizes nothing there); otherwise granitemoehybrid's spec model: layer 2 attending with RoPE, the others Mamba2."""

from __future__ import annotations

from specs import Spec
from specs.granitemoehybrid import MIXER, A, L

SPEC = Spec(  # bf16: see granitemoeshared
    "granitemoehybrid",
    kwargs=dict(MIXER, num_local_experts=0, num_experts_per_tok=0, shared_intermediate_size=96,
                embedding_multiplier=12.0, attention_multiplier=0.0625, residual_multiplier=0.22, logits_scaling=8.0,
                num_hidden_layers=4, layer_types=[L, L, A, L], position_embedding_type="rope", mamba_proj_bias=True,
                attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
    old_style={"rope_theta": 1e4}, family="granitemoehybrid",
    card=("mixer: Mamba2 (SSD), 8 heads x 16, 2 group(s), state 16, conv 4, chunk 8", "FFN: SwiGLU, d_ff 96",
          "gate and up as one fused output", "residual scale: 0.22", "layer pattern: MF MF AF MF"),
    not_on_card=("mixture of experts",),
    tp_refusal="the mamba2 mixer layers have no tensor-parallel plan",
)
