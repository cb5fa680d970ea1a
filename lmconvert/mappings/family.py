"""A family: its model_types, its tensor table, and its config table (translation both ways).

Whether a family can express a canonical config is decided by one generic test: translate the
config to the family's config.json and back; every ArchConfig field that does not survive is a
variant the family cannot express, and the error names it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from lmconvert.arch import ArchConfig, ConfigError

from .errors import Inexpressible, MappingError
from .tables.config_table import ConfigTable
from .tables.gguf import GgufArch
from .tables.table import TensorTable

VARIANT_NAMES = {
    "norm": "this norm", "norm_placement": "this norm placement",
    "final_norm": "the final norm setting", "qk_norm": "QK norm", "q_bias": "a q bias", "k_bias": "a k bias",
    "v_bias": "a v bias", "o_bias": "an output-projection bias",
    "o_bias_layers": "an output-projection bias on some layers only",
    "unnormed_attn_layers": "layers without an attention norm",
    "mlp_fused": "gate and up computed as one fused output",
    "head_transform": "an LM-head transform (dense + activation + norm)",
    "head_transform_bias": "an LM-head transform bias", "mlp_bias": "MLP biases",
    "lm_head_bias": "an LM-head bias", "activation": "this activation", "gated": "this FFN gating",
    "absolute_positions": "absolute position embeddings", "position_offset": "a position offset",
    "layer_positions": "this per-layer position pattern", "rope": "this RoPE configuration",
    "rope_local": "a separate RoPE for local layers", "relative_buckets": "relative-position buckets",
    "relative_max_distance": "relative-position distance", "attention": "this attention kind",
    "attention_settings": "these attention settings",
    "layer_kinds": "this local/global layer pattern", "sliding_window": "a sliding window",
    "attn_scale": "a custom attention score scale", "attn_softcap": "attention soft-capping",
    "attn_sinks": "attention sinks (a learned logit per head in the softmax)",
    "sink_form": "attention sinks as an output scale (sigmoid(logsumexp - sink))",
    "sinks_fp32": "attention sinks kept in fp32 in any dtype",
    "residual_scale": "residual scaling",
    "qk_norm_weight": "QK-norm weights per head", "qk_norm_bias": "a QK-norm bias",
    "clip_qkv": "q/k/v clamping",
    "attn_temperature": "a position-dependent query scale (attention temperature)",
    "attn_temperature_floor": "this attention-temperature period",
    "tie_embeddings": "this embedding tying", "embed_scale": "embedding scaling",
    "final_softcap": "final-logit soft-capping", "logit_scale": "a logit scale",
    "head_divisor": "a divided LM-head input",
    "head_dim": "this head_dim", "n_kv_heads": "this number of KV heads", "moe": "this mixture of experts",
    "scale_query": "the score scale applied to q", "scale_by_inverse_layer": "per-layer score scaling (1/(layer+1))",
    "scores_fp32": "q.k in fp32",
    "embed_dim": "an embedding width other than d_model (project_in/out)",
    "embed_scale_unrounded": "an unrounded embedding scale", "embed_dropout": "embedding dropout",
    "resid_dropout": "residual dropout", "attn_dropout": "attention dropout",
    "embed_norm": "an embedding norm", "residual_after_norm": "the residual taken after the norm",
    "residual_fp32": "an fp32 residual stream",
    "parallel_sum": "this parallel-block sum order", "scale_in_product": "the score scale inside q.k's product",
    "d_ff": "this FFN width", "vocab_size": "this vocabulary size", "d_model": "this width (d_model)",
    "n_layers": "this number of layers", "n_heads": "this number of heads",
    "max_positions": "this context length (max_positions)", "positions_from_mask": "positions counted from the mask",
    "z_loss": "a z-loss", "alibi": "this kind of ALiBi", "bias_separate": "biases added after the matmul",
    "conv1d_linears": "Conv1D projections (addmm over weights held [in, out])",
    "qk_norm_after_rope": "a QK norm after RoPE", "sub_norms": "sub-norms before the o and down projections",
    "output_vocab": "an LM head narrower than the vocabulary (output_vocab_size)",
    "attn_temperature_form": "this attention-temperature form (Llama 4's or Beam's: fp32, layers without positions)",
    "attention_chunk": "chunked local attention", "chunked_layers": "chunked local attention on these layers",
    "qk_l2_norm": "a weightless L2 QK norm after RoPE (Llama 4)",
    "attn_output_gate": "this sigmoid gate on the attention output (AFMoE's gate_proj, Beam's with a bias per head)",
    "residual_form": "a depth-scaled residual add (Beam)", "glu_fp32": "the FFN's gated product in fp32",
    "softcap_fp32": "the final soft-cap in fp32",
    "mixer": "this token mixer beside attention", "mixer_settings": "these token-mixer settings",
    "layer_mixers": "this per-layer schedule of attention and mixer layers (or both side by side)",
    "layer_ffns": "layers without an FFN",
    "mixer_norm_placement": "another norm placement on the mixer layers",
    "shared_blocks": "shared transformer blocks called by several layers (Zamba's and Zamba2's)",
    # Falcon-H1's muP multipliers
    "attn_in_multiplier": "an attention input multiplier (muP)",
    "attn_out_multiplier": "an attention output multiplier (muP)",
    "mixer_out_multiplier": "a mixer output multiplier (muP)", "key_multiplier": "a key multiplier (muP)",
    "mlp_gate_multiplier": "an FFN gate multiplier (muP)", "mlp_down_multiplier": "an FFN output multiplier (muP)",
    # Gemma 4
    "global_head_dim": "a head_dim of the global layers' own", "global_kv_heads": "KV heads of the global layers' own",
    "k_eq_v": "K = V layers (no v projection)", "v_norm": "a weightless V norm",
    "kv_shared_layers": "cross-layer KV sharing", "kv_reused": "a KV-shared layer",
    "shared_ffn_factor": "wider FFNs on the KV-shared layers", "layer_scalar": "a per-layer output scalar",
    # MiMo-V2-Flash, Laguna
    "v_head_dim": "values of their own width (v_head_dim)", "attn_value_scale": "a scale on the values",
    "sink_layers": "attention sinks on the sliding layers only", "layer_heads": "query heads that differ by layer",
    "attn_gate_activation": "this activation of the attention output gate (Laguna's softplus in fp32)",
    # Gemma 3n
    "altup": "AltUp's residual streams", "ple": "per-layer embeddings", "laurel_rank": "a LAuReL residual branch",
    "gate_sparsity": "sparse FFN gates (activation sparsity)", "d_ff_layers": "an FFN width per layer",
}

def tensor_sizes(arch: ArchConfig) -> dict[str, int]:
    """The sizes an HF family's tensor-table transforms are written in (fused pieces, per-group qkv)."""
    return {"q": arch.q_dim, "kv": arch.kv_dim, "ffn": arch.d_ff, "heads": arch.n_heads,
            "kv_heads": arch.n_kv_heads, "head_dim": arch.head_dim, "vocab": arch.vocab_size, "dim": arch.d_model,
            **({"shared": arch.moe.d_shared} if arch.moe is not None and arch.moe.d_shared is not None else {}),
            # a token mixer's own sizes, prefixed (gated delta-net's per-key-head groups)
            **{f"mixer.{k}": v for k, v in getattr(arch.mixer_settings, "sizes", {}).items()}}


