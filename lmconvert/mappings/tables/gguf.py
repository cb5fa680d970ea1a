"""llama.cpp's GGUF conventions as data: the entry (`GgufArch`) a family module declares for each
llama.cpp architecture it is (which transformers model_type, what llama.cpp's converter,
`convert_hf_to_gguf.py`, does to each tensor), and the GGUF tensor table (llama.cpp names <->
canonical names) with the transforms that undo those changes. `registry.py` gathers the entries
(`ARCHS`). No file I/O and no `gguf` package: formats/gguf.py reads the file and calls these.

What llama.cpp's converter changes, each undone by the table the way transformers' own GGUF loader
(`modeling_gguf_pytorch_utils.py`) undoes it:
- names: `blk.{i}.attn_q.weight` and so on, as gguf's `TensorNameMap` names them (a test checks
  this table against it for every architecture here);
- the q and k rows of `llama` files (Mistral included) are permuted for llama.cpp's interleaved
  RoPE (`LlamaModel.permute`): Permute undoes it for weights and biases;
- Gemma 2 and 3 norm weights are stored as `w + 1` (q/k norms too): Offset subtracts 1 in float32;
- Falcon-H1's muP multipliers are folded into its weights: Scale multiplies on export; the import
  reads the weights as stored, with unit multipliers (`folded`);
- embedding / output rows past the vocabulary are padding: Trim drops them;
- Phi-3's fused `attn_qkv` and `ffn_up` are HF's qkv_proj and gate_up_proj unchanged: pieces.
- a mixture's experts are stacked per layer and projection (`ffn_gate_exps` [experts, width,
  hidden]): Unstack gives each expert's matrix; Qwen2-MoE's shared-expert gate is stored as a
  vector: Unsqueeze restores its row.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from .table import Rule, TensorTable
from .transforms import IDENTITY, Offset, Permute, Piece, Step, Transform, Trim, Unsqueeze, Unstack


@dataclass(frozen=True)
class GgufArch:
    """How one llama.cpp architecture maps to a transformers model_type."""

    model_type: str
    arch: str = ""  # llama.cpp's architecture name (`general.architecture`)
    named: str = ""  # a word of `general.name` telling this model apart within `arch` (Mistral within llama)
    keys: Mapping[str, str] = field(default_factory=dict)  # `{arch}.` keys beyond SHARED_KEYS -> HF keys
    defaults: Mapping[str, Any] = field(default_factory=dict)  # HF keys the file does not state
    bias_flags: Mapping[str, str] = field(default_factory=dict)  # HF bool key -> GGUF tensor that sets it
    # HF key -> a per-layer GGUF tensor (`{}` the layer): the import states the layers holding it there, for
    # `derived` to read and the import to drop (Jamba's expert layers, which llama.cpp tells by their router)
    layer_tensors: Mapping[str, str] = field(default_factory=dict)
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
    # export: `{arch}.` keys computed from the config, over what `keys` writes (GraniteSWA's rope_pattern, one
    # flag per layer where config.json has a theta per layer): the inverse of `derived`
    exported: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
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
    # export: required HF keys the config may have no value for -> the value (what the model has, Falcon's KV
    # heads from its layout, or what llama.cpp's converter states)
    unstated: Mapping[str, Callable[[Mapping[str, Any]], Any]] = field(default_factory=dict)
    # export: `{arch}.` keys llama.cpp's converter writes whatever the config says (OLMo's LayerNorm eps)
    constants: Mapping[str, Any] = field(default_factory=dict)
    # export: optional `{arch}.` keys llama.cpp's converter class for this architecture writes even where
    # they hold its runtime's default (`vocab_size`, `rope.dimension_count`, `attention.key_length`,
    # `attention.sliding_window_pattern`); any entry of an architecture may state them for all
    stated: frozenset[str] = frozenset()
    # export: whether llama.cpp's converter states config.json's head_dim as the key and value lengths (its
    # TextModel does, where the config has one); False where the transformers config class keeps none (Qwen2's,
    # Phi-3's, OLMo's, Granite's ...: the config lmconvert writes names one all the same) or the converter
    # class writes its own (ChatGLM's)
    head_dim_stated: bool = True
    # export: optional keys that class never writes, or writes only where they differ from the runtime's
    # default -> that default (Gemma's, StableLM's, Phi-2's and Falcon's classes write no RoPE base;
    # DeepseekV2Model no expert_weights_norm false)
    omitted: Mapping[str, Any] = field(default_factory=dict)
    # export: tokenizer keys llama.cpp's converter takes from a config key rather than the tokenizer's files,
    # stated over theirs (HunYuan's `tokenizer.ggml.eos_token_id` from eod_token_id)
    token_keys: Mapping[str, str] = field(default_factory=dict)
    # export: tokenizer keys -> the token (by its text) llama.cpp's converter states where the tokenizer's
    # files name none (GLM's end of turn, `<|user|>`)
    token_texts: Mapping[str, str] = field(default_factory=dict)
    # rope parameters (HF names) llama.cpp's runtime takes as these whatever the file states (gpt-oss: YaRN's
    # betas, which its loader does not read): read as these, so an export stating others is refused
    rope_fixed: Mapping[str, Any] = field(default_factory=dict)
    # `lmconvert.` keys -> HF keys: what llama.cpp's format has no key for, its runtime no use for, and the
    # import needs back (a Mamba2 mixer's chunk size, which changes how its prefill rounds)
    own: Mapping[str, str] = field(default_factory=dict)
    # export: (a test of the HF config, entry): a model passing it is written as that entry, under that entry's
    # own architecture (Nemotron-H with MoE blocks: llama.cpp's nemotron_h_moe beside nemotron_h)
    written_as: tuple[tuple[Callable[[Mapping[str, Any]], bool], GgufArch], ...] = ()
    # HF keys -> the value the file's model has for them: multipliers llama.cpp's converter folds into the weights
    # (Falcon-H1's muP; `layout` builds the table's Scale transforms from the config), so the file states none. The
    # import reads these, the weights holding the rest; the export holds what it reads back to the source with these
    # values in place of its own
    folded: Mapping[str, Any] = field(default_factory=dict)
    # the key and value lengths and the rotated width are per layer kind (Gemma 4: `attention.key_length` the full
    # layers', `attention.key_length_swa` the sliding ones'): `exported` writes them and `derived` reads them, in
    # place of the one head size the others state
    per_kind_heads: bool = False
    # RoPE that llama.cpp reads from a `rope_freqs` tensor of this architecture's own (Gemma 4's proportional RoPE:
    # 1 for each rotated frequency, 1e30 for each left still): export's (config -> `{arch}.` keys, extra tensors),
    # and the import's (the tensor's values, the config so far -> HF keys)
    rope_out: Callable[[Mapping[str, Any]], tuple[dict[str, Any], dict[str, Any]]] | None = None
    rope_in: Callable[[Any, Mapping[str, Any]], dict[str, Any]] | None = None
    # export: `tokenizer.ggml.model` as llama.cpp's converter class writes it, where it writes its own ("gemma4":
    # the tokenizer.json vocabulary with scores, llama.cpp's gemma4 tokenizer); "": by the tokenizer's files
    tokenizer: str = ""
    # HF keys that `keys` reads a file's values into for `derived` alone (Gemma 4's full head size), dropped after it
    transient: tuple[str, ...] = ()

    @property
    def attends(self) -> bool:
        """False for llama.cpp's all-state-space architectures (mamba, mamba2), whose files state a head count
        and an FFN width of 0: no head size, no RoPE."""
        return self.constants.get("attention.head_count") != 0

    def read_by_transformers(self, config: Mapping[str, Any]) -> bool:
        """Whether transformers' GGUF loader builds this file's model (a reference for `verify`)."""
        return self.transformers_reads and (self.transformers_layout is None or self.transformers_layout(config))

    def stating(self, value_of: Callable[[str], Any]) -> GgufArch:
        """The entry for a file whose `{arch}.` keys have these values (`value_of`: key -> value or None)."""
        return next((entry for key, value, entry in self.told_apart if value_of(key) == value), self)

    def holding(self, tensors: Collection[str]) -> GgufArch:
        """The entry for a file holding these tensors: a variant's, if it holds the variant's tensor."""
        return next((variant for tensor, variant in self.variants if tensor in tensors), self)

    # the table for one HF config, where llama.cpp's names depend on it (Nemotron-H's block norm, `attn_norm`, is
    # the attention's or the MLP's norm by the block); None: `tensors`
    layout: Callable[[Mapping[str, Any]], TensorTable] | None = None

    def tensors_for(self, config: Mapping[str, Any]) -> TensorTable:
        """llama.cpp's tensor names <-> canonical names for this HF config."""
        return self.layout(config) if self.layout is not None else self.tensors

    @property
    def tensors(self) -> TensorTable:
        """llama.cpp's tensor names <-> canonical names, with this architecture's transforms."""
        return self.table if self.table is not None else tensor_table(self.permute_qk, self.norm_offset, self.output,
                                                                      self.fused, self.experts)


