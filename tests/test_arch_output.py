"""Output side and training: tied head, embedding scale in the weight dtype, final soft-cap, logit
scale, dropout, the loss (transformers' convention) with z-loss; plus state_dict hygiene and the
meta-device build the loader uses."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from arch_helpers import build, max_diff, tiny, tokens, variant
from transformers.loss.loss_utils import ForCausalLMLoss

from lmconvert.arch import Decoder, RopeConfig
from lmconvert.arch.describe import variants

# ----------------------------------------------------------------------------- tied embeddings


def test_tied_embeddings_have_no_head_and_use_the_embedding():
    tied = build(tiny(tie_embeddings=True))
    assert tied.lm_head is None and not any(k.startswith("lm_head") for k in tied.state_dict())
    untied = variant_untied(tied)
    ids = tokens()
    with torch.no_grad():
        torch.testing.assert_close(tied(ids), untied(ids), rtol=0, atol=0)
        # a vocabulary row that is never an input still moves its logit: the head reads embed.weight
        unused = sorted(set(range(64)) - set(ids.flatten().tolist()))[0]
        before = tied(ids)
        tied.embed.weight[unused].add_(1.0)
        after = tied(ids)
    assert max_diff(after[..., unused], before[..., unused]) > 1e-3
    others = [v for v in range(64) if v != unused]
    assert torch.equal(after[..., others], before[..., others])


def test_a_tied_head_with_a_bias_is_ctrls_linear():
    """CTRL's head: nn.Linear(bias=True) whose weight is the embedding; the bias is its own parameter."""
    model = build(tiny(tie_embeddings=True, lm_head_bias=True))
    assert [k for k in model.state_dict() if k.startswith("lm_head")] == ["lm_head.bias"]
    with torch.no_grad():
        model.lm_head.bias.normal_()
        h = torch.randn(2, 5, model.cfg.d_model)
        linear = torch.nn.Linear(model.cfg.d_model, model.cfg.vocab_size)
        linear.weight, linear.bias = model.embed.weight, model.lm_head.bias
        assert torch.equal(model.logits(h), linear(model.final_norm(h)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.bitexact
def test_head_transform_is_modernberts_prediction_head_bit_for_bit(dtype):
    from transformers import ModernBertDecoderConfig
    from transformers.models.modernbert_decoder.modeling_modernbert_decoder import ModernBertDecoderPredictionHead

    from lmconvert.arch import NormConfig
    from lmconvert.arch.decoder import HeadTransform

    config = ModernBertDecoderConfig(hidden_size=32, classifier_bias=True, norm_bias=True, norm_eps=1e-5)
    theirs = ModernBertDecoderPredictionHead(config)
    ours = HeadTransform(tiny(d_model=32, head_transform="gelu", head_transform_bias=True,
                              norm=NormConfig(kind="layer", bias=True, eps=1e-5, dtype_order="scale_then_cast")))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
        ours.load_state_dict(theirs.state_dict())
        theirs.to(dtype)
        ours.to(dtype)
        h = torch.randn(2, 7, 32, dtype=dtype)
        assert torch.equal(ours(h), theirs(h))


def variant_untied(tied: Decoder) -> Decoder:
    untied = Decoder(tiny(tie_embeddings=False))
    state = dict(tied.state_dict())
    state["lm_head.weight"] = tied.embed.weight.detach().clone()
    untied.load_state_dict(state, strict=True)
    return untied.eval()


# ----------------------------------------------------------------------------- embedding scale


def test_embed_scale_is_rounded_to_the_weight_dtype():
    """Gemma multiplies by sqrt(d_model) cast to the weight dtype: sqrt(3072) = 55.43 is 55.5 in bf16."""
    model = build(tiny(embed_scale=math.sqrt(3072)), dtype=torch.bfloat16)
    ids = tokens()
    positions = torch.arange(ids.shape[1])
    with torch.no_grad():
        h = model.embed_tokens(ids, positions)
        raw = model.embed(ids)
    assert h.dtype == torch.bfloat16
    assert torch.equal(h, raw * torch.tensor(55.5, dtype=torch.bfloat16))
    assert torch.equal(h, (raw.float() * 55.5).bfloat16())
    assert not torch.equal(h, (raw.float() * math.sqrt(3072)).bfloat16())  # the rounding is visible
    fp32 = build(tiny(embed_scale=math.sqrt(3072)))
    with torch.no_grad():
        torch.testing.assert_close(fp32.embed_tokens(ids, positions), fp32.embed(ids) * math.sqrt(3072),
                                   rtol=1e-7, atol=0)


def test_embed_scale_at_real_width():
    """The same check on a d_model=3072 decoder built on the meta device (only the embedding is real)."""
    with torch.device("meta"):
        model = Decoder(tiny(d_model=3072, n_heads=4, d_ff=8, n_layers=1, vocab_size=8, embed_scale=math.sqrt(3072)))
    model.embed = torch.nn.Embedding(8, 3072, dtype=torch.bfloat16)
    ids = torch.arange(8)[None]
    with torch.no_grad():
        h = model.embed_tokens(ids, torch.arange(8))
        assert torch.equal(h, model.embed.weight[None] * torch.tensor(55.5, dtype=torch.bfloat16))


# ----------------------------------------------------------------------------- soft-cap and scale


def test_final_softcap_bounds_and_equals_tanh_of_uncapped():
    cap = 2.0
    model = build(tiny(final_softcap=cap))
    ids = tokens()
    with torch.no_grad():
        capped = model(ids)
        raw = variant(model, final_softcap=None)(ids)
    assert capped.abs().max() < cap and raw.abs().max() > cap
    torch.testing.assert_close(capped, torch.tanh(raw / cap) * cap, rtol=1e-6, atol=1e-6)


def test_logit_scale_multiplies_logits():
    model = build(tiny(logit_scale=0.125))
    ids = tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), 0.125 * variant(model, logit_scale=1.0)(ids), rtol=1e-6, atol=1e-6)


