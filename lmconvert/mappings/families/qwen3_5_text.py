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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..family import Family
from ..tables.gguf import GgufArch
from ..tables.hf_wrapper import nested_text_config, wrapped
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Chain, Transform
from . import lfm2, llama, qwen3_next

if TYPE_CHECKING:
    import torch

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

# -- llama.cpp (GGUF): its qwen35 architecture (Qwen3_5TextModel in llama.cpp's converter): as qwen3next's
# (norms as 1 + w, ssm_a = -exp(A_log), dt_bias as ssm_dt.bias, the squeezed conv), except that b and a are apart
# (`ssm_beta`, `ssm_alpha`) and every tensor indexed by value head has its value heads reordered from grouped by
# key head (transformers': key head 0's value heads, then key head 1's ...) to tiled (each key head's first value
# head, then each one's second ...), for ggml's broadcast: the v rows of in_proj_qkv and of the conv's channels,
# in_proj_z's, b's and a's rows, A_log and dt_bias, out_proj's columns (`Tiled`, a permutation, exact both ways).
# Metadata: the MRoPE sections (`rope.dimension_sections`, which llama.cpp requires): see gguf_metadata.
@dataclass(frozen=True)
class Tiled:
    """Rows along `dim`: the q and k rows kept where `qk` (in_proj_qkv's, the conv's), then value heads of
    `width` rows each (a size name, over mixer.heads_per_key: the rows per value head; none: 1), stored tiled
    (heads_per_key runs of one head per key head) -> grouped (key_heads runs of that key head's heads_per_key
    heads). A permutation."""

    qk: bool = False
    width: str | None = None
    dim: int = 0

    def bind(self, sizes: Mapping[str, int]) -> Transform:
        keys, per_key = sizes["mixer.key_heads"], sizes["mixer.heads_per_key"]
        width = sizes[self.width] // per_key if self.width else 1
        lead, dim = 2 * sizes["mixer.key_dim"] if self.qk else 0, self.dim

        def move(t: torch.Tensor, runs: tuple[int, int]) -> torch.Tensor:
            kept, heads = t.narrow(dim, 0, lead), t.narrow(dim, lead, t.shape[dim] - lead)
            shape = list(heads.shape)
            split = heads.reshape(*shape[:dim], *runs, width, *shape[dim + 1:]).transpose(dim, dim + 1)
            return torch_cat([kept, split.reshape(shape)], dim)

        return Transform(f"value heads tiled over {keys} key heads", lambda t: move(t, (per_key, keys)),
                         lambda t: move(t, (keys, per_key)))


def torch_cat(pieces: list[torch.Tensor], dim: int) -> torch.Tensor:
    import torch

    return torch.cat(pieces, dim)


QKV_ROWS = Tiled(True, "mixer.values_per_key")
GDN_GGUF_RULES = (
    Rule("blk.{}.attn_qkv.weight", "layers.{}.mixer.in_proj_qkv.weight", QKV_ROWS),
    Rule("blk.{}.attn_gate.weight", "layers.{}.mixer.in_proj_z.weight", Tiled(False, "mixer.values_per_key")),
    Rule("blk.{}.ssm_beta.weight", "layers.{}.mixer.in_proj_b.weight", Tiled()),
    Rule("blk.{}.ssm_alpha.weight", "layers.{}.mixer.in_proj_a.weight", Tiled()),
    Rule("blk.{}.ssm_conv1d.weight", "layers.{}.mixer.conv1d.weight", Chain(QKV_ROWS, lfm2.CONV_2D)),
    Rule("blk.{}.ssm_dt.bias", "layers.{}.mixer.dt_bias", Tiled()),
    Rule("blk.{}.ssm_a", "layers.{}.mixer.A_log", Chain(qwen3_next.NEG_EXP, Tiled())),
    Rule("blk.{}.ssm_norm.weight", "layers.{}.mixer.norm.weight"),
    Rule("blk.{}.ssm_out.weight", "layers.{}.mixer.out_proj.weight", Tiled(False, "mixer.values_per_key", dim=1)),
)
MROPE_SECTIONS = [11, 11, 10, 0]  # _Qwen35MRopeMixin's, where rope_parameters has no mrope_section
# ggml's M-RoPE wants the sections to sum to at most the rotated dimensions; a text position is the same on the
# t, h and w sections, and each rotated pair takes section (pair mod their sum) by its index mod 3: [1, 1, 0, 0]
# puts every pair on t or h, so rotates as transformers does at any width
NARROW_SECTIONS = [1, 1, 0, 0]


def gguf_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """qwen3next's, and the MRoPE sections: llama.cpp's converter's default where the rotated part holds them,
    else the narrowest sections that rotate text positions the same (config.json's are not kept: text positions
    make any that cover the rotated pairs alike)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    params = config.get("rope_parameters") or {}
    rotated = int(head_dim * (params.get("partial_rotary_factor") or config.get("partial_rotary_factor") or 0.25))
    sections = MROPE_SECTIONS if sum(MROPE_SECTIONS) <= rotated else NARROW_SECTIONS
    return {**qwen3_next.schedule_to_gguf(config), "rope.dimension_sections": sections}


def gguf_entry(model_type: str, arch: str, experts: bool, keys: Mapping[str, str]) -> GgufArch:
    """llama.cpp's qwen35 (dense) or qwen35moe."""
    return GgufArch(model_type, arch=arch, keys={**keys, **qwen3_next.GDN_GGUF_KEYS},
                    unstated={"full_attention_interval": lambda _: 4}, derived=qwen3_next.schedule_from_gguf,
                    exported=gguf_metadata, table=qwen3_next.gguf_table(experts, GDN_GGUF_RULES),
                    partial_rotary=True, experts=experts, stated=frozenset({"rope.dimension_count"}))


GGUF_QWEN35 = gguf_entry("qwen3_5_text", "qwen35", False, {})

FAMILY = Family("qwen3_5_text", ("qwen3_5_text", "qwen3_5"), "Qwen3_5ForCausalLM",
                wrapped(TENSORS, "visual", legacy=False), CONFIG, notes=NOTES,
                gguf=(GGUF_QWEN35,), reference_layouts=qwen3_next.REFERENCE_LAYOUTS)
