"""Qwen3.5 (dense) text decoders: Qwen3_5ForCausalLM (model_type qwen3_5_text) and the text half of
the published Qwen3_5ForConditionalGeneration (qwen3_5).

Same as qwen3_next, except: no experts (every FFN the dense MLP of `intermediate_size`, no expert
keys); the gated delta-net's projections are stored apart, under our names (in_proj_qkv, in_proj_z,
in_proj_b, in_proj_a); `rope_parameters` may carry `mrope_section` / `mrope_interleaved`, the
multimodal positions, which change nothing for text (every grid takes the text position) and are
not read. The wrapper (model_type qwen3_5) nests the decoder's config under `text_config` (absent:
Qwen3_5TextConfig's defaults) and keeps `tie_word_embeddings` at the top level (default false); its
text weights sit under `model.language_model.`, and its vision tower and patch merger (`model.visual.`) are left out.
Export writes the text-only Qwen3_5ForCausalLM.
"""

from __future__ import annotations

from ..family import Family
from ..tables.hf_wrapper import nested_text_config, wrapped
from ..tables.table import Rule, TensorTable
from . import llama, qwen3_next

UNFUSED_GDN_RULES = tuple(Rule(f"{qwen3_next.LINEAR}.{n}.weight", f"layers.{{}}.mixer.{n}.weight")
                          for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))
TENSORS = TensorTable(llama.EDGE_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + llama.PRE_NORM_RULES
                      + llama.QK_NORM_RULES + qwen3_next.GDN_RULES + UNFUSED_GDN_RULES + qwen3_next.MTP_RULES)

CONFIG = qwen3_next.CONFIG.but(
    drop=("experts",),
    defaults={"vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
              "num_attention_heads": 16, "num_key_value_heads": 4},
    decoder=lambda data: nested_text_config(data, "qwen3_5", ("qwen3_5_text",), {}, tie=False),
)

NOTES = {"qwen3_5": "Qwen3_5ForConditionalGeneration (model_type qwen3_5): only the text decoder is read; the "
                    "vision tower and its patch merger are left out"}

NO_GGUF = ("lmconvert does not write llama.cpp's qwen35 architecture yet: its gated delta-net tensors (value "
           "heads reordered from grouped to tiled, ssm_a as -exp(A_log), the squeezed conv), recurrent-layer "
           "schedule, MRoPE sections and norms stored as 1 + w are not mapped to llama.cpp's metadata and "
           "tensors")

FAMILY = Family("qwen3_5_text", ("qwen3_5_text", "qwen3_5"), "Qwen3_5ForCausalLM",
                wrapped(TENSORS, "visual", legacy=False), CONFIG, notes=NOTES,
                no_gguf=NO_GGUF, reference_layouts=qwen3_next.REFERENCE_LAYOUTS)
