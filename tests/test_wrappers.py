"""Multimodal wrappers read as their text decoder (#24): Mistral3ForConditionalGeneration (mistral),
GotOcr2ForConditionalGeneration (qwen2), MossTranscribeDiarizeForConditionalGeneration (qwen3) and
Phi4MultimodalForCausalLM (phi3), each a tiny transformers model with tiny towers and every
parameter perturbed. For each: the text path's logits equal transformers' wrapper's, convert gives
the text family's canonical checkpoint (the towers recorded as dropped) and its text-only
CausalLM, `inspect` and `convert` say the wrapper's note once, and `verify` of the canonical
checkpoint passes against the wrapper. Then what each refuses by name."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from click.testing import CliRunner
from family_specs import FP32_TOL, IDS, SPECS, WINDOW
from hf_models import build_model, edited_weights, load_reference, perturb, save_checkpoint, tensors_of

import lmconvert
from lmconvert.cli import main
from lmconvert.convert import to_canonical, to_hf
from lmconvert.formats.errors import InputError
from lmconvert.mappings import FAMILIES, MappingError, family_for
from lmconvert.verify.run import verify

TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)


def mistral3(**top: Any) -> transformers.PreTrainedConfig:
    return transformers.Mistral3Config(
        text_config=dict(model_type="mistral", head_dim=16, sliding_window=WINDOW, **TEXT),
        vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, head_dim=8, image_size=28, patch_size=14),
        image_token_index=5, **top)


def mistral3_ministral3(**top: Any) -> transformers.PreTrainedConfig:
    """Ministral 3 as published: the wrapper around a ministral3 decoder (YaRN over 8 positions, so the query
    scale bites on IDS)."""
    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 8,
            "llama_4_scaling_beta": 0.1}
    return transformers.Mistral3Config(
        text_config=dict(model_type="ministral3", head_dim=16, rope_parameters=rope,
                         **{**TEXT, "max_position_embeddings": 32}),
        vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, head_dim=8, image_size=28, patch_size=14),
        image_token_index=5, **top)


def got_ocr2(**top: Any) -> transformers.PreTrainedConfig:
    return transformers.GotOcr2Config(
        text_config=dict(model_type="qwen2", **TEXT),
        vision_config=dict(hidden_size=16, output_channels=8, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=16, mlp_dim=32, window_size=2, global_attn_indexes=[0]),
        image_token_index=5, **top)


def moss(**top: Any) -> transformers.PreTrainedConfig:
    return transformers.MossTranscribeDiarizeConfig(
        text_config=dict(model_type="qwen3", head_dim=16, attention_bias=True, **TEXT),
        audio_config=dict(d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
                          num_mel_bins=8, max_source_positions=16),
        audio_token_id=5, **top)


def phi4(**top: Any) -> transformers.PreTrainedConfig:
    return transformers.Phi4MultimodalConfig(
        **TEXT, partial_rotary_factor=0.75, bos_token_id=1, eos_token_id=2,  # Phi-4-multimodal rotates 3/4
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14, crop_size=28, feature_layer=-1),
        audio_config=dict(hidden_size=16, intermediate_size=32, num_blocks=1, num_attention_heads=2, input_size=8,
                          nemo_conv_channels=8, chunk_size=-1, left_chunk=-1, kernel_size=3, ext_pw_out_channel=16,
                          depthwise_seperable_out_channel=16, depthwise_multiplier=1, time_reduction=2,
                          nemo_final_size=2, bias_max_distance=10),
        **top)


def llama4(text: dict[str, Any] | None = None, **top: Any) -> transformers.PreTrainedConfig:
    """Llama 4 as published (Scout, Maverick): the wrapper around a llama4_text decoder, the family spec's
    (chunks of 8 positions, NoPE layers' query temperature, input-weighted experts), its experts on layers 0 and 2
    (layer 1's dense MLP is a point the verify test looks for), or `text`'s."""
    return transformers.Llama4Config(
        text_config=dict(model_type="llama4_text",
                         **(text or {**TEXT, **SPECS["llama4_text"].kwargs, "moe_layers": [0, 2]})),
        vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                           vision_output_dim=16, image_size=28, patch_size=14, projector_input_dim=16,
                           projector_output_dim=16),
        image_token_index=5, **top)


QWEN3_5_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=14,
                      temporal_patch_size=2, spatial_merge_size=1, num_position_embeddings=16)


def qwen3_5(text: dict[str, Any] | None = None, **top: Any) -> transformers.PreTrainedConfig:
    """Qwen3.5 as published: the wrapper around the spec's qwen3_5_text decoder (gated delta-net layers)."""
    return transformers.Qwen3_5Config(text_config=dict(model_type="qwen3_5_text", **{**TEXT,
                                                                                       **SPECS["qwen3_5_text"].kwargs,
                                                                                       **(text or {})}),
                                      vision_config=QWEN3_5_VISION, **top)


def qwen3_5_moe(text: dict[str, Any] | None = None, **top: Any) -> transformers.PreTrainedConfig:
    return transformers.Qwen3_5MoeConfig(
        text_config=dict(model_type="qwen3_5_moe_text", **{**TEXT, **SPECS["qwen3_5_moe_text"].kwargs, **(text or {})}),
        vision_config=QWEN3_5_VISION, **top)


def gemma4_unified(**top: Any) -> transformers.PreTrainedConfig:
    """Gemma 4 unified as published: the wrapper around a gemma4_unified_text decoder, the family spec's (per-layer
    geometry, K = V, KV sharing), with tiny vision and audio embedders (saved under the Hub's `vision_embedder.`)."""
    return transformers.Gemma4UnifiedConfig(
        text_config=dict(model_type="gemma4_unified_text", **{**TEXT, **SPECS["gemma4_unified_text"].kwargs}),
        vision_config=dict(patch_size=4, pooling_kernel_size=2, mm_embed_dim=64, mm_posemb_size=16,
                           output_proj_dims=64),
        # the placeholder ids past the vocabulary: transformers reads a placeholder in the text as padding
        audio_config=dict(audio_embed_dim=16), image_token_id=1000, boi_token_id=1001, eoi_token_id=1002,
        video_token_id=1003, boa_token_id=1004, eoa_token_index=1005, audio_token_id=1006, **top)


# wrapper model_type (and ":" its text decoder's, where another family reads that one) -> (config,
# transformers class, text family, its CausalLM, the towers' first names, what the
# note says is left out)
WRAPPERS: dict[str, tuple[Callable[..., Any], str, str, str, tuple[str, ...], str]] = {
    "mistral3": (mistral3, "Mistral3ForConditionalGeneration", "mistral", "MistralForCausalLM",
                 ("vision_tower.", "multi_modal_projector."), "the vision tower and multi-modal projector"),
    "mistral3:ministral3": (mistral3_ministral3, "Mistral3ForConditionalGeneration", "ministral3",
                            "Ministral3ForCausalLM", ("vision_tower.", "multi_modal_projector."),
                            "the vision tower and multi-modal projector"),
    "got_ocr2": (got_ocr2, "GotOcr2ForConditionalGeneration", "qwen2", "Qwen2ForCausalLM",
                 ("vision_tower.", "multi_modal_projector."), "the vision tower and multi-modal projector"),
    "moss_transcribe_diarize": (moss, "MossTranscribeDiarizeForConditionalGeneration", "qwen3", "Qwen3ForCausalLM",
                                ("model.audio_tower.", "model.multi_modal_projector."),
                                "the audio tower and multi-modal projector"),
    "phi4_multimodal": (phi4, "Phi4MultimodalForCausalLM", "phi3", "Phi3ForCausalLM",
                        ("model.embed_tokens_extend.image_embed.", "model.embed_tokens_extend.audio_embed."),
                        "the image and audio embedders"),
    "llama4": (llama4, "Llama4ForConditionalGeneration", "llama4_text", "Llama4ForCausalLM",
               ("vision_model.", "multi_modal_projector."), "the vision model and multi-modal projector"),
    "qwen3_5": (qwen3_5, "Qwen3_5ForConditionalGeneration", "qwen3_5_text", "Qwen3_5ForCausalLM", ("model.visual.",),
                "the vision tower and its patch merger"),
    "qwen3_5_moe": (qwen3_5_moe, "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM",
                    ("model.visual.",), "the vision tower and its patch merger"),
    "gemma4_unified": (gemma4_unified, "Gemma4UnifiedForConditionalGeneration", "gemma4_unified_text",
                       "Gemma4UnifiedForCausalLM",
                       ("model.vision_embedder.", "model.embed_audio.", "model.embed_vision."),
                       "the vision and audio embedders"),
}


def wrapper_type(name: str) -> str:
    return name.split(":")[0]


def build(name: str, directory: Path, **top: Any) -> tuple[Path, torch.Tensor]:
    """A tiny perturbed wrapper saved by transformers, and its logits on IDS."""
    make, cls = WRAPPERS[name][:2]
    torch.manual_seed(0)
    model = getattr(transformers, cls)._from_config(make(**top), attn_implementation="eager").eval()
    perturb(model)
    model.save_pretrained(directory)
    with torch.no_grad():
        return directory, model(IDS).logits.float()


def wrapper_logits(directory: Path) -> torch.Tensor:
    """transformers' own wrapper, loaded from the directory as its config.json names it."""
    cls = json.loads((directory / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, cls).from_pretrained(directory, attn_implementation="eager",
                                                       dtype=torch.float32).eval()
    with torch.no_grad():
        return model(IDS).logits.float()


@torch.no_grad()
def our_logits(path: Path) -> torch.Tensor:
    return lmconvert.load(path, attention="eager")(IDS).float()


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def edited_config(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


@pytest.fixture(scope="module", params=list(WRAPPERS))
def wrapper(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, torch.Tensor]:
    name = request.param
    directory, logits = build(name, tmp_path_factory.mktemp(name) / "hf")
    return name, directory, logits


def test_the_text_path_matches_transformers_wrapper(wrapper: tuple[str, Path, torch.Tensor]) -> None:
    name, src, ref = wrapper
    _, _, family, _, towers, _ = WRAPPERS[name]
    config = json.loads((src / "config.json").read_text())
    assert config["model_type"] == wrapper_type(name)
    names = list(tensors_of(src))
    assert all(any(n.startswith(tower) for n in names) for tower in towers)  # the towers are in the files
    assert family_for(wrapper_type(name), config) is FAMILIES[family]
    assert family_for(family) is FAMILIES[family]  # the text type is still its own family's
    assert max_abs(wrapper_logits(src), ref) <= FP32_TOL  # what was saved is what transformers loads
    assert max_abs(our_logits(src), ref) <= FP32_TOL


def test_convert_gives_the_text_family_and_its_causal_lm(wrapper: tuple[str, Path, torch.Tensor],
                                                        tmp_path: Path) -> None:
    name, src, ref = wrapper
    _, _, family, architecture, towers, _ = WRAPPERS[name]
    meta = to_canonical(src, tmp_path / "canon")
    assert meta.family == family and meta.source["model_type"] == wrapper_type(name)
    dropped = meta.source["dropped_tensors"]
    assert dropped and all(n.startswith(towers) for n in dropped)
    assert all(any(n.startswith(tower) for n in dropped) for tower in towers)
    assert max_abs(our_logits(tmp_path / "canon"), ref) <= FP32_TOL
    to_hf(tmp_path / "canon", tmp_path / "text")
    config = json.loads((tmp_path / "text" / "config.json").read_text())
    assert config["architectures"] == [architecture] and config["model_type"] == family
    assert all(not n.startswith(towers) for n in tensors_of(tmp_path / "text"))
    text = getattr(transformers, architecture).from_pretrained(tmp_path / "text", attn_implementation="eager",
                                                               dtype=torch.float32).eval()
    with torch.no_grad():
        assert max_abs(text(IDS).logits, ref) <= FP32_TOL


def test_inspect_and_convert_say_the_note_once(wrapper: tuple[str, Path, torch.Tensor], tmp_path: Path) -> None:
    name, src, _ = wrapper
    note = FAMILIES[WRAPPERS[name][2]].note_for(wrapper_type(name))
    assert note.startswith(f"{WRAPPERS[name][1]} (model_type {wrapper_type(name)}): only the text decoder is read; ")
    assert note.endswith(f"{WRAPPERS[name][5]} are left out")
    for args in (["inspect", str(src)], ["convert", str(src), str(tmp_path / "said")]):
        said = CliRunner().invoke(main, args)
        assert said.exit_code == 0, said.output
        assert said.output.count(note) == 1, said.output


def test_verify_of_the_canonical_checkpoint_runs_the_wrapper(wrapper: tuple[str, Path, torch.Tensor],
                                                            tmp_path: Path) -> None:
    name, src, _ = wrapper
    to_canonical(src, tmp_path / "canon")
    report = verify(tmp_path / "canon", seq_len=16, generate=2)
    assert report.passed, report
    assert report.reference is not None and Path(report.reference).resolve() == src.resolve()
    names = {p.name for p in report.points}
    assert {"embed", "layers.1", "layers.1.attn.q", "final_norm"} <= names
    assert {"layers.1.mlp.down", "layers.1.mlp.experts"} & names  # dense, or a mixture's (Qwen3.5-MoE's)


# ------------------------------------------------------------------------------------------------ tying
def test_llama4_converts_to_gguf_as_its_text_decoder(tmp_path: Path) -> None:
    """`convert WRAPPER X.gguf` in one step: llama.cpp's llama4 text model (the towers dropped), which lmconvert
    reads back as the wrapper's text path; the spec's GGUF model, as llama.cpp's llama4 hard-codes it."""
    spec = SPECS["llama4_text"]
    src, ref = build("llama4", tmp_path / "hf", text={**TEXT, **spec.kwargs, **spec.gguf, "num_hidden_layers": 4})
    said = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "m.gguf"), "--quant", "f32"])
    assert said.exit_code == 0, said.output
    assert max_abs(our_logits(tmp_path / "m.gguf"), ref) <= FP32_TOL


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_converts_to_gguf_as_its_text_decoder(name: str, tmp_path: Path) -> None:
    """The published Qwen3.5 wrappers in one step: llama.cpp's qwen35 / qwen35moe text model (the vision tower
    dropped), read back as the wrapper's text path; the spec's GGUF model (tests/test_llamacpp.py runs it)."""
    src, ref = build(name, tmp_path / "hf", text=SPECS[WRAPPERS[name][2]].gguf)
    said = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "m.gguf"), "--quant", "f32"])
    assert said.exit_code == 0, said.output
    assert max_abs(our_logits(tmp_path / "m.gguf"), ref) <= FP32_TOL


