"""InternLM3 (internlm3-8b-instruct): transformers runs it with the LLaMA modules (`LlamaForCausalLM`).

Same as llama, except: `attention_bias` (spelled `qkv_bias` in InternLM's own config.json, which wins
when both are stated, as transformers' `attribute_map` sets it last) and `mlp_bias` (spelled `bias`)
must agree (transformers refuses them apart, since one setting covers q, k, v, o and the MLP); its
own defaults (128512 tokens, 48 layers, 32 heads and 2 KV heads of head_dim 128, rms_norm_eps 1e-5,
32768 positions). The dtype order is llama's: the RMSNorm statistics in fp32, cast back, then the
weight multiplies in the activation dtype.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry
from ..tables.hf_config import HfConfig, Key
from . import llama

# (the key written, the spelling InternLM's files use) for the attention and the MLP biases
ATTENTION, MLP = ("attention_bias", "qkv_bias"), ("mlp_bias", "bias")


def _flag(hf: HfConfig, keys: tuple[str, str]) -> bool:
    key, alias = keys
    return hf.get(alias) if hf.stated(alias) else hf.get(key)


def biases_from_hf(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    attention, mlp = _flag(hf, ATTENTION), _flag(hf, MLP)
    if attention != mlp:
        raise MappingError(f"config.json: attention_bias (qkv_bias)={str(attention).lower()} and mlp_bias (bias)="
                           f"{str(mlp).lower()} differ; InternLM3 runs one bias setting for q, k, v, o and the MLP "
                           "(transformers refuses them apart too); set both alike")
    return {**llama.attention_biases(attention), "mlp_bias": mlp}


BIASES = Entry("biases", tuple(Key(name, bool, False, legacy=name in (ATTENTION[1], MLP[1]))
                               for name in (*ATTENTION, *MLP)),
               biases_from_hf,
               lambda cfg: {"attention_bias": llama.attention_bias_of(cfg), "mlp_bias": cfg.mlp_bias})

CONFIG = llama.CONFIG.but(
    drop=("attention_bias", "mlp_bias"),
    add=(BIASES,),
    defaults={"vocab_size": 128512, "intermediate_size": 10240, "num_hidden_layers": 48, "num_key_value_heads": 2,
              "head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5},
    nullable={"attention_dropout": False},
)



# -- llama.cpp (GGUF)
# llama.cpp's converter writes InternLM3 as `llama` (InternLM3Model: q/k permuted, biases kept); like
# Mistral, told apart by its general.name (the real one's, "Internlm3 8b Instruct", holds the word)
GGUF_INTERNLM3 = replace(llama.GGUF_LLAMA, model_type="internlm3", named="internlm3")

FAMILY = Family("internlm3", ("internlm3",), "LlamaForCausalLM", llama.TENSORS, CONFIG, gguf=(GGUF_INTERNLM3,))
