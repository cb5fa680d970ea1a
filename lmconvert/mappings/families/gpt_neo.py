"""GPT-Neo (EleutherAI/gpt-neo-125m ... 2.7B).

Same as gpt2's layout (pre-norm LayerNorms with bias, learned positions from 0, a plain MLP
`c_fc` -> `activation_function` (gelu_new) -> `c_proj`, tied), except: q, k, v and out_proj are
`nn.Linear`s under `attn.attention`, with a bias on out_proj only; the scores are not scaled, and
q.k is computed from fp32 copies of q and k, its softmax in fp32; layers are global or local as
`attention_types` (`[[kinds, repeats], ...]`, expanded into `attention_layers`) says, local ones
seeing the last `window_size` keys; `num_layers` and `num_heads` are also read as
`num_hidden_layers` and `num_attention_heads` (GPTNeoConfig's attribute_map); `embed_dropout`,
`resid_dropout` and `attention_dropout` are the three dropouts (training only). transformers runs
it eager (or flash), never SDPA.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, ConfigTable, Entry, fixed, plain
from ..tables.hf_alias import aliased
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import window_fields
from ..tables.table import Rule, TensorTable
from .gpt2 import LAYER_NORM
from .llama import activation
from .opt import attention_rules, learned_positions

LAYER = "transformer.h.{}"
EDGE_RULES = (
    Rule("transformer.wte.weight", "embed.weight"),
    Rule("transformer.wpe.weight", "pos_embed.weight"),
)
FINAL_RULES = (
    Rule("transformer.ln_f.weight", "final_norm.weight"),
    Rule("transformer.ln_f.bias", "final_norm.bias"),
    Rule("lm_head.weight", "lm_head.weight"),
)
NORM_RULES = tuple(Rule(f"{LAYER}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
                   for hf, c in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")) for p in ("weight", "bias"))
MLP_RULES = tuple(Rule(f"{LAYER}.mlp.{hf}.{p}", f"layers.{{}}.mlp.{c}.{p}")
                  for hf, c in (("c_fc", "up"), ("c_proj", "down")) for p in ("weight", "bias"))
TENSORS = TensorTable(EDGE_RULES + attention_rules(f"{LAYER}.attn.attention") + NORM_RULES + MLP_RULES + (
    Rule(f"{LAYER}.attn.attention.bias", None),  # causal-mask buffers older checkpoints stored
    Rule(f"{LAYER}.attn.attention.masked_bias", None),
) + FINAL_RULES)

DEFAULT_TYPES = [[["global", "local"], 12]]


def expand(types: list[Any]) -> list[str]:
    """GPTNeoConfig.expand_attention_types_params: each [kinds, repeats] is kinds, repeats times."""
    try:
        layers = [kind for kinds, repeats in types for _ in range(repeats) for kind in kinds]
    except (TypeError, ValueError):
        layers = None
    if layers is None or any(kind not in ("global", "local") for kind in layers):
        raise MappingError(f"config.json: attention_types={show(types)} should be a list of [[\"global\" or "
                           "\"local\", ...], repeats] pairs, as GPT-Neo writes it")
    return layers


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    layers = expand(hf.get("attention_types") or DEFAULT_TYPES)  # null: transformers' default
    if len(layers) != fields["n_layers"]:
        raise MappingError(f"config.json: attention_types covers {len(layers)} layers but num_layers is "
                           f"{fields['n_layers']}; transformers refuses this too; make them agree")
    return window_fields(tuple(layers), hf.get("window_size"))


def compress(kinds: list[str]) -> list[Any]:
    """The shortest repeating pattern, as GPT-Neo writes it: [[["global", "local"], 12]]."""
    period = next(p for p in range(1, len(kinds) + 1) if len(kinds) % p == 0 and kinds == kinds[:p] * (len(kinds) // p))
    return [[kinds[:period], len(kinds) // period]]


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    kinds = list(cfg.layer_kinds)
    return {"attention_types": compress(kinds), "attention_layers": kinds,
            "window_size": cfg.sliding_window if cfg.sliding_window is not None else DEFAULT}


CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 50257),
    plain("hidden_size", "d_model", int, 2048),
    Entry("intermediate_size", (Key("intermediate_size", int, None, nullable=True),),
          lambda hf, fields: {"d_ff": hf.get("intermediate_size") or 4 * fields["d_model"]},
          lambda cfg: {"intermediate_size": None if cfg.d_ff == 4 * cfg.d_model else cfg.d_ff}),
    aliased("num_layers", "num_hidden_layers", "n_layers", int, 24),
    aliased("num_heads", "num_attention_heads", "n_heads", int, 16),
    plain("max_position_embeddings", "max_positions", int, 2048),
    plain("tie_word_embeddings", "tie_embeddings", bool, True),
    LAYER_NORM,
    activation("activation_function", "gelu_new"),
    Entry("layer kinds", (Key("attention_types", list, None, nullable=True), Key("attention_layers", list, None),
                          Key("window_size", int, 256)), layers_from_hf, layers_to_hf),
    plain("embed_dropout", "embed_dropout", float, 0.0, bound="probability"),
    plain("resid_dropout", "resid_dropout", float, 0.0, bound="probability"),
    plain("attention_dropout", "attn_dropout", float, 0.0, bound="probability"),
    fixed("GPT-Neo attention", gated=False, o_bias=True, mlp_bias=True, attn_scale=1.0, scores_fp32=True),
    Entry("positions", (), lambda hf, fields: learned_positions(fields["n_layers"], 0), lambda cfg: {}),
))

FAMILY = Family("gpt_neo", ("gpt_neo",), "GPTNeoForCausalLM", TENSORS, CONFIG)
