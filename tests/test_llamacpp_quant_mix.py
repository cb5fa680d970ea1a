"""The K-quant mixes' per-tensor types (lmconvert/formats/gguf_quant_mix.py) are llama.cpp's own:
for every family `convert --to gguf` writes (test_export_gguf.MODELS), our float GGUF goes through
llama.cpp's `llama_model_quantize` (nthread 2, no importance matrix) at q3_k_m, q4_k_s, q4_k_m and
q5_k_m, and the type llama.cpp gave each tensor of its file is the one `mix_types` chooses from our
file's tensors and metadata; its `general.file_type` is ours too.

The families' tiny models have rows of 64 or 96: most tensors take the fallback types there. WIDE's
models have every row a multiple of 256, so the rules themselves run: the V-projection counter and
use_more_bits, ffn_down by layer (1/16, 1/8), attn_output, the output and the tied embedding, 8
experts, Falcon, fused QKV, MLA's attn_kv_b, a shared-expert mixture, and Llama-2-70B's 80 layers with grouped KV
heads; they are written in bf16, the families' in f32. Runs in `make llamacpp-check`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import pytest
from hf_models import save_checkpoint
from test_export_gguf import MODELS, built

from lmconvert.convert.export_gguf import to_gguf
from lmconvert.formats.gguf_quant_mix import MIXES, QuantModel, mix_types

pytestmark = pytest.mark.llamacpp

WIDTH = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
# models whose every row is a multiple of 256 (ggml's K block), each exercising rules the tiny ones cannot
WIDE: dict[str, tuple[str, dict[str, Any]]] = {
    # 16 layers: use_more_bits' thirds, ffn_down's first 1/16 and 1/8, the first two and four attn_v; untied
    "llama": ("llama", dict(MODELS["llama"], **WIDTH, num_hidden_layers=16)),
    "qwen2-tied": ("qwen2", dict(MODELS["qwen2"], **WIDTH, num_hidden_layers=8)),  # token_embd as the output
    # 8 experts: attn_v and attn_k Q8_0, attn_output Q5_K, ffn_down_exps by the layer in its name
    "mixtral-8": ("mixtral", dict(MODELS["mixtral"], **{**WIDTH, "intermediate_size": 256}, num_hidden_layers=8,
                                  num_local_experts=8)),
    # experts other than 8, with a shared expert, a dense ffn_down_shexp beside ffn_down_exps
    "qwen2_moe": ("qwen2_moe", dict(MODELS["qwen2_moe"], **WIDTH, num_hidden_layers=8, moe_intermediate_size=256,
                                    shared_expert_intermediate_size=512)),
    # Falcon: fused attn_qkv, its own ffn_down and output rules
    "falcon": ("falcon", dict(MODELS["falcon"], hidden_size=256, num_attention_heads=4, ffn_hidden_size=512,
                              num_hidden_layers=16)),
    "gpt_neox": ("gpt_neox", dict(MODELS["gpt_neox"], **WIDTH, num_hidden_layers=8)),  # fused attn_qkv, not Falcon
    # MLA: attn_kv_b counted and chosen as a V projection; dense, every layer
    "deepseek_v2-mla": ("deepseek_v2", dict(MODELS["deepseek_v2:dense"], **{**WIDTH, "num_key_value_heads": 4},
                                            q_lora_rank=256, kv_lora_rank=256, qk_nope_head_dim=32,
                                            qk_rope_head_dim=32, v_head_dim=64, num_hidden_layers=8,
                                            first_k_dense_replace=8)),
    # llama.cpp's LLM_TYPE_70B (80 layers, grouped KV heads): attn_v Q5_K; a narrow MLP keeps the file small
    "llama-70b": ("llama", dict(MODELS["llama"], **{**WIDTH, "intermediate_size": 256}, num_hidden_layers=80)),
}
FTYPES = {"q3_k_m": "LLAMA_FTYPE_MOSTLY_Q3_K_M", "q4_k_s": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
          "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M"}


def llama_cpp_quantize(src: Path, out: Path, mix: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[mix])
    params.nthread = 2
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params)) == 0, mix


def file_tensors(path: Path) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape in torch order, GGML type) of each tensor, in the file's order."""
    return [(t.name, tuple(int(n) for n in reversed(t.shape.tolist())), t.tensor_type.name)
            for t in gguf.GGUFReader(path).tensors]