def test_logit_scale_applies_before_the_softcap():
    model = build(tiny(logit_scale=4.0, final_softcap=3.0))
    ids = tokens()
    with torch.no_grad():
        raw = variant(model, logit_scale=1.0, final_softcap=None)(ids)
        torch.testing.assert_close(model(ids), torch.tanh(4.0 * raw / 3.0) * 3.0, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- dropout


def test_dropout_is_off_by_default():
    model = build(tiny())
    ids = tokens()
    model.train()
    train = model(ids)
    model.eval()
    assert torch.equal(train, model(ids))


@pytest.mark.parametrize("field", ["embed_dropout", "attn_dropout", "resid_dropout"])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_each_dropout_acts_in_training_only(field, backend):
    model = build(tiny(**{field: 0.3})).set_attention(backend)
    ids = tokens()
    with torch.no_grad():
        evaluated = model(ids)
        torch.testing.assert_close(evaluated, variant(model, **{field: 0.0})(ids), rtol=0, atol=0)
        model.train()
        torch.manual_seed(0)
        a = model(ids)
        torch.manual_seed(1)
        b = model(ids)
    assert max_diff(a, evaluated) > 1e-3 and max_diff(a, b) > 1e-3


@pytest.mark.parametrize("kept", ["attn", "mlp"])
def test_residual_dropout_acts_on_each_sublayer(kept):
    model = build(tiny(resid_dropout=0.3))
    with torch.no_grad():
        for layer in model.layers:  # silence the other sublayer: only `kept` can carry dropout noise
            (layer.mlp.down if kept == "attn" else layer.attn.o).weight.zero_()
        ids = tokens()
        evaluated = model(ids)
        model.train()
        torch.manual_seed(0)
        assert max_diff(model(ids), evaluated) > 1e-3


# ----------------------------------------------------------------------------- loss


def _labels(ids):
    labels = ids.clone()
    labels[0, :5] = -100
    labels[1, -3:] = -100
    return labels


def test_loss_matches_transformers_convention():
    model = build(tiny())
    ids = tokens()
    labels = _labels(ids)
    with torch.no_grad():
        logits, loss = model(ids, labels=labels)
    reference = ForCausalLMLoss(logits, labels, vocab_size=64)
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=1e-6)
    # independent: mean over the kept targets of -log p(labels[t+1] | ..t)
    logp = torch.log_softmax(logits[:, :-1].double(), -1)
    target = labels[:, 1:]
    keep = target != -100
    nll = -logp.gather(-1, target.clamp(min=0)[..., None])[..., 0]
    torch.testing.assert_close(loss.double(), nll[keep].mean(), rtol=1e-6, atol=1e-6)
    assert keep.sum() < target.numel()  # the -100s were really there


