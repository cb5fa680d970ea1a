"""llama.cpp's GGUF conventions as data: which llama.cpp architecture is which transformers
model_type, what its converter (`convert_hf_to_gguf.py`) does to each tensor, and the GGUF tensor
table (llama.cpp names <-> canonical names) with the transforms that undo those changes. No file
I/O and no `gguf` package: formats/gguf.py reads the file and calls these.

What llama.cpp's converter changes, each undone by the table the way transformers' own GGUF loader
(`modeling_gguf_pytorch_utils.py`) undoes it:
- names: `blk.{i}.attn_q.weight` and so on, as gguf's `TensorNameMap` names them (a test checks
  this table against it for every architecture here);
- the q and k rows of `llama` files (Mistral included) are permuted for llama.cpp's interleaved
  RoPE (`LlamaModel.permute`): Permute undoes it for weights and biases;
- Gemma 2 and 3 norm weights are stored as `w + 1` (q/k norms too): Offset subtracts 1 in float32;
- embedding / output rows past the vocabulary are padding: Trim drops them;
- Phi-3's fused `attn_qkv` and `ffn_up` are HF's qkv_proj and gate_up_proj unchanged: pieces.
- a mixture's experts are stacked per layer and projection (`ffn_gate_exps` [experts, width,
  hidden]): Unstack gives each expert's matrix; Qwen2-MoE's shared-expert gate is stored as a
  vector: Unsqueeze restores its row.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

from .errors import MappingError
from .table import Rule, TensorTable
from .transforms import IDENTITY, HeadPart, Offset, Permute, Piece, Step, Transform, Trim, Unsqueeze, Unstack


@dataclass(frozen=True)
class GgufArch:
    """How one llama.cpp architecture maps to a transformers model_type."""

    model_type: str
    keys: Mapping[str, str] = field(default_factory=dict)  # `{arch}.` keys beyond SHARED_KEYS -> HF keys
    defaults: Mapping[str, Any] = field(default_factory=dict)  # HF keys the file does not state
    bias_flags: Mapping[str, str] = field(default_factory=dict)  # HF bool key -> GGUF tensor that sets it
    permute_qk: bool = False  # q/k rows interleaved for llama.cpp's RoPE (LlamaModel.permute)
    norm_offset: float = 0.0  # norm weights stored as w + offset
    output: bool = True  # llama.cpp's architecture has an `output` matrix (Gemma 2's is always tied)
    swa_pattern: int | None = None  # llama.cpp's hard-coded sliding pattern: every n-th layer is full
    big_layers: int | None = None  # Gemma: the layer count llama.cpp treats as 27B (score scale hidden/heads)
    fused: bool = False  # q, k, v in one `attn_qkv`, gate and up in one `ffn_up` (Phi-3), as in HF
    norm_eps: str = "attention.layer_norm_rms_epsilon"  # the required key holding the norm eps (GPT-2's is
    #   attention.layer_norm_epsilon)
    table: TensorTable | None = None  # a table of its own (GPT-2: fused qkv, positions, norm biases)
    experts: bool = False  # a mixture of experts on every layer (stacked experts), no dense FFN
    partial_rotary: bool = False  # `rope.dimension_count` rotates part of each head (StableLM)
    rotary_key: str = "partial_rotary_factor"  # the HF key the rotated fraction goes to (GPT-NeoX: rotary_pct)
    transformers_reads: bool = True  # transformers' GGUF loader reads it (a reference for `verify`)
    renamed: Mapping[str, str] = field(default_factory=dict)  # shared HF keys -> the family's own (MPT's d_model)
    # (tensor, entry): a file holding that tensor is read as that entry instead (Falcon-40B's second norm)
    variants: tuple[tuple[str, GgufArch], ...] = ()
    derived: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None  # HF keys computed from the others
    refused: Mapping[str, str] = field(default_factory=dict)  # tensor -> the layout it means, which is refused
    # tensor -> what it holds, which llama.cpp runs but transformers' GGUF loader does not read (it loads
    # the model without it), so no import could be checked against it: refused too
    unread: Mapping[str, str] = field(default_factory=dict)
    latent: bool = False  # MLA: key/value lengths and the rotated width are the latent attention's (`derived`)
    # the configs transformers' GGUF loader builds as the file holds them, where it reads only some (Falcon:
    # it builds every file as Falcon-7B's layout); None: all
    transformers_layout: Callable[[Mapping[str, Any]], bool] | None = None
    # (`{arch}.` key, value, entry): a file stating that value (None: not stating the key) is that
    # entry's model, and export writes the value for it (llama.cpp's deepseek2 router: softmax is
    # DeepSeek-V2's, sigmoid DeepSeek-V3's); the first that matches wins
    told_apart: tuple[tuple[str, Any, GgufArch], ...] = ()

    def read_by_transformers(self, config: Mapping[str, Any]) -> bool:
        """Whether transformers' GGUF loader builds this file's model (a reference for `verify`)."""
        return self.transformers_reads and (self.transformers_layout is None or self.transformers_layout(config))

    def stating(self, value_of: Callable[[str], Any]) -> GgufArch:
        """The entry for a file whose `{arch}.` keys have these values (`value_of`: key -> value or None)."""
        return next((entry for key, value, entry in self.told_apart if value_of(key) == value), self)

    def holding(self, tensors: Collection[str]) -> GgufArch:
        """The entry for a file holding these tensors: a variant's, if it holds the variant's tensor."""
        return next((variant for tensor, variant in self.variants if tensor in tensors), self)

    @property
    def tensors(self) -> TensorTable:
        """llama.cpp's tensor names <-> canonical names, with this architecture's transforms."""
        return self.table if self.table is not None else tensor_table(self.permute_qk, self.norm_offset, self.output,
                                                                      self.fused, self.experts)


ATTENTION_BIAS = {"attention_bias": "blk.0.attn_q.bias"}
# llama.cpp's qwen2moe / qwen3moe graphs (no dense layers, no window) hard-code whether the top-k
# weights are renormalised: never for qwen2moe, always for qwen3moe
QWEN_MOE_KEYS = {"expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
                 "expert_feed_forward_length": "moe_intermediate_size"}
GEMMA_KEYS = {"attention.sliding_window": "sliding_window", "final_logit_softcapping": "final_logit_softcapping"}
ARCHS: dict[str, GgufArch] = {
    "llama": GgufArch("llama", defaults={"hidden_act": "silu"},
                      bias_flags={**ATTENTION_BIAS, "mlp_bias": "blk.0.ffn_up.bias"}, permute_qk=True),
    "qwen2": GgufArch("qwen2", defaults={"hidden_act": "silu", "use_sliding_window": False}),
    "qwen3": GgufArch("qwen3", defaults={"hidden_act": "silu", "use_sliding_window": False}, bias_flags=ATTENTION_BIAS),
    "olmo2": GgufArch("olmo2", defaults={"hidden_act": "silu"}, bias_flags=ATTENTION_BIAS),
    "qwen2moe": GgufArch("qwen2_moe", keys={**QWEN_MOE_KEYS,
                                            "expert_shared_feed_forward_length": "shared_expert_intermediate_size"},
                         defaults={"hidden_act": "silu", "use_sliding_window": False, "norm_topk_prob": False},
                         bias_flags={"qkv_bias": "blk.0.attn_q.bias"}, experts=True),
    "qwen3moe": GgufArch("qwen3_moe", keys=QWEN_MOE_KEYS,
                         defaults={"hidden_act": "silu", "use_sliding_window": False, "norm_topk_prob": True},
                         bias_flags=ATTENTION_BIAS, experts=True),
    "gemma2": GgufArch("gemma2", keys={**GEMMA_KEYS, "attn_logit_softcapping": "attn_logit_softcapping"},
                       defaults={"hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0,
                                 "final_logit_softcapping": 30.0},
                       bias_flags=ATTENTION_BIAS, norm_offset=1.0, output=False, swa_pattern=2, big_layers=46),
    "gemma3": GgufArch("gemma3_text", keys={**GEMMA_KEYS, "rope.freq_base_swa": "rope_local_base_freq"},
                       defaults={"hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
                                 "rope_local_base_freq": 10000.0},
                       bias_flags=ATTENTION_BIAS, norm_offset=1.0, swa_pattern=6, big_layers=62),
    # transformers' GGUF loader reads no window; llama.cpp's converter writes one when config.json has it
    "phi3": GgufArch("phi3", keys={"attention.sliding_window": "sliding_window"}, defaults={"hidden_act": "silu"},
                     fused=True),
}
# llama.cpp writes Mistral as `llama`; like transformers, tell it by its general.name
BY_NAME: tuple[tuple[str, str, GgufArch], ...] = (
    ("llama", "mistral", GgufArch("mistral", keys={"attention.sliding_window": "sliding_window"},
                                  defaults={"hidden_act": "silu", "sliding_window": None}, permute_qk=True)),
    # Mixtral is llama.cpp's `llama` with stacked experts on every layer (feed_forward_length is the
    # expert width); its graph renormalises the top-k weights and has no window
    ("llama", "mixtral", GgufArch("mixtral", keys={"expert_count": "num_local_experts",
                                                   "expert_used_count": "num_experts_per_tok"},
                                  defaults={"hidden_act": "silu", "sliding_window": None}, permute_qk=True,
                                  experts=True, transformers_reads=False)),
)


def arch_entry(architecture: str, general_name: str = "") -> GgufArch:
    """The table entry for `general.architecture` (and, for variants llama.cpp does not tell
    apart, `general.name`)."""
    if architecture not in ARCHS:
        raise MappingError(f"GGUF architecture {architecture!r} is not supported; supported: "
                           f"{', '.join(sorted(ARCHS))}")
    name = general_name.lower()
    for base, word, variant in BY_NAME:
        if base == architecture and word in name:
            return variant
    return ARCHS[architecture]


# ---------------------------------------------------------------------------------------------
# the tensor table

PADDED = Trim("vocab", "rows")  # "rows": the rows the file stores


def _weight_and_bias(gguf: str, canonical: str, step: Step | Transform) -> tuple[Rule, ...]:
    return tuple(Rule(f"blk.{{}}.{gguf}.{p}", f"layers.{{}}.{canonical}.{p}", step) for p in ("weight", "bias"))


def _fused() -> tuple[Rule, ...]:
    """Phi-3's layout: `attn_qkv` rows [q | k | v], `ffn_up` rows [gate | up], as HF's qkv_proj and
    gate_up_proj (llama.cpp copies them unchanged)."""
    return (*(Rule("blk.{}.attn_qkv.weight", f"layers.{{}}.attn.{n}.weight", Piece(("q", "kv", "kv"), i))
              for i, n in enumerate("qkv")),
            *(Rule("blk.{}.ffn_up.weight", f"layers.{{}}.mlp.{n}.weight", Piece(("ffn", "ffn"), i))
              for i, n in enumerate(("gate", "up"))))


@cache
def tensor_table(permute_qk: bool, norm_offset: float, output: bool, fused: bool = False,
                 experts: bool = False) -> TensorTable:
    """The GGUF table for an architecture with these facts."""
    q = Permute("heads") if permute_qk else IDENTITY
    k = Permute("kv_heads") if permute_qk else IDENTITY
    norm = Offset(norm_offset) if norm_offset else IDENTITY
    layer_norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"), ("post_attention_norm", "attn_post_norm"),
                   ("post_ffw_norm", "mlp_post_norm"), ("attn_q_norm", "attn.q_norm"), ("attn_k_norm", "attn.k_norm"))
    separate = (*_weight_and_bias("attn_q", "attn.q", q), *_weight_and_bias("attn_k", "attn.k", k),
                *_weight_and_bias("attn_v", "attn.v", IDENTITY),
                *(() if experts else (*_weight_and_bias("ffn_gate", "mlp.gate", IDENTITY),
                                      *_weight_and_bias("ffn_up", "mlp.up", IDENTITY))))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        *((Rule("output.weight", "lm_head.weight", PADDED),) if output else ()),
        Rule("output_norm.weight", "final_norm.weight", norm),
        *(_fused() if fused else separate),
        *_weight_and_bias("attn_output", "attn.o", IDENTITY),
        *(MOE_RULES if experts else _weight_and_bias("ffn_down", "mlp.down", IDENTITY)),
        *(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight", norm) for g, c in layer_norms),
        Rule("rope_freqs.weight", None),  # Llama 3's RoPE scaling factors: read into the config
    ))


MOE_RULES = (
    Rule("blk.{}.ffn_gate_inp.weight", "layers.{}.mlp.router.weight"),
    *(Rule(f"blk.{{}}.ffn_{n}_exps.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight", Unstack())
      for n in ("gate", "up", "down")),
    *(Rule(f"blk.{{}}.ffn_{n}_shexp.weight", f"layers.{{}}.mlp.shared.{n}.weight") for n in ("gate", "up", "down")),
    Rule("blk.{}.ffn_gate_inp_shexp.weight", "layers.{}.mlp.shared_gate.weight", Unsqueeze()),
)


def tensor_sizes(config: Mapping[str, Any], renamed: Mapping[str, str] | None = None) -> dict[str, int]:
    """The sizes the table's transforms are written in, from the HF config (whose shared keys the
    family may spell its own way, `renamed`); the reader adds each tensor's stored `rows`."""
    config = {**config, **{shared: config[own] for shared, own in (renamed or {}).items() if own in config}}
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    ffn = config.get("intermediate_size") or config.get("n_inner") or 4 * config["hidden_size"]
    latent = {"k_nope": config["qk_nope_head_dim"], "v_head": config["v_head_dim"]} if "v_head_dim" in config else {}
    return {"vocab": config["vocab_size"], "heads": heads, "kv_heads": kv_heads, "q": heads * head_dim,
            "kv": kv_heads * head_dim, "ffn": ffn, **latent}  # MLA: the per-head parts of DeepSeek's kv_b


