"""EXAONE 3.x (LGAI-EXAONE/EXAONE-3.0-7.8B-Instruct, EXAONE-3.5-2.4B / 7.8B / 32B).

Same as llama, except: transformers runs it as `LlamaForCausalLM` (so the same ops in the same dtype
order) but reads and saves the original names: `transformer.wte`, `transformer.h.{i}` with `ln_1` /
`ln_2` (the RMSNorms), `attn.attention.{q,k,v,out}_proj`, the MLP's `c_fc_0` (gate), `c_fc_1` (up)
and `c_proj` (down), and `transformer.ln_f` (export writes these; llama's names, which transformers
also loads, are read too); `num_layers`, `layer_norm_epsilon` and
`activation_function` are also read as num_hidden_layers, rms_norm_eps and hidden_act
(ExaoneConfig's attribute_map, the spellings of the released config.json files); `rms_norm_eps`
defaults to 1e-5, `rope_theta` to 500000, `num_key_value_heads` to 8.
"""

from __future__ import annotations

from dataclasses import replace

from lmconvert.arch import NormConfig

from ..family import Family
from ..tables.gguf import ATTENTION_BIAS_FLAG, GgufArch
from ..tables.hf_alias import aliased
from ..tables.table import Rule, TensorTable
from . import llama

LAYER = "transformer.h.{}"
TENSORS = TensorTable((
    Rule("transformer.wte.weight", "embed.weight"),
    Rule(f"{LAYER}.ln_1.weight", "layers.{}.attn_norm.weight"),
    *(Rule(f"{LAYER}.attn.attention.{hf}_proj.{p}", f"layers.{{}}.attn.{c}.{p}")
      for hf, c in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o")) for p in ("weight", "bias")),
    Rule(f"{LAYER}.ln_2.weight", "layers.{}.mlp_norm.weight"),
    *(Rule(f"{LAYER}.mlp.{hf}.{p}", f"layers.{{}}.mlp.{c}.{p}")
      for hf, c in (("c_fc_0", "gate"), ("c_fc_1", "up"), ("c_proj", "down")) for p in ("weight", "bias")),
    Rule("transformer.ln_f.weight", "final_norm.weight"),
    Rule("lm_head.weight", "lm_head.weight"),
) + tuple(r for r in llama.TENSORS.rules if r.stored != "lm_head.weight"))  # LlamaForCausalLM's names, read too

CONFIG = llama.CONFIG.but(
    add=(aliased("num_hidden_layers", "num_layers", "n_layers", int, 32),
         replace(aliased("rms_norm_eps", "layer_norm_epsilon", "norm", float, 1e-5,
                         read=lambda eps: NormConfig(eps=eps), write=lambda norm: norm.eps), name="norm"),
         replace(aliased("hidden_act", "activation_function", "activation", str, "silu",
                         choices=llama.ACTIVATIONS_FROM_HF, read=llama.ACTIVATIONS_FROM_HF.__getitem__,
                         write=llama.activation_to_hf), name="activation")),
    defaults={"vocab_size": 102400, "intermediate_size": 14336, "num_key_value_heads": 8,
              "max_position_embeddings": 4096, "rope_theta": 500000.0},
)


# -- llama.cpp (GGUF)
# llama.cpp's exaone (ExaoneModel in its converter): llama's layout with q/k unpermuted (NeoX-style
# rotation); its loader reads the q, k and v biases, no o or MLP bias
GGUF_EXAONE = GgufArch("exaone", arch="exaone", defaults={"hidden_act": "silu"}, bias_flags=ATTENTION_BIAS_FLAG,
                       transformers_reads=False)

FAMILY = Family("exaone", ("exaone",), "LlamaForCausalLM", TENSORS, CONFIG, gguf=(GGUF_EXAONE,))