def test_a_wrapper_written_before_transformers_5_keeps_its_own_head(tmp_path: Path) -> None:
    """Mistral Small 3.1 / 3.2 as published state `tie_word_embeddings` nowhere and hold their own
    `language_model.lm_head.weight`: transformers 5, whose Mistral3Config ties by default, keeps a
    stored head that differs from the embeddings, and so does the import."""
    src, ref = build("mistral3", tmp_path / "untied", tie_word_embeddings=False)
    assert "language_model.lm_head.weight" in tensors_of(src)

    def published(config: dict[str, Any]) -> None:
        del config["tie_word_embeddings"]
        config["text_config"].pop("tie_word_embeddings", None)

    old = edited_config(src, tmp_path / "published", published)
    assert max_abs(wrapper_logits(old), ref) <= FP32_TOL
    assert lmconvert.load(old).cfg.tie_embeddings is False
    assert max_abs(our_logits(old), ref) <= FP32_TOL


def test_any_tying_config_with_a_stored_head_is_read_as_transformers_5_reads_it(tmp_path: Path) -> None:
    """Not only wrappers: transformers 5 keeps a stored LM head that differs from the embeddings
    whatever config.json says of tying, and so does the import."""
    src = save_checkpoint(build_model("llama", tie_word_embeddings=False), tmp_path / "untied")
    tied = edited_config(src, tmp_path / "says-tied", lambda config: config.update(tie_word_embeddings=True))
    with torch.no_grad():
        ref = load_reference(src)(IDS).logits
        assert max_abs(load_reference(tied)(IDS).logits, ref) == 0.0
    assert lmconvert.load(tied).cfg.tie_embeddings is False
    assert max_abs(our_logits(tied), ref) <= FP32_TOL


