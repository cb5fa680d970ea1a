"""The gated delta-net families (every spec whose model has `mixer="gated_deltanet"`: Qwen3-Next,
Qwen3.5, Qwen3.5-MoE, OLMo-hybrid, LaraMini) on sequences past the delta rule's chunk of 64 and the conv
width, which the shared family tests' 28 tokens do not reach: the spec's tiny perturbed model run
by transformers on 150 tokens (three chunks, the last partial), fp32 logits within 1e-5 from the
HF directory and through a canonical one, bf16 logits equal bit for bit where the spec says so, and
cached decoding (a prefill of 100 tokens, two chunks and a part, then 50 tokens one at a time, the
recurrent rule) equal to transformers' own cached decoding within 1e-5, and in float64 to our full
forward (the chunked and recurrent rules round apart by ~1.5e-5 in fp32, transformers' own too)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from family_specs import FP32_TOL, SPECS
from hf_models import build_model, check_cached_decoding, check_parity, load_reference, save_checkpoint, token_batch
from transformers import AutoConfig, AutoModelForCausalLM

import lmconvert
from lmconvert.mappings import family_for

SEQ, PREFILL = 150, 100
IDS = token_batch(seq=SEQ)
LONG = dict(max_position_embeddings=256)


def _is_gated_deltanet(name: str) -> bool:
    spec = SPECS[name]
    config = AutoConfig.for_model(spec.model_type, **{**dict(vocab_size=128, hidden_size=64, intermediate_size=96,
                                                                num_attention_heads=4, num_key_value_heads=2),
                                                      **spec.kwargs})
    return family_for(spec.model_type).arch_config(config.to_dict()).mixer == "gated_deltanet"


NAMES = [name for name in SPECS if _is_gated_deltanet(name)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    made: dict[tuple[str, torch.dtype], Path] = {}

    def get(name: str, dtype: torch.dtype = torch.float32) -> Path:
        if (name, dtype) not in made:
            spec = SPECS[name]
            directory = tmp_path_factory.mktemp(f"{name}-long-{str(dtype).removeprefix('torch.')}")
            made[name, dtype] = save_checkpoint(build_model(spec.model_type, **{**spec.kwargs, **LONG}), directory,
                                                dtype)
        return made[name, dtype]

    return get


def test_the_gated_deltanet_families_are_found() -> None:
    assert {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "lara_mini"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_fp32_parity_over_three_chunks(name: str, checkpoint, tmp_path: Path) -> None:  # noqa: ANN001
    check_parity(checkpoint(name), IDS, tmp_path, "eager", FP32_TOL)


@pytest.mark.parametrize("name", NAMES)
def test_bf16_over_three_chunks_is_transformers_bit_for_bit(name: str, checkpoint) -> None:  # noqa: ANN001
    src = checkpoint(name, torch.bfloat16)
    with torch.no_grad():
        theirs = load_reference(src, torch.bfloat16)(IDS).logits
        ours = lmconvert.load(src, dtype=torch.bfloat16, attention="eager")(IDS)
    assert torch.equal(ours, theirs) is SPECS[name].bf16_exact


@pytest.mark.slow  # 1.2-1.9 s each: 150 tokens, then 50 steps
@pytest.mark.parametrize("name", NAMES)
def test_cached_decoding_past_the_chunks_equals_full_forward(name: str, checkpoint) -> None:  # noqa: ANN001
    check_cached_decoding(checkpoint(name), IDS, PREFILL, "eager", "eager", FP32_TOL)


def test_the_prefill_crosses_chunks_and_decoding_runs_the_recurrent_rule(checkpoint,  # noqa: ANN001
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """What the tests above rely on: transformers' model, on these lengths, runs its chunked rule over
    more than one chunk in the prefill, and its recurrent rule one token at a time after it."""
    from hf_models import cached_logits
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    calls: list[tuple[str, int]] = []
    for rule, fn in (("chunk", m.torch_chunk_gated_delta_rule), ("recurrent", m.torch_recurrent_gated_delta_rule)):
        def counted(q, *args, rule=rule, fn=fn, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            calls.append((rule, q.shape[1]))
            return fn(q, *args, **kwargs)
        monkeypatch.setattr(m, f"torch_{rule}_gated_delta_rule", counted)
    model = AutoModelForCausalLM.from_pretrained(checkpoint("qwen3_next"), attn_implementation="eager").eval()
    cached_logits(model, IDS[:, :PREFILL + 2], PREFILL)
    assert calls[0] == ("chunk", PREFILL) and PREFILL > 64
    assert calls[-1] == ("recurrent", 1)


def test_mixer_norm_placement_sets_the_mixer_layers_slots_and_is_refused_where_it_cannot_apply() -> None:
    """OLMo-hybrid's one per-layer difference: its gated delta-net layers pre-norm, its attention
    layers normalising each sublayer's output; both sequential, so one wiring, the slots per layer."""
    from lmconvert.arch import ArchConfig
    from lmconvert.arch.errors import ConfigError
    from lmconvert.arch.shapes import norm_slots

    base = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=48, mixer="gated_deltanet",
                mixer_settings=dict(key_heads=2, value_heads=4, key_head_dim=8, value_head_dim=8),
                layer_mixers=("mixer", "attention"), norm_placement="output")
    cfg = ArchConfig(**base, mixer_norm_placement="pre")
    assert norm_slots(cfg, 0) == ("attn_norm", "mlp_norm")
    assert norm_slots(cfg, 1) == ("attn_post_norm", "mlp_post_norm")
    assert ArchConfig(**base, mixer_norm_placement="output").mixer_norm_placement is None  # one spelling
    with pytest.raises(ConfigError, match="mixer_norm_placement='post': must be one of pre, sandwich, output"):
        ArchConfig(**base, mixer_norm_placement="post")
    with pytest.raises(ConfigError, match="mixer_norm_placement='pre': differs from norm_placement"):
        ArchConfig(**{**base, "norm_placement": "post", "final_norm": False}, mixer_norm_placement="pre")
    with pytest.raises(ConfigError, match="mixer_norm_placement='pre': places the mixer layers' norms; set mixer"):
        ArchConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=48, norm_placement="output",
                   mixer_norm_placement="pre")
