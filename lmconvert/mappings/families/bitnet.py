"""BitNet b1.58 (microsoft/bitnet-b1.58-2B-4T, model_type `bitnet`), unquantized.

Same as llama, except: the attention output is normalised before the output projection
(`self_attn.attn_sub_norm`, an RMSNorm over hidden_size) and the MLP's gated product before its
down projection (`mlp.ffn_sub_norm`, over intermediate_size), both llama-style (weight after the
cast); the MLP is gated with `hidden_act` (default relu2, squared ReLU) and has no bias (there is no
`mlp_bias` key); `rms_norm_eps` defaults to 1e-5; a `rope_theta` missing from the RoPE parameters is
5e5 (BitNetConfig's default_theta); its own defaults (128256 tokens, 2560 wide, 6912
MLP, 30 layers, 20 heads, 5 KV heads); `head_dim` is not a BitNetConfig key (read if stated).

Checkpoints quantized by transformers' BitNet quantizer (`quantization_config.quant_method`
"bitnet": the Hub's microsoft/bitnet-b1.58-2B-4T, ternary weights packed four to a uint8 with a
`weight_scale` per matrix, run with 8-bit activations) are refused by name: their weights are not
the float matrices this family reads. Checkpoints saved unquantized (BitNetForCausalLM as
transformers builds it, plain float linears) convert exactly.

llama.cpp: its converter ternarizes each projection on conversion (`BitnetModel.weight_quant`);
lmconvert writes the float weights as they are, which llama.cpp's bitnet graph runs as given. That
graph hard-codes a gated SiLU MLP, the LM head tied to the embeddings and no biases, so only such
models go to GGUF (BitNet's own relu2 is refused by name).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry, fixed
from ..tables.gguf import tensor_table, written
from ..tables.hf_config import HfConfig, Key
from ..tables.table import Rule, TensorTable
from . import llama

SUB_NORM_RULES = (
    Rule("model.layers.{}.self_attn.attn_sub_norm.weight", "layers.{}.attn.sub_norm.weight"),
    Rule("model.layers.{}.mlp.ffn_sub_norm.weight", "layers.{}.mlp.sub_norm.weight"),
)
TENSORS = TensorTable(llama.TENSORS.rules + SUB_NORM_RULES)

QUANTIZATION = Key("quantization_config", dict, None, nullable=True)


def refuse_quantized(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    config = hf.get(QUANTIZATION.name)
    if config:
        method = config.get("quant_method")
        what = ("BitNet-quantized weights (ternary values packed four to a uint8, a weight_scale per matrix, "
                "8-bit activations)" if method == "bitnet" else "quantized weights")
        raise MappingError(f"config.json: quantization_config.quant_method={json.dumps(method)}: {what} are not "
                           "read; lmconvert converts unquantized BitNet checkpoints (float linear weights) only")
    return {}


QUANTIZED = Entry("quantized", (QUANTIZATION,), refuse_quantized, lambda cfg: {})

CONFIG = llama.CONFIG.but(
    drop=("mlp_bias",),
    add=(llama.norm(1e-5), llama.activation("hidden_act", "relu2"), QUANTIZED, fixed("sub-norms", sub_norms=True)),
    defaults={"vocab_size": 128256, "hidden_size": 2560, "intermediate_size": 6912, "num_hidden_layers": 30,
              "num_attention_heads": 20, "num_key_value_heads": 5, "rope_theta": 500_000.0},
    nullable={"head_dim": False, "num_key_value_heads": True},  # head_dim: not a BitNetConfig key, read if stated
)


# -- llama.cpp (GGUF)
GGUF_TABLE = TensorTable(tensor_table(False, 0.0, False).rules + (
    Rule("blk.{}.attn_sub_norm.weight", "layers.{}.attn.sub_norm.weight"),
    Rule("blk.{}.ffn_sub_norm.weight", "layers.{}.mlp.sub_norm.weight"),
))
GGUF_BITNET = written("bitnet", arch="bitnet", defaults={"hidden_act": "silu"}, output=False, table=GGUF_TABLE)

FAMILY = Family("bitnet", ("bitnet",), "BitNetForCausalLM", TENSORS, CONFIG, gguf=(GGUF_BITNET,))