@pytest.mark.parametrize("name", ["mistral3", "got_ocr2", "moss_transcribe_diarize"])
def test_the_top_level_tying_wins(name: str) -> None:
    """transformers 5 writes both keys and reads the wrapper's (true when absent): a tied Mistral3
    is saved tied at the top level and untied in text_config."""
    family = FAMILIES[WRAPPERS[name][2]]
    config = WRAPPERS[name][0]().to_dict()
    for top, text, tied in ((True, False, True), (False, True, False), (None, False, True)):
        config["text_config"]["tie_word_embeddings"] = text
        if top is None:
            config.pop("tie_word_embeddings")
        else:
            config["tie_word_embeddings"] = top
        assert family.arch_config(config).tie_embeddings is tied
    config["tie_word_embeddings"] = None
    with pytest.raises(MappingError, match="tie_word_embeddings=null"):
        family.arch_config(config)


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(("name", "text_type", "says"), [
    ("mistral3", "mistral4", "text_config.model_type=\"mistral4\": lmconvert reads mistral3 only around a "
                             "mistral text decoder"),
    ("mistral3:ministral3", "mistral", "reads mistral3 only around a ministral3 text decoder"),
    ("got_ocr2", "llama", "reads got_ocr2 only around a qwen2 text decoder"),
    ("moss_transcribe_diarize", "qwen2", "reads moss_transcribe_diarize only around a qwen3 text decoder"),
    ("llama4", "llama", "reads llama4 only around a llama4_text text decoder"),
    ("qwen3_5", "qwen3_next", "reads qwen3_5 only around a qwen3_5_text text decoder"),
    ("qwen3_5_moe", "qwen3_5_text", "reads qwen3_5_moe only around a qwen3_5_moe_text text decoder"),
])
def test_another_text_decoder_is_refused_by_name(name: str, text_type: str, says: str) -> None:
    family = FAMILIES[WRAPPERS[name][2]]
    config = WRAPPERS[name][0]().to_dict()
    config["text_config"]["model_type"] = text_type
    with pytest.raises(MappingError, match=says.replace("(", r"\(")):
        family.arch_config(config)
    config["text_config"] = "qwen3"
    with pytest.raises(MappingError, match=f"text_config=\"qwen3\" should be a JSON object \\(the "
                                           f"{wrapper_type(name)} model's"):
        family.arch_config(config)


