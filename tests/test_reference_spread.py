"""transformers' reference spread over several GPUs (`verify/spread.py`): the budgets each GPU is
given, and where transformers' own placement (`infer_auto_device_map`, which takes GPU indices on
any machine) then puts a real tiny model's modules, for a stated number of GPUs. No GPU is needed:
the placement is arithmetic on module sizes. Where the modules really land and run is
`test_gpu.py`'s."""

from __future__ import annotations

import pytest
from hf_models import build_model
from transformers.integrations.accelerate import compute_module_sizes, infer_auto_device_map

from lmconvert.verify.reference import indivisible, spread_gpus
from lmconvert.verify.spread import spread_memory

GIB = 2**30
LAYERS = 8


def placed(model, budgets: dict[int | str, int]) -> dict[str, int | str]:
    return infer_auto_device_map(model, max_memory=budgets, no_split_module_classes=model._no_split_modules,
                                 clean_result=False)


def on(device_map: dict[str, int | str], sizes: dict[str, int], device: int | str) -> int:
    return sum(sizes[name] for name, where in device_map.items() if where == device)


@pytest.mark.parametrize("gpus", [2, 4])
@pytest.mark.parametrize("tied", [False, True])
def test_a_model_that_fits_one_gpu_still_spans_every_gpu(gpus: int, tied: bool) -> None:
    """1 GiB free on each GPU, a 1 MB model: every GPU takes layers, in order, none the CPU or disk,
    and no GPU holds more than an equal share plus one block (the balance is the point)."""
    model = build_model("llama", num_hidden_layers=LAYERS, tie_word_embeddings=tied)
    sizes, _ = compute_module_sizes(model)
    blocks = indivisible(model)
    device_map = placed(model, spread_memory([GIB] * gpus, sizes, blocks))
    layers = [device_map[f"model.layers.{i}"] for i in range(LAYERS)]
    assert set(device_map.values()) == set(range(gpus)), device_map
    assert set(layers) == set(range(gpus)) and layers == sorted(layers), layers
    assert device_map["model.embed_tokens"] == 0
    if tied:  # one weight, one device
        assert device_map["lm_head"] == device_map["model.embed_tokens"]
    largest = max(sizes[name] for name in blocks)
    assert max(on(device_map, sizes, i) for i in range(gpus)) <= sizes[""] / gpus + largest


def test_the_blocks_are_the_decoder_layers_and_the_leaves() -> None:
    model = build_model("llama", num_hidden_layers=2)
    blocks = indivisible(model)
    assert {"model.layers.0", "model.layers.1", "model.embed_tokens", "lm_head", "model.norm"} <= set(blocks)
    assert "model.layers.0.self_attn.q_proj" in blocks  # a leaf inside a layer: never larger than its layer
    assert "model" not in blocks and "model.layers" not in blocks


def test_each_gpu_keeps_its_reserve_and_the_cap() -> None:
    """A GPU with less free memory takes less; every budget leaves `reserve` for the activations
    and stays under --max-memory, and CPU RAM gets --max-memory, the rest going to disk."""
    model = build_model("llama", num_hidden_layers=LAYERS)
    sizes, _ = compute_module_sizes(model)
    free = [GIB, sizes[""] // 4, GIB]
    reserve = sizes[""] // 16
    for cap in (None, sizes[""] // 8):
        budgets = spread_memory(free, sizes, indivisible(model), reserve, cap)
        assert all(budgets[i] <= free[i] - reserve for i in range(3)), budgets
        assert cap is None or all(budgets[i] <= cap for i in range(3))
        assert budgets.get("cpu") == cap
    assert "cpu" not in spread_memory(free, sizes, indivisible(model), reserve)


def test_what_does_not_fit_goes_to_cpu_ram_then_disk_with_max_memory_and_nowhere_without() -> None:
    """Two GPUs with room for a quarter of the model: with --max-memory the rest lands in CPU RAM
    and on disk; without it the map sends the rest to disk, which `spread_map` refuses."""
    model = build_model("llama", num_hidden_layers=LAYERS)
    sizes, _ = compute_module_sizes(model)
    free = [sizes[""] // 4] * 2
    offloaded = placed(model, spread_memory(free, sizes, indivisible(model), max_memory=sizes[""] // 4))
    assert {0, 1, "cpu", "disk"} <= set(offloaded.values()), offloaded
    assert "disk" in placed(model, spread_memory(free, sizes, indivisible(model))).values()


def test_only_a_bare_cuda_spreads() -> None:
    """`cuda:N` pins the reference to that GPU, the CPU is the CPU (no CUDA needed to ask)."""
    assert spread_gpus("cpu") == 1
    assert spread_gpus("cuda:1") == 1


def test_under_torchrun_the_reference_runs_where_the_ranks_do() -> None:
    """Unless --device says otherwise: on GPUs a bare `cuda` (spread over the node's GPUs), on CPUs
    the CPU; a CPU reference beside ranks on GPUs is refused in one line."""
    import torch

    from lmconvert.formats.errors import InputError
    from lmconvert.verify.parallel import ranks_device

    if not torch.cuda.is_available():
        assert ranks_device(None) == "cpu" and ranks_device("cpu") == "cpu"
        return
    assert ranks_device(None) == "cuda" and ranks_device("cuda:0") == "cuda:0"
    with pytest.raises(InputError, match="--device cpu: under torchrun the ranks run on cuda"):
        ranks_device("cpu")
