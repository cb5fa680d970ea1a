"""One test spec per family (or per second model of one, `stablelm_qk`): a module here defining
`SPEC`, found by tests/family_specs.py without a list to edit. A spec is the tiny perturbed
transformers model the family tests share: its config overrides, what `inspect` must say of it, the
older config.json style it also comes in, and, for a family added with its spec alone, its config
variants and its GGUF test model. Every sequence is several windows long, and the soft-caps are
small enough to bite."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WINDOW = 4
SEQ = 28  # seven windows long
ATTN_CAP, FINAL_CAP = 2.0, 3.0
S, F = "sliding_attention", "full_attention"
# transformers' names of a selection bias held as a buffer (a spec's `selection_bias_buffer`): DeepSeek-V3's, LFM2-MoE's
SELECTION_BIAS_BUFFERS = ("e_score_correction_bias", "expert_bias")
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
YARN = {"factor": 4.0, "original_max_position_embeddings": 32}
LONGROPE = {"short_factor": [1.0, 1.25, 1.5, 2.0], "long_factor": [2.0, 3.0, 5.0, 8.0]}  # 4 = 16 * 0.5 / 2


@dataclass(frozen=True)
class GgufNaming:
    """What gguf's TensorNameMap does not say of how llama.cpp's converter names a family's HF tensors."""

    # (HF name less its layer prefix, our part) -> llama.cpp's name, for tensors the converter names in its own
    # modify_tensors (GraniteMoeModel splits each fused input_linear into gate and up; DbrxModel adds `.weight`
    # to the experts' w1, v1, w2)
    converter_names: dict[tuple[str, str], str] = field(default_factory=dict)
    # (ours, theirs): modules TensorNameMap knows only under another checkpoint's names (BitNet's sub-norms,
    # mapped from the original 1bitLLM files' `inner_attn_ln` / `ffn_layernorm`)
    aliases: tuple[tuple[str, str], ...] = ()
    stripped: str = ""  # the prefix the converter strips before naming (BloomModel's `transformer.`)
    # a variant entry's layout (by the tensor that tells it apart, as in GgufArch.variants), as a config of the
    # family, where the family's stored names depend on it (Falcon's norms)
    variant_layouts: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Spec:
    model_type: str
    kwargs: dict[str, Any]
    # transformers 4 keys that replace rope_parameters in a hand-written config.json, or the llama-era names
    # a GPT-2-era config class also reads (its attribute_map)
    old_style: dict[str, Any]
    card: tuple[str, ...]  # what `lmconvert inspect` must say
    old_drop: tuple[str, ...] = ()  # further keys a transformers 4 file lacks (derived by transformers)
    layer_types: tuple[list[str], tuple[str, ...]] | None = None  # a non-default layer_types, the kinds it means
    not_on_card: tuple[str, ...] = ()  # what it must not say
    # transformers runs it with SDPA (GPT-Neo and XGLM have only their own attention; it refuses SDPA for Gemma 2's
    # soft-capped scores, BLOOM's and MPT's ALiBi): False runs transformers eager where ours runs SDPA
    sdpa: bool = True
    rope: bool = True  # config.json states rope_parameters (the families with RoPE)
    # transformers reads an older config.json style of this model_type (False: a model_type newer than transformers
    # 4 whose config class reads no older keys, Mellum's: there is one style, and nothing to compare it with)
    old_styled: bool = True
    bf16_exact: bool = True  # our bf16 logits equal transformers' bf16 logits bit for bit on CPU (False: say why)
    family: str = ""  # the lmconvert family, where the entry is a second model of one (stablelm_qk); "": its name
    # transformers-written configs of this model_type in which every stated key takes effect
    # (tests/test_config_table.py; the families there before specs held them have theirs in its VARIANTS)
    config_variants: tuple[dict[str, Any], ...] = ()
    # the overrides of `kwargs` that llama.cpp's architecture holds whole: the model GGUF out is tested on
    # (tests/test_export_gguf.py, and llama.cpp itself in tests/test_llamacpp.py); None: no GGUF test model here
    gguf: dict[str, Any] | None = None
    # why its tiny model cannot split tensor-parallel over 2 and 4 ranks (tests/test_tensor_parallel.py); "": it can
    tp_refusal: str = ""
    # tests/test_config_table.py's bad values (stated in llama's keys) where this model_type spells a key its own
    # way: llama's key -> this model_type's (GPT-2's `rms_norm_eps` is `layer_norm_epsilon`)
    own_spelling: dict[str, str] = field(default_factory=dict)
    # keys of those (in this model_type's spelling) that its transformers config class never reads, so that neither
    # a bad value nor a good one changes the model (OLMo's LayerNorm eps is fixed; GPT-2 has no head_dim)
    not_a_key: tuple[str, ...] = ()
    # keys of those that transformers takes null for (its default) where the other families refuse null
    null_is_default: tuple[str, ...] = ()
    # the keys that make transformers' default config of this model_type one lmconvert converts
    # (tests/test_families.py::test_missing_keys_take_transformers_defaults; dots1's expert counts have no default)
    convertible: dict[str, Any] = field(default_factory=dict)
    # config keys our GGUF reader writes in this model_type's own spelling, where tests/test_formats_gguf.py
    # compares them with llama's (GPT-2's d_ff is n_inner)
    gguf_spelling: dict[str, str] = field(default_factory=dict)
    # how llama.cpp's converter names this family's tensors where gguf's TensorNameMap alone does not
    # (tests/test_table_transforms.py::test_gguf_names_are_llama_cpps)
    gguf_naming: GgufNaming = field(default_factory=GgufNaming)
    # a mixture of experts that transformers 5 keeps in the Hub's layout only, with no fused one of its own
    # (DBRX's checkpoints already hold every expert in w1, v1 and w2; tests/test_moe.py)
    hub_experts_only: bool = False
    # a mixture whose transformers model holds the router's selection bias (e_score_correction_bias) as a buffer,
    # which build_model's perturbation of parameters leaves at 0: tests/test_moe.py perturbs it
    selection_bias_buffer: bool = False
    # a mixture's config key for the load-balancing loss's weight in the training loss (JetMoE's aux_loss_coef)
    aux_loss_key: str = "router_aux_loss_coef"

