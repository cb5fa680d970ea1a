"""GLM-4 (GlmForCausalLM: glm-4-9b and its chat models).

Same as llama, except: gate and up are one fused `gate_up_proj` whose rows are [gate | up] (split on
import, joined on export, bit for bit, as phi3's), and the MLP multiplies `up * act(gate)`; RoPE
rotates only `partial_rotary_factor` (default 0.5, for every rope type) of each head, and reads those
rotary dims in interleaved pairs (cos/sin are cast to the activation dtype first, then each frequency
repeated for its pair, as GPT-J's); `attention_bias` (default true) switches the q, k and v biases,
never the output projection's; the MLP has no bias; `rms_norm_eps` defaults to 1.5625e-7 (the norm
as llama's: statistics in fp32, the weight multiplied after the cast back); head_dim defaults to
128 and the model has two KV heads by default. GlmConfig accepts a null `head_dim` or
`num_key_value_heads`, but its attention then cannot be built: refused here.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import ATTENTION_BIAS_FLAG, tensor_table, written
from ..tables.hf_config import HfConfig, Key
from ..tables.hf_rope import rope
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Piece
from . import llama, phi3

FUSED_MLP_RULES = (
    *(Rule("model.layers.{}.mlp.gate_up_proj.weight", f"layers.{{}}.mlp.{name}.weight", Piece(phi3.GATE_UP, i))
      for i, name in enumerate(("gate", "up"))),
    Rule("model.layers.{}.mlp.down_proj.weight", "layers.{}.mlp.down.weight"),
)
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + FUSED_MLP_RULES + llama.PRE_NORM_RULES)


def built(hf: HfConfig, key: str) -> Any:
    """A key GlmConfig accepts as null but GlmAttention cannot be built with (`heads // None`,
    `None ** -0.5`): refused here rather than when the model is built."""
    value = hf.get(key)
    if value is None:
        raise MappingError(f"config.json: {key}=null: transformers cannot build this model (it accepts the "
                           f"config, then fails building the attention); set the model's value, or remove the "
                           f"key for the default")
    return value


def built_row(key: str, field: str) -> Entry:
    return Entry(key, (Key(key, int, None, nullable=True),), lambda hf, _: {field: built(hf, key)},
                 lambda cfg: {key: getattr(cfg, field)})


def qkv_biases_of(cfg: ArchConfig) -> bool:
    """`attention_bias` for export: true only when q, k and v all have biases; an o bias is never
    read back, so export names it as what GLM cannot express."""
    return cfg.q_bias and cfg.k_bias and cfg.v_bias


QKV_BIAS = Entry("attention_bias", (Key("attention_bias", bool, True),),
                 lambda hf, _: {"q_bias": hf.get("attention_bias"), "k_bias": hf.get("attention_bias"),
                                "v_bias": hf.get("attention_bias")},
                 lambda cfg: {"attention_bias": qkv_biases_of(cfg)})

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(built_row("num_key_value_heads", "n_kv_heads"), built_row("head_dim", "head_dim"),
         rope(partial=True, layout="interleaved"), QKV_BIAS),
    defaults={"vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40,
              "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
              "max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-07, "partial_rotary_factor": 0.5},
)


# one gate_up_proj output [gate | up]
REFERENCE_LAYOUTS = {"mlp.gate": "B T [F]|F", "mlp.up": "B T F|[F]"}

# -- llama.cpp (GGUF)
GATE_UP = ("blk.{}.ffn_gate.weight", "blk.{}.ffn_up.weight")


def gguf_table() -> TensorTable:
    """llama.cpp's chatglm and glm4: HF's gate_up_proj unchanged as `ffn_up` [gate | up], q/k
    unpermuted (their rotation reads adjacent pairs, as GLM's interleaved RoPE); GLM-4-0414's
    sandwich norms as `post_attention_norm` and `post_ffw_norm`."""
    fused = tuple(Rule("blk.{}.ffn_up.weight", f"layers.{{}}.mlp.{n}.weight", Piece(("ffn", "ffn"), i))
                  for i, n in enumerate(("gate", "up")))
    return TensorTable(tuple(r for r in tensor_table(False, 0.0, True).rules if r.stored not in GATE_UP) + fused)


# llama.cpp's chatglm (ChatGLMModel in its converter reads GlmForCausalLM): its loader reads the q, k and v
# biases only; the rotated part of a head is `rope.dimension_count`
# the special tokens llama.cpp's converter states by their text where the tokenizer's files name none
# (ChatGLMModel's; Glm4Model's adds BOS, GLM-4.5's _set_vocab_glm its own)
END_OF_TURN = {"tokenizer.ggml.eos_token_id": "<|endoftext|>", "tokenizer.ggml.eot_token_id": "<|user|>",
               "tokenizer.ggml.unknown_token_id": "<|endoftext|>"}
GGUF_CHATGLM = written("glm", arch="chatglm", defaults={"hidden_act": "silu"}, bias_flags=ATTENTION_BIAS_FLAG,
                       partial_rotary=True, table=gguf_table(), token_texts=END_OF_TURN,
                       head_dim_stated=False)  # ChatGLMModel writes its own parameters

FAMILY = Family("glm", ("glm",), "GlmForCausalLM", TENSORS, CONFIG, gguf=(GGUF_CHATGLM,),
                reference_layouts=REFERENCE_LAYOUTS)
