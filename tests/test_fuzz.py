"""Fuzzing the readers that see untrusted bytes first: the safetensors header and data reader,
the sharded index reader, config translation, and a canonical checkpoint's lmconvert.json. The
only outcome allowed besides success is a clean lmconvert error (InputError / MappingError), or
through the command line exit 1 or 2 with one line: never 3 (a bug) or a traceback.

About 1,200 examples run in `make test` (a quarter of them in `make test-fast`, tests/examples_budget.py);
set LMCONVERT_FUZZ_SCALE=20 (or more) for a longer run.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from dataclasses import fields
from pathlib import Path

import pytest
from bad_input import lmconvert
from examples_budget import examples as budget
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lmconvert.arch import ArchConfig
from lmconvert.formats.errors import InputError
from lmconvert.formats.safetensors_dir import TensorSource, shard_map
from lmconvert.mappings import BY_MODEL_TYPE, MappingError, family_for

SCALE = int(os.environ.get("LMCONVERT_FUZZ_SCALE", "1"))


def fuzz(examples: int):  # noqa: ANN201
    return settings(max_examples=budget(examples) * SCALE, deadline=None, derandomize=SCALE == 1,
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


@pytest.mark.slow  # 300 examples, each a directory on disk: ~1.7-3 s alone (other readers stay in test-fast)
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


@pytest.mark.slow  # 400 configs through every family's translation: ~2-3.5 s alone
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


# lmconvert.json: what a canonical directory's description may hold. Every command that reads it
# (verify --files, inspect, the exports) ends in 0, 1 (integrity) or 2 (bad input), with one line.
DESCRIPTION_KEYS = ["format", "format_version", "arch", "family", "dtype", "source", "hf_extras", "hash", "tensors",
                    "files", "shards"]
ENTRY_NAMES = st.one_of(st.sampled_from(["model.safetensors", "generation_config.json", "lmconvert.json",
                                         "tokenizer.json", "/etc/passwd", "../../x", "..", ".", "", "sub/x",
                                         "tokenizer/../../x", "layers.0.attn.q.weight", "embed.weight"]),
                        st.text(max_size=6))
mutations = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(DESCRIPTION_KEYS), json_values),
    st.tuples(st.just("delete"), st.sampled_from(DESCRIPTION_KEYS), st.none()),
    st.tuples(st.just("entry"), st.sampled_from(["files", "shards", "tensors", "source", "hf_extras"]),
              st.tuples(ENTRY_NAMES, st.one_of(json_values, st.just("0" * 64),
                                               st.fixed_dictionaries({"header": st.text(max_size=4),
                                                                      "bytes": st.integers(-1, 10**6)})))),
    st.tuples(st.just("arch"), st.sampled_from(sorted(f.name for f in fields(ArchConfig))), json_values),
)
COMMANDS = [["verify", "{can}", "--files"], ["inspect", "{can}"], ["convert", "{can}", "{out}", "--to", "hf"],
            ["convert", "{can}", "{out}", "--to", "meta"]]


def _mutate(description: dict, mutation: tuple) -> None:
    kind, key, value = mutation
    if kind == "set":
        description[key] = value
    elif kind == "delete":
        description.pop(key, None)
    elif kind == "arch" and isinstance(description.get("arch"), dict):
        description["arch"][key] = value
    elif kind == "entry" and isinstance(description.get(key), dict):
        description[key][value[0]] = value[1]


@pytest.fixture(scope="module")
def canonical_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hf_models import make_checkpoint

    hf = make_checkpoint(tmp_path_factory.mktemp("fuzz") / "hf", intermediate_size=192)  # Meta can hold it
    out = hf.parent / "can"
    assert lmconvert("convert", hf, out).returncode == 0
    return out


@fuzz(60)
@given(changes=st.lists(mutations, min_size=1, max_size=3), command=st.sampled_from(COMMANDS))
def test_lmconvert_json_fails_cleanly(canonical_dir: Path, changes: list, command: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        can = Path(shutil.copytree(canonical_dir, Path(tmp) / "can"))
        description = json.loads((can / "lmconvert.json").read_text())
        for change in changes:
            _mutate(description, change)
        (can / "lmconvert.json").write_text(json.dumps(description))
        proc = lmconvert(*(arg.format(can=can, out=Path(tmp) / "out") for arg in command))
    assert proc.returncode in (0, 1, 2), (proc.returncode, proc.stderr, changes)
    if proc.returncode:
        err = proc.stderr.strip()
        assert len(err.splitlines()) == 1 and err.startswith("lmconvert: error: "), (err, changes)


# --- golden files, GGUF metadata, Meta params and JSON inputs (issue 13, sections 4-5) ---
# Besides success, the outcomes allowed are the errors the CLI turns into exit 2.

from functools import cache  # noqa: E402

import gguf  # noqa: E402
import torch  # noqa: E402
from bad_input import TINY_GGUF, TINY_PARAMS, write_tiny_gguf, write_tiny_meta  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from lmconvert.arch import ConfigError  # noqa: E402
from lmconvert.arch.shapes import parameter_shapes  # noqa: E402
from lmconvert.formats.checkpoint import open_checkpoint  # noqa: E402
from lmconvert.formats.jsonfile import read_json  # noqa: E402
from lmconvert.verify import golden  # noqa: E402
from lmconvert.verify.expected import Expected  # noqa: E402
from lmconvert.verify.tolerance import Tolerance  # noqa: E402

CLEAN = (InputError, MappingError, ConfigError)


def nesting(depth: int, kind: str) -> str:
    return kind[0] * depth + kind[1] * depth


@fuzz(200)
@given(data=st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode()),
                      st.builds(lambda d, k, tail: (nesting(d, k) + tail).encode(),
                                st.sampled_from([1, 100, 2_000, 50_000, 200_000]), st.sampled_from(["[]", "{}"]),
                                st.sampled_from(["", "x", "]"]))))
def test_json_reader_fails_cleanly(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_bytes(data)
        try:
            read_json(path)
        except InputError as exc:
            assert "\n" not in str(exc)


@cache
def golden_parts() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A golden file's tensors and metadata, as golden.save writes them for a 2 x 6 batch over a
    vocabulary of 16, with 3 greedy tokens after a 4-token prompt."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (2, 6), generator=g)
    sequences = torch.cat([ids[:1, :4], torch.randint(0, 16, (1, 3), generator=g)], 1)
    expected = Expected(ids=ids, logits=torch.randn(2, 6, 16, generator=g), dtype="bfloat16", device="cpu",
                        points={"embed": torch.randn(2, 6, 8, generator=g), "layers.0": torch.randn(2, 6, 8)},
                        tolerance=Tolerance.for_dtype("bfloat16"), exact_logits=torch.randn(2, 6, 16, generator=g),
                        reference_error=0.01, own={"embed": (0.001, 0.01)},
                        generation=(sequences, torch.randn(1, 3, 16, generator=g)), prompt_tokens=4,
                        info={"tokens": "random ids", "versions": {"torch": "2"}})
    with tempfile.TemporaryDirectory() as tmp:
        golden.save(expected, Path(tmp) / "g.safetensors")
        from safetensors import safe_open

        with safe_open(str(Path(tmp) / "g.safetensors"), framework="pt") as f:
            return {n: f.get_tensor(n) for n in f.keys()}, dict(f.metadata())


TENSOR_DTYPES = [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float32, torch.bfloat16, torch.float16]
tensors = st.builds(lambda dtype, shape, low: torch.randint(low, low + 20, shape).to(dtype),
                    st.sampled_from(TENSOR_DTYPES), st.lists(st.integers(0, 7), max_size=4), st.integers(-5, 5))
golden_tensor_names = st.sampled_from(["ids", "logits", "logits.fp32", "points.embed", "points.layers.0",
                                       "generation.sequences", "generation.logits"])
golden_meta_keys = st.sampled_from(["format", "format_version", "dtype", "device", "tolerance", "versions",
                                    "own_errors", "reference_error", "prompt_tokens", "info"])
meta_values = st.one_of(st.none(), st.text(max_size=10), json_values.map(json.dumps),
                        st.sampled_from(['{"dtype": "bfloat16"}', '{"dtype": "float32", "logits_max_abs": 1e-5}',
                                         '{"embed": [1, 2, 3]}', "-1", "99", "1e400", "NaN", nesting(100_000, "[]")]))


@fuzz(300)
@given(tensor_changes=st.dictionaries(golden_tensor_names, st.one_of(st.none(), tensors), max_size=3),
       meta_changes=st.dictionaries(golden_meta_keys, meta_values, max_size=3))
def test_golden_reader_fails_cleanly(tensor_changes: dict, meta_changes: dict) -> None:
    base, metadata = golden_parts()
    tensors_out = {n: t.contiguous() for n, t in {**base, **tensor_changes}.items() if t is not None}
    metadata_out = {k: v for k, v in {**metadata, **meta_changes}.items() if v is not None}
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "g.safetensors"
        save_file(tensors_out, str(file), metadata_out)
        try:
            expected = golden.load(file)
        except InputError as exc:
            assert "\n" not in str(exc)
            event("refused")
            return
    event("accepted")
    # what it accepted is what verify relies on
    batch, seq = expected.ids.shape
    assert int(expected.ids.min()) >= 0 and not expected.ids.dtype.is_floating_point
    assert expected.logits.shape[:2] == (batch, seq) and expected.logits.dtype.is_floating_point
    assert expected.tolerance.dtype == expected.dtype
    if expected.generation is not None:
        sequences, steps = expected.generation
        assert 0 < expected.prompt_tokens <= seq
        assert steps.shape == (1, sequences.shape[1] - expected.prompt_tokens, expected.logits.shape[2])
    for mean, worst in (expected.own or {}).values():
        assert mean >= 0 and worst >= 0


INT_TYPES = {gguf.GGUFValueType.UINT8: (0, 255), gguf.GGUFValueType.INT8: (-128, 127),
             gguf.GGUFValueType.UINT32: (0, 2**32 - 1), gguf.GGUFValueType.INT32: (-2**31, 2**31 - 1),
             gguf.GGUFValueType.UINT64: (0, 2**64 - 1), gguf.GGUFValueType.INT64: (-2**63, 2**63 - 1)}
typed_ints = st.sampled_from(list(INT_TYPES)).flatmap(
    lambda kind: st.tuples(st.one_of(st.integers(max(-3, INT_TYPES[kind][0]), min(300, INT_TYPES[kind][1])),
                                     st.integers(*INT_TYPES[kind])), st.just(kind)))
gguf_values = st.one_of(
    st.none(), typed_ints, st.integers(-3, 300), st.floats(width=32), st.floats(allow_nan=False, width=32).map(
        lambda f: (f, gguf.GGUFValueType.FLOAT64)), st.text(max_size=6), st.booleans(),
    st.lists(st.integers(0, 5), min_size=1, max_size=4), st.lists(st.booleans(), min_size=1, max_size=4),
    st.sampled_from(["4", "abc", "linear", "yarn", 0, 1_000_000]))
gguf_keys = st.sampled_from(sorted({*TINY_GGUF, "split.count", "tokenizer.ggml.bos_token_id",
                                    "tokenizer.ggml.eos_token_id", "llama.attention.key_length",
                                    "llama.attention.value_length", "llama.rope.dimension_count",
                                    "llama.rope.scaling.type", "llama.rope.scaling.factor",
                                    "llama.rope.scaling.original_context_length", "llama.rope.scale_linear",
                                    "llama.attention.sliding_window_pattern"}))


def opens_cleanly(path: Path) -> None:
    """Open and map the checkpoint and read every tensor; one-line lmconvert errors only. What it
    accepts has the tensors its ArchConfig needs, in the shapes it needs."""
    try:
        with open_checkpoint(path) as checkpoint:
            shapes = parameter_shapes(checkpoint.arch)
            read = {name: tuple(t.shape) for name, t in checkpoint.tensors()}
    except CLEAN as exc:
        assert "\n" not in str(exc), exc
        event("refused")
        return
    event("accepted")
    assert read == shapes


@fuzz(150)
@given(changes=st.dictionaries(gguf_keys, gguf_values, max_size=3))
def test_gguf_metadata_fails_cleanly(changes: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        opens_cleanly(write_tiny_gguf(Path(tmp) / "m.gguf", changes))


@cache
def tiny_meta_shard() -> Path:
    return write_tiny_meta(Path(tempfile.mkdtemp(prefix="lmconvert-fuzz-meta-"))) / "consolidated.00.pth"


param_values = st.one_of(json_values, st.integers(-3, 300), st.sampled_from([0, -1, 1, 2, 3, 32, 64, 10**6, 10**12]),
                         st.floats(min_value=-2, max_value=4))
param_keys = st.sampled_from(sorted({*TINY_PARAMS, "ffn_dim_multiplier", "rope_theta", "use_scaled_rope",
                                     "rope_scaling_factor", "max_seq_len"}))


@fuzz(150)
@given(changes=st.dictionaries(param_keys, param_values, max_size=3), nested_under_model=st.booleans(),
       raw=st.one_of(st.none(), st.binary(max_size=32)))
def test_meta_params_fail_cleanly(changes: dict, nested_under_model: bool, raw: bytes | None) -> None:
    params = {**TINY_PARAMS, **changes}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "meta"
        directory.mkdir()
        shutil.copy(tiny_meta_shard(), directory / "consolidated.00.pth")
        text = json.dumps({"model": params} if nested_under_model else params).encode()
        (directory / "params.json").write_bytes(raw if raw is not None else text)
        opens_cleanly(directory)
