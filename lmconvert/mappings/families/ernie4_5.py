"""ERNIE 4.5 dense (Ernie4_5ForCausalLM: ERNIE-4.5-0.3B).

Same as llama, except: `use_bias` (default false) switches the biases of q, k, v, o and the MLP's
three projections together (there is no `attention_bias` or `mlp_bias`, and the LM head never has
one); RoPE reads each head's dims in interleaved pairs, and rotates in fp32 with cos/sin kept fp32
(`q.float() * cos + rotate_half(q).float() * sin`, cast back), theta default 500000; the
embeddings are tied by default; `rms_norm_eps` defaults to 1e-5; head_dim defaults to 128 (null:
hidden/heads); there is no attention dropout (no key).
"""

from __future__ import annotations

from lmconvert.arch import ArchConfig

from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import written
from ..tables.hf_config import Key
from ..tables.hf_rope import rope
from . import llama


def biases(flag: bool) -> dict[str, bool]:
    """`use_bias` switches every linear of a block but the experts' (q, k, v, o, gate, up, down)."""
    return {**llama.attention_biases(flag), "mlp_bias": flag}


def use_bias_of(cfg: ArchConfig) -> bool:
    """`use_bias` for export: true only when every block linear has its bias; a partial set is
    reported as the biases ERNIE cannot express."""
    return llama.attention_bias_of(cfg) and cfg.mlp_bias


USE_BIAS = Entry("use_bias", (Key("use_bias", bool, False, nullable=True),),
                 lambda hf, _: biases(bool(hf.get("use_bias"))), lambda cfg: {"use_bias": use_bias_of(cfg)})

CONFIG = llama.CONFIG.but(
    drop=("attention_bias", "mlp_bias", "attention_dropout"),
    add=(llama.norm(1e-5), rope(fp32_tables=True, layout="interleaved"), USE_BIAS),
    defaults={"vocab_size": 103424, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 18,
              "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128,
              "max_position_embeddings": 131072, "tie_word_embeddings": True, "rope_theta": 500000.0},
)

# -- llama.cpp (GGUF): ERNIE4_5, NORM rope (adjacent pairs, as HF's: no permutation); its loader reads
# an o bias only, so the test model has none (use_bias switches them all)
GGUF_ERNIE4_5 = written("ernie4_5", arch="ernie4_5", defaults={"hidden_act": "silu"})

FAMILY = Family("ernie4_5", ("ernie4_5",), "Ernie4_5ForCausalLM", llama.TENSORS, CONFIG, gguf=(GGUF_ERNIE4_5,))