def _gpt2_table() -> TensorTable:
    """llama.cpp's GPT-2 (`GPT2Model` in convert_hf_to_gguf.py): its converter transposes the Conv1D
    weights to nn.Linear's [out, in], so c_attn is `attn_qkv`, q | k | v along its rows; norms have
    biases; `position_embd` is the learned table; `output` is always written (a copy of
    token_embd for the tied original)."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight"),
        Rule("position_embd.weight", "pos_embed.weight"),
        *(Rule(f"blk.{{}}.attn_qkv.{p}", f"layers.{{}}.attn.{c}.{p}", Piece(("q", "q", "q"), i))
          for p in ("weight", "bias") for i, c in enumerate("qkv")),
        *_weight_and_bias("attn_output", "attn.o", IDENTITY), *_weight_and_bias("ffn_up", "mlp.up", IDENTITY),
        *_weight_and_bias("ffn_down", "mlp.down", IDENTITY),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        Rule("output.weight", "lm_head.weight"),
    ))


ARCHS["gpt2"] = GgufArch("gpt2", keys={"attention.layer_norm_epsilon": "layer_norm_epsilon",
                                       "feed_forward_length": "n_inner"},
                         norm_eps="attention.layer_norm_epsilon", table=_gpt2_table())


def _starcoder2_table() -> TensorTable:
    """llama.cpp's StarCoder2 (`StarCoder2Model`): LayerNorms with biases, every linear with a bias,
    a plain MLP (`ffn_up`, `ffn_down`), q/k unpermuted; `output` only when untied."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        *(rule for g, c in (("attn_q", "attn.q"), ("attn_k", "attn.k"), ("attn_v", "attn.v"),
                            ("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))
          for rule in _weight_and_bias(g, c, IDENTITY)),
    ))


