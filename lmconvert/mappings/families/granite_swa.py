"""GraniteSWA (GraniteSWAForCausalLM: Granite with sliding windows and attention sinks).

Same as granite, except: every attention head has a learned sink (`self_attn.sinks` [heads]), which
transformers applies as the output scale sigmoid(logsumexp(scores) - sink), the logsumexp in the
scores' dtype and the sigmoid in fp32 (`sink_form="scale"`: the same function as gpt-oss's extra
softmax column, rounded its own way); `layer_types` (default: layer i full where i % 4 == 0, sliding
elsewhere) picks the layers that attend within `sliding_window` (default 128); `layer_rope_theta`
gives each layer its own RoPE theta, 0 for no positions (NoPE), every layer rope_parameters' theta
when absent or null. The decoder holds one theta for the full layers and one for the sliding ones
(`rope`, `rope_local`): a file giving two layers of one kind different non-zero thetas is refused by
name. `rms_norm_eps` defaults to 1e-5 and embeddings are tied by default."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry, fixed
from ..tables.gguf import ATTENTION_BIAS_FLAG, tensor_table
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_layers import (
    LAYER_TYPES_KEY,
    SLIDING_WINDOW_KEY,
    layer_kinds_from_hf,
    layers_and_window_to_hf,
    window_fields,
)
from ..tables.hf_rope import KEYS, rope_from_hf, rope_parameters, rope_to_hf
from ..tables.table import Rule, TensorTable
from ..tables.transforms import Piece, Unstack
from . import granite, llama
from .gpt_oss import SINK_RULES

TENSORS = TensorTable(llama.EDGE_RULES + SINK_RULES + llama.ATTENTION_RULES + llama.MLP_RULES + llama.PRE_NORM_RULES)

KIND_NAMES = {"global": "full", "local": "sliding"}
THETAS = Key("layer_rope_theta", list, None, nullable=True)  # absent or null: rope_parameters' theta everywhere


def window_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    kinds = layer_kinds_from_hf(hf, fields["n_layers"], lambda i: i % 4 != 0)
    return window_fields(kinds, hf.get("sliding_window"))


def layer_thetas(hf: HfConfig, n_layers: int) -> list[float] | None:
    thetas = hf.get(THETAS.name)
    if thetas is not None and (len(thetas) != n_layers or any(
            isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0 for t in thetas)):
        raise MappingError(f"config.json: layer_rope_theta={show(thetas)} should hold a RoPE theta (0: no positions) "
                           f"for each of the num_hidden_layers={n_layers} layers")
    return thetas


def rope_by_layer_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """`rope` for the full layers' theta, `rope_local` for the sliding layers' where it differs, and
    no positions where a layer's theta is 0."""
    rope = rope_from_hf(hf, *rope_parameters(hf))
    kinds, thetas = fields["layer_kinds"], layer_thetas(hf, fields["n_layers"])
    if thetas is None:
        return {"rope": rope}
    by_kind: dict[str, set[float]] = {"global": set(), "local": set()}
    for theta, kind in zip(thetas, kinds, strict=True):
        if theta:
            by_kind[kind].add(float(theta))
    for kind, found in by_kind.items():
        if len(found) > 1:
            raise MappingError(f"config.json: layer_rope_theta={show(thetas)} gives the {KIND_NAMES[kind]} layers "
                               f"several RoPE thetas ({', '.join(map(str, sorted(found)))}); lmconvert's decoder holds "
                               "one theta for the full layers and one for the sliding ones (0: none), so it cannot "
                               "convert this model")
    full, sliding = (replace(rope, theta=found.pop()) if found else None for found in by_kind.values())
    positions = tuple("rope" if theta else "none" for theta in thetas)
    full = full or sliding or rope
    return {"rope": full, "rope_local": sliding if sliding not in (None, full) else None,
            "layer_positions": positions}


def rope_by_layer_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """A layer's own theta, 0 where it has no positions. Only the theta of `rope_local` is written, and
    a scheme other than RoPE or none reads back as none: export refuses either by name."""
    ropes = [cfg.rope_for(i) for i in range(cfg.n_layers)]
    return {"rope_parameters": rope_to_hf(cfg.rope),
            THETAS.name: [0.0 if rope is None else rope.theta for rope in ropes]}


# what granitemoe_swa shares: the layer kinds, the RoPE by layer (in place of llama's "rope" row) and the sinks
SWA_ROWS = (Entry("layer kinds", (SLIDING_WINDOW_KEY, LAYER_TYPES_KEY), window_from_hf, layers_and_window_to_hf),
            Entry("rope by layer", (*KEYS, THETAS), rope_by_layer_from_hf, rope_by_layer_to_hf),
            fixed("sinks", attn_sinks=True, sink_form="scale"))
