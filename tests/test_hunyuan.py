"""HunYuan's NTK-alpha RoPE: transformers' static base, and llama.cpp's converter's spelling of it
(the base as rope.freq_base, no scaling) on the way to GGUF and back."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from family_specs import SPECS
from hf_models import build_model, token_batch
from test_export_gguf import canonical_of, exported

import lmconvert
from lmconvert.arch.rope import Rotary
from lmconvert.mappings import MappingError


def test_ntk_alpha_frequencies_are_transformers_own() -> None:
    spec = SPECS["hunyuan_v1_dense"]
    model = build_model("hunyuan_v1_dense", **spec.kwargs)
    theirs = model.model.rotary_emb
    assert theirs.rope_type == "ntk_alpha"  # the "dynamic" + alpha spelling, as transformers reads it
    cfg = lmconvert.mappings.family_named("hunyuan_v1_dense").arch_config(model.config.to_dict())
    assert cfg.rope.scaling == "ntk_alpha" and cfg.rope.alpha == 1000.0
    ours = Rotary(cfg.rope, cfg.head_dim, cfg.max_positions)
    assert torch.equal(ours.inv_freq, theirs.inv_freq)
    plain = Rotary(type(cfg.rope)(theta=cfg.rope.theta), cfg.head_dim, cfg.max_positions)
    assert not torch.equal(plain.inv_freq, theirs.inv_freq)  # alpha bites


def test_ntk_alpha_goes_to_gguf_as_its_static_base(tmp_path: Path) -> None:
    spec = SPECS["hunyuan_v1_dense"]
    canonical = canonical_of(build_model("hunyuan_v1_dense", **{**spec.kwargs, "attention_bias": False}), tmp_path)
    out = exported(canonical, tmp_path / "m.gguf", "f32")
    reader = gguf.GGUFReader(out)
    field = reader.fields["hunyuan-dense.rope.freq_base"]
    head_dim = spec.kwargs["head_dim"]
    expected = 1e4 * 1000.0 ** (head_dim / (head_dim - 2))  # llama.cpp's HunYuanModel.set_gguf_parameters
    assert float(field.parts[field.data[0]][0]) == float(np.float32(expected))
    assert "hunyuan-dense.rope.scaling.type" not in reader.fields
    back, source = lmconvert.load(out, attention="eager"), lmconvert.load(canonical, attention="eager")
    assert back.cfg.rope.scaling == "none" and source.cfg.rope.scaling == "ntk_alpha"
    ids = token_batch(seq=28)
    with torch.no_grad():
        assert (back(ids) - source(ids)).abs().max() <= 1e-5  # the base rounded to float32 by GGUF


BASE = {"model_type": "hunyuan_v1_moe", "num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
        "head_dim": 16, "num_experts": 6}


def test_moe_topk_per_layer_list_is_read_where_every_layer_agrees() -> None:
    """Hunyuan-A13B's config.json states `moe_topk` once per layer; transformers' gate reads entry i on layer i."""
    family = lmconvert.mappings.family_named("hunyuan_v1_moe")
    assert family.arch_config({**BASE, "moe_topk": [2, 2, 2]}) == family.arch_config({**BASE, "moe_topk": 2})
    assert family.arch_config({**BASE, "moe_topk": 2}).moe.top_k == 2


@pytest.mark.parametrize("top_k", [[2, 3, 2], [2, 2], [2, 0, 2], [2, "2", 2]])
def test_moe_topk_lists_the_decoder_cannot_hold_are_refused(top_k: list) -> None:
    with pytest.raises(MappingError, match="moe_topk"):
        lmconvert.mappings.family_named("hunyuan_v1_moe").arch_config({**BASE, "moe_topk": top_k})
