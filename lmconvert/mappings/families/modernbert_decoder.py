"""ModernBERT decoder (`modernbert-decoder`: the Ettin decoders).

Same as llama's block order, except: LayerNorms (`norm_eps`, default 1e-5; a bias only with
`norm_bias`, default false; torch's kernel, weight in fp32) everywhere, one on the embeddings
(`embeddings.norm`) and none before layer 0's attention (its `attn_norm` is an nn.Identity:
`unnormed_attn_layers`); q, k, v and o (`Wo`) biases with `attention_bias`; the MLP is one fused
`Wi` whose output is [input | gate], `Wo(act(input) * gate)` with `hidden_activation` (GeGLU with
gelu; the activation runs on the strided half: `mlp_fused`), biases with `mlp_bias`;
`layer_types` of sliding and full layers (from `global_attn_every_n_layers`, default 3, where it
is absent: layer i is full when i % n == 0), the sliding ones attending within
`local_attention // 2` tokens; RoPE per layer type, nested `rope_parameters` (theta 160000 on full
layers, 10000 on sliding ones; older files: `global_rope_theta`, `local_rope_theta`, and
`rope_scaling` applied to both), q and k rotated in fp32 with cos/sin in their dtype; head_dim is
hidden / heads; after the final norm the LM head's prediction transform (`lm_head`: dense with
`classifier_bias`, `classifier_activation`, a LayerNorm as the others) and the vocabulary
projection (`decoder`, tied to the embeddings by default, a bias of its own with `decoder_bias`,
default true); `embedding_dropout` drops the embeddings in training, and non-zero
`attention_dropout` (which also drops the attention output) and `mlp_dropout` are refused.
"""

from __future__ import annotations

import copy
from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from ..errors import MappingError
from ..family import Family
from ..tables import hf_rope
from ..tables.config_table import DEFAULT, Entry, plain, unsupported
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import LAYER_TYPES_KEY, layer_kinds_from_hf, layer_types_to_hf
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Piece
from . import llama

WB = ("weight", "bias")
INPUT_GATE = ("ffn", "ffn")  # Wi's output: [input (activated) | gate]