CONFIG = granite.CONFIG.but(
    drop=("rope",),
    add=(llama.norm(1e-5), *SWA_ROWS),
    defaults={"vocab_size": 100352, "hidden_size": 2560, "intermediate_size": 8192, "num_hidden_layers": 24,
              "num_attention_heads": 20, "num_key_value_heads": 4, "max_position_embeddings": 8192,
              "tie_word_embeddings": True, "sliding_window": 128},
)


# -- llama.cpp (GGUF)
# llama.cpp's granite_swa (convert_hf_to_gguf.py's GraniteSWAModel, a GraniteModel): granite's scales and permuted
# q/k, the sinks as `attn_sinks.weight`, the layer kinds as one flag per layer (`attention.sliding_window_pattern`)
# and the layers that rotate as `attention.rope_pattern` (left out where every layer does, its runtime's default).
# Its graph rotates every such layer with the one `rope.freq_base`: a model whose full and sliding layers have
# different thetas is refused by name (its read-back loses rope_local). Its converter reads no layer_rope_theta
# (only `no_rope_layers`), so it would rotate a NoPE layer; lmconvert writes the pattern
def rope_pattern_to_gguf(config: Mapping[str, Any]) -> dict[str, Any]:
    thetas = config.get(THETAS.name)
    return {"attention.rope_pattern": [bool(t) for t in thetas]} if thetas and not all(thetas) else {}


def rope_pattern_from_gguf(config: Mapping[str, Any]) -> dict[str, Any]:
    """`layer_rope_theta` from the flags (read into it): the file's RoPE base where a layer rotates, else 0."""
    flags = config.get(THETAS.name)
    if flags is None:
        return {}
    theta = float(config.get("rope_theta", KEYS[2].default))
    return {THETAS.name: [theta if flag else 0.0 for flag in flags]}


GGUF_TABLE = TensorTable((*tensor_table(True, 0.0, True).rules,
                          Rule("blk.{}.attn_sinks.weight", "layers.{}.attn.sinks")))
GGUF_GRANITE_SWA = replace(
    granite.GGUF_GRANITE, model_type="granite_swa", arch="granite_swa", table=GGUF_TABLE, swa_pattern=4,
    keys={**granite.GGUF_GRANITE.keys, "attention.sliding_window": "sliding_window",
          "attention.rope_pattern": THETAS.name},
    stated=granite.GGUF_GRANITE.stated | {"attention.sliding_window_pattern"},
    exported=rope_pattern_to_gguf, derived=rope_pattern_from_gguf)


# granitemoe_swa (GraniteMoeSWAModel), told apart by its router: granitemoe's keys and experts on every layer, the
# routed experts' gate and up kept fused as transformers 5 holds them (`ffn_gate_up_exps`), and so the shared
# expert's (`ffn_up_shexp` [gate rows | up rows], which llama.cpp's graph runs as one SwiGLU)
GGUF_MOE_TABLE = TensorTable((
    *(r for r in tensor_table(True, 0.0, True, experts=True).rules
      if not re.search(r"ffn_(gate|up)_exps|shexp", r.stored)),
    Rule("blk.{}.attn_sinks.weight", "layers.{}.attn.sinks"),
    *(Rule("blk.{}.ffn_gate_up_exps.weight", f"layers.{{}}.mlp.experts.{{}}.{n}.weight", Unstack(part=i, parts=2))
      for i, n in enumerate(("gate", "up"))),
    *(Rule("blk.{}.ffn_up_shexp.weight", f"layers.{{}}.mlp.shared.{n}.weight", Piece(("shared", "shared"), i))
      for i, n in enumerate(("gate", "up"))),
    Rule("blk.{}.ffn_down_shexp.weight", "layers.{}.mlp.shared.down.weight"),
))
GGUF_MOE_SWA = replace(
    GGUF_GRANITE_SWA, model_type="granitemoe_swa", table=GGUF_MOE_TABLE, experts=True,
    keys={**GGUF_GRANITE_SWA.keys, "expert_count": "num_local_experts", "expert_used_count": "num_experts_per_tok",
          "expert_shared_feed_forward_length": "shared_intermediate_size"},
    bias_flags=ATTENTION_BIAS_FLAG)
GGUF_GRANITE_SWA = replace(GGUF_GRANITE_SWA, variants=(("blk.0.ffn_gate_inp.weight", GGUF_MOE_SWA),))


FAMILY = Family("granite_swa", ("granite_swa",), "GraniteSWAForCausalLM", TENSORS, CONFIG, gguf=(GGUF_GRANITE_SWA,))
