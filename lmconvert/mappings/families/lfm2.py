"""LFM2 (Liquid AI).

Same as llama, except: a hybrid stack, `layer_types` naming each layer "full_attention" or "conv"
(else `full_attn_idxs` the attention layers; neither: every layer attends); a conv layer's token
mixer is the gated short convolution (`mixer="short_conv"`, arch/short_conv.py: in_proj to B, C, x,
a depthwise causal conv of width `conv_L_cache` over B*x, C times it, out_proj; `conv_bias` switches
the three biases); attention has a per-head QK norm before RoPE (`q_layernorm` / `k_layernorm`) and
no biases; every norm takes `norm_eps` (default 1e-5); the final norm is `embedding_norm`; the MLP is
`feed_forward.w1` (gate), `w3` (up), `w2` (down), its width derived when `block_auto_adjust_ff_dim`
(int(2/3 x intermediate_size), times `block_ffn_dim_multiplier` and rounded up to a multiple of
`block_multiple_of`): export writes the width itself, with the adjustment off; `block_ff_dim` and
`tie_embedding` are older spellings that win over `intermediate_size` and `tie_word_embeddings`, as
in Lfm2Config; rope_theta defaults to 1e6, embeddings are tied by default. A stack without conv
layers reads as plain attention (no mixer).
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig, NormConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry, fixed
from ..tables.gguf import GgufArch, tensor_table
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import layer_mixers_from_types
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Transform
from . import llama

LAYER = "model.layers.{}"
TENSORS = TensorTable((
    Rule("model.embed_tokens.weight", "embed.weight"),
    Rule("model.embedding_norm.weight", "final_norm.weight"),
    Rule("lm_head.weight", "lm_head.weight"),
    Rule(f"{LAYER}.operator_norm.weight", "layers.{}.attn_norm.weight"),
    Rule(f"{LAYER}.ffn_norm.weight", "layers.{}.mlp_norm.weight"),
    *(Rule(f"{LAYER}.self_attn.{hf}.weight", f"layers.{{}}.attn.{c}.weight")
      for hf, c in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o"),
                    ("q_layernorm", "q_norm"), ("k_layernorm", "k_norm"))),
    *(Rule(f"{LAYER}.conv.{part}.{p}", f"layers.{{}}.mixer.{part}.{p}")
      for part in ("conv", "in_proj", "out_proj") for p in ("weight", "bias")),
    *(Rule(f"{LAYER}.feed_forward.{hf}.weight", f"layers.{{}}.mlp.{c}.weight")
      for hf, c in (("w1", "gate"), ("w3", "up"), ("w2", "down"))),
))

LAYER_TYPES = {"full_attention": "attention", "conv": "mixer"}
SCHEDULE_KEYS = (Key("layer_types", list, None, nullable=True), Key("full_attn_idxs", list, None, nullable=True),
                 Key("conv_L_cache", int, 3), Key("conv_bias", bool, False))


def schedule_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Lfm2Config.__post_init__: layer_types, else the layers full_attn_idxs lists attend (all of them when
    it is absent) and the others convolve."""
    n = fields["n_layers"]
    types = hf.get("layer_types")
    if types is None:  # LFM2-MoE has no full_attn_idxs (nor a schedule without layer_types): every layer attends
        attending = hf.get("full_attn_idxs") if "full_attn_idxs" in hf.keys else None
        attending = range(n) if attending is None else attending
        if any(isinstance(i, bool) or not isinstance(i, int) for i in attending):
            raise MappingError(f"config.json: full_attn_idxs={show(attending)} should list layer indices")
        types = ["full_attention" if i in attending else "conv" for i in range(n)]
    mixers = layer_mixers_from_types(types, n, LAYER_TYPES)
    if "mixer" not in mixers:
        return {}
    return {"mixer": "short_conv", "layer_mixers": mixers,
            "mixer_settings": {"kernel": hf.get("conv_L_cache"), "bias": hf.get("conv_bias")}}


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """layer_types; a mixer other than the short convolution reads back as none, so export refuses it by name."""
    conv = cfg.mixer == "short_conv"
    types = ["conv" if conv and m == "mixer" else "full_attention" for m in cfg.layer_mixers]
    settings = cfg.mixer_settings if conv else None
    # full_attn_idxs as Lfm2Config leaves it: every layer when neither key says otherwise, else None beside layer_types
    every = "conv" not in types
    return {"layer_types": types, "full_attn_idxs": list(range(cfg.n_layers)) if every else DEFAULT,
            "conv_L_cache": settings.kernel if settings else DEFAULT,
            "conv_bias": settings.bias if settings else DEFAULT}


FFN_KEYS = (Key("intermediate_size", int, 12288), Key("block_ff_dim", int, 12288, legacy=True),
            Key("block_auto_adjust_ff_dim", bool, True), Key("block_ffn_dim_multiplier", float, 1.0),
            Key("block_multiple_of", int, 256))


