"""A family: its model_types, its tensor table, and its config translation both ways.

Whether a family can express a canonical config is decided by one generic test: translate the
config to the family's config.json and back; every ArchConfig field that does not survive is a
variant the family cannot express, and the error names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from lmconvert.arch import ArchConfig, ConfigError

from .errors import Inexpressible, MappingError
from .table import TensorTable

VARIANT_NAMES = {
    "norm": "this norm (kind, offset or dtype order)", "norm_placement": "this norm placement",
    "final_norm": "the final norm setting", "qk_norm": "QK norm", "q_bias": "a q bias", "k_bias": "a k bias",
    "v_bias": "a v bias", "o_bias": "an output-projection bias", "mlp_bias": "MLP biases",
    "lm_head_bias": "an LM-head bias", "activation": "this activation", "gated": "this FFN gating",
    "absolute_positions": "absolute position embeddings", "position_offset": "a position offset",
    "layer_positions": "this per-layer position pattern", "rope": "this RoPE configuration",
    "rope_local": "a separate RoPE for local layers", "relative_buckets": "relative-position buckets",
    "relative_max_distance": "relative-position distance", "attention": "this attention kind",
    "layer_kinds": "this local/global layer pattern", "sliding_window": "a sliding window",
    "attn_scale": "a custom attention score scale", "attn_softcap": "attention soft-capping",
    "tie_embeddings": "this embedding tying", "embed_scale": "embedding scaling",
    "final_softcap": "final-logit soft-capping", "logit_scale": "a logit scale",
    "head_dim": "this head_dim", "n_kv_heads": "this number of KV heads",
}

# config.json keys that are not architecture but should travel with the checkpoint
PASSTHROUGH_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache")


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    architecture: str  # the transformers class written into config.json on export
    tensors: TensorTable
    from_hf: Callable[[dict[str, Any]], ArchConfig]
    to_hf: Callable[[ArchConfig], dict[str, Any]]
    note: str = ""  # said to the user on import, e.g. what is left out

    def arch_config(self, hf: dict[str, Any]) -> ArchConfig:
        try:
            return self.from_hf(hf)
        except ConfigError as exc:
            raise MappingError(f"config.json: {exc}") from None

    def hf_config(self, cfg: ArchConfig, source_family: str = "",
                  extras: dict[str, Any] | None = None) -> dict[str, Any]:
        """The config.json for `cfg`; raises Inexpressible naming what this family lacks."""
        hf = {"architectures": [self.architecture], "model_type": self.model_types[0], **self.to_hf(cfg)}
        try:
            back = self.from_hf(hf)
        except (ConfigError, MappingError) as exc:
            raise Inexpressible(f"{self.name} cannot express this model: {exc}") from None
        lost = [VARIANT_NAMES.get(f.name, f.name) for f in fields(ArchConfig)
                if getattr(back, f.name) != getattr(cfg, f.name)]
        if lost:
            origin = f" ({source_family})" if source_family else ""
            raise Inexpressible(f"{self.name} cannot express {', '.join(lost)}{origin}; "
                                "export to the source family instead")
        for key in PASSTHROUGH_KEYS:
            if extras and key in extras:
                hf.setdefault(key, extras[key])
        return hf
