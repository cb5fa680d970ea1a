"""Pipeline placement (runtime/pipeline.py): the Decoder's blocks spread over devices give the
single-device logits, in a full forward and in cached decoding. On CPU every "device" is the CPU,
so what is checked here is the placement and the hooks (a Context moved per device, the cache
kept per block); the GPU check (`tests/test_gpu.py`) runs it across the CPU and a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_models import build_model, incremental, save_checkpoint, token_batch

import lmconvert
from lmconvert.arch import ConfigError
from lmconvert.runtime.pipeline import block_devices, place

IDS = token_batch(seq=20)


def decoded(model: torch.nn.Module) -> torch.Tensor:
    """Logits from a prefill, then one token at a time through the KV cache."""
    cache = model.new_cache()
    return incremental(lambda chunk: model(chunk, cache=cache), IDS, 12)


@pytest.mark.parametrize(("model_type", "overrides"), [
    ("llama", dict(num_hidden_layers=3)), ("gemma", dict(num_hidden_layers=3, head_dim=16)),  # tied
    ("ctrl", dict(num_hidden_layers=3, dff=96)),  # tied, with the head's own bias
    ("modernbert-decoder", dict(num_hidden_layers=3, local_attention=8, decoder_bias=True)),  # the head transform
])
def test_placed_blocks_give_the_single_device_logits(model_type: str, overrides: dict, tmp_path: Path) -> None:
    path = save_checkpoint(build_model(model_type, **overrides), tmp_path / "hf")
    single = lmconvert.load(path, attention="eager")
    placed = place(lmconvert.load(path, attention="eager"), ["cpu", "cpu"])
    with torch.no_grad():
        assert torch.equal(placed(IDS), single(IDS))
        assert torch.equal(decoded(placed), decoded(single))
    assert [len(b._forward_pre_hooks) for b in placed.layers] == [1, 1, 1]


def test_blocks_are_split_in_contiguous_runs() -> None:
    assert [str(d) for d in block_devices(5, ["cuda:0", "cuda:1"])] == ["cuda:0"] * 3 + ["cuda:1"] * 2
    assert [str(d) for d in block_devices(2, ["cpu", "cuda:0", "cuda:1"])] == ["cpu", "cuda:0"]
    with pytest.raises(ConfigError, match="at least one device"):
        block_devices(2, [])
