"""GPT (openai-community/openai-gpt, the first GPT).

Same as gpt2's layout (q, k and v the three pieces of one `Conv1D` `attn.c_attn`, `attn.c_proj`,
`mlp.c_fc` and `mlp.c_proj` Conv1Ds with biases, LayerNorms with a bias at `layer_norm_epsilon`,
learned positions from 0, a tied LM head without a bias, the softmax in the scores' dtype), except:
the blocks are post-norm, `ln_1(x + attn(x))` then `ln_2(n + mlp(n))`, with no final norm; the
embeddings are `tokens_embed` and `positions_embed`; the scores are always scaled, divided by
sqrt(head_dim) (the same bits as head_dim ** -0.5 where sqrt(head_dim) is a power of two, as in the
released 64-wide heads), and the causal mask is `w * b - 1e4 * (1 - b)`, which the fp32 softmax
zeroes like -inf; the MLP is always 4 * n_embd wide (no n_inner key); `afn` names the activation
(`gelu` is GPT's tanh approximation, gelu_new; also relu, silu, swish); the keys are `n_embd`,
`n_layer`, `n_head`, `n_positions`, also read as hidden_size, num_hidden_layers,
num_attention_heads, max_position_embeddings (OpenAIGPTConfig's attribute_map); dropouts
`embd_pdrop`, `resid_pdrop`, `attn_pdrop` (training only); the `summary_*` keys configure the
double-heads model's classifier, not the LM. transformers runs it with its own attention only
(no SDPA) and keeps no KV cache.
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import DEFAULT, ConfigTable, Entry, fixed, plain
from ..tables.hf_alias import aliased
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Chain, Piece, Transpose
from .gpt2 import LAYER_NORM, QKV, REFERENCE_LAYOUTS, THIRDS
from .opt import learned_positions

AFN = {"relu": "relu", "silu": "silu", "swish": "silu", "gelu": "gelu_new"}  # modeling_openai.ACT_FNS
AFN_TO_HF = {"relu": "relu", "silu": "silu", "gelu_new": "gelu"}


def _rules(prefix: str) -> tuple[Rule, ...]:
    """The whole table under one prefix ("transformer." as transformers saves it, "" as older files)."""
    layer = f"{prefix}h.{{}}"
    return (
        Rule(f"{prefix}tokens_embed.weight", "embed.weight"),
        Rule(f"{prefix}positions_embed.weight", "pos_embed.weight"),
        *(Rule(f"{layer}.{hf}.{p}", f"layers.{{}}.{c}.{p}")
          for hf, c in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")) for p in ("weight", "bias")),
        *(Rule(f"{layer}.attn.c_attn.weight", f"layers.{{}}.attn.{c}.weight", Chain(Transpose(), Piece(THIRDS, i)))
          for i, c in enumerate(QKV)),
        *(Rule(f"{layer}.attn.c_attn.bias", f"layers.{{}}.attn.{c}.bias", Piece(THIRDS, i)) for i, c in enumerate(QKV)),
        *(Rule(f"{layer}.{hf}.weight", f"layers.{{}}.{c}.weight", Transpose())
          for hf, c in (("attn.c_proj", "attn.o"), ("mlp.c_fc", "mlp.up"), ("mlp.c_proj", "mlp.down"))),
        *(Rule(f"{layer}.{hf}.bias", f"layers.{{}}.{c}.bias")
          for hf, c in (("attn.c_proj", "attn.o"), ("mlp.c_fc", "mlp.up"), ("mlp.c_proj", "mlp.down"))),
        Rule(f"{layer}.attn.bias", None),  # the causal-mask buffer, where a file stored it
    )


TENSORS = TensorTable(_rules("transformer.") + (Rule("lm_head.weight", "lm_head.weight"),) + _rules(""))



CONFIG = ConfigTable((
    plain("vocab_size", "vocab_size", int, 40478),
    aliased("n_embd", "hidden_size", "d_model", int, 768),
    Entry("d_ff", (), lambda hf, fields: {"d_ff": 4 * fields["d_model"]}, lambda cfg: {}),
    aliased("n_layer", "num_hidden_layers", "n_layers", int, 12),
    aliased("n_head", "num_attention_heads", "n_heads", int, 12),
    aliased("n_positions", "max_position_embeddings", "max_positions", int, 512),
    plain("tie_word_embeddings", "tie_embeddings", bool, True),
    LAYER_NORM,
    plain("afn", "activation", str, "gelu", name="activation", choices=AFN, read=AFN.__getitem__,
          write=lambda a: AFN_TO_HF.get(a, DEFAULT)),
    plain("embd_pdrop", "embed_dropout", float, 0.1, bound="probability"),
    plain("resid_pdrop", "resid_dropout", float, 0.1, bound="probability"),
    plain("attn_pdrop", "attn_dropout", float, 0.1, bound="probability"),
    fixed("GPT layers", norm_placement="post", final_norm=False, gated=False, q_bias=True, k_bias=True, v_bias=True,
          o_bias=True, mlp_bias=True, conv1d_linears=True),  # Conv1D: addmm over [in, out], as GPT-2
    Entry("positions", (), lambda hf, fields: learned_positions(fields["n_layers"], 0), lambda cfg: {}),
))

FAMILY = Family("openai_gpt", ("openai-gpt",), "OpenAIGPTLMHeadModel", TENSORS, CONFIG,
                reference_layouts=REFERENCE_LAYOUTS)
