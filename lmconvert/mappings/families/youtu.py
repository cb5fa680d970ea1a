"""Youtu-LLM (YoutuForCausalLM: Youtu-LLM-2B).

Same as deepseek_v3, except: every layer is dense, a llama decoder layer (pre-norm RMSNorms, the
weight multiplied after the cast back) whose MLP is a gated `down(act(gate(x)) * up(x))` without
biases, with no mixture-of-experts keys at all; the attention is DeepSeek-V3's latent attention
unchanged (its `q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`,
`rope_interleave`, `attention_bias` on q_a, kv_a and o, MLA-internal norms at eps 1e-6, and the
score scale times mscale squared under scaled RoPE with `mscale_all_dim`); embeddings are tied by
default; `num_key_value_heads` is never null; its own size defaults.

Not followed: transformers 5.24 zeroes the `pad_token_id` row of the embeddings (and so of a tied LM
head) whenever it loads a Youtu checkpoint that states one (`YoutuPreTrainedModel._init_weights`
writes through `.data`, past the guard that keeps loaded weights), so its loaded model differs from
the stored weights there; the import keeps the stored weights.
"""

from __future__ import annotations

from ..family import Family
from ..tables.points import LATENT
from ..tables.table import TensorTable
from . import deepseek_v3, llama

TENSORS = TensorTable(llama.EDGE_RULES + deepseek_v3.MLA_RULES + llama.MLP_RULES + llama.PRE_NORM_RULES)

CONFIG = deepseek_v3.CONFIG.but(
    drop=("experts",),
    add=(deepseek_v3.latent("youtu", deinterleave=True, v_head_dim_nullable=True),),
    defaults={"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 32,
              "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 131072,
              "tie_word_embeddings": True},
    nullable={"num_key_value_heads": False},
)


# DeepseekV3Attention's layout: kv_b_proj on the latent viewed as (B, 1, T, C), as ours
REFERENCE_LAYOUTS = LATENT


# -- llama.cpp (GGUF)
# llama.cpp's deepseek2 runs it (its converter: DeepseekV2Model): a dense DeepSeek-V3, every layer one of
# the leading dense blocks; its loader wants an expert count at least the one used
GGUF_YOUTU = deepseek_v3.runs_as_v3("youtu", "youtu", unstated={
    **deepseek_v3.DEEPSEEK_V3.unstated, "first_k_dense_replace": lambda config: config["num_hidden_layers"],
    "n_routed_experts": lambda config: 1})

FAMILY = Family("youtu", ("youtu",), "YoutuForCausalLM", TENSORS, CONFIG, gguf=(GGUF_YOUTU,),
                reference_layouts=REFERENCE_LAYOUTS)