TENSORS = TensorTable((
    Rule("model.embeddings.tok_embeddings.weight", "embed.weight"),
    *(Rule(f"model.embeddings.norm.{p}", f"embed_norm.{p}") for p in WB),
    *(Rule(f"model.layers.{{}}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
      for hf, c in (("attn_norm", "attn_norm"), ("mlp_norm", "mlp_norm"), ("attn.q_proj", "attn.q"),
                    ("attn.k_proj", "attn.k"), ("attn.v_proj", "attn.v"), ("attn.Wo", "attn.o"),
                    ("mlp.Wo", "mlp.down")) for p in WB),
    *(Rule(f"model.layers.{{}}.mlp.Wi.{p}", f"layers.{{}}.mlp.{c}.{p}", Piece(INPUT_GATE, i))
      for p in WB for i, c in enumerate(("gate", "up"))),
    *(Rule(f"model.final_norm.{p}", f"final_norm.{p}") for p in WB),
    *(Rule(f"lm_head.{hf}.{p}", f"head_transform.{hf}.{p}") for hf in ("dense", "norm") for p in WB),
    *(Rule(f"decoder.{p}", f"lm_head.{p}") for p in WB),
))

LAYER_TYPES = ("full_attention", "sliding_attention")
THETA_KEYS = {"full_attention": Key("global_rope_theta", float, 160_000.0, legacy=True),
              "sliding_attention": Key("local_rope_theta", float, 10_000.0, legacy=True)}
ROPE_KEYS = (Key("rope_parameters", dict, None, nullable=True), Key("rope_scaling", dict, None, nullable=True,
                                                                    legacy=True), *THETA_KEYS.values(),
             hf_rope.KEYS[-1])  # a top-level partial_rotary_factor, which only scaled types would read


def norm_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    return {"norm": NormConfig(kind="layer", eps=hf.get("norm_eps"), bias=hf.get("norm_bias"),
                               dtype_order="scale_then_cast")}


def layers_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    every = hf.get("global_attn_every_n_layers")
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: i % every != 0)
    local = hf.get("local_attention")
    if "local" not in kinds:
        return {"layer_kinds": kinds, "sliding_window": None}
    if not local or local // 2 == 0:  # transformers' window is then -1, or 0: no key to attend to
        raise MappingError(f"config.json: local_attention={show(local)} leaves the sliding_attention layers no "
                           "window; set local_attention (2 or more) or make every layer full_attention")
    return {"layer_kinds": kinds, "sliding_window": local // 2}


def layers_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    # an odd window reads back one smaller, so export refuses it by name
    return {"layer_types": layer_types_to_hf(cfg.layer_kinds),
            "local_attention": DEFAULT if cfg.sliding_window is None else 2 * cfg.sliding_window}


def rope_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """As ModernBertDecoderConfig merges them: `rope_scaling` into both types' dicts, then each
    type's theta from its dict, else the older key, else the default; q and k rotate in fp32."""
    nested, scaling = hf.get("rope_parameters") or {}, hf.get("rope_scaling")
    ropes = {}
    for kind in LAYER_TYPES:
        value = nested.get(kind)
        if not isinstance(value, dict | None):
            raise MappingError(f"config.json: rope_parameters.{kind}={show(value)} should be a JSON object")
        params = copy.deepcopy(value) or {"rope_type": "default"}
        if scaling is not None:
            params.update(scaling)
        ropes[kind] = hf_rope.rope_from_hf(hf, params, f"rope_parameters.{kind}.",
                                           theta=hf.get(THETA_KEYS[kind].name), fp32_rotation=True)
    return hf_rope.rope_by_kind(ropes["full_attention"], ropes["sliding_attention"], fields["layer_kinds"])


def rope_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """Both types' dicts; a type no layer has gets its default theta, as ModernBertDecoderConfig writes it."""
    ropes = {"full_attention": cfg.rope, "sliding_attention": cfg.rope_local or cfg.rope}
    unused = {"full_attention": "global", "sliding_attention": "local"}
    return {"rope_parameters": {
        kind: {"rope_type": "default", "rope_theta": THETA_KEYS[kind].default}
        if unused[kind] not in cfg.layer_kinds else hf_rope.rope_to_hf(rope) for kind, rope in ropes.items()}}


def biases_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    return {**llama.attention_biases(hf.get("attention_bias")), "mlp_bias": hf.get("mlp_bias")}


CONFIG = llama.CONFIG.but(
    drop=("num_key_value_heads", "head_dim", "mlp_bias", "rope", "attention_dropout"),
    add=(Entry("norm", (Key("norm_eps", float, 1e-5), Key("norm_bias", bool, False)), norm_from_hf,
               lambda cfg: {"norm_eps": cfg.norm.eps, "norm_bias": cfg.norm.bias}),
         llama.activation("hidden_activation", "gelu"),
         Entry("attention_bias", (Key("attention_bias", bool, False), Key("mlp_bias", bool, False)), biases_from_hf,
               lambda cfg: {"attention_bias": llama.attention_bias_of(cfg), "mlp_bias": cfg.mlp_bias}),
         Entry("layer kinds", (LAYER_TYPES_KEY, Key("local_attention", int, 128, nullable=True),
                               Key("global_attn_every_n_layers", int, 3, legacy=True)), layers_from_hf, layers_to_hf),
         Entry("rope by layer type", ROPE_KEYS, rope_from_hf, rope_to_hf),
         plain("decoder_bias", "lm_head_bias", bool, True),
         plain("classifier_bias", "head_transform_bias", bool, False),
         plain("classifier_activation", "head_transform", str, "gelu", choices=llama.ACTIVATIONS_FROM_HF,
               read=llama.ACTIVATIONS_FROM_HF.__getitem__, write=llama.activation_to_hf),
         plain("embedding_dropout", "embed_dropout", float, 0.0, bound="probability"),
         unsupported("attention_dropout", float, 0.0, "dropout of the attention weights and of its output",
                     "ModernBERT decoder", bound="probability"),
         unsupported("mlp_dropout", float, 0.0, "dropout inside the MLP", "ModernBERT decoder", bound="probability"),
         Entry("embedding norm", (), lambda hf, fields: {"embed_norm": True, "unnormed_attn_layers": (0,),
                                                               "mlp_fused": True},
               lambda cfg: {})),
    defaults={"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
              "num_attention_heads": 12, "max_position_embeddings": 8192, "tie_word_embeddings": True},
)

# one Wi output [input | gate], as Phi-3's gate_up_proj
REFERENCE_LAYOUTS = {"mlp.gate": "B T [F]|F", "mlp.up": "B T F|[F]"}

FAMILY = Family("modernbert_decoder", ("modernbert-decoder",), "ModernBertDecoderForCausalLM", TENSORS, CONFIG,
                reference_layouts=REFERENCE_LAYOUTS)
