"""Helium (kyutai/helium-1).

Same as llama, except: the RMSNorm weight is cast to fp32 and multiplies the fp32 normalised
activations before the one cast back (eps `rms_norm_eps`, default 1e-8); RoPE rotates interleaved
pairs (cos/sin computed in fp32 as for the half layout, cast to the activation dtype, each
frequency repeated for its pair), theta defaulting to 1e5; `attention_bias` switches the q, k and
v biases and o never has one; o_proj takes hidden_size inputs, so a model whose heads x head_dim is
not hidden_size cannot be built (refused); head_dim (128), num_key_value_heads (20) and
attention_dropout are never null; its own defaults (48000 tokens, 2560 wide, 24 layers, 20 heads,
7040 FFN width, 4096 positions).
"""

from __future__ import annotations

from typing import Any

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry
from ..tables.hf_config import HfConfig
from ..tables.hf_rope import rope
from . import llama, seed_oss


def width_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    heads, head_dim, width = fields["n_heads"], fields["head_dim"], fields["d_model"]
    if heads * head_dim != width:
        raise MappingError(f"config.json: num_attention_heads={heads} x head_dim={head_dim} is not hidden_size="
                           f"{width}: Helium's o_proj takes hidden_size inputs, so transformers cannot run it "
                           "either; set head_dim to hidden_size / num_attention_heads")
    return {}


CONFIG = llama.CONFIG.but(
    add=(llama.norm(1e-8, dtype_order="scale_then_cast"), rope(layout="interleaved"), seed_oss.qkv_bias(False),
         Entry("attention width", (), width_from_hf, lambda cfg: {})),
    defaults={"vocab_size": 48000, "hidden_size": 2560, "intermediate_size": 7040, "num_hidden_layers": 24,
              "num_attention_heads": 20, "num_key_value_heads": 20, "head_dim": 128, "max_position_embeddings": 4096,
              "rope_theta": 100000.0},
    nullable={"num_key_value_heads": False, "head_dim": False, "attention_dropout": False},
)


FAMILY = Family("helium", ("helium",), "HeliumForCausalLM", llama.TENSORS, CONFIG)
