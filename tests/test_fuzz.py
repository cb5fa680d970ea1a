"""Fuzzing the readers that see untrusted bytes first: the safetensors header and data reader,
the sharded index reader, and config translation. The only outcome allowed besides success is a
clean lmconvert error (InputError / MappingError).

About 1,200 examples run in the suite; set LMCONVERT_FUZZ_SCALE=20 (or more) for a longer run.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmconvert.formats.errors import InputError
from lmconvert.formats.safetensors_dir import TensorSource, shard_map
from lmconvert.mappings import BY_MODEL_TYPE, MappingError, family_for

SCALE = int(os.environ.get("LMCONVERT_FUZZ_SCALE", "1"))


def fuzz(examples: int):  # noqa: ANN201
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=SCALE == 1,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=8)

DTYPES = ["F32", "F16", "BF16", "I64", "I8", "U8", "BOOL", "F64", "Q4", "", "f32"]
entry = st.fixed_dictionaries({
    "dtype": st.one_of(st.sampled_from(DTYPES), json_scalars),
    "shape": st.one_of(st.lists(st.integers(-2, 6), max_size=3), json_scalars),
    "data_offsets": st.one_of(st.lists(st.integers(-4, 80), min_size=2, max_size=2), json_values),
})
headers = st.dictionaries(st.text(min_size=1, max_size=6), st.one_of(entry, json_values), max_size=4)


@pytest.mark.slow
@fuzz(500)
@given(header=headers, data=st.binary(max_size=96), length_delta=st.sampled_from([0, 0, 0, -3, 5, 10**9]),
       raw=st.one_of(st.none(), st.binary(max_size=64)))
def test_safetensors_reader_fails_cleanly(header: dict, data: bytes, length_delta: int, raw: bytes | None) -> None:
    blob = raw if raw is not None else json.dumps(header).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        path.write_bytes(struct.pack("<Q", max(0, len(blob) + length_delta)) + blob + data)
        try:
            with TensorSource(Path(tmp)) as source:
                for name in source.names():
                    t = source.get(name)
                    assert tuple(t.shape) == source.shape(name)
        except InputError:
            pass


index_values = st.one_of(st.sampled_from(["model.safetensors", "a.safetensors", "../x.safetensors", "/etc/passwd",
                                          "sub/a.safetensors", "", ".", ".."]), json_values)


@fuzz(300)
@given(weight_map=st.one_of(st.dictionaries(st.text(max_size=6), index_values, max_size=5), json_values),
       extra=st.dictionaries(st.text(max_size=5), json_values, max_size=2))
def test_index_reader_fails_cleanly(weight_map: object, extra: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "a.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
        (directory / "model.safetensors.index.json").write_text(json.dumps({**extra, "weight_map": weight_map}))
        try:
            files = shard_map(directory)
        except InputError:
            return
        for file in files.values():  # whatever it accepted stays inside the directory
            assert file.resolve().parent == directory.resolve()


LLAMA = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64}}
keys = st.sampled_from(sorted(set(LLAMA) | {"head_dim", "rope_parameters", "sliding_window", "layer_types",
                                            "attention_bias", "query_pre_attn_scalar", "use_sliding_window"}))


@fuzz(400)
@given(model_type=st.sampled_from(sorted(BY_MODEL_TYPE)), changes=st.dictionaries(keys, json_values, max_size=3),
       rope=st.dictionaries(st.sampled_from(["rope_type", "factor", "rope_theta", "original_max_position_embeddings",
                                             "low_freq_factor", "type", "beta_fast"]), json_values, max_size=3))
def test_config_translation_fails_cleanly(model_type: str, changes: dict, rope: dict) -> None:
    config = {**LLAMA, "model_type": model_type, **changes}
    if rope:
        config["rope_scaling"] = {**LLAMA["rope_scaling"], **rope}
    try:
        family_for(model_type).arch_config(config)
    except MappingError:
        pass