def test_phi4_multimodal_lora_weights_are_refused_by_name(tmp_path: Path) -> None:
    """Phi-4-multimodal's vision and speech LoRA adapters live in their own folders, which
    transformers applies only on request; a LoRA-wrapped projection in the weights themselves (the
    original phi4mm layout) is one transformers' Phi4Multimodal does not load: refused, named."""
    src, _ = build("phi4_multimodal", tmp_path / "hf")

    def wrap(tensors: dict[str, torch.Tensor]) -> None:
        weight = tensors.pop("model.layers.1.self_attn.qkv_proj.weight")
        tensors["model.layers.1.self_attn.qkv_proj.base_layer.weight"] = weight
        tensors["model.layers.1.self_attn.qkv_proj.lora_A.vision.weight"] = torch.zeros(4, weight.shape[1])

    lora = edited_weights(src, tmp_path / "lora", wrap)
    with pytest.raises(InputError, match="is a LoRA-wrapped projection .*merge or remove the adapters first"):
        lmconvert.load(lora)
    said = CliRunner().invoke(main, ["inspect", str(lora)])
    assert said.exit_code != 0 and "LoRA-wrapped projection" in said.output + said.stderr


def test_phi4_multimodal_reads_its_own_defaults() -> None:
    """Phi4MultimodalConfig's defaults differ from Phi3Config's in three keys; a phi3 file keeps Phi-3's."""
    phi3 = FAMILIES["phi3"]
    minimal = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 16}
    wrapped = phi3.arch_config({"model_type": "phi4_multimodal", **minimal})
    expected = transformers.Phi4MultimodalConfig(**minimal)
    assert (wrapped.vocab_size, wrapped.n_kv_heads, wrapped.max_positions) == \
        (expected.vocab_size, expected.num_key_value_heads, expected.max_position_embeddings)
    plain = phi3.arch_config({"model_type": "phi3", **minimal})
    assert (plain.vocab_size, plain.n_kv_heads, plain.max_positions) == (32064, 16, 4096)


