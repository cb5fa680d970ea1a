"""GGUF in: tiny transformers models written as GGUF at test time the way llama.cpp's converter
writes them (q/k permuted for `llama`, Gemma norms stored as w + 1, metadata instead of a config,
optionally quantized, padded vocabulary rows, Llama 3 RoPE as a rope_freqs tensor), then imported.

The bars: F32 files give logits equal to the original model (eager vs eager, <= 1e-5); every
imported tensor equals what transformers' own GGUF loader produces, bit for bit, quantized or
not; our decoder on the dequantized tensors equals transformers on the same tensors; and the
tokenizer transformers builds from the GGUF travels into the output unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from family_specs import SPECS
from hf_models import build_model, token_batch
from transformers import AutoModelForCausalLM, AutoTokenizer

import lmconvert
from lmconvert.cli import main
from lmconvert.formats import gguf as gguf_format
from lmconvert.formats.checkpoint import open_source
from lmconvert.mappings.gguf.metadata import llama3_factors

FP32_MAX_ABS = 1e-5
# transformers model_type -> llama.cpp architecture, as convert_hf_to_gguf.py registers them
LLAMA_CPP_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                  "gemma3_text": "gemma3", "olmo2": "olmo2", "phi3": "phi3", "gpt2": "gpt2",
                  "starcoder2": "starcoder2", "stablelm": "stablelm", "nemotron": "nemotron", "bloom": "bloom",
                  "falcon": "falcon"}
# tiny configs whose every variant llama.cpp can state: Gemma's score scale is head_dim (llama.cpp's
# rule below 27B), Gemma 3's local RoPE base is llama.cpp's hard-coded 10000
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(attention_bias=True, tie_word_embeddings=False),
    "mistral": dict(sliding_window=None),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(head_dim=32),
    "gemma2": dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8),
    "gemma3_text": dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8, num_hidden_layers=3,
                        sliding_window_pattern=2, rope_parameters={
                            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    "olmo2": dict(),
    "phi3": dict(bos_token_id=2, eos_token_id=1),  # fused attn_qkv and ffn_up, as transformers' qkv/gate_up
    # llama.cpp states d_ff as 4 * n_embd; transformers' GGUF loader keeps GPT-2's default 1024 positions
    "gpt2": dict(intermediate_size=256, num_key_value_heads=4, max_position_embeddings=1024),
    # LayerNorm and linear biases, a plain MLP; the window is llama.cpp's none and transformers' default
    # RoPE base, since its GGUF loader reads neither
    "starcoder2": dict(sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       vocab_size=49152),  # nor the vocabulary size: its default
    # sequential blocks and a quarter of each head rotated: what transformers' GGUF loader assumes
    # half of each head rotated and eps 1e-5: what transformers' GGUF loader assumes
    "nemotron": dict(attention_bias=True, mlp_bias=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    "stablelm": dict(use_qkv_bias=True, use_parallel_residual=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
    # six heads (ALiBi's interleaved extra slopes) and an eps of its own, which transformers' GGUF loader
    # reads; the keys BLOOM has not are what llama.cpp states (4 x hidden, one KV head per head)
    "bloom": dict(hidden_size=96, num_attention_heads=6, layer_norm_epsilon=1e-4, num_key_value_heads=6,
                  intermediate_size=384),
    # Falcon-7B's layout (parallel, one norm, one KV head), the one transformers' GGUF loader assumes,
    # with its eps (it reads none); llama.cpp states 2048 positions and d_ff as 4 x hidden, Falcon's
    # default; the other layouts: FALCON_LAYOUTS
    "falcon": dict(num_key_value_heads=1, intermediate_size=256, max_position_embeddings=2048),
}
# what llama.cpp's file says differently from the model's config: it writes GPT-2's `output` even when tied
# and BLOOM's context length as n_embed (it has no position limit)
METADATA_DIFFERS: dict[str, dict[str, Any]] = {"gpt2": {"tie_word_embeddings": False},
                                               "bloom": {"max_position_embeddings": 96}}
# config keys a family spells its own way (its spec's `gguf_spelling`): GPT-2's d_ff is n_inner (the tiny model's
# is 4 * n_embd)
OWN_SPELLING: dict[str, dict[str, str]] = {spec.model_type: spec.gguf_spelling for spec in SPECS.values()
                                           if spec.gguf_spelling}
# transformers' GGUF loader builds these; what its metadata reading misses is kept out of the
# comparisons with it: it reads no attention_bias for llama (it drops the biases) and no
# attention.key_length for qwen3 (it assumes the default head_dim, 128), nor nemotron's biases
TRANSFORMERS_LOADS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "gpt2", "starcoder2",
                      "stablelm", "nemotron", "bloom", "falcon")
TRANSFORMERS_OVERRIDES = {"llama": dict(attention_bias=False), "qwen3": dict(head_dim=128),
                          "nemotron": dict(attention_bias=False, mlp_bias=False)}
TEXT = ("The capital of France is Paris. 北京是中国的首都。 def f(x):\n    return x ** 2  # 🚀✨ "
        "Ünïcödé — naïve café, 東京タワー, emoji 👩‍💻 and numbers 12345.")


def cli(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def permute(w: torch.Tensor, n_head: int, n_head_kv: int) -> torch.Tensor:
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_theta(config: Any) -> float:
    params = config.rope_parameters
    return float((params.get("full_attention") or params)["rope_theta"])


def write_gguf(model: torch.nn.Module, path: Path, *, quant: str | None = None, pad_rows: int = 0,
               name: str = "tiny", tokenizer: dict[str, Any] | None = None, rope_freqs: np.ndarray | None = None,
               raw_types: dict[str, str] | None = None) -> Path:
    """What llama.cpp's convert_hf_to_gguf.py writes for this model: its metadata, its tensor names
    and forward transforms; 2-D weights stored as `quant` (Q8_0, F16; norms and biases stay F32).
    `raw_types` stores the named GGUF tensors as zero blocks of another type."""
    cfg = model.config
    arch = LLAMA_CPP_ARCH[cfg.model_type]
    if arch in OWN_WRITERS:
        return OWN_WRITERS[arch](model, path, quant=quant, name=name)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    if arch == "starcoder2":  # a LayerNorm's eps (StarCoder2Model)
        writer.add_layer_norm_eps(cfg.norm_epsilon)
    elif arch == "stablelm":  # StableLMModel: a LayerNorm's eps
        writer.add_layer_norm_eps(cfg.layer_norm_eps)
    elif arch == "nemotron":  # NemotronModel: a LayerNorm's eps
        writer.add_layer_norm_eps(cfg.norm_eps)
    else:
        writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(rope_theta(cfg))
    if arch == "llama":
        writer.add_rope_dimension_count(head_dim)
    if arch == "nemotron":  # NemotronModel: the rotated part of a head, as int(rot_pct * n_embd) // n_head
        writer.add_rope_dimension_count(int(cfg.rope_parameters["partial_rotary_factor"] * cfg.hidden_size)
                                        // cfg.num_attention_heads)
    if arch == "stablelm":  # StableLMModel: the rotated part of a head, the block kind
        writer.add_rope_dimension_count(int(head_dim * cfg.rope_parameters.get("partial_rotary_factor", 0.25)))
        writer.add_parallel_residual(cfg.use_parallel_residual)
    if arch == "phi3":  # Phi3MiniModel: the rotated part of a head
        writer.add_rope_dimension_count(int(head_dim * cfg.rope_parameters.get("partial_rotary_factor", 1.0)))
    if arch == "phi3" and cfg.sliding_window is not None:
        writer.add_sliding_window(cfg.sliding_window)
    if arch == "phi3" and tokenizer is None:  # else transformers builds Phi-3's default pad id, 32000, past the vocab
        writer.add_pad_token_id(cfg.pad_token_id)
    scaling = cfg.rope_parameters if "rope_type" in cfg.rope_parameters else {}
    if scaling.get("rope_type") in ("linear", "yarn"):
        writer.add_rope_scaling_type(gguf.RopeScalingType(scaling["rope_type"]))
        writer.add_rope_scaling_factor(scaling["factor"])
        if scaling["rope_type"] == "yarn":
            writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    if arch in ("gemma2", "gemma3"):
        writer.add_sliding_window(cfg.sliding_window)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if arch == "gemma3":
        writer.add_sliding_window_pattern(cfg.sliding_window_pattern)
    if tokenizer is None:
        writer.add_vocab_size(cfg.vocab_size)
    else:
        add_tokenizer(writer, tokenizer)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quant == "Q8_0" else gguf.LlamaFileType.ALL_F32)
    gguf_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(gguf_arch, cfg.num_hidden_layers)
    tied = cfg.tie_word_embeddings
    generator = torch.Generator().manual_seed(7)
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight" and tied:
            continue
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = f"{names.get_name(base)}.{suffix}"
        t = t.detach().float().clone()
        if arch == "llama" and ".attn_q." in gguf_name:
            t = permute(t, cfg.num_attention_heads, cfg.num_attention_heads)
        elif arch == "llama" and ".attn_k." in gguf_name:
            t = permute(t, cfg.num_attention_heads, cfg.num_key_value_heads)
        if arch in ("gemma2", "gemma3", "nemotron") and gguf_name.endswith("norm.weight"):
            t = t + 1
        if pad_rows and gguf_name in ("token_embd.weight", "output.weight"):
            t = torch.cat([t, torch.randn(pad_rows, t.shape[1], generator=generator)])
        data = t.numpy()
        if raw_types and gguf_name in raw_types:
            kind = gguf.GGMLQuantizationType[raw_types[gguf_name]]
            block, size = gguf.GGML_QUANT_SIZES[kind]
            blocks = np.zeros((*data.shape[:-1], data.shape[-1] // block * size), dtype=np.uint8)
            writer.add_tensor(gguf_name, blocks, raw_dtype=kind)
        elif quant == "F16" and data.ndim == 2:
            writer.add_tensor(gguf_name, data.astype(np.float16))
        elif quant is not None and data.ndim == 2:
            kind = gguf.GGMLQuantizationType[quant]
            writer.add_tensor(gguf_name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name, data)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_gpt2_gguf(model: torch.nn.Module, path: Path, *, quant: str | None = None, name: str = "tiny") -> Path:
    """llama.cpp's GPT2Model (convert_hf_to_gguf.py): its metadata (d_ff stated as 4 * n_embd), the
    Conv1D weights transposed to [out, in], and `output` written as the (tied) embedding's copy."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_name(name)
    writer.add_block_count(cfg.n_layer)
    writer.add_context_length(cfg.n_positions)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_feed_forward_length(4 * cfg.n_embd)
    writer.add_head_count(cfg.n_head)
    writer.add_layer_norm_eps(cfg.layer_norm_epsilon)
    add_tokenizer(writer, numbered_vocabulary(cfg.vocab_size))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quant == "Q8_0" else gguf.LlamaFileType.ALL_F32)
    tensors: dict[str, torch.Tensor] = {}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, cfg.n_layer)
    for hf_name, t in model.state_dict().items():
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = f"{names.get_name(base)}.{suffix}"
        t = t.detach().float().clone()
        if hf_name.endswith((".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")):
            t = t.t().contiguous()
        tensors[gguf_name] = t
    return write_tensors(writer, tensors, quant, path)


