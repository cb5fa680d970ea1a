"""The decoder variants added for HunYuan, nanochat, Apertus and BitNet, each against transformers' own
module: xIELU (XIELUActivation), the reversed rotation (nanochat's apply_rotary_pos_emb), and the QK norm
after RoPE, the sub-norms and the narrower LM head inside a whole Decoder."""

from __future__ import annotations

import pytest
import torch
from transformers.activations import XIELUActivation
from transformers.models.nanochat import modeling_nanochat

from lmconvert.arch import ArchConfig, Decoder
from lmconvert.arch.activations import XIELU
from lmconvert.arch.rope import apply_rotary


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_xielu_is_transformers_bit_for_bit(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    theirs, ours = XIELUActivation(dtype=torch.float32), XIELU()
    with torch.no_grad():  # learned values away from the init, beta and eps as a checkpoint may hold them
        for name, value in (("alpha_p", torch.tensor([0.37])), ("alpha_n", torch.tensor([-1.3])),
                            ("beta", torch.tensor(0.45)), ("eps", torch.tensor(-2e-3))):
            getattr(theirs, name).copy_(value)
            getattr(ours, name).copy_(value)
    theirs, ours = theirs.to(dtype), ours.to(dtype)
    x = torch.cat([torch.randn(4096) * 3, torch.tensor([0.0, -1e-3, -3e-3, 1e-7, -1e-7])]).to(dtype)
    assert torch.equal(ours(x), theirs._xielu_python(x))
    assert torch.equal(ours(x), theirs(x))
    assert not torch.equal(ours(x), torch.nn.functional.relu(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reversed_rotation_is_nanochats(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    q, k = torch.randn(2, 3, 5, 8, dtype=dtype), torch.randn(2, 3, 5, 8, dtype=dtype)
    angles = torch.randn(2, 5, 4)
    emb = torch.cat([angles, angles], -1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    q_theirs, k_theirs = modeling_nanochat.apply_rotary_pos_emb(q, k, cos, sin)
    cos, sin = cos[:, None], sin[:, None]
    assert torch.equal(apply_rotary(q, cos, sin, "half", reverse=True), q_theirs)
    assert torch.equal(apply_rotary(k, cos, sin, "half", reverse=True), k_theirs)
    assert not torch.equal(apply_rotary(q, cos, sin, "half"), q_theirs)


TINY = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_positions=64)


def _logits(cfg: ArchConfig, seed: int = 0) -> tuple[Decoder, torch.Tensor]:
    torch.manual_seed(seed)
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
        return model, model(torch.randint(0, 64, (2, 12)))


def test_each_variant_changes_the_function() -> None:
    """Each flag reaches the forward: switching it off (same weights where it has none) changes the logits."""
    base = ArchConfig(**TINY, qk_norm="head")
    model, after = _logits(ArchConfig(**TINY, qk_norm="head", qk_norm_after_rope=True))
    before = Decoder(base).eval()
    before.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(before(torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))),
                                  model(torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))))
    narrow, logits = _logits(ArchConfig(**TINY, output_vocab=50))
    assert logits.shape[-1] == 50 and narrow.lm_head.weight.shape == (50, 32)
    subbed, _ = _logits(ArchConfig(**TINY, sub_norms=True))
    assert subbed.layers[0].attn.sub_norm.weight.shape == (32,) and subbed.layers[0].mlp.sub_norm.weight.shape == (48,)
