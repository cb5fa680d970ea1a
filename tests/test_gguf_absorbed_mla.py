"""DeepSeek GGUF files in the layout of llama.cpp's converter (absorbed MLA): kv_b stored as
`attn_k_b` (each head's k rows, transposed) and `attn_v_b`, the key and value lengths the
latent's (kv_lora_rank plus the rotary width, kv_lora_rank) with one KV head, the heads' own in
`key_length_mla` and `value_length_mla`. Built here with the `gguf` library from lmconvert's own
export, kv_b split as the converter splits it (test_table_transforms.converter_split);
test_llamacpp.py runs llama.cpp's converter itself on a tiny checkpoint. Our reader gives back the
model bit for bit, so its logits are transformers'; a file holding kv_b beside its parts is read
only if they agree.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from hf_models import token_batch
from test_export_gguf import FP32_MAX_ABS, WRITTEN_ONLY, as_float32, built, canonical_of, exported
from test_formats_gguf import cli, logits_of
from test_table_transforms import converter_split
from transformers import AutoModelForCausalLM

import lmconvert

ARCH = "deepseek2"


def absorbed(ours: Path, out: Path, *, whole: bool = False, tampered: bool = False, without: str = "") -> Path:
    """Our f32 file as llama.cpp's converter writes the model: kv_b split into k_b and v_b (also kept
    whole with `whole`; k_b's first element changed with `tampered`; the part `without` left out)
    and the MLA sizes stated its way."""
    reader = gguf.GGUFReader(ours)
    fields = {name: f for name, f in reader.fields.items()
              if not name.startswith("GGUF.") and name != "general.architecture"}
    heads, lora, rotary, key, value = (fields[f"{ARCH}.{k}"].contents() for k in (
        "attention.head_count", "attention.kv_lora_rank", "rope.dimension_count", "attention.key_length",
        "attention.value_length"))
    stated = {"attention.key_length": lora + rotary, "attention.value_length": lora, "attention.head_count_kv": 1,
              "attention.key_length_mla": key, "attention.value_length_mla": value}
    writer = gguf.GGUFWriter(str(out), ARCH)
    for name, f in fields.items():
        if name.removeprefix(f"{ARCH}.") not in stated:
            array = f.types[0] == gguf.GGUFValueType.ARRAY
            writer.add_key_value(name, f.contents(), f.types[0], f.types[-1] if array else None)
    for name, number in stated.items():
        writer.add_uint32(f"{ARCH}.{name}", number)
    for t in reader.tensors:
        data = torch.from_numpy(np.array(t.data))
        if not t.name.endswith("attn_kv_b.weight"):
            writer.add_tensor(t.name, data.numpy())
            continue
        k_b, v_b = (p.contiguous().clone() for p in converter_split(data, heads, key - rotary, value))
        if tampered:
            k_b[0, 0, 0] += 1
        for part, tensor in (("k_b", k_b), ("v_b", v_b)):
            if part != without:
                writer.add_tensor(t.name.replace("kv_b", part), tensor.numpy())
        if whole:
            writer.add_tensor(t.name, data.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v3:moe"])
def test_kv_b_as_llama_cpp_s_parts_reads_back_bit_for_bit(name: str, tmp_path: Path) -> None:
    model = built(name, WRITTEN_ONLY[name])
    canonical = canonical_of(model, tmp_path)
    path = absorbed(exported(canonical, tmp_path / "ours.gguf", "f32"), tmp_path / "absorbed.gguf")
    assert {"blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight"} <= {t.name for t in gguf.GGUFReader(path).tensors}
    ours, source = lmconvert.load(path, attention="eager"), lmconvert.load(canonical, attention="eager")
    assert as_float32(ours.cfg) == as_float32(source.cfg)
    theirs = source.state_dict()
    assert set(ours.state_dict()) == set(theirs)
    for tensor_name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, theirs[tensor_name]), tensor_name
    ids = token_batch(seq=28)
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32,
                                                     attn_implementation="eager", experts_implementation="eager")
    assert torch.equal(logits_of(ours, ids), logits_of(source, ids))
    assert (logits_of(ours, ids) - logits_of(reference.eval(), ids)).abs().max() <= FP32_MAX_ABS


@pytest.fixture
def ours(tmp_path: Path) -> Path:
    canonical = canonical_of(built("deepseek_v2", WRITTEN_ONLY["deepseek_v2"]), tmp_path)
    return exported(canonical, tmp_path / "ours.gguf", "f32")


def test_kv_b_beside_its_parts_is_read_when_they_agree(ours: Path, tmp_path: Path) -> None:
    both = lmconvert.load(absorbed(ours, tmp_path / "both.gguf", whole=True)).state_dict()
    for tensor_name, tensor in lmconvert.load(ours).state_dict().items():
        assert torch.equal(both[tensor_name], tensor), tensor_name


@pytest.mark.parametrize(("change", "fragment"), [
    (dict(whole=True, tampered=True), "holds model.layers.0.self_attn.kv_b_proj.weight twice, as "
                                      "blk.0.attn_kv_b.weight and as blk.0.attn_k_b.weight and blk.0.attn_v_b.weight, "
                                      "and they differ"),
    (dict(without="v_b"), "tensor 'blk.0.attn_k_b.weight' is one part of layers.0.attn.kv_b.weight, stored as "
                          "blk.0.attn_k_b.weight, blk.0.attn_v_b.weight, and the file lacks blk.0.attn_v_b.weight"),
    (dict(without="k_b"), "and the file lacks blk.0.attn_k_b.weight"),
    (dict(whole=True, without="k_b"), "and the file lacks blk.0.attn_k_b.weight"),
])
def test_parts_that_disagree_or_are_missing_are_refused(ours: Path, tmp_path: Path, change: dict,
                                                         fragment: str) -> None:
    path = absorbed(ours, tmp_path / "bad.gguf", **change)
    code, _, err = cli("convert", path, tmp_path / "out")
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()
