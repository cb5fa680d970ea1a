"""Bamba (IBM; `BambaForCausalLM`).

Same as llama, except: a hybrid stack, the layers `attn_layer_indices` lists attending and every other
layer's token mixer Mamba2 (`mixer="mamba2"`, arch/mamba2.py; tensors `model.layers.{i}.mamba.*` with
transformers' names; none listed: every layer Mamba2); every layer has its SwiGLU FFN
(`feed_forward.{gate,up,down}_proj`), its norms `input_layernorm` and `pre_ff_layernorm`, the final norm
`final_layernorm`; the mixer's sizes are `mamba_n_heads` x `mamba_d_head` ("auto": `mamba_expand` x
hidden_size / heads), `mamba_n_groups`, `mamba_d_state`, `mamba_d_conv`, `mamba_chunk_size`;
`mamba_proj_bias` switches in_proj's and out_proj's biases, `mamba_conv_bias` the conv's (null: none,
as nn.Linear and nn.Conv1d take it); `time_step_limit` clamps dt in the chunked prefill; the mixer's
gated norm takes `rms_norm_eps` and its conv `hidden_act` (SiLU only); RoPE rotates the first
`partial_rotary_factor` of each head (BambaConfig sets 0.5 where rope_parameters states none); defaults
rms_norm_eps 1e-5, 262144 positions.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import Entry
from ..tables.gguf import STATES_VOCAB_AND_ROPE, tensor_table, written
from ..tables.hf_config import HfConfig, Key, show
from ..tables.hf_rope import rope
from ..tables.table import Rule, TensorTable
from . import llama, mamba2

LAYER = "model.layers.{}"
EDGE_RULES = (
    Rule("model.embed_tokens.weight", "embed.weight"),
    Rule("model.final_layernorm.weight", "final_norm.weight"),
    Rule("lm_head.weight", "lm_head.weight"),
)
NORM_RULES = (
    Rule(f"{LAYER}.input_layernorm.weight", "layers.{}.attn_norm.weight"),
    Rule(f"{LAYER}.pre_ff_layernorm.weight", "layers.{}.mlp_norm.weight"),
)
FFN_RULES = tuple(Rule(f"{LAYER}.feed_forward.{n}_proj.{p}", f"layers.{{}}.mlp.{n}.{p}")
                  for n in ("gate", "up", "down") for p in ("weight", "bias"))
MIXER_RULES = mamba2.mixer_rules(f"{LAYER}.mamba")
TENSORS = TensorTable(EDGE_RULES + llama.ATTENTION_RULES + NORM_RULES + FFN_RULES + MIXER_RULES)


# the keys BambaConfig (and GraniteMoeHybridConfig) give the Mamba2 mixer; null where transformers takes it
MIXER_KEYS = (Key("mamba_n_heads", int, 128), Key("mamba_d_head", int, "auto"),
              Key("mamba_n_groups", int, 1, nullable=True), Key("mamba_d_state", int, 256, nullable=True),
              Key("mamba_d_conv", int, 4, nullable=True), Key("mamba_expand", int, 2),
              Key("mamba_chunk_size", int, 256, nullable=True), Key("mamba_conv_bias", bool, True, nullable=True),
              Key("mamba_proj_bias", bool, False, nullable=True),
              Key("time_step_limit", list, (0.0, float("inf")), nullable=True))
CRASHING_NULLS = ("mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_chunk_size", "time_step_limit")


def mixer_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Mamba2Settings from the mamba_* keys; only where some layer is Mamba2's (`fields["layer_mixers"]`)."""
    if "mixer" not in fields.get("layer_mixers", ()):
        return {}
    for name in CRASHING_NULLS:
        if hf.stated(name) and hf.get(name) is None:
            raise MappingError(f"config.json: {name}=null leaves the Mamba2 layers without a value transformers "
                               "can run; remove the key for the default")
    if fields["activation"] != "silu":
        raise MappingError(f"config.json: hidden_act={show(fields['activation'])} is also the Mamba2 conv's "
                           "activation, which lmconvert runs as SiLU only; use silu")
    d, heads, expand = fields["d_model"], hf.get("mamba_n_heads"), hf.get("mamba_expand")
    head_dim = expand * d // heads if not hf.stated("mamba_d_head") else hf.get("mamba_d_head")
    if heads * head_dim != expand * d:
        raise MappingError(f"config.json: mamba_n_heads={heads} x mamba_d_head={head_dim} should equal mamba_expand="
                           f"{expand} x hidden_size={d}, as transformers requires; fix the sizes")
    return {"mixer": "mamba2", "mixer_settings": {
        "n_heads": heads, "head_dim": head_dim, "d_state": hf.get("mamba_d_state"),
        "n_groups": hf.get("mamba_n_groups"), "conv_kernel": hf.get("mamba_d_conv"),
        "chunk_size": hf.get("mamba_chunk_size"), "conv_bias": bool(hf.get("mamba_conv_bias")),
        "in_bias": bool(hf.get("mamba_proj_bias")), "out_bias": bool(hf.get("mamba_proj_bias")),
        "norm_eps": fields["norm"].eps, **mamba2.time_step_limit(hf)}}