def test_z_loss_adds_alpha_mean_logsumexp_squared():
    alpha = 1e-2
    model = build(tiny(z_loss=alpha))
    ids = tokens()
    labels = _labels(ids)
    with torch.no_grad():
        logits, loss = model(ids, labels=labels)
        _, plain = variant(model, z_loss=0.0)(ids, labels=labels)
    flat, target = logits[:, :-1].reshape(-1, 64), labels[:, 1:].reshape(-1)
    keep = target != -100
    expected = F.cross_entropy(flat, target) + alpha * (torch.logsumexp(flat[keep], -1) ** 2).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(plain, F.cross_entropy(flat, target), rtol=1e-6, atol=1e-6)
    assert loss - plain > 1e-4


def test_loss_gradient_reaches_every_parameter():
    model = build(tiny(q_bias=True, layer_positions=("relative", "rope")))
    model.train()
    ids = tokens()
    _, loss = model(ids, labels=ids)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


# ----------------------------------------------------------------------------- state_dict and meta build


RICH = dict(n_layers=3, layer_positions=("relative", "relative", "alibi"), absolute_positions="learned",
            qk_norm="head", q_bias=True, lm_head_bias=True, norm_placement="sandwich")


def test_state_dict_lists_each_tensor_once():
    model = build(tiny(**RICH))
    state = model.state_dict()
    assert len(state) == len(dict(model.named_parameters()))
    pointers = [t.data_ptr() for t in state.values()]
    assert len(set(pointers)) == len(pointers)
    assert "rel_bias.weight" in state


def test_meta_build_then_assign_equals_eager_build():
    """The loader builds on the meta device and assigns tensors: RoPE tables must still be real."""
    cfg = tiny(**RICH, rope=RopeConfig(scaling="yarn", factor=4.0, original_max_positions=8))
    model = build(cfg)
    with torch.device("meta"):
        meta = Decoder(cfg)
    meta.load_state_dict(model.state_dict(), strict=True, assign=True)
    ids = tokens()
    with torch.no_grad():
        assert torch.equal(meta.eval()(ids), model(ids))


def test_variant_card_names_what_it_sees():
    lines = "\n".join(variants(tiny(n_heads=4, n_kv_heads=2, gated=True, activation="gelu_tanh",
                                    layer_kinds=("local", "global"), sliding_window=4, attn_softcap=5.0)))
    assert "GQA (2 q heads per kv head)" in lines and "GeGLU (tanh)" in lines
    assert "sliding window 4 on local layers; pattern LG" in lines and "attention soft-cap: 5" in lines
    assert "MQA" in "\n".join(variants(tiny(n_kv_heads=1))) and "ReLU" in "\n".join(variants(tiny(
        activation="relu", gated=False)))


# ----------------------------------------------------------------------------- memory held by a forward pass


def test_a_forward_pass_holds_only_the_current_hidden_state():
    """Without autograd, a block's output is freed once the next block has used it (holding every
    layer's output would cost n_layers x batch x seq x d_model, and fresh pages for each block)."""
    import weakref

    model = build(tiny(n_layers=4))
    outputs: list[weakref.ref] = []
    alive_at_start: list[int] = []

    def before(block, args):
        alive_at_start.append(sum(ref() is not None for ref in outputs))

    def after(block, args, out):
        outputs.append(weakref.ref(out))

    for block in model.layers:
        block.register_forward_pre_hook(before)
        block.register_forward_hook(after)
    with torch.no_grad():
        logits = model(tokens())
    # each block starts with at most its own input (the previous block's output) alive
    assert alive_at_start == [0, 1, 1, 1]
    assert len(model.hidden_states(tokens())) == 5 and logits.shape[-1] == 64
