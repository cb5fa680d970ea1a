"""Gemma 3n text decoders: Gemma3nForCausalLM checkpoints (model_type gemma3n_text) and the text half of
Gemma3nForConditionalGeneration ones (model_type gemma3n).

Same as gemma3, except: the RMSNorm multiplies by its weight as stored (no `1 + w`), in fp32 before the cast, and
takes 1/sqrt as `torch.pow(mean + eps, -0.5)`; scores are not scaled (scale 1); v is normalised per head by a
weightless RMSNorm (`v_norm`); `layer_types` defaults to every fifth layer full; the last `num_kv_shared_layers`
(default 15) layers have no k_proj, v_proj, k_norm of their own and attend over the K/V (cached ones too) of the
last earlier layer of their kind; `intermediate_size` may be a list, one width per layer;
`activation_sparsity_pattern` gives each layer's gate sparsity (null: 0.95 on the first 10 layers of a model
deeper than 10, else none), the gate cut at mean + std * icdf_N(0,1)(s) (`gate_sparsity`); AltUp carries
`altup_num_inputs` residual streams (`altup_projections` in, `altup_unembed_projections` out, each layer's
`altup` predicting the active stream `altup_active_idx` and correcting all, `altup_correct_scale`;
`altup_coef_clip` acts in training only); the per-layer embeddings (`embed_tokens_per_layer`,
`vocab_size_per_layer_input` rows of num_hidden_layers * `hidden_size_per_layer_input`, with
`per_layer_model_projection` and `per_layer_projection_norm`) feed every layer's `per_layer_input_gate`,
`per_layer_projection` and `post_per_layer_input_norm`; each layer's LAuReL branch (`laurel`, rank
`laurel_rank`) joins the attention's residual sum, over sqrt(2); `final_logit_softcapping` defaults to 30.

Gemma3nForConditionalGeneration nests the text config under `text_config` and keeps `tie_word_embeddings` at the
top level; its text weights sit under `model.language_model.`, its vision and audio towers and embedders are
dropped. Export writes the text-only Gemma3nForCausalLM layout.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import LAYER_TYPES_KEY, SLIDING_WINDOW_KEY, layer_kinds_from_hf, window_fields
from ..tables.hf_layers import layers_and_window_to_hf as _layers_to_hf
from ..tables.hf_wrapper import nested_text_config, wrapped
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import Rule, TensorTable
from . import gemma2, gemma3, llama


def renamed(prefix: str, ours: str, names: str) -> tuple[Rule, ...]:
    """Rules from pairs "theirs=ours" (space-separated): `{prefix}.theirs` stored, `{ours}.ours` canonical."""
    return tuple(Rule(f"{prefix}.{pair.split('=')[0]}", f"{ours}.{pair.split('=')[1]}") for pair in names.split())


# each layer's AltUp and LAuReL modules
LAYER_RULES = renamed("model.layers.{}", "layers.{}", """
    altup.correct_output_scale=altup.correct_scale altup.correction_coefs.weight=altup.correction.weight
    altup.prediction_coefs.weight=altup.prediction.weight altup.modality_router.weight=altup.router.weight
    altup.router_norm.weight=altup.router_norm.weight laurel.linear_left.weight=laurel.left.weight
    laurel.linear_right.weight=laurel.right.weight laurel.post_laurel_norm.weight=laurel.norm.weight""")
# per-layer embeddings (Gemma 4's spell them the same): the tables before the blocks, then each layer's gate
PLE_RULES = renamed("model", "ple", """embed_tokens_per_layer.weight=embed.weight
    per_layer_model_projection.weight=project.weight per_layer_projection_norm.weight=norm.weight""")
PLE_LAYER_RULES = renamed("model.layers.{}", "layers.{}", """per_layer_input_gate.weight=ple.gate.weight
    per_layer_projection.weight=ple.proj.weight post_per_layer_input_norm.weight=ple.norm.weight""")
TOWERS = ("vision_tower", "audio_tower", "embed_vision", "embed_audio")


def table(streams: int, shared: range = range(0)) -> TensorTable:
    """The table of a model with `streams` AltUp streams (their projections numbered 0 to streams - 2) whose
    `shared` layers reuse others' K/V: the published checkpoints still hold those layers' k_proj, v_proj and k_norm,
    which transformers ignores on loading (`_keys_to_ignore_on_load_unexpected`), and so does the import."""
    stale = tuple(Rule(f"model.layers.{i}.self_attn.{part}", None) for i in shared
                  for part in ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias", "k_norm.weight"))
    altup = tuple(Rule(f"model.{theirs}.{i}.weight", f"{ours}.proj.{i}.weight")
                  for theirs, ours in (("altup_projections", "altup_in"), ("altup_unembed_projections", "altup_out"))
                  for i in range(streams - 1))
    text = TensorTable(stale + PLE_RULES + altup + gemma2.TENSORS.rules + llama.QK_NORM_RULES + LAYER_RULES
                       + PLE_LAYER_RULES)
    return wrapped(text, *TOWERS, legacy=False)


TENSORS = table(4)  # transformers' default altup_num_inputs


def tensors(arch: ArchConfig) -> TensorTable:
    return table(arch.altup.n_inputs if arch.altup is not None else 4,
                 range(arch.n_layers - arch.kv_shared_layers, arch.n_layers))


# -- layers: kinds, KV sharing, widths, sparsity
SHARED = Key("num_kv_shared_layers", int, 15, bound="non_negative")
WIDTHS = Key("intermediate_size", tuple, 16_384)
SPARSITY = Key("activation_sparsity_pattern", list, None, nullable=True)


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    n = fields["n_layers"]
    kinds = layer_kinds_from_hf(hf, n, lambda i: (i + 1) % 5 != 0)
    out = window_fields(kinds, hf.get("sliding_window"))
    shared = hf.get("num_kv_shared_layers")
    if shared >= n:
        raise MappingError(f"config.json: num_kv_shared_layers={shared} leaves no layer with K/V of its own "
                           f"(num_hidden_layers={n})")
    widths = hf.get("intermediate_size")
    if isinstance(widths, list):
        if len(widths) != n or any(isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in widths):
            raise MappingError(f"config.json: intermediate_size={show(widths)} should be a positive integer, or "
                               f"one for each of the num_hidden_layers={n} layers")
        out |= {"d_ff": widths[0], "d_ff_layers": tuple(widths)}
    else:
        out["d_ff"] = widths
    pattern = hf.get("activation_sparsity_pattern")
    if pattern is None:  # transformers' default: the first 10 layers of a deeper model at 0.95
        pattern = [0.95] * 10 + [0.0] * (n - 10) if n > 10 else [0.0] * n
    if len(pattern) != n or any(isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s < 1
                                for s in pattern):
        raise MappingError(f"config.json: activation_sparsity_pattern={show(pattern)} should give a sparsity in "
                           f"[0, 1) for each of the num_hidden_layers={n} layers")
    return out | {"kv_shared_layers": shared, "gate_sparsity": tuple(float(s) for s in pattern)}


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    widths = list(cfg.d_ff_layers) if cfg.d_ff_layers is not None else [cfg.d_ff] * cfg.n_layers  # as transformers
    return _layers_to_hf(cfg) | {
        "num_kv_shared_layers": cfg.kv_shared_layers, "intermediate_size": widths,
        "activation_sparsity_pattern": [cfg.sparsity_for(i) for i in range(cfg.n_layers)]}


# -- AltUp, per-layer embeddings, LAuReL
ALTUP_KEYS = (Key("altup_num_inputs", int, 4), Key("altup_active_idx", int, 0, bound="non_negative"),
              Key("altup_coef_clip", float, 120.0), Key("altup_correct_scale", bool, True))


def altup_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    n, active = hf.get("altup_num_inputs"), hf.get("altup_active_idx")
    if n < 2 or active >= n:
        raise MappingError(f"config.json: altup_num_inputs={n}, altup_active_idx={active}: lmconvert reads AltUp "
                           "with at least 2 streams and the active one among them")
    return {"altup": {"n_inputs": n, "active": active, "coef_clip": hf.get("altup_coef_clip"),
                      "correct_scale": hf.get("altup_correct_scale")}}


def altup_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    altup = cfg.altup
    if altup is None:
        return {key.name: DEFAULT for key in ALTUP_KEYS}
    return {"altup_num_inputs": altup.n_inputs, "altup_active_idx": altup.active,
            "altup_coef_clip": DEFAULT if altup.coef_clip is None else altup.coef_clip,
            "altup_correct_scale": altup.correct_scale}


def ple_entry(scales: str, bound: str = "positive") -> Entry:
    """The per-layer embeddings' keys, as Gemma 3n (scales "rounded") and Gemma 4 ("python"; with `bound`
    "non_negative", hidden_size_per_layer_input 0 for none) declare them; a model whose per-layer embeddings differ
    (or that has none where the family always has them) is written with the defaults, so export refuses it."""
    keys = (Key("vocab_size_per_layer_input", int, 262_144), Key("hidden_size_per_layer_input", int, 256, bound=bound))

    def read(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
        dim = hf.get("hidden_size_per_layer_input")
        return {"ple": {"vocab_size": hf.get("vocab_size_per_layer_input"), "dim": dim, "scales": scales}
                if dim else None}

    def write(cfg: ArchConfig) -> dict[str, Any]:
        if cfg.ple is None or cfg.ple.scales != scales:
            return {keys[0].name: DEFAULT, keys[1].name: 0 if bound == "non_negative" and cfg.ple is None else DEFAULT}
        return {keys[0].name: cfg.ple.vocab_size, keys[1].name: cfg.ple.dim}

    return Entry("per-layer embeddings", keys, read, write)


CONFIG = gemma3.CONFIG.but(
    drop=("query_pre_attn_scalar", "use_bidirectional_attention", "intermediate_size"),
    add=(
        llama.norm(1e-6, dtype_order="scale_then_cast", power=True),
        fixed("QK norm", qk_norm="head", v_norm=True, attn_scale=1.0),
        Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY, SHARED, WIDTHS, SPARSITY), layers_from_hf,
              layers_to_hf),
        Entry("altup", ALTUP_KEYS, altup_from_hf, altup_to_hf),
        ple_entry("rounded"),
        Entry("laurel_rank", (Key("laurel_rank", int, 64),), lambda hf, _: {"laurel_rank": hf.get("laurel_rank")},
              lambda cfg: {"laurel_rank": DEFAULT if cfg.laurel_rank is None else cfg.laurel_rank}),
    ),
    defaults={"vocab_size": 262_400, "hidden_size": 2048, "num_hidden_layers": 35, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 256, "max_position_embeddings": 32_768, "sliding_window": 512,
              "final_logit_softcapping": 30.0},
    nullable={"sliding_window": False, "final_logit_softcapping": False},
    decoder=lambda data: nested_text_config(data, "gemma3n", ("gemma3n_text",), {"model_type": "gemma3n_text"}),
)


# q_proj(x).view(B, T, -1, D), then q_norm, before the heads are moved first
REFERENCE_LAYOUTS = QK_NORM_PER_HEAD

# llama.cpp's gemma3n graph (src/models/gemma3n.cpp) runs every gemma3n model otherwise than transformers: its
# gaussian_topk divides the squared deviations by n - 1, and its n_layer_sparsity (10) and f_sparsity_std_mul
# (icdf(0.95)) are constants (models.h), not the file's activation_sparsity_scale. Beside these it hard-codes 20
# layers with K/V of their own, LAuReL rank 64, per-layer inputs 256 wide and 4 AltUp streams with the first active
# (llama-hparams.h; the converter's keys for them are not read), which transformers' defaults would meet.
NO_GGUF = ("llama.cpp's gemma3n graph computes another model: it cuts each sparse gate at mean + std x icdf(0.95) with "
           "the std over n - 1 (gaussian_topk), where transformers' Gemma3nTextMLP takes it over n "
           "(torch.std(unbiased=False)), and sparsifies the first 10 layers whatever activation_sparsity_pattern says")

FAMILY = Family("gemma3n_text", ("gemma3n_text", "gemma3n"), "Gemma3nForCausalLM", TENSORS, CONFIG,
                layout=tensors,
                notes={"gemma3n": "Gemma3nForConditionalGeneration (model_type gemma3n): only the text decoder is "
                                  "read; the vision and audio towers and embedders are left out"},
                no_gguf=NO_GGUF,
                reference_layouts=REFERENCE_LAYOUTS)