# config.json keys that are not architecture but should travel with the checkpoint (HunYuan's end of document
# is its GGUF EOS)
PASSTHROUGH_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "eod_token_id", "initializer_range", "use_cache")


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    architecture: str  # the transformers class written into config.json on export
    tensors: TensorTable
    config: ConfigTable
    # model_type -> what `convert` and `inspect` say of a checkpoint of it, in one line (a multimodal
    # wrapper: which towers are left out)
    notes: Mapping[str, str] = field(default_factory=dict)
    layout: Callable[[ArchConfig], TensorTable] | None = None  # the table for one config, where names depend on it
    gguf: tuple[GgufArch, ...] = ()  # its llama.cpp architectures (read, and written by `--to gguf`)
    no_gguf: str = ""  # why it has no GGUF form, where llama.cpp names it but cannot run it
    no_offload: str = ""  # why verify --max-memory cannot offload transformers' model of it (accelerate's hooks)
    # wrapper model_type -> the text model_types of it this family reads, where another family claims the wrapper
    # (Mistral3ForConditionalGeneration around a ministral3 decoder): `family_for` chooses by `text_config`
    wraps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # verify: where transformers' modules of this family lay a point out otherwise than llama's
    # (verify/layouts.py), by point, or a function of the config giving them; QK norms have no default
    reference_layouts: Mapping[str, Any] | Callable[[ArchConfig], Mapping[str, Any]] = field(default_factory=dict)

    def note_for(self, model_type: object) -> str:
        """What is said of a checkpoint of this model_type ("" for none)."""
        return self.notes.get(model_type, "") if isinstance(model_type, str) else ""

    def tensors_for(self, arch: ArchConfig) -> TensorTable:
        """The tensor table for this config: `tensors`, unless the stored names depend on the layout
        (Falcon's norms are `ln_attn`/`ln_mlp` in one layout, `input_layernorm` in the others)."""
        return self.layout(arch) if self.layout is not None else self.tensors

    def from_hf(self, data: dict[str, Any]) -> ArchConfig:
        return self.config.from_hf(data)

    def to_hf(self, cfg: ArchConfig) -> dict[str, Any]:
        return self.config.to_hf(cfg)

    def arch_config(self, hf: dict[str, Any]) -> ArchConfig:
        try:
            return self.from_hf(hf)
        except MappingError:
            raise
        except ConfigError as exc:
            raise MappingError(f"config.json: {exc}") from None
        except (TypeError, ValueError, ArithmeticError, AttributeError) as exc:  # a value of the wrong shape
            raise MappingError(f"config.json: a value has the wrong type or range ({exc}); "
                               f"compare it with the model card") from None

    def hf_config(self, cfg: ArchConfig, source_family: str = "",
                  extras: dict[str, Any] | None = None) -> dict[str, Any]:
        """The config.json for `cfg`; raises Inexpressible naming what this family lacks."""
        hf = {"architectures": [self.architecture], "model_type": self.model_types[0], **self.to_hf(cfg)}
        try:
            back = self.from_hf(hf)
        except (ConfigError, MappingError) as exc:
            raise Inexpressible(f"{self.name} cannot express this model: {str(exc).rstrip('.')}; export to the "
                                "source family instead") from None
        lost = [f.name for f in fields(ArchConfig) if getattr(back, f.name) != getattr(cfg, f.name)]
        if lost:
            raise Inexpressible(self._lost_message(cfg, back, lost, source_family))
        for key in PASSTHROUGH_KEYS:
            if extras and key in extras:
                hf.setdefault(key, extras[key])
        return hf

    def _lost_message(self, cfg: ArchConfig, back: ArchConfig, lost: list[str], source_family: str) -> str:
        """Names what the model uses that this family lacks, and what this family always has
        (q/k/v biases in qwen2, say) that the model lacks."""
        absent = [name for name in lost if getattr(cfg, name) in _ABSENT]
        used = [_describe(name, cfg, back) for name in lost if name not in absent]
        origin = f" ({source_family})" if source_family else ""
        parts = []
        if used:
            parts.append(f"{self.name} cannot express {', '.join(used)}{origin}")
        if absent:
            names = ", ".join(VARIANT_NAMES.get(n, n) for n in absent)
            parts.append(f"{self.name} always has {names}, which this model{origin} lacks")
        return "; ".join(parts) + "; export to the source family instead"


_ABSENT = (False, None, "none")


def _describe(name: str, cfg: ArchConfig, back: ArchConfig) -> str:
    """The variant's name; for a norm, RoPE or attention settings, also which of its fields differ."""
    text = VARIANT_NAMES.get(name, name)
    ours, theirs = getattr(cfg, name), getattr(back, name)
    if name in ("norm", "rope", "attention_settings") and is_dataclass(ours) and type(ours) is type(theirs):
        differ = [f.name for f in fields(ours) if getattr(ours, f.name) != getattr(theirs, f.name)]
        text += f"'s {' and '.join(differ)}"
    return text
