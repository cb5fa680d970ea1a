"""Gemma 3n's decoder features against transformers' own code: the sparse gate (Gemma3nTextMLP._gaussian_topk) bit
for bit in every dtype, the KV cache of a model whose last layers share K/V (inspect's figure counts only the layers
that compute their own), and `lmconvert pull` of a Gemma3nForConditionalGeneration checkpoint as the Hub holds it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from family_specs import IDS, SPECS
from hf_models import build_model, save_checkpoint, token_batch
from hub_server import HubServer
from safetensors.torch import save
from test_pull import hub_env, lmconvert
from transformers import Gemma3nTextConfig
from transformers.models.gemma3n.modeling_gemma3n import Gemma3nTextMLP

import lmconvert as lm
from lmconvert.arch.mlp import gaussian_top_k

SPEC = SPECS["gemma3n_text"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sparsity", [0.95, 0.6, 0.3])
def test_sparse_gate_is_transformers_bit_for_bit(dtype: torch.dtype, sparsity: float) -> None:
    config = Gemma3nTextConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=96,
                               activation_sparsity_pattern=[sparsity])
    gate = torch.randn(2, 28, 96, generator=torch.Generator().manual_seed(0)).to(dtype) * 3
    theirs = Gemma3nTextMLP(config, layer_idx=0)._gaussian_topk(gate)
    ours = gaussian_top_k(gate, sparsity)
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    assert 0 < int((ours != 0).sum()) < gate.numel()  # the cut bites


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_model(SPEC.model_type, **SPEC.kwargs)


def test_kv_cache_holds_only_the_layers_with_their_own_kv(model: torch.nn.Module, tmp_path: Path) -> None:
    """Layers 4 (sliding) and 5 (full) reuse layers 3's and 2's K/V: the cache holds layers 0-3, each 2 KV heads of
    16 for K and V per token, and inspect says so."""
    ours = lm.load(save_checkpoint(model, tmp_path / "hf"))
    cfg = ours.cfg
    assert [cfg.kv_source(i) for i in range(cfg.n_layers)] == [None, None, None, None, 3, 2]
    cache = ours.new_cache()
    with torch.no_grad():
        ours(token_batch(seq=9), cache=cache)
    assert [None if k is None else tuple(k.shape[1:]) for k in cache.keys] == [(2, 9, 16)] * 4 + [None, None]
    assert cfg.kv_cache_bytes_per_token(4) == 4 * 4 * (2 * 2 * 16)
    from click.testing import CliRunner

    from lmconvert.cli import main
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    assert f"KV cache          {4 * 4 * 2 * 2 * 16:,} bytes per token (float32)" in result.output  # fp32


def hub_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text config as google/gemma-3n-E2B's config.json spells it (written by transformers 4.53): RoPE as
    `rope_theta`, `rope_local_base_freq` and a null `rope_scaling`, with the keys transformers 5 no longer reads
    (`query_pre_attn_scalar`, `altup_lr_multiplier`)."""
    text = {k: v for k, v in config.items() if k not in ("rope_parameters", "transformers_version", "architectures",
                                                          "dtype")}
    rope = config["rope_parameters"]
    text.update(rope_theta=rope["full_attention"]["rope_theta"],
                rope_local_base_freq=rope["sliding_attention"]["rope_theta"], rope_scaling=None,
                query_pre_attn_scalar=256, altup_lr_multiplier=1.0, torch_dtype="float32")
    return text


def published_files(model: torch.nn.Module) -> dict[str, bytes]:
    """A tiny Gemma3nForConditionalGeneration as the Hub repos hold it: the text model under
    `model.language_model.` (no lm_head: tied), the KV-shared layers' k_proj, v_proj and k_norm still stored (which
    transformers ignores on loading), and the towers' tensors under `model.vision_tower.timm_model.`,
    `model.audio_tower.`, `model.embed_vision.` and `model.embed_audio.`. (transformers' own wrapper needs timm for
    its vision tower; its text path is Gemma3nForCausalLM's, which gives the reference logits.)"""
    g = torch.Generator().manual_seed(3)
    tensors = {f"model.language_model.{k}": v.contiguous() for k, v in model.model.state_dict().items()}
    for i in (4, 5):
        for part, shape in (("k_proj.weight", (32, 64)), ("v_proj.weight", (32, 64)), ("k_norm.weight", (16,))):
            tensors[f"model.language_model.layers.{i}.self_attn.{part}"] = torch.randn(shape, generator=g)
    for name, shape in (("model.vision_tower.timm_model.conv_stem.conv.weight", (8, 3, 3, 3)),
                        ("model.vision_tower.timm_model.blocks.0.0.conv_exp.weight", (16, 8, 3, 3)),
                        ("model.audio_tower.conformer.0.attention.attn.q_proj.weight", (16, 16)),
                        ("model.audio_tower.subsample_conv_projection.conv_0.conv.weight", (8, 1, 3, 3)),
                        ("model.embed_vision.embedding.weight", (8, 64)),
                        ("model.embed_vision.hard_embedding_norm.weight", (64,)),
                        ("model.embed_audio.embedding.weight", (8, 64)),
                        ("model.embed_audio.embedding_projection.weight", (64, 16))):
        tensors[name] = torch.randn(shape, generator=g)
    config = {"architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n",
              "text_config": hub_text_config(model.config.to_dict()),
              "vision_config": {"model_type": "gemma3n_vision", "architecture": "mobilenetv5_300m_enc",
                                "hidden_size": 2048, "vocab_size": 128, "vocab_offset": 262144},
              "audio_config": {"model_type": "gemma3n_audio", "hidden_size": 1536, "vocab_size": 128,
                               "vocab_offset": 262272},
              "audio_soft_tokens_per_image": 188, "vision_soft_tokens_per_image": 256, "boi_token_id": 255999,
              "eoi_token_id": 262144, "image_token_id": 262145, "boa_token_id": 256000, "eoa_token_id": 262272,
              "audio_token_id": 262273, "eos_token_id": [1, 106], "initializer_range": 0.02,
              "torch_dtype": "float32", "transformers_version": "4.53.0.dev0"}
    return {"config.json": json.dumps(config, indent=2).encode(), "model.safetensors": save(tensors)}


@pytest.mark.slow  # as the other pulls are marked
def test_pull_of_a_gemma3n_checkpoint_in_the_hub_layout(model: torch.nn.Module, tmp_path: Path) -> None:
    """`lmconvert pull` of a Gemma 3n repo: the wrapper read as its text decoder (AltUp, per-layer embeddings,
    LAuReL, sparse gates, KV sharing), the towers and the shared layers' stale K/V tensors left out; its logits are
    transformers'."""
    with torch.no_grad():
        reference = model(IDS).logits
    server = HubServer()
    server.add_repo("google/gemma-3n-tiny", [published_files(model)])
    with server:
        proc = lmconvert("pull", "google/gemma-3n-tiny", "--out", tmp_path / "out",
                         env=hub_env(server.url, tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr
    ours = lm.load(tmp_path / "out", attention="eager")
    assert ours.cfg.altup.n_inputs == 4 and ours.cfg.kv_shared_layers == 2 and ours.cfg.ple.dim == 8
    with torch.no_grad():
        assert float((ours(IDS) - reference).abs().max()) <= 1e-5