def test_mistral3_is_read_by_the_family_of_its_text_decoder() -> None:
    """Mistral3ForConditionalGeneration wraps a mistral decoder (Mistral Small 3.1, 3.2; the class's default when
    text_config names none) or a ministral3 one (Ministral 3): each is read by that decoder's family."""
    config = mistral3_ministral3().to_dict()
    assert family_for("mistral3", config) is FAMILIES["ministral3"]
    assert family_for("mistral3", {**config, "text_config": None}) is FAMILIES["mistral"]
    assert family_for("mistral3", mistral3().to_dict()) is FAMILIES["mistral"]
    assert family_for("mistral3") is FAMILIES["mistral"]


def gemma4(**text: Any) -> transformers.PreTrainedConfig:
    """Gemma 4 (Gemma4ForConditionalGeneration) around the gemma4_text spec's decoder, without towers."""
    return transformers.Gemma4Config(
        text_config=dict(model_type="gemma4_text", **{**TEXT, **SPECS["gemma4_text"].kwargs, **text}),
        vision_config=None, audio_config=None, image_token_id=1000, boi_token_id=1001, eoi_token_id=1002,
        video_token_id=1003, boa_token_id=1004, eoa_token_index=1005, audio_token_id=1006)


MOE = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32}


@pytest.mark.parametrize("text", [{}, MOE], ids=["dense", "moe"])
def test_gemma4_is_read_as_its_text_decoder(tmp_path: Path, text: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration._from_config(gemma4(**text),
                                                                     attn_implementation="eager").eval()
    perturb(model)
    model.save_pretrained(tmp_path / "hf")
    with torch.no_grad():
        ref = model(IDS).logits
    assert all(n.startswith("model.language_model.") or n == "lm_head.weight" for n in tensors_of(tmp_path / "hf"))
    assert max_abs(our_logits(tmp_path / "hf"), ref) <= FP32_TOL
    meta = to_canonical(tmp_path / "hf", tmp_path / "canon")
    assert meta.family == "gemma4_text" and meta.source["model_type"] == "gemma4"
    to_hf(tmp_path / "canon", tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == ["Gemma4ForCausalLM"]
    assert max_abs(wrapper_logits(tmp_path / "back"), ref) <= FP32_TOL


@pytest.mark.parametrize(("text", "says"), [
    ({**MOE, "moe_intermediate_size": None}, "enable_moe_block=true needs moe_intermediate_size"),
])
def test_gemma4_moe_block_without_its_sizes_is_refused_by_name(text: dict[str, Any], says: str) -> None:
    with pytest.raises(MappingError, match=says.replace("(", r"\(").replace(")", r"\)")):
        FAMILIES["gemma4_text"].arch_config(gemma4(**text).to_dict())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma4", "gemma4_unified"])
def test_gemma4_wrappers_are_written_as_llama_cpp_s_gemma4(name: str, tmp_path: Path) -> None:
    """Gemma 4's wrappers export to GGUF as their text decoders (llama.cpp's gemma4; Gemma 4 unified told apart by
    its name), and our reader gives back the wrapper's logits from the file."""
    import gguf

    from lmconvert.convert import convert

    if name == "gemma4":
        torch.manual_seed(0)
        model = transformers.Gemma4ForConditionalGeneration._from_config(gemma4(), attn_implementation="eager").eval()
        perturb(model)
        model.save_pretrained(tmp_path / "hf")
        with torch.no_grad():
            src, ref = tmp_path / "hf", model(IDS).logits.float()
    else:
        src, ref = build(name, tmp_path / "hf")
    to_canonical(src, tmp_path / "canon")
    convert(tmp_path / "canon", tmp_path / "m.gguf", "gguf", quant="f32")
    fields = gguf.GGUFReader(tmp_path / "m.gguf").fields
    assert fields["general.architecture"].contents() == "gemma4"
    assert max_abs(our_logits(tmp_path / "m.gguf"), ref) <= FP32_TOL