def mixer_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    return mamba2.keys_of(cfg, {"n_heads": "mamba_n_heads", "head_dim": "mamba_d_head", "n_groups": "mamba_n_groups",
                                "d_state": "mamba_d_state", "conv_kernel": "mamba_d_conv",
                                "chunk_size": "mamba_chunk_size", "expand": "mamba_expand",
                                "conv_bias": "mamba_conv_bias", "in_bias": "mamba_proj_bias",
                                "time_step_limit": "time_step_limit"})


MIXER = Entry("mixer", MIXER_KEYS, mixer_from_hf, mixer_to_hf)
SCHEDULE_KEYS = (Key("attn_layer_indices", list, None, nullable=True),)


def schedule_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """BambaConfig.layers_block_type: the listed layers attend, the others run Mamba2 (all of them when null)."""
    n, attending = fields["n_layers"], hf.get("attn_layer_indices") or []
    if any(isinstance(i, bool) or not isinstance(i, int) for i in attending):
        raise MappingError(f"config.json: attn_layer_indices={show(attending)} should list layer indices")
    return {"layer_mixers": tuple("attention" if i in attending else "mixer" for i in range(n))}


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """A layer without a mixer or an FFN has no name here: it reads back as one with both, refused by name."""
    return {"attn_layer_indices": cfg.layers_mixed_by("attention")}


SCHEDULE = Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf)

CONFIG = llama.CONFIG.but(
    add=(llama.norm(1e-5), rope(partial=True), SCHEDULE, MIXER),
    defaults={"vocab_size": 128000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 262144,
              "partial_rotary_factor": 0.5},
)


# -- llama.cpp (GGUF): its granitehybrid architecture (GraniteHybridModel in its converter, Granite 4's and Bamba's;
# granitemoehybrid.GGUF_GRANITEHYBRID is the architecture's entry, this the one for a file stating no expert count: a
# dense Granite 4 states 0, and Bamba's config has no expert keys for llama.cpp's converter to state). The schedule is
# one KV-head count per layer (0 on a Mamba2 layer: what the import reads it from); the Mamba2 layers are mamba2's in
# llama.cpp's layout (mamba2.gguf_mixer_rules), their heads `ssm.time_step_rank`, d_inner `ssm.inner_size`; q/k
# permuted for llama.cpp's interleaved RoPE (LlamaModel.permute, whole heads); `rope.scaling.finetuned` says whether
# attention rotates (llama.cpp's converter writes true for Bamba, false for Granite 4, with a context of 2**20, which
# lmconvert states as its own `lmconvert.context_length` too). What llama.cpp's granitehybrid cannot run is refused
# by name: a Mamba2 width other than 2 x hidden_size (its loader asserts it), part of each head rotated (its
# converter permutes and it rotates whole heads), in_proj or out_proj biases (it loads none), a dt clamp (it runs
# none: a clamped model reads back otherwise).
SSM_GGUF_KEYS = {"ssm.conv_kernel": "mamba_d_conv", "ssm.state_size": "mamba_d_state",
                 "ssm.group_count": "mamba_n_groups", "ssm.time_step_rank": "mamba_n_heads",
                 "ssm.inner_size": "mamba_d_head",  # read as llama.cpp states d_inner; `derived` makes the head size
                 "rope.scaling.finetuned": "position_embedding_type"}  # read as the flag; `derived` makes the type