def layer_norm_model_writer(path: Path, arch: str, cfg: Any, name: str, context: int, kv_heads: int,
                            quant: str | None) -> gguf.GGUFWriter:
    """The metadata llama.cpp's BloomModel and FalconModel both write: d_ff stated as 4 x hidden
    whatever config.json says, a LayerNorm eps, and (for transformers' GGUF loader, which reads the
    vocabulary size from it) a token list."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_context_length(context)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(4 * cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_eps(cfg.layer_norm_epsilon)
    add_tokenizer(writer, numbered_vocabulary(cfg.vocab_size))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quant == "Q8_0" else gguf.LlamaFileType.ALL_F32)
    return writer


def write_bloom_gguf(model: torch.nn.Module, path: Path, *, quant: str | None = None, name: str = "tiny") -> Path:
    """llama.cpp's BloomModel (convert_hf_to_gguf.py): the context length stated as n_embed when
    config.json has no seq_length, the per-head fused qkv
    ([q_h; k_h; v_h] for each head) reordered to [q | k | v] rows, weight and bias alike."""
    cfg = model.config
    n_head, n_embed = cfg.n_head, cfg.hidden_size
    writer = layer_norm_model_writer(path, "bloom", cfg, name, getattr(cfg, "seq_length", n_embed), n_head, quant)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BLOOM, cfg.n_layer)
    tensors: dict[str, torch.Tensor] = {}
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:  # not in a tied checkpoint's files
            continue
        base, _, suffix = hf_name.removeprefix("transformer.").rpartition(".")
        t = t.detach().float().clone()
        if base.endswith("query_key_value"):
            per_head = t.reshape(n_head, 3, n_embed // n_head, *t.shape[1:])
            t = torch.cat([per_head[:, i].reshape(n_embed, *t.shape[1:]) for i in range(3)])
        tensors[f"{names.get_name(base)}.{suffix}"] = t
    return write_tensors(writer, tensors, quant, path)


def falcon_kv_heads(cfg: Any) -> int:
    """The KV head count llama.cpp's converter finds in the original config.json: num_kv_heads where
    the layout uses it, else none stated (Falcon-7B's hub config), so 1; a multi-head file states
    num_kv_heads = the head count, as transformers saves it."""
    if cfg.new_decoder_architecture or not cfg.multi_query:
        return cfg.num_kv_heads
    return 1


def write_falcon_gguf(model: torch.nn.Module, path: Path, *, quant: str | None = None, name: str = "tiny",
                      extra: dict[str, torch.Tensor] | None = None) -> Path:
    """llama.cpp's FalconModel (convert_hf_to_gguf.py): 2048 positions whatever config.json says, no
    RoPE keys, the fused qkv reordered from Falcon's per-KV-group layout ([q heads of the group; k;
    v] per group) to [q | k | v] rows. `extra`: tensors a file might also hold, which llama.cpp's
    falcon does not run."""
    cfg = model.config
    n_head, hidden, n_kv = cfg.num_attention_heads, cfg.hidden_size, falcon_kv_heads(cfg)
    head_dim = hidden // n_head
    writer = layer_norm_model_writer(path, "falcon", cfg, name, 2048, n_kv, quant)
    writer.add_tensor_data_layout("jploski")
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.FALCON, cfg.num_hidden_layers)
    tensors: dict[str, torch.Tensor] = {}
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, _, suffix = hf_name.rpartition(".")
        t = t.detach().float().clone()
        if base.endswith("query_key_value"):
            qkv = t.view(n_kv, n_head // n_kv + 2, head_dim, hidden)
            kv_rows = n_kv * head_dim
            t = torch.cat((qkv[:, :-2].reshape(n_head * head_dim, hidden), qkv[:, [-2]].reshape(kv_rows, hidden),
                           qkv[:, [-1]].reshape(kv_rows, hidden)))
        tensors[f"{names.get_name(base)}.{suffix}"] = t
    return write_tensors(writer, {**tensors, **(extra or {})}, quant, path)


OWN_WRITERS = {"gpt2": write_gpt2_gguf, "bloom": write_bloom_gguf, "falcon": write_falcon_gguf}


def numbered_vocabulary(size: int) -> dict[str, Any]:
    """A token list of the model's size: transformers' GGUF loader reads GPT-2's, BLOOM's and Falcon's
    vocabulary size from it only."""
    return {"model": "gpt2", "tokens": [f"<{i}>" for i in range(size)], "types": [1] * size, "merges": [],
            "bos": 0, "eos": 1}


def write_tensors(writer: gguf.GGUFWriter, tensors: dict[str, torch.Tensor], quant: str | None, path: Path) -> Path:
    """Each tensor stored as llama.cpp's converter stores it: matrices (and stacks of them) as
    `quant` when given, vectors as F32; then the file."""
    for name, t in tensors.items():
        data = t.contiguous().numpy()
        if quant is not None and data.ndim >= 2:
            kind = gguf.GGMLQuantizationType[quant]
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_tokenizer(writer: gguf.GGUFWriter, tok: dict[str, Any]) -> None:
    writer.add_tokenizer_model(tok["model"])
    writer.add_tokenizer_pre(tok.get("pre", "default"))
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["types"])
    if "scores" in tok:
        writer.add_token_scores(tok["scores"])
    if "merges" in tok:
        writer.add_token_merges(tok["merges"])
    writer.add_bos_token_id(tok["bos"])
    writer.add_eos_token_id(tok["eos"])
    if "pad" in tok:
        writer.add_pad_token_id(tok["pad"])


def gguf_of(model_type: str, tmp: Path, seed: int = 0, overrides: dict[str, Any] | None = None,
            **write: Any) -> tuple[torch.nn.Module, Path]:
    model = build_model(model_type, seed, **{**FAMILIES[model_type], **(overrides or {})})
    name = "Mistral-tiny" if model_type == "mistral" else "tiny"
    return model, write_gguf(model, tmp / f"{model_type}.gguf", name=name, **write)


def imported_tensors(path: Path) -> dict[str, torch.Tensor]:
    source = open_source(path)
    try:
        return {name: source.tensors.get(name) for name in source.tensors.names()}
    finally:
        source.close()


@torch.no_grad()
def logits_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return out.logits if hasattr(out, "logits") else out


@torch.no_grad()
def transformers_gguf(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                attn_implementation="eager").eval()


# -- every family, F32: logits equal to the original model --------------------------------------


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_f32_gguf_matches_the_original_model(model_type: str, tmp_path: Path) -> None:
    model, path = gguf_of(model_type, tmp_path)
    ours = lmconvert.load(path, attention="eager")
    ids = token_batch(seq=40)
    diff = (logits_of(ours, ids) - logits_of(model, ids)).abs().max().item()
    assert diff <= FP32_MAX_ABS, f"{model_type}: max |Δlogit| {diff:.3e}"
    # exactly, Gemma too: in float32 (w + 1) - 1 need not be w, but for w in [-0.5, 1] the subtraction
    # is exact (Sterbenz), so 1 + ((w + 1) - 1) rounds to 1 + w, which is all a Gemma norm computes
    assert diff == 0.0, f"{model_type}: max |Δlogit| {diff:.3e}"


def test_phi3_window_is_read_and_partial_rotary_refused(tmp_path: Path) -> None:
    """llama.cpp's converter writes Phi-3's window (transformers' GGUF loader drops it; the window
    bites at 40 tokens, so reading it is what matches the original model); a rotary width below
    head_dim, which the metadata states but neither loader can express, is refused by name."""
    model, path = gguf_of("phi3", tmp_path, overrides=dict(sliding_window=4))
    assert lmconvert.load(path).cfg.sliding_window == 4
    ids = token_batch(seq=40)
    assert (logits_of(lmconvert.load(path, attention="eager"), ids) - logits_of(model, ids)).abs().max() <= FP32_MAX_ABS
    partial = dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})
    model = build_model("phi3", **{**FAMILIES["phi3"], **partial})
    code, _, err = cli("convert", write_gguf(model, tmp_path / "partial.gguf"), tmp_path / "out")
    assert code == 2 and "phi3.rope.dimension_count=8 differs from the head size 16" in err, err


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_config_is_what_the_metadata_says(model_type: str, tmp_path: Path) -> None:
    model, path = gguf_of(model_type, tmp_path)
    source = open_source(path)
    source.close()
    cfg = model.config
    assert source.format == "gguf" and source.config["model_type"] == model_type
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
                "intermediate_size", "max_position_embeddings", "tie_word_embeddings"):
        spelled = OWN_SPELLING.get(model_type, {}).get(key, key)
        assert source.config[spelled] == METADATA_DIFFERS.get(model_type, {}).get(key, getattr(cfg, key)), key
    assert source.info["gguf_architecture"] == LLAMA_CPP_ARCH[model_type]


# -- quantized: bit for bit what transformers' GGUF loader produces ------------------------------


@pytest.mark.parametrize("model_type", TRANSFORMERS_LOADS)
@pytest.mark.parametrize("quant", ["Q8_0", None])
def test_tensors_equal_transformers_gguf_loader(model_type: str, quant: str | None, tmp_path: Path) -> None:
    _, path = gguf_of(model_type, tmp_path, quant=quant, overrides=TRANSFORMERS_OVERRIDES.get(model_type))
    ours = imported_tensors(path)
    theirs = transformers_gguf(path).state_dict()
    assert set(ours) == set(theirs) - ({"lm_head.weight"} if "lm_head.weight" not in ours else set())
    for name, t in ours.items():
        assert t.dtype == torch.float32
        assert torch.equal(t, theirs[name]), f"{model_type} {quant}: {name} differs from transformers' import"


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_quantized_logits_equal_transformers_on_the_dequantized_weights(model_type: str, tmp_path: Path) -> None:
    model, path = gguf_of(model_type, tmp_path, quant="Q8_0")
    dequantized = imported_tensors(path)
    assert any(not torch.equal(dequantized[n], t) for n, t in model.state_dict().items() if n in dequantized)
    model.load_state_dict(dequantized, strict=False)  # transformers' own model on the imported weights
    ours = lmconvert.load(path, attention="eager")
    ids = token_batch(seq=40)
    diff = (logits_of(ours, ids) - logits_of(model, ids)).abs().max().item()
    assert diff == 0.0, f"{model_type}: max |Δlogit| {diff:.3e}"


def test_quantized_llama_logits_equal_transformers_gguf_loader(tmp_path: Path) -> None:
    _, path = gguf_of("llama", tmp_path, quant="Q8_0", overrides=TRANSFORMERS_OVERRIDES["llama"])
    ids = token_batch(seq=40)
    ours = logits_of(lmconvert.load(path, attention="eager"), ids)
    assert torch.equal(ours, logits_of(transformers_gguf(path), ids))


@pytest.mark.parametrize(("kind", "dtype"), [("F16", torch.float16), ("BF16", torch.bfloat16)])
def test_half_file_loads_in_its_half_type(kind: str, dtype: torch.dtype, tmp_path: Path) -> None:
    model, path = gguf_of("qwen2", tmp_path, quant=kind)
    tensors = imported_tensors(path)
    assert {t.dtype for t in tensors.values()} == {dtype}  # the F32 norms too: one dtype per file
    for name, t in model.state_dict().items():
        if name in tensors:
            assert torch.equal(tensors[name], t.to(dtype)), name
    theirs = transformers_gguf(path).state_dict()
    assert all(torch.equal(t, theirs[n].to(dtype)) for n, t in tensors.items())


# -- padded vocabulary, Llama 3 RoPE, CLI round trip -------------------------------------------------


def test_padded_vocab_rows_are_trimmed(tmp_path: Path) -> None:
    model = build_model("llama", 0, **FAMILIES["llama"])
    vocab = model.config.vocab_size
    tokens = [f"t{i}" for i in range(vocab)]
    tok = {"model": "gpt2", "tokens": tokens, "types": [1] * vocab, "merges": [], "bos": 1, "eos": 2}
    path = write_gguf(model, tmp_path / "padded.gguf", pad_rows=16, tokenizer=tok)
    assert gguf.GGUFReader(path).get_tensor(0).shape.tolist()[-1] == vocab + 16
    ours = lmconvert.load(path, attention="eager")
    assert ours.cfg.vocab_size == vocab
    ids = token_batch(seq=40)
    assert torch.equal(logits_of(ours, ids), logits_of(model, ids))


@pytest.mark.parametrize(("model_type", "scaling"), [
    ("llama", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    ("qwen2", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}),
])
def test_rope_scaling_from_metadata(model_type: str, scaling: dict[str, Any], tmp_path: Path) -> None:
    model = build_model(model_type, 0, rope_parameters=scaling)
    path = write_gguf(model, tmp_path / "scaled.gguf")
    ours = lmconvert.load(path, attention="eager")
    assert ours.cfg.rope.scaling == scaling["rope_type"] and ours.cfg.rope.factor == scaling["factor"]
    ids = token_batch(seq=60)
    assert torch.equal(logits_of(ours, ids), logits_of(model, ids))


def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tmp_path: Path) -> None:
    scaling = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    model = build_model("llama", 0, max_position_embeddings=128, rope_parameters=scaling)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    factors = llama3_factors(10000.0, head_dim, 8.0, 1.0, 4.0, 8192)
    assert factors.max() == 8.0 and factors.min() == 1.0 and ((factors > 1) & (factors < 8)).any()
    path = write_gguf(model, tmp_path / "llama3.gguf", rope_freqs=factors)
    source = open_source(path)
    source.close()
    assert source.config["rope_scaling"] == {k: v for k, v in scaling.items() if k != "rope_theta"}
    ours = lmconvert.load(path, attention="eager")
    ids = token_batch(seq=40)
    assert torch.equal(logits_of(ours, ids), logits_of(model, ids))


def test_llama3_factors_match_transformers_inv_freq() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theta, head_dim = 500000.0, 128
    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, max_position_embeddings=131072,
                         rope_parameters={"rope_type": "llama3", "rope_theta": theta, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factors = torch.from_numpy(llama3_factors(theta, head_dim, 8.0, 1.0, 4.0, 8192))
    assert torch.allclose(base / factors, inv_freq, rtol=1e-6, atol=0)
    assert ((factors > 1) & (factors < 8)).any()  # the smooth band is exercised


@pytest.mark.parametrize("model_type", ["llama", "bloom", "falcon"])
def test_cli_convert_verify_export(model_type: str, tmp_path: Path) -> None:
    _, path = gguf_of(model_type, tmp_path, quant="Q8_0", overrides=TRANSFORMERS_OVERRIDES.get(model_type))
    code, _, err = cli("convert", path, tmp_path / "canonical")
    assert code == 0, err
    meta = json.loads((tmp_path / "canonical" / "lmconvert.json").read_text())
    assert meta["source"]["format"] == "gguf" and meta["source"]["gguf_tensor_types"]["Q8_0"] > 0
    code, out, err = cli("verify", tmp_path / "canonical", "--seq-len", "40", "--json", "-")  # vs the recorded GGUF
    assert code == 0, err + out
    assert json.loads(out)["max_abs"] == 0.0
    code, _, err = cli("convert", tmp_path / "canonical", tmp_path / "hf", "--to", "hf")
    assert code == 0, err
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    ids = token_batch(seq=40)
    assert torch.equal(logits_of(exported, ids), logits_of(transformers_gguf(path), ids))


def test_directory_holding_one_gguf(tmp_path: Path) -> None:
    _, path = gguf_of("qwen2", tmp_path)
    source = open_source(tmp_path)
    source.close()
    assert source.path == path
    write_gguf(build_model("qwen2", 1, **FAMILIES["qwen2"]), tmp_path / "other.gguf")
    code, _, err = cli("convert", tmp_path, tmp_path.parent / "out-two")
    assert code == 2 and "holds 2 .gguf files" in err and len(err.strip().splitlines()) == 1


# -- bad files: exit 2, one line ----------------------------------------------------------------


def one_line_error(path: Path, out: Path) -> str:
    code, _, err = cli("convert", path, out)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert not out.exists()
    return lines[0]


def test_bad_magic(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    line = one_line_error(path, tmp_path / "out")
    assert str(path) in line and "not a GGUF file" in line


def test_truncated_file(tmp_path: Path) -> None:
    _, path = gguf_of("llama", tmp_path)
    data = path.read_bytes()
    for cut in (len(data) // 2, 200):
        short = tmp_path / f"short{cut}.gguf"
        short.write_bytes(data[:cut])
        line = one_line_error(short, tmp_path / f"out{cut}")
        assert str(short) in line and ("truncated" in line or "not a readable GGUF" in line)


def test_unsupported_quant_type_is_named(tmp_path: Path) -> None:
    model = build_model("llama", 0)  # Q8_1: a type GGUF can hold and gguf cannot dequantize
    path = write_gguf(model, tmp_path / "q81.gguf", raw_types={"blk.0.ffn_down.weight": "Q8_1"})
    line = one_line_error(path, tmp_path / "out")
    assert "Q8_1" in line and "blk.0.ffn_down.weight" in line


def test_unsupported_architecture(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "rwkv6.gguf"), "rwkv6")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    line = one_line_error(tmp_path / "rwkv6.gguf", tmp_path / "out")
    assert "'rwkv6' is not supported" in line


# -- tokenizers travel ------------------------------------------------------------------------------


def bpe_tokenizer() -> dict[str, Any]:
    """A byte-level BPE trained on a few lines, as llama.cpp writes a "gpt2" vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT, "The capital of France is Paris.", "def f(x): return x + 1"] * 4, trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    types = [3 if t.startswith("<|") else 1 for t in tokens]
    return {"model": "gpt2", "pre": "qwen2", "tokens": tokens, "types": types, "merges": merges,
            "bos": 1, "eos": 2, "pad": 0}