# transformers' GGUF loader reads no RoPE base for StarCoder2 (its default, 10000, if the file has
# another: our reader takes the file's) and no window (llama.cpp's StarCoder2 has none either)
ARCHS["starcoder2"] = GgufArch("starcoder2", keys={"attention.layer_norm_epsilon": "norm_epsilon"},
                               defaults={"hidden_act": "gelu_pytorch_tanh", "sliding_window": None},
                               bias_flags={"use_bias": "blk.0.attn_q.bias"},
                               norm_eps="attention.layer_norm_epsilon", table=_starcoder2_table())


def _stablelm_table() -> TensorTable:
    """llama.cpp's StableLM (`StableLMModel`): LayerNorms with biases, optional q/k/v biases (the
    config says which; the o and MLP bias rules are gguf's names, which StableLM never fills),
    SwiGLU, q/k unpermuted (NeoX-style rotation); `output` always written."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        *(rule for g, c in (("attn_q", "attn.q"), ("attn_k", "attn.k"), ("attn_v", "attn.v"),
                            ("attn_output", "attn.o"), ("ffn_gate", "mlp.gate"), ("ffn_up", "mlp.up"),
                            ("ffn_down", "mlp.down"))
          for rule in _weight_and_bias(g, c, IDENTITY)),
    ))


ARCHS["stablelm"] = GgufArch("stablelm", keys={"attention.layer_norm_epsilon": "layer_norm_eps",
                                               "use_parallel_residual": "use_parallel_residual"},
                             defaults={"hidden_act": "silu"}, bias_flags={"use_qkv_bias": "blk.0.attn_q.bias"},
                             norm_eps="attention.layer_norm_epsilon", partial_rotary=True, table=_stablelm_table(),
                             unread={"blk.0.attn_q_norm.weight":
                                     "per-head QK LayerNorms, StableLM's qk_layernorm=true"})


def _nemotron_table() -> TensorTable:
    """llama.cpp's Nemotron (`NemotronModel`): LayerNorm1P stored as `w + 1` with biases, optional
    attention and MLP biases, a plain squared-ReLU MLP (`ffn_up`, `ffn_down`)."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    plus_one = Offset(1.0)
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight", plus_one), Rule("output_norm.bias", "final_norm.bias"),
        *(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight", plus_one) for g, c in norms),
        *(Rule(f"blk.{{}}.{g}.bias", f"layers.{{}}.{c}.bias") for g, c in norms),
        *(rule for g, c in (("attn_q", "attn.q"), ("attn_k", "attn.k"), ("attn_v", "attn.v"),
                            ("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))
          for rule in _weight_and_bias(g, c, IDENTITY)),
    ))


ARCHS["nemotron"] = GgufArch("nemotron", keys={"attention.layer_norm_epsilon": "norm_eps"},
                             defaults={"hidden_act": "relu2"},
                             bias_flags={"attention_bias": "blk.0.attn_q.bias", "mlp_bias": "blk.0.ffn_up.bias"},
                             norm_eps="attention.layer_norm_epsilon", partial_rotary=True, table=_nemotron_table())


def _written(model_type: str, **facts: Any) -> GgufArch:  # noqa: ANN401 - GgufArch's fields
    """An architecture lmconvert writes that transformers' GGUF loader does not read."""
    return GgufArch(model_type, transformers_reads=False, **facts)


# -- architectures that lmconvert's GGUF export writes (and reads back the same way); transformers'
# GGUF loader reads none of them, so `verify` takes the source the file records as its reference
# What each one's llama.cpp graph hard-codes instead of stating is in its defaults: Gemma's tanh GELU
# and embeddings scaled by sqrt(hidden) (the gemma family's own), SmolLM3's NoPE on every fourth
# layer, OLMo's LayerNorm without weights and eps 1e-5.
ARCHS["gemma"] = _written("gemma", defaults={"hidden_activation": "gelu_pytorch_tanh"}, bias_flags=ATTENTION_BIAS,
                          norm_offset=1.0, output=False)  # llama.cpp's Gemma always ties its output
ARCHS["granite"] = _written("granite", keys={"attention.scale": "attention_multiplier",
                                             "embedding_scale": "embedding_multiplier",
                                             "residual_scale": "residual_multiplier", "logit_scale": "logits_scaling"},
                            defaults={"hidden_act": "silu"},
                            bias_flags={**ATTENTION_BIAS, "mlp_bias": "blk.0.ffn_up.bias"}, permute_qk=True)
ARCHS["smollm3"] = _written("smollm3", defaults={"hidden_act": "silu", "no_rope_layer_interval": 4,
                                                 "use_sliding_window": False},
                            bias_flags=ATTENTION_BIAS, permute_qk=True)
ARCHS["olmo"] = _written("olmo", keys={"attention.clamp_kqv": "clip_qkv"}, defaults={"hidden_act": "silu"},
                         norm_eps="attention.layer_norm_epsilon", permute_qk=True,
                         table=TensorTable(tuple(r for r in tensor_table(True, 0.0, True).rules
                                                 if not r.stored.endswith("norm.weight"))))  # norms without weights
# OLMoE: llama.cpp's graph never renormalises the top-k weights; feed_forward_length is the expert width
ARCHS["olmoe"] = _written("olmoe", keys={"expert_count": "num_experts", "expert_used_count": "num_experts_per_tok"},
                          defaults={"hidden_act": "silu", "norm_topk_prob": False}, bias_flags=ATTENTION_BIAS,
                          experts=True)


def _layernorm_table(*rules: Rule, qkv: bool = False) -> TensorTable:
    """A LayerNorm family's llama.cpp layout: norms with biases, every linear with a bias; q, k, v
    fused into one `attn_qkv` [q | k | v] when `qkv` (GPT-NeoX: llama.cpp's converter regroups its
    per-head layout into that), else separate; q/k unpermuted (NeoX-style rotation); and `rules`."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    attention = ((Rule(f"blk.{{}}.attn_qkv.{p}", f"layers.{{}}.attn.{c}.{p}", Piece(("q", "kv", "kv"), i))
                  for p in ("weight", "bias") for i, c in enumerate("qkv")) if qkv else
                 (r for g, c in (("attn_q", "attn.q"), ("attn_k", "attn.k"), ("attn_v", "attn.v"))
                  for r in _weight_and_bias(g, c, IDENTITY)))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        Rule("output.weight", "lm_head.weight", PADDED), *rules,
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        *attention,
        *(r for g, c in (("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))
          for r in _weight_and_bias(g, c, IDENTITY)),
    ))


# Phi-2 (`phi`): one LayerNorm shared by the parallel attention and MLP (`attn_norm`), an output bias
ARCHS["phi2"] = _written("phi", keys={"attention.layer_norm_epsilon": "layer_norm_eps"},
                         defaults={"hidden_act": "gelu_new"}, norm_eps="attention.layer_norm_epsilon",
                         partial_rotary=True, table=_layernorm_table(Rule("output.bias", "lm_head.bias")))
ARCHS["gptneox"] = _written("gpt_neox", keys={"attention.layer_norm_epsilon": "layer_norm_eps",
                                              "use_parallel_residual": "use_parallel_residual",
                                              "rope.freq_base": "rotary_emb_base"},  # its older spellings
                            defaults={"hidden_act": "gelu"}, norm_eps="attention.layer_norm_epsilon",
                            partial_rotary=True, rotary_key="rotary_pct", table=_layernorm_table(qkv=True))
# Command-R (`cohere`): one LayerNorm without a bias shared by the parallel attention and MLP, q/k
# norms per head (llama.cpp: exactly when there are 64 layers or more, as Command R+), the output
# always tied, the logits multiplied by logit_scale
ARCHS["command-r"] = _written("cohere", keys={"logit_scale": "logit_scale",
                                              "attention.layer_norm_epsilon": "layer_norm_eps"},
                              defaults={"hidden_act": "silu"}, bias_flags={"use_qk_norm": "blk.0.attn_q_norm.weight"},
                              norm_eps="attention.layer_norm_epsilon", output=False)
# Cohere2: Command-R's block, sliding-window layers with RoPE and every fourth layer global without it
ARCHS["cohere2"] = _written("cohere2", keys={"attention.sliding_window": "sliding_window", "logit_scale": "logit_scale",
                                             "attention.layer_norm_epsilon": "layer_norm_eps"},
                            defaults={"hidden_act": "silu"}, norm_eps="attention.layer_norm_epsilon", output=False,
                            swa_pattern=4, table=TensorTable(tuple(r for r in tensor_table(False, 0.0, False).rules
                                                                   if "attn_q_norm" not in r.stored
                                                                   and "attn_k_norm" not in r.stored)))  # none


def _mpt_table() -> TensorTable:
    """llama.cpp's MPT (`MPTModel`): LayerNorms with weights only, q, k, v fused as [q | k | v] (as
    MPT's Wqkv), a plain MLP, no biases; the output tied unless the model has its own."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED), Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight"),
        *(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight") for g, c in norms),
        *(Rule("blk.{}.attn_qkv.weight", f"layers.{{}}.attn.{c}.weight", Piece(("q", "kv", "kv"), i))
          for i, c in enumerate("qkv")),
        *(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight")
          for g, c in (("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))),
    ))


# MPT: ALiBi (llama.cpp's slopes for max bias 8, which are MPT's), scores scaled by 1/sqrt(head_dim),
# clip_qkv as clamp_kqv, a 4 x d_model MLP; its config spells the shared keys its own way
ARCHS["mpt"] = _written("mpt", keys={"attention.layer_norm_epsilon": "layer_norm_epsilon",
                                     "attention.clamp_kqv": "attn_config.clip_qkv"},
                        renamed={"hidden_size": "d_model", "num_attention_heads": "n_heads",
                                 "num_hidden_layers": "n_layers", "max_position_embeddings": "max_seq_len"},
                        norm_eps="attention.layer_norm_epsilon", table=_mpt_table())


def _bloom_table() -> TensorTable:
    """llama.cpp's BLOOM (`BloomModel`): its converter reorders the per-head fused qkv
    ([q_h; k_h; v_h] for each head) to GPT-2's [q | k | v] rows, weight and bias alike; the
    embedding LayerNorm is `token_embd_norm`; every norm and linear has a bias; `output` only when
    the checkpoint stores an lm_head."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        *(Rule(f"token_embd_norm.{p}", f"embed_norm.{p}") for p in ("weight", "bias")),
        *(Rule(f"blk.{{}}.attn_qkv.{p}", f"layers.{{}}.attn.{c}.{p}", Piece(("q", "q", "q"), i))
          for p in ("weight", "bias") for i, c in enumerate("qkv")),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        *(rule for g, c in (("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))
          for rule in _weight_and_bias(g, c, IDENTITY)),
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        Rule("output.weight", "lm_head.weight", PADDED),
    ))


# llama.cpp's BLOOM graph adds each sublayer to its un-normed input: a model with
# apply_residual_connection_post_layernorm has no GGUF form, and the file cannot say so
ARCHS["bloom"] = GgufArch("bloom", keys={"attention.layer_norm_epsilon": "layer_norm_epsilon"},
                          norm_eps="attention.layer_norm_epsilon", table=_bloom_table())


def _falcon_table(norms: tuple[tuple[str, str], ...]) -> TensorTable:
    """llama.cpp's Falcon (`FalconModel`): its converter reorders the fused qkv from Falcon's per-KV
    group layout to [q | k | v] rows; LayerNorms with biases, no linear biases, a plain MLP."""
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        *(Rule("blk.{}.attn_qkv.weight", f"layers.{{}}.attn.{c}.weight", Piece(("q", "kv", "kv"), i))
          for i, c in enumerate("qkv")),
        *(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight")
          for g, c in (("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))),
    ))


def _falcon_layout(config: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp runs every Falcon as a parallel block: one KV head and one norm is Falcon-7B's layout
    (what transformers' GGUF loader assumes for every file), anything else new_decoder_architecture's
    with the file's KV heads and norms (Falcon-40B/180B: two; Falcon2-11B: one)."""
    if config["num_key_value_heads"] == 1 and config["num_ln_in_parallel_attn"] == 1:
        return {"new_decoder_architecture": False, "multi_query": True, "parallel_attn": True}
    return {"new_decoder_architecture": True, "parallel_attn": True, "num_kv_heads": config["num_key_value_heads"]}


# what llama.cpp's falcon cannot run (its converter may still write them): Falcon-RW's layout
FALCON_REFUSED = {**dict.fromkeys((f"blk.0.{t}.bias" for t in ("attn_qkv", "attn_output", "ffn_up", "ffn_down")),
                                   "linear biases, Falcon's bias=true"),
                  "blk.0.ffn_norm.weight": "a sequential block, Falcon's parallel_attn=false"}


def _falcon(norms: int, table: TensorTable) -> GgufArch:
    return GgufArch("falcon", keys={"attention.layer_norm_epsilon": "layer_norm_epsilon",
                                    "feed_forward_length": "ffn_hidden_size"},
                    defaults={"activation": "gelu", "bias": False, "alibi": False, "num_ln_in_parallel_attn": norms},
                    norm_eps="attention.layer_norm_epsilon", table=table, derived=_falcon_layout,
                    refused=FALCON_REFUSED, transformers_layout=lambda config: not config["new_decoder_architecture"])


# Falcon-40B's second norm (`ln_attn`, `attn_norm_2`) feeds attention, its first (`ln_mlp`) the MLP;
# Falcon-RW's ALiBi has no GGUF form (llama.cpp's falcon always rotates)
FALCON_TWO_NORMS = _falcon(2, _falcon_table((("attn_norm_2", "attn_norm"), ("attn_norm", "mlp_norm"))))
ARCHS["falcon"] = replace(_falcon(1, _falcon_table((("attn_norm", "attn_norm"),))),
                          variants=(("blk.0.attn_norm_2.weight", FALCON_TWO_NORMS),))


KV_B_PARTS = ("k_nope", "v_head")  # each head's rows of DeepSeek's kv_b: its no-RoPE key, then its value


def _deepseek2_table() -> TensorTable:
    """llama.cpp's DeepSeek-V2/V3 (`DeepseekV2Model`) in the layout its loader reads without MLA
    absorption (`attn_kv_b` whole, which export writes), or with it (its converter's files: kv_b as
    `attn_k_b`, each head's k rows transposed, and `attn_v_b`, gathered back on import): q (or q's
    low-rank pair with its norm), kv_a with the rotary key, kv_a's norm, kv_b; dense SwiGLU layers
    first, then stacked experts with shared ones and the selection bias (`exp_probs_b`)."""
    attention = (("attn_q", "attn.q"), ("attn_q_a", "attn.q_a"), ("attn_q_a_norm", "attn.q_a_norm"),
                 ("attn_q_b", "attn.q_b"), ("attn_kv_a_mqa", "attn.kv_a"), ("attn_kv_a_norm", "attn.kv_a_norm"),
                 ("attn_kv_b", "attn.kv_b"), ("attn_output", "attn.o"), ("attn_norm", "attn_norm"),
                 ("ffn_norm", "mlp_norm"), ("ffn_gate", "mlp.gate"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))
    biased = (("attn_q_a", "attn.q_a"), ("attn_kv_a_mqa", "attn.kv_a"), ("attn_output", "attn.o"),
              *((f"ffn_{n}{e}", f"mlp.{s}{n}") for n in ("gate", "up", "down") for e, s in (("", ""),
                                                                                              ("_shexp", "shared."))))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED), Rule("output.weight", "lm_head.weight", PADDED),
        Rule("output_norm.weight", "final_norm.weight"),
        *(Rule(f"blk.{{}}.{g}.weight", f"layers.{{}}.{c}.weight") for g, c in attention),
        *(Rule(f"blk.{{}}.attn_{n}_b.weight", "layers.{}.attn.kv_b.weight", HeadPart(KV_B_PARTS, (True, False), i))
          for i, n in enumerate("kv")),
        *(Rule(f"blk.{{}}.{g}.bias", f"layers.{{}}.{c}.bias") for g, c in biased),  # llama.cpp loads none: refused
        Rule("blk.{}.exp_probs_b.bias", "layers.{}.mlp.router.selection_bias"),
        *MOE_RULES,
    ))