SSM_GGUF_OWN = {"ssm.chunk_size": "mamba_chunk_size", "context_length": "max_position_embeddings"}
# the layers holding an attention bias (Granite 4's first layers may all be Mamba2's)
SSM_GGUF_LAYERS = {"attention_biased": "blk.{}.attn_q.bias"}


def hybrid_from_gguf(config: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """What granitehybrid's Bamba and Granite 4 read alike, and the attention layers (a KV head count above 0)."""
    n, counts, inner = config["num_hidden_layers"], config["num_key_value_heads"], config["mamba_d_head"]
    counts = counts if isinstance(counts, list) else [counts] * n
    return ({"num_key_value_heads": max(counts), "mamba_d_head": inner // config["mamba_n_heads"],
             "mamba_expand": inner // config["hidden_size"], "attention_bias": bool(config["attention_biased"])},
            [i for i, c in enumerate(counts) if c])


def hybrid_to_gguf(config: dict[str, Any], attending: list[int], rotates: bool) -> dict[str, Any]:
    """The per-layer KV-head counts, d_inner and the RoPE switch; refusals of what llama.cpp cannot run."""
    d, heads, head_dim = config["hidden_size"], config["mamba_n_heads"], config["mamba_d_head"]
    if heads * head_dim != 2 * d:
        raise MappingError(f"llama.cpp's granitehybrid runs a Mamba2 width of 2 x hidden_size only, and this model's "
                           f"is mamba_n_heads={heads} x mamba_d_head={head_dim}")
    params = config.get("rope_parameters") or {}
    fraction = params.get("partial_rotary_factor", config.get("partial_rotary_factor")) or 1.0
    if rotates and fraction != 1.0:
        raise MappingError(f"llama.cpp's granitehybrid rotates whole heads (its converter permutes every q/k row "
                           f"for that), and this model rotates partial_rotary_factor={fraction} of each")
    kv, n = config["num_key_value_heads"], config["num_hidden_layers"]
    return {"ssm.inner_size": heads * head_dim, "rope.scaling.finetuned": rotates,
            "attention.head_count_kv": [kv if i in attending else 0 for i in range(n)],
            **({} if rotates else {"context_length": 2**20})}


def _from_gguf(config: dict[str, Any]) -> dict[str, Any]:
    """Bamba always rotates: a file saying otherwise is not Bamba's."""
    out, attending = hybrid_from_gguf(config)
    if config.get("position_embedding_type") is False:
        raise MappingError("states granitehybrid.rope.scaling.finetuned false (no RoPE) and no expert count, which "
                           "no Bamba has (it always rotates) and no Granite 4 (it states its expert count, 0 when "
                           "dense); lmconvert has no model for it")
    return {**out, "attn_layer_indices": attending, "position_embedding_type": None}


GGUF_BAMBA = written("bamba", arch="granitehybrid", keys=SSM_GGUF_KEYS, own=SSM_GGUF_OWN,
                     defaults={"hidden_act": "silu"}, bias_flags={"mlp_bias": "blk.0.ffn_up.bias"},
                     layer_tensors=SSM_GGUF_LAYERS, derived=_from_gguf, partial_rotary=True,
                     exported=lambda config: hybrid_to_gguf(config, config.get("attn_layer_indices") or [], True),
                     table=TensorTable((*tensor_table(True, 0.0, True).rules, *mamba2.gguf_mixer_rules())),
                     stated=STATES_VOCAB_AND_ROPE, head_dim_stated=False, refused=mamba2.PROJECTION_BIASES)

# its GGUF entry is reached through granitemoehybrid.GGUF_GRANITEHYBRID (told apart there)
FAMILY = Family("bamba", ("bamba",), "BambaForCausalLM", TENSORS, CONFIG)
