"""IQuest-Coder-V1: transformers runs it with the LLaMA modules (`LlamaForCausalLM`).

Same as llama, except: its own defaults (76800 tokens, 5120 wide, 80 layers, 40 heads and 8 KV heads
of head_dim 128, rms_norm_eps 1e-5, 131072 positions), and the two options of IQuest's original code
that transformers refuses (`clip_qkv` set, `use_sliding_window` true) are refused here too. The dtype
order is llama's: the RMSNorm statistics in fp32, cast back, then the weight multiplies in the
activation dtype.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry
from ..tables.hf_config import HfConfig, Key
from . import llama

REFUSED = (Key("clip_qkv", float, None, nullable=True), Key("use_sliding_window", bool, False))


def refuse_unsupported(hf: HfConfig, _: dict[str, Any]) -> dict[str, Any]:
    for key in REFUSED:
        if hf.get(key.name) not in (None, False):
            raise MappingError(f"config.json: {key.name}={json.dumps(hf.get(key.name))} is not supported by "
                               f"IQuestCoder (transformers refuses it too); remove the key")
    return {}


CONFIG = llama.CONFIG.but(
    add=(Entry("unsupported options", REFUSED, refuse_unsupported, lambda cfg: {}),),
    defaults={"vocab_size": 76800, "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 80,
              "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-5},
    nullable={"attention_dropout": False},
)



# -- llama.cpp (GGUF)
# llama.cpp's converter writes IQuest-Coder as `llama` (its LlamaModel); told apart by its general.name
GGUF_IQUESTCODER = replace(llama.GGUF_LLAMA, model_type="iquestcoder", named="iquestcoder")

FAMILY = Family("iquestcoder", ("iquestcoder",), "LlamaForCausalLM", llama.TENSORS, CONFIG, gguf=(GGUF_IQUESTCODER,))