def _mla_sizes(config: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek's MLA sizes from llama.cpp's. In the layout without absorption (lmconvert's files,
    `attn_kv_b` whole) the key length is the no-RoPE part plus the rotary width
    (`rope.dimension_count`) and the value length v_head_dim; in the layout of llama.cpp's converter
    (absorbed MLA: `attn_k_b`, `attn_v_b`) those are the latent's (kv_lora_rank plus the rotary width,
    kv_lora_rank) with one KV head (its MQA cache), and the heads' own are `key_length_mla` and
    `value_length_mla`. transformers' head_dim is the rotary width. llama.cpp scales the chosen experts'
    weights only by an `expert_weights_scale` other than 0 (and 1)."""
    rotary, heads = config["qk_rope_head_dim"], config["num_attention_heads"]
    sizes: dict[str, Any] = {"qk_nope_head_dim": config["head_dim"] - rotary, "head_dim": rotary}
    if "key_length_mla" in config or "value_length_mla" in config:
        latent = (config.get("kv_lora_rank", 0) + rotary, config.get("kv_lora_rank"), 1)
        if {"key_length_mla", "value_length_mla"} - set(config) or \
                (config["head_dim"], config.get("v_head_dim"), config["num_key_value_heads"]) != latent:
            raise MappingError("its deepseek2 MLA sizes (attention.key_length_mla, value_length_mla, key_length, "
                               "value_length, head_count_kv) are not those llama.cpp's converter writes together")
        sizes = {"qk_nope_head_dim": config["key_length_mla"] - rotary, "head_dim": rotary,
                 "v_head_dim": config["value_length_mla"], "num_key_value_heads": heads}
    if config.get("routed_scaling_factor") == 0:
        sizes["routed_scaling_factor"] = 1.0
    return sizes


def _groups(config: Mapping[str, Any]) -> tuple[int, Any]:
    """(expert groups, groups used), refused where llama.cpp's loader asserts: it takes grouping
    to keep fewer groups than there are."""
    groups, used = config.get("n_group") or 1, config.get("topk_group")
    if groups > 1 and used is not None and used >= groups:
        raise MappingError(f"llama.cpp's deepseek2 loader requires expert_group_used_count below expert_group_count "
                           f"(it aborts otherwise), and this model uses {used} of {groups} expert groups")
    return groups, used


def _deepseek_v3(config: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3's router: llama.cpp's sigmoid scores (`expert_gating_func` 2), with the selection
    bias and groups scored by their two best experts, as DeepseekV3TopkRouter."""
    if config.get("expert_gating_func") != 2:
        raise MappingError(f"deepseek2.expert_gating_func={config.get('expert_gating_func')}: lmconvert reads "
                           "llama.cpp's softmax router (1, DeepSeek-V2's) and its sigmoid one (2, DeepSeek-V3's)")
    _groups(config)
    return _mla_sizes(config)