ATTENTION_BIAS_FLAG = {"attention_bias": "blk.0.attn_q.bias"}
# llama.cpp's qwen2moe / qwen3moe graphs (no dense layers, no window) hard-code whether the top-k
# weights are renormalised: never for qwen2moe, always for qwen3moe
QWEN_MOE_KEYS = {"expert_count": "num_experts", "expert_used_count": "num_experts_per_tok",
                 "expert_feed_forward_length": "moe_intermediate_size"}
GEMMA_KEYS = {"attention.sliding_window": "sliding_window", "final_logit_softcapping": "final_logit_softcapping"}

# ---------------------------------------------------------------------------------------------
# the tensor table

PADDED = Trim("vocab", "rows")  # "rows": the rows the file stores


def weight_and_bias(gguf: str, canonical: str, step: Step | Transform) -> tuple[Rule, ...]:
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
    separate = (*weight_and_bias("attn_q", "attn.q", q), *weight_and_bias("attn_k", "attn.k", k),
                *weight_and_bias("attn_v", "attn.v", IDENTITY),
                *(() if experts else (*weight_and_bias("ffn_gate", "mlp.gate", IDENTITY),
                                      *weight_and_bias("ffn_up", "mlp.up", IDENTITY))))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        *((Rule("output.weight", "lm_head.weight", PADDED),) if output else ()),
        Rule("output_norm.weight", "final_norm.weight", norm),
        *(_fused() if fused else separate),
        *weight_and_bias("attn_output", "attn.o", IDENTITY),
        *(MOE_RULES if experts else weight_and_bias("ffn_down", "mlp.down", IDENTITY)),
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
    def own_value(own: str) -> Any:  # noqa: ANN401 - a config value; a dotted name is a nested dict's key (DBRX)
        value: Any = config
        for part in own.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        return value

    config = {**config, **{shared: own_value(own) for shared, own in (renamed or {}).items()
                           if own_value(own) is not None}}
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or (config["hidden_size"] // heads if heads else 0)  # 0 heads: Mamba
    ffn = config.get("intermediate_size") or config.get("n_inner") or 4 * config["hidden_size"]
    latent = ({"k_nope": config["qk_nope_head_dim"], "v_head": config["v_head_dim"]} if "qk_nope_head_dim" in config
              else {})
    shared = {"shared": config["shared_intermediate_size"]} if config.get("shared_intermediate_size") else {}
    # the gated delta-net's per-key-head groups (Qwen3-Next's ssm_ba), as its settings' `sizes` name them
    gdn = ({"mixer.key_heads": config["linear_num_key_heads"], "mixer.value_heads": config["linear_num_value_heads"],
            "mixer.heads_per_key": config["linear_num_value_heads"] // config["linear_num_key_heads"],
            "mixer.key_dim": config["linear_num_key_heads"] * config["linear_key_head_dim"],
            "mixer.values_per_key": config["linear_num_value_heads"] // config["linear_num_key_heads"]
            * config["linear_value_head_dim"]}
           if config.get("linear_num_key_heads") else {})
    return {**gdn, "vocab": config["vocab_size"], "heads": heads, "kv_heads": kv_heads, "q": heads * head_dim,
            "kv": kv_heads * head_dim, "ffn": ffn, **latent,  # MLA: the per-head parts of DeepSeek's kv_b
            **shared}  # a shared expert stored as one [gate | up] (granite_swa's ffn_up_shexp)


# what llama.cpp's LlamaModel and its subclasses (and DeepseekV2Model, Cohere2Model, NemotronModel) state
# whatever the value: the vocabulary's size and the rotated width
STATES_VOCAB_AND_ROPE = frozenset({"vocab_size", "rope.dimension_count"})
NO_ROPE_BASE = {"rope.freq_base": 10000.0}


def written(model_type: str, **facts: Any) -> GgufArch:  # noqa: ANN401 - GgufArch's fields
    """An architecture lmconvert writes that transformers' GGUF loader does not read."""
    return GgufArch(model_type, transformers_reads=False, **facts)


# -- architectures that lmconvert's GGUF export writes (and reads back the same way); transformers'
# GGUF loader reads none of them, so `verify` takes the source the file records as its reference
# What each one's llama.cpp graph hard-codes instead of stating is in its defaults: Gemma's tanh GELU
# and embeddings scaled by sqrt(hidden) (the gemma family's own), SmolLM3's NoPE on every fourth
# layer, OLMo's LayerNorm without weights and eps 1e-5.

def layernorm_table(*rules: Rule, qkv: bool = False) -> TensorTable:
    """A LayerNorm family's llama.cpp layout: norms with biases, every linear with a bias; q, k, v
    fused into one `attn_qkv` [q | k | v] when `qkv` (GPT-NeoX: llama.cpp's converter regroups its
    per-head layout into that), else separate; q/k unpermuted (NeoX-style rotation); and `rules`."""
    norms = (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm"))
    attention = ((Rule(f"blk.{{}}.attn_qkv.{p}", f"layers.{{}}.attn.{c}.{p}", Piece(("q", "kv", "kv"), i))
                  for p in ("weight", "bias") for i, c in enumerate("qkv")) if qkv else
                 (r for g, c in (("attn_q", "attn.q"), ("attn_k", "attn.k"), ("attn_v", "attn.v"))
                  for r in weight_and_bias(g, c, IDENTITY)))
    return TensorTable((
        Rule("token_embd.weight", "embed.weight", PADDED),
        Rule("output.weight", "lm_head.weight", PADDED), *rules,
        Rule("output_norm.weight", "final_norm.weight"), Rule("output_norm.bias", "final_norm.bias"),
        *(Rule(f"blk.{{}}.{g}.{p}", f"layers.{{}}.{c}.{p}") for g, c in norms for p in ("weight", "bias")),
        *attention,
        *(r for g, c in (("attn_output", "attn.o"), ("ffn_up", "mlp.up"), ("ffn_down", "mlp.down"))
          for r in weight_and_bias(g, c, IDENTITY)),
    ))


