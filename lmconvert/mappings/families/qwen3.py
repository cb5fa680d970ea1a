"""Qwen3 (dense).

Same as qwen2, except: a per-head QK norm (`q_norm` / `k_norm` over head_dim, llama-style RMSNorm
with the weight applied after the cast, before RoPE), `attention_bias` (default false) switching
the q, k, v and o biases together, and head_dim 128 when config.json does not state it.

MossTranscribeDiarizeForConditionalGeneration (model_type `moss_transcribe_diarize`) is read as its
qwen3 text decoder: `text_config` (MossTranscribeDiarizeConfig's own when absent), tied as the
top-level `tie_word_embeddings` says (default true; a stored head of its own is kept: `hf_wrapper`);
the text weights under `model.language_model.`, the audio tower and projector
dropped. Export writes the text-only Qwen3ForCausalLM.
"""

from __future__ import annotations

from ..family import Family
from ..tables.config_table import fixed
from ..tables.gguf import (
                          ATTENTION_BIAS_FLAG,
                          GgufArch,
)
from ..tables.hf_wrapper import nested_text_config, wrapped
from ..tables.points import QK_NORM_PER_HEAD
from ..tables.table import TensorTable
from . import llama, qwen2

TENSORS = TensorTable(llama.TENSORS.rules + llama.QK_NORM_RULES)

# MossTranscribeDiarizeConfig's text decoder when config.json has none
MOSS_TEXT = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "max_position_embeddings": 131_072,
             "rope_parameters": {"rope_theta": 1_000_000.0, "rope_type": "default"}}

CONFIG = qwen2.CONFIG.but(
    drop=("q, k, v biases",),
    add=(fixed("QK norm", qk_norm="head"), llama.ATTENTION_BIAS),
    defaults={"head_dim": 128},
    decoder=lambda data: nested_text_config(data, "moss_transcribe_diarize", ("qwen3",), MOSS_TEXT),
)


# -- llama.cpp (GGUF)
GGUF_QWEN3 = GgufArch("qwen3", arch="qwen3", defaults={"hidden_act": "silu", "use_sliding_window": False},
                         bias_flags=ATTENTION_BIAS_FLAG)


# q_norm(q_proj(x).view(B, T, -1, D)), transposed afterwards
REFERENCE_LAYOUTS = QK_NORM_PER_HEAD

FAMILY = Family("qwen3", ("qwen3", "moss_transcribe_diarize"), "Qwen3ForCausalLM",
                # MossTranscribeDiarizeForConditionalGeneration's text decoder, its audio tower and projector left out
                wrapped(TENSORS, "audio_tower", "multi_modal_projector", legacy=False), CONFIG, gguf=(GGUF_QWEN3,),
                notes={"moss_transcribe_diarize": "MossTranscribeDiarizeForConditionalGeneration (model_type "
                       "moss_transcribe_diarize): only the text decoder is read; the audio tower and multi-modal "
                       "projector are left out"},
                reference_layouts=REFERENCE_LAYOUTS)