def _deepseek_v2(config: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek-V2's router: llama.cpp's softmax scores (`expert_gating_func` 1, or none stated),
    the top k taken unrenormalised and scaled, as DeepseekV2TopkRouter's `greedy`. Its
    `group_limited_greedy` scores a group by its best expert, llama.cpp by its two best experts'
    sum: the same only when every group is kept, which llama.cpp's loader does not take."""
    if config.get("norm_topk_prob"):
        raise MappingError("deepseek2.expert_weights_norm=true with softmax routing (expert_gating_func 1): "
                           "DeepSeek-V2 never renormalises the chosen experts' weights")
    groups, used = _groups(config)
    if groups > 1:
        raise MappingError(f"softmax routing limited to {used} of {groups} expert groups: llama.cpp's deepseek2 "
                           "scores a group by the sum of its two best experts, DeepSeek-V2's group_limited_greedy by "
                           "its best one, so they choose different experts")
    return {**_mla_sizes(config), "topk_method": "greedy", "n_group": None, "topk_group": None}


# the `{arch}.` keys of llama.cpp's deepseek2 (MLA, and its MoE keys)
DEEPSEEK2_KEYS = {
    "attention.q_lora_rank": "q_lora_rank", "attention.kv_lora_rank": "kv_lora_rank",
    "attention.value_length": "v_head_dim", "rope.dimension_count": "qk_rope_head_dim",
    "attention.key_length_mla": "key_length_mla", "attention.value_length_mla": "value_length_mla",
    "leading_dense_block_count": "first_k_dense_replace", "expert_count": "n_routed_experts",
    "expert_used_count": "num_experts_per_tok", "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_count": "n_shared_experts", "expert_weights_scale": "routed_scaling_factor",
    "expert_weights_norm": "norm_topk_prob", "expert_group_count": "n_group", "expert_group_used_count": "topk_group",
    "expert_gating_func": "expert_gating_func"}
# what llama.cpp assumes when a deepseek2 file leaves a key out: no q LoRA, no renormalising, no groups, no scale
DEEPSEEK2_DEFAULTS = {"hidden_act": "silu", "q_lora_rank": None, "norm_topk_prob": False, "n_group": 1,
                      "topk_group": 1, "routed_scaling_factor": 1.0}
# DeepSeek-V3 (dense or MoE), interleaved RoPE (llama.cpp's rope type for deepseek2), MLA in llama.cpp's
# layout without absorption; DeepSeek-V2 the same with its softmax router (its RoPE always interleaved)
DEEPSEEK_V3 = _written("deepseek_v3", keys=DEEPSEEK2_KEYS, defaults={**DEEPSEEK2_DEFAULTS, "rope_interleave": True},
                       latent=True, table=_deepseek2_table(), derived=_deepseek_v3)
DEEPSEEK_V2 = replace(DEEPSEEK_V3, model_type="deepseek_v2", defaults=DEEPSEEK2_DEFAULTS, derived=_deepseek_v2)
# llama.cpp's loader takes a file stating no gating function as DeepSeek-V2's (softmax)
ARCHS["deepseek2"] = replace(DEEPSEEK_V3, told_apart=(("expert_gating_func", 2, DEEPSEEK_V3),
                                                      ("expert_gating_func", 1, DEEPSEEK_V2),
                                                      ("expert_gating_func", None, DEEPSEEK_V2)))