def ffn_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    """Lfm2MLP's width: `block_ff_dim` wins over `intermediate_size` (Lfm2Config pops it last)."""
    width = hf.get("block_ff_dim") if hf.stated("block_ff_dim") else hf.get("intermediate_size")
    if hf.get("block_auto_adjust_ff_dim"):
        width = int(2 * width / 3)
        multiplier, multiple = hf.get("block_ffn_dim_multiplier"), hf.get("block_multiple_of")
        width = int(multiplier * width)
        width = multiple * ((width + multiple - 1) // multiple)
    return {"d_ff": width}


def ffn_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return {"intermediate_size": cfg.d_ff, "block_auto_adjust_ff_dim": False, "block_ffn_dim_multiplier": DEFAULT,
            "block_multiple_of": DEFAULT}


TIE_KEYS = (Key("tie_word_embeddings", bool, True), Key("tie_embedding", bool, True, legacy=True))

CONFIG = llama.CONFIG.but(
    drop=("intermediate_size", "attention_bias", "mlp_bias", "activation", "attention_dropout", "tie_word_embeddings"),
    add=(Entry("norm", (Key("norm_eps", float, 1e-5),),
               lambda hf, _: {"norm": NormConfig(eps=hf.get("norm_eps"))}, lambda cfg: {"norm_eps": cfg.norm.eps}),
         Entry("tied embeddings", TIE_KEYS,  # `tie_embedding` wins, as Lfm2Config pops it last
               lambda hf, _: {"tie_embeddings": hf.get("tie_embedding") if hf.stated("tie_embedding")
                              else hf.get("tie_word_embeddings")},
               lambda cfg: {"tie_word_embeddings": cfg.tie_embeddings}),
         Entry("FFN width", FFN_KEYS, ffn_from_hf, ffn_to_hf),
         Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf),
         fixed("QK norm", qk_norm="head")),
    defaults={"vocab_size": 65536, "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "max_position_embeddings": 128_000, "rope_theta": 1e6},
    nullable={"head_dim": False, "num_key_value_heads": False},  # head_dim: not an Lfm2Config key, read if stated
)


# -- llama.cpp (GGUF): its lfm2 architecture. The conv layers state no KV heads (`head_count_kv` is one count per
# layer, 0 on a conv layer: what the import reads the schedule from), the FFN width is the derived one, the final
# norm is `token_embd_norm`, the conv weight is stored [channels, kernel] (LFM2Model.modify_tensors squeezes it),
# q/k rows are not permuted (NeoX rotation), and llama.cpp loads no conv biases (an export holding them is
# refused, naming the tensors).
CONV_2D = Transform("the convolution's middle dimension of 1 left out", lambda t: t.unsqueeze(1),
                    lambda t: t.squeeze(1))


def _gguf_table() -> TensorTable:
    rules = tuple(r for r in tensor_table(False, 0.0, True).rules if r.stored != "output_norm.weight")
    return TensorTable((*rules, Rule("token_embd_norm.weight", "final_norm.weight"),
                        Rule("blk.{}.shortconv.conv.weight", "layers.{}.mixer.conv.weight", CONV_2D),
                        Rule("blk.{}.shortconv.in_proj.weight", "layers.{}.mixer.in_proj.weight"),
                        Rule("blk.{}.shortconv.out_proj.weight", "layers.{}.mixer.out_proj.weight")))


def _schedule_from_gguf(config: dict[str, Any]) -> dict[str, Any]:
    """transformers' GGUF loader for lfm2: the KV heads the largest count, the attention layers those with any,
    and the width as stated (no adjustment)."""
    counts = config["num_key_value_heads"]
    counts = counts if isinstance(counts, list) else [counts] * config["num_hidden_layers"]
    return {"num_key_value_heads": max(counts), "block_auto_adjust_ff_dim": False,
            "layer_types": ["full_attention" if n > 0 else "conv" for n in counts]}


def _kv_heads_per_layer(config: dict[str, Any]) -> dict[str, Any]:
    types = config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"]
    return {"attention.head_count_kv": [config["num_key_value_heads"] if t == "full_attention" else 0
                                        for t in types]}


GGUF_LFM2 = GgufArch("lfm2", arch="lfm2", keys={"shortconv.l_cache": "conv_L_cache"},
                     renamed={"rms_norm_eps": "norm_eps"}, derived=_schedule_from_gguf, exported=_kv_heads_per_layer,
                     table=_gguf_table(), stated=frozenset({"vocab_size"}), head_dim_stated=False,
                     refused={f"blk.0.shortconv.{p}.bias": "a short-convolution bias (conv_bias)"
                              for p in ("conv", "in_proj", "out_proj")})


# q_layernorm(q_proj(x).view(B, T, -1, D)), transposed afterwards
REFERENCE_LAYOUTS = QK_NORM_PER_HEAD

FAMILY = Family("lfm2", ("lfm2",), "Lfm2ForCausalLM", TENSORS, CONFIG, gguf=(GGUF_LFM2,),
                reference_layouts=REFERENCE_LAYOUTS)