def spm_tokenizer() -> dict[str, Any]:
    """A sentencepiece-style vocabulary with byte fallback, as llama.cpp writes a "llama" one:
    <unk>, <s>, </s>, the 256 byte tokens, then pieces by score."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False)
    tok.train_from_iterator([TEXT, "The capital of France is Paris.", "def f(x): return x + 1"] * 4, trainer)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    types = [2 if t == "<unk>" else 3 if t in ("<s>", "</s>") else 6 if t.startswith("<0x") else 1 for t in tokens]
    scores = [0.0 if i < len(specials) else -float(i) for i in range(len(tokens))]
    return {"model": "llama", "tokens": tokens, "types": types, "scores": scores, "bos": 1, "eos": 2}


@pytest.mark.parametrize("make", [bpe_tokenizer, spm_tokenizer], ids=["gpt2-bpe", "llama-spm"])
def test_tokenizer_travels(make: Any, tmp_path: Path) -> None:
    tok = make()
    model = build_model("llama", 0, vocab_size=len(tok["tokens"]))
    path = write_gguf(model, tmp_path / "tok.gguf", tokenizer=tok)
    code, _, err = cli("convert", path, tmp_path / "canonical")
    assert code == 0, err
    source_tok = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    output_tok = AutoTokenizer.from_pretrained(str(tmp_path / "canonical"))
    ids = source_tok(TEXT).input_ids
    assert output_tok(TEXT).input_ids == ids
    assert len(ids) < len(TEXT.encode())  # real merges, not bytes
    assert output_tok.decode(ids, skip_special_tokens=True) == source_tok.decode(ids, skip_special_tokens=True)
    assert output_tok.all_special_tokens == source_tok.all_special_tokens
    assert (output_tok.bos_token, output_tok.eos_token) == (tok["tokens"][1], tok["tokens"][2])
    generation = json.loads((tmp_path / "canonical" / "generation_config.json").read_text())
    assert generation["bos_token_id"] == 1 and generation["eos_token_id"] == 2
    code, out, err = cli("generate", tmp_path / "canonical", "--prompt", "The capital", "--max-new-tokens", "4")
    assert code == 0 and out.startswith("The capital"), err


def test_metadata_that_contradicts_the_weights_is_refused(tmp_path: Path) -> None:
    path = write_gguf(build_model("qwen2", 0), tmp_path / "q.gguf")
    reader = gguf.GGUFReader(path, "r+")
    field = reader.fields["qwen2.attention.key_length"]
    field.parts[field.data[0]][0] = 8  # head size 8, for weights shaped for 16
    field = reader.fields["qwen2.attention.value_length"]
    field.parts[field.data[0]][0] = 8
    reader.data.flush()
    del reader, field
    line = one_line_error(path, tmp_path / "out")
    assert "q_proj" in line and "shape" in line


def test_reading_is_lazy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, path = gguf_of("llama", tmp_path, quant="Q8_0")
    calls: list[int] = []
    real = gguf_format._dequantized  # each quantized tensor read, whichever code dequantizes it
    monkeypatch.setattr(gguf_format, "_dequantized", lambda *a, **k: calls.append(1) or real(*a, **k))
    source = open_source(path)
    try:
        opened = len(calls)
        source.tensors.get("model.layers.0.self_attn.q_proj.weight")
        assert len(calls) == opened + 1
    finally:
        source.close()
    assert opened == 0  # opening reads no tensor (the quant type's probe is one block through gguf)


def test_stablelm_parallel_residual_is_read(tmp_path: Path) -> None:
    """`stablelm.use_parallel_residual`, which llama.cpp's converter writes and transformers' GGUF
    loader does not read: ours does, so a parallel StableLM imports as itself."""
    model, path = gguf_of("stablelm", tmp_path, overrides={"use_parallel_residual": True})
    assert open_source(path).config["use_parallel_residual"] is True
    ids = token_batch(seq=40)
    assert (logits_of(lmconvert.load(path, attention="eager"), ids) - logits_of(model, ids)).abs().max() == 0.0


def test_stablelm_qk_layernorm_is_refused_by_name(tmp_path: Path) -> None:
    """llama.cpp's StableLMModel stacks each layer's per-head QK LayerNorms into `attn_q_norm` /
    `attn_k_norm` ([heads, head_dim]) and runs them; transformers' GGUF loader neither sets
    `qk_layernorm` nor maps those tensors, so it loads the model without them. With nothing to
    check an import against, lmconvert refuses such a file, naming the tensor."""
    model = build_model("stablelm", **{**FAMILIES["stablelm"], "qk_layernorm": True})
    stacked = {name: t for name, t in model.state_dict().items() if "layernorm.norms." not in name}
    for i, layer in enumerate(model.model.layers):
        for which in ("q_layernorm", "k_layernorm"):  # convert_hf_to_gguf.py's StableLMModel._stack_qk_norm
            norms = getattr(layer.self_attn, which).norms
            stacked[f"model.layers.{i}.self_attn.{which}.weight"] = torch.stack([n.weight for n in norms])
    path = write_gguf(SimpleNamespace(config=model.config, state_dict=lambda: stacked), tmp_path / "qk.gguf")
    written = {t.name for t in gguf.GGUFReader(str(path)).tensors}
    assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= written
    assert transformers_gguf(path).config.qk_layernorm is False  # the loader's model has no QK norms
    line = one_line_error(path, tmp_path / "out")
    assert "holds blk.0.attn_q_norm.weight: per-head QK LayerNorms, StableLM's qk_layernorm=true" in line
    assert "transformers' GGUF loader does not read" in line and str(path) in line


# Falcon's layouts llama.cpp's falcon runs (every one parallel): transformers' GGUF loader reads each
# file as Falcon-7B's, so these are checked against the original model
FALCON_LAYOUTS: dict[str, tuple[dict[str, Any], str, int]] = {  # overrides, norm placement, KV heads
    "7b": ({}, "parallel_shared", 1),
    "40b": (dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=2, tie_word_embeddings=False),
            "parallel_separate", 2),
    "11b": (dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1), "parallel_shared", 2),
    "multi-head": (dict(multi_query=False, num_kv_heads=4), "parallel_shared", 4),
}


@pytest.mark.parametrize("layout", list(FALCON_LAYOUTS))
def test_falcon_layouts_import_as_themselves(layout: str, tmp_path: Path) -> None:
    overrides, placement, kv_heads = FALCON_LAYOUTS[layout]
    model, path = gguf_of("falcon", tmp_path, overrides=overrides)
    ours = lmconvert.load(path, attention="eager")
    assert (ours.cfg.norm_placement, ours.cfg.n_kv_heads) == (placement, kv_heads)
    assert ours.cfg.tie_embeddings == model.config.tie_word_embeddings
    ids = token_batch(seq=40)
    assert (logits_of(ours, ids) - logits_of(model, ids)).abs().max().item() == 0.0


def test_verify_of_a_falcon_layout_transformers_misreads_asks_for_the_reference(tmp_path: Path) -> None:
    """transformers' GGUF loader builds every Falcon file as Falcon-7B's layout: for the others,
    verify needs the original (--reference), as for the architectures it does not read."""
    _, path = gguf_of("falcon", tmp_path, overrides=FALCON_LAYOUTS["40b"][0])
    code, _, err = cli("verify", path, "--seq-len", 20)
    assert code == 2 and "transformers' GGUF loader does not read falcon in this file's layout" in err, err
    assert "records no source; pass --reference SRC" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(("extra", "fragment"), [
    ("blk.0.attn_qkv.bias", "linear biases, Falcon's bias=true"),
    ("blk.0.ffn_norm.weight", "a sequential block, Falcon's parallel_attn=false"),
])
def test_falcon_layouts_llama_cpp_does_not_run_are_refused_by_name(extra: str, fragment: str, tmp_path: Path) -> None:
    """Falcon-RW's sequential blocks and linear biases: llama.cpp's falcon has neither (nor ALiBi,
    which no GGUF key can state), so a file holding their tensors is refused, naming them."""
    model = build_model("falcon", **FAMILIES["falcon"])
    rows = model.transformer.h[0].self_attention.query_key_value.out_features
    tensor = torch.zeros(rows if "qkv" in extra else model.config.hidden_size)
    path = write_falcon_gguf(model, tmp_path / "rw.gguf", extra={extra: tensor})
    line = one_line_error(path, tmp_path / "out")
    assert f"holds {extra}: {fragment}" in line and str(path) in line