def file_model(path: Path) -> QuantModel:
    fields = gguf.GGUFReader(path).fields
    arch = fields["general.architecture"].contents()
    return QuantModel.from_metadata(arch, {k: f.contents() for k, f in fields.items() if k.startswith(f"{arch}.")})


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """(our float GGUF, llama.cpp's file for each mix, the metadata the writer was given) of a model,
    built once."""
    made: dict[str, tuple[Path, dict[str, Path], dict[str, Any]]] = {}

    def get(key: str, family: str, kwargs: dict[str, Any], quant: str) -> tuple[Path, dict[str, Path], dict[str, Any]]:
        if key not in made:
            root = tmp_path_factory.mktemp(key.replace(":", "-"))
            save_checkpoint(built(family, kwargs), root / "hf")
            values = to_gguf(root / "hf", root / "m.gguf", quant=quant)
            (root / "hf" / "model.safetensors").unlink()
            mixes = {mix: root / f"{mix}.gguf" for mix in MIXES}
            for mix, out in mixes.items():
                llama_cpp_quantize(root / "m.gguf", out, mix)
            made[key] = root / "m.gguf", mixes, values
        return made[key]

    yield get


def check_mixes(ours: Path, theirs: dict[str, Path], values: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Every tensor's type as llama.cpp chose it equals ours, for each mix; returns llama.cpp's. What
    the chooser reads of the model is the same from the writer's metadata as from the file."""
    tensors, model = file_tensors(ours), file_model(ours)
    assert QuantModel.from_metadata(model.arch, values) == model
    chosen = {}
    for mix, path in theirs.items():
        reader = gguf.GGUFReader(path)
        assert reader.fields["general.file_type"].contents() == MIXES[mix][0], mix
        llama_types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert set(llama_types) == {name for name, _, _ in tensors}
        ours_types = dict(zip([name for name, _, _ in tensors], mix_types(mix, model, tensors), strict=True))
        differ = {name: (ours_types[name], llama_types[name]) for name in llama_types
                  if ours_types[name] != llama_types[name]}
        assert not differ, f"{mix}: (ours, llama.cpp's) {differ}"
        chosen[mix] = llama_types
    return chosen


@pytest.mark.parametrize("name", list(MODELS))
def test_every_family_s_types_are_llama_cpp_s(name: str, quantized: Any) -> None:  # noqa: ANN401
    check_mixes(*quantized(name, name.split(":")[0], MODELS[name], "f32"))


@pytest.mark.parametrize("name", list(WIDE))
def test_the_rules_on_rows_of_256(name: str, quantized: Any) -> None:  # noqa: ANN401
    """No tensor falls back, and more than one K type is chosen in each mix: the rules ran."""
    family, kwargs = WIDE[name]
    chosen = check_mixes(*quantized(f"wide-{name}", family, kwargs, "bf16"))
    fallbacks = {"Q4_0", "Q5_0", "Q5_1", "F16"}
    for mix, types in chosen.items():
        assert not fallbacks & set(types.values()), (mix, {n: t for n, t in types.items() if t in fallbacks})
        assert len(set(types.values()) - {"F32", "BF16"}) > 1, (mix, set(types.values()))


def test_the_wide_models_reach_the_rules(quantized: Any) -> None:  # noqa: ANN401
    """The rules WIDE is for do fire in llama.cpp's files: tied embeddings, 8 experts, Falcon, MLA, 70B."""
    def types(name: str, mix: str) -> dict[str, str]:
        family, kwargs = WIDE[name]
        return {t.name: t.tensor_type.name for t in gguf.GGUFReader(quantized(f"wide-{name}", family, kwargs,
                                                                              "bf16")[1][mix]).tensors}

    assert types("qwen2-tied", "q4_k_m")["token_embd.weight"] == "Q6_K"
    untied = types("llama", "q4_k_m")
    assert (untied["token_embd.weight"], untied["output.weight"]) == ("Q4_K", "Q6_K")
    assert {types("mixtral-8", "q4_k_m")[f"blk.0.attn_{p}.weight"] for p in ("k", "v", "output")} == {"Q8_0", "Q5_K"}
    assert types("falcon", "q4_k_m")["token_embd.weight"] == "Q8_0"  # Falcon-7B's is tied: the output's rule
    assert types("falcon", "q3_k_m")["blk.2.ffn_down.weight"] == "Q3_K"  # Falcon's own ffn_down rule
    assert types("deepseek_v2-mla", "q3_k_m")["blk.1.attn_kv_b.weight"] == "Q5_K"  # the first two V projections
    assert types("llama-70b", "q4_k_s")["blk.10.attn_v.weight"] == "Q5_K"
    assert types("llama", "q4_k_s")["blk.10.attn_v.weight"] == "Q4_K"
