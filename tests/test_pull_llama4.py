"""`lmconvert pull --verify` of a Llama 4 repo laid out as meta-llama/Llama-4-Scout-17B-16E-Instruct is
(#26): the Llama4ForConditionalGeneration wrapper's config.json with the Hub's keys (text_config and
vision_config, the legacy `rope_scaling`, `no_rope_layers: []`), its tensors under the Hub's names
(`language_model.model.layers.N...`, `language_model.lm_head.weight`, the experts fused and transposed as
`feed_forward.experts.gate_up_proj` / `down_proj`, the vision model and projector beside them) in bfloat16
shards with their index, served by tests/hub_server.py; every size shrunk, every key kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from hf_models import perturb, save_tiny_tokenizer
from safetensors.torch import load_file, save_file

LAYERS = 4
# Llama-4-Scout-17B-16E-Instruct's text_config, its sizes shrunk: chunks of 8 positions and llama3 RoPE scaling
# from 8 original positions so both bite on the verified sequence
SCOUT_TEXT: dict[str, Any] = {
    "attention_bias": False, "attention_chunk_size": 8, "attention_dropout": 0.0, "attn_scale": 0.1,
    "attn_temperature_tuning": True, "bos_token_id": 1, "eos_token_id": [2, 3, 4], "floor_scale": 8,
    "for_llm_compressor": False, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
    "interleave_moe_layer_step": 1, "intermediate_size": 32, "intermediate_size_mlp": 48,
    "max_position_embeddings": 1024, "model_type": "llama4_text", "no_rope_layers": [], "num_attention_heads": 4,
    "num_experts_per_tok": 1, "num_hidden_layers": LAYERS, "num_key_value_heads": 2, "num_local_experts": 4,
    "output_router_logits": False, "pad_token_id": 0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8, "rope_type": "llama3"},
    "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "torch_dtype": "bfloat16",
    "use_cache": True, "use_qk_norm": True, "vocab_size": None,
}
SCOUT_VISION: dict[str, Any] = {
    "attention_dropout": 0.0, "hidden_act": "gelu", "hidden_size": 16, "image_size": 28, "initializer_range": 0.02,
    "intermediate_size": 32, "model_type": "llama4_vision_model", "multi_modal_projector_bias": False,
    "norm_eps": 1e-05, "num_attention_heads": 2, "num_channels": 3, "num_hidden_layers": 1, "patch_size": 14,
    "pixel_shuffle_ratio": 0.5, "projector_dropout": 0.0, "projector_input_dim": 16, "projector_output_dim": 16,
    "rope_theta": 10000, "vision_feature_layer": -1, "vision_feature_select_strategy": "default",
    "vision_output_dim": 16,
}


def scout_config(vocab: int) -> dict[str, Any]:
    return {"architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": vocab - 3,
            "eoi_token_index": vocab - 2, "image_token_index": vocab - 1, "model_type": "llama4",
            "text_config": {**SCOUT_TEXT, "vocab_size": vocab}, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "4.51.0.dev0", "vision_config": SCOUT_VISION}


def published_repo(root: Path) -> dict[str, bytes]:
    """The tiny Scout repo's files: the model's tensors in three bfloat16 shards numbered as the Hub's
    (`model-00001-of-00003.safetensors` ...), their index, config.json and a tokenizer."""
    from test_pull import files_of

    vocab = save_tiny_tokenizer(root / "tokenizer")
    config = scout_config(vocab)
    torch.manual_seed(0)
    model = transformers.Llama4ForConditionalGeneration._from_config(transformers.Llama4Config(**config))
    perturb(model)
    tensors = {n: t.detach().to(torch.bfloat16).contiguous() for n, t in model.state_dict().items()}
    layer = "language_model.model.layers.0.feed_forward."
    assert tensors[f"{layer}experts.gate_up_proj"].shape == (4, 64, 64)  # [experts, hidden, 2 * width] as stored
    assert tensors[f"{layer}experts.down_proj"].shape == (4, 32, 64)
    assert {f"{layer}router.weight", "language_model.lm_head.weight", "language_model.model.norm.weight",
            "multi_modal_projector.linear_1.weight", "vision_model.class_embedding"} <= set(tensors)
    groups = [lambda n: not n.startswith("language_model.model.layers."),
              lambda n: n.startswith(("language_model.model.layers.0.", "language_model.model.layers.1.")),
              lambda n: n.startswith(("language_model.model.layers.2.", "language_model.model.layers.3."))]
    names = [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    (root / "repo").mkdir()
    weight_map = {}
    for name, keep in zip(names, groups, strict=True):
        shard = {n: t for n, t in tensors.items() if keep(n)}
        save_file(shard, root / "repo" / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    assert set(weight_map) == set(tensors)
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": dict(sorted(weight_map.items()))}
    (root / "repo" / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (root / "repo" / "config.json").write_text(json.dumps(config, indent=2))
    return {**files_of(root / "repo"), **files_of(root / "tokenizer")}


@pytest.mark.slow
def test_pull_a_repo_in_llama4_scout_published_layout(tmp_path: Path) -> None:
    """`lmconvert pull --verify` passes against transformers' Llama4ForConditionalGeneration loading the
    snapshot, keeps the text decoder's every tensor bit for bit (the experts unfused and transposed back
    exactly) and records the vision model and projector as dropped."""
    from test_pull import pull_verified

    meta = pull_verified("meta-llama/Llama-4-Scout-tiny", published_repo(tmp_path), tmp_path)
    hub = {n: t for f in sorted((tmp_path / "repo").glob("*.safetensors")) for n, t in load_file(f).items()}
    assert meta["family"] == "llama4_text" and meta["source"]["model_type"] == "llama4"
    assert meta["source"]["dropped_tensors"] == sorted(n for n in hub if not n.startswith("language_model."))
    assert meta["arch"]["chunked_layers"] == [0, 1, 2]  # `no_rope_layers: []`: every 4th layer NoPE, unchunked
    ours = load_file(tmp_path / "out" / "model.safetensors")
    fused = hub["language_model.model.layers.2.feed_forward.experts.gate_up_proj"]
    assert torch.equal(ours["layers.2.mlp.experts.3.gate.weight"], fused[3, :, :32].T)
    assert torch.equal(ours["layers.2.mlp.experts.3.up.weight"], fused[3, :, 32:].T)
    assert torch.equal(ours["layers.2.mlp.experts.1.down.weight"],
                       hub["language_model.model.layers.2.feed_forward.experts.down_proj"][1].T)
    assert torch.equal(ours["lm_head.weight"], hub["language_model.lm_head.weight"])
