"""Arcee (AFM-4.5B).

Same as llama, except: the MLP is plain, not gated (`up_proj`, then `hidden_act`, then `down_proj`:
Nemotron's MLP), its activation squared ReLU unless `hidden_act` says otherwise; `rms_norm_eps`
defaults to 1e-5; its own size defaults. llama.cpp's `arcee` is its LLaMA graph with that MLP
(q/k rows permuted for its interleaved RoPE, as llama's).
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import fixed
from ..tables.gguf import STATES_VOCAB_AND_ROPE, tensor_table, written
from ..tables.table import TensorTable
from . import llama

CONFIG = llama.CONFIG.but(
    add=(llama.norm(1e-5), llama.activation("hidden_act", "relu2"), fixed("plain MLP", gated=False)),
    defaults={"hidden_size": 2560, "intermediate_size": 18432, "max_position_embeddings": 4096},
    nullable={"attention_dropout": False},
)

# -- llama.cpp (GGUF): transformers' GGUF loader does not read it
GGUF_ARCEE = written("arcee", arch="arcee", defaults={"hidden_act": "relu2"}, permute_qk=True,
                     stated=STATES_VOCAB_AND_ROPE,
                     table=TensorTable(tuple(r for r in tensor_table(True, 0.0, True).rules
                                             if "ffn_gate" not in r.stored)))  # llama's, without the gate

FAMILY = Family("arcee", ("arcee",), "ArceeForCausalLM", llama.TENSORS, CONFIG, gguf=(GGUF_ARCEE,))
