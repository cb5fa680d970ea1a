"""Zamba2 (Zyphra; `Zamba2ForCausalLM`).

Same as mamba2, except: every layer is a Mamba2 mixer after a pre-norm (`input_layernorm`) with the residual in the
activation dtype; the layers `layers_block_type` calls "hybrid" (the others "mamba" or "linear_attention") first
call a shared transformer block (`shared_blocks`, arch/shared_blocks.py): `num_mem_blocks` blocks alternate over
the hybrid layers in order and are weight-tied, each block's tensors stored once, under
`model.layers.{L}.shared_transformer.*` of the first hybrid layer L calling it (save_pretrained drops the tied
copies; a file that still holds them is refused, naming the tensor: transformers ties a copy only where it equals
the first caller's, and runs it untied otherwise). A block reads concat(hidden, the embeddings), RMSNorm over 2 x
hidden_size (`input_layernorm`), attention from 2 x hidden_size (`num_attention_heads` x head_dim, head_dim 2 x
hidden_size / heads, score scale (head_dim / 2)^-0.5, RoPE where `use_mem_rope`, no biases), RMSNorm
(`pre_ff_layernorm`), a gated FFN (`feed_forward.gate_up_proj` fused, `hidden_act` default GeLU,
`intermediate_size` default 4 x hidden_size); each hybrid call n has its own adapters (rank `adapter_rank`), stored
in the block as `...adapter_list.{n}.{0,1}`: on gate_up always, on q, k and v where `use_shared_attention_adapter`;
then the layer's own `linear`, whose output joins the mamba layer's input before its norm. The mixer:
`n_mamba_heads` heads of `mamba_expand` x hidden_size / heads, `mamba_ngroups`, `mamba_d_state`, `mamba_d_conv`,
`chunk_size`; the conv always has a bias (`use_conv_bias` is not read), the gated norm's eps is 1e-5 (not
`rms_norm_eps`); dt is clamped below by `time_step_min` in the chunked prefill (no upper bound); `add_bias_linear`
switches in_proj's, out_proj's and the FFN's biases. Embeddings tied by default; `use_long_context` only sets 16384
positions.
"""

from __future__ import annotations

from typing import Any

from lmconvert.arch import ArchConfig

from ..errors import MappingError
from ..family import Family
from ..tables.config_table import DEFAULT, Entry
from ..tables.hf_config import HfConfig, Key, show
from ..tables.table import Rule, TensorTable
from . import llama, mamba2

MIXER_PARAMS = mamba2.MAMBA2_PARAMS
# the default schedule (Zamba2Config.__post_init__), 54 layers
DEFAULT_TYPES = (["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4 + ["hybrid"] + ["mamba"] * 3
                 + ["hybrid"] + ["mamba"] * 2)
MIXER_TYPES = ("mamba", "linear_attention")


# ----------------------------------------------------------------------------- tensors
def _block_rules(arch: ArchConfig) -> list[Rule]:
    """Each shared block under the first hybrid layer calling it; the calls' adapters under their block."""
    shared, rules = arch.shared_blocks, []
    firsts = shared.layers[:shared.n_blocks]
    for j, first in enumerate(firsts):
        stored, ours = f"model.layers.{first}.shared_transformer", f"shared_blocks.{j}"
        rules += [Rule(f"{stored}.input_layernorm.weight", f"{ours}.attn_norm.weight"),
                  Rule(f"{stored}.pre_ff_layernorm.weight", f"{ours}.mlp_norm.weight"),
                  *(Rule(f"{stored}.self_attn.{p}_proj.weight", f"{ours}.attn.{p}.weight") for p in "qkvo"),
                  *(Rule(f"{stored}.feed_forward.{p}_proj.{w}", f"{ours}.mlp.{p}.{w}")
                    for p in ("gate_up", "down") for w in ("weight", "bias"))]
    for n, layer in enumerate(shared.layers):
        stored, ours = f"model.layers.{firsts[n % shared.n_blocks]}.shared_transformer", f"layers.{layer}.shared"
        lists = {"gate_up": f"feed_forward.gate_up_proj_adapter_list.{n}"}
        if shared.attn_adapters:
            lists |= {p: f"self_attn.linear_{p}_adapter_list.{n}" for p in "qkv"}
        rules += [Rule(f"{stored}.{where}.{i}.weight", f"{ours}.{p}_adapter.{i}.weight")
                  for p, where in lists.items() for i in (0, 1)]
        rules.append(Rule(f"model.layers.{layer}.linear.weight", f"{ours}.linear.weight"))
    return rules


def _tied_copies(arch: ArchConfig) -> tuple[tuple[str, str], ...]:
    """A block saved again under a later caller: refused by name, since transformers ties such a copy only where its
    values equal the first caller's and otherwise runs it untied, while lmconvert holds each block once."""
    shared = arch.shared_blocks
    return tuple((rf"^model\.layers\.{layer}\.shared_transformer\.",
                  f"a copy of shared block {shared.block_of(layer)} under a later hybrid layer ({layer}), which "
                  "save_pretrained leaves out: transformers ties it only where it equals the first caller's and runs "
                  "it untied otherwise, and lmconvert holds each block once; where the copies equal the first "
                  "caller's, remove them from the file (as save_pretrained does)")
                 for layer in shared.layers[shared.n_blocks:])


def layout_table(arch: ArchConfig) -> TensorTable:
    """Zamba2's tensors for this schedule: a hybrid layer's Mamba2 layer sits under `mamba_decoder`."""
    hybrid = () if arch.shared_blocks is None else arch.shared_blocks.layers
    rules = list(EDGE_RULES)
    for i in range(arch.n_layers):
        stored = f"model.layers.{i}.mamba_decoder" if i in hybrid else f"model.layers.{i}"
        rules.append(Rule(f"{stored}.input_layernorm.weight", f"layers.{i}.attn_norm.weight"))
        rules += [Rule(f"{stored}.mamba.{p}", f"layers.{i}.mixer.{p}") for p in MIXER_PARAMS]
    if arch.shared_blocks is None:
        return TensorTable(tuple(rules))
    return TensorTable(tuple(rules + _block_rules(arch)), refused=_tied_copies(arch))


EDGE_RULES = (
    Rule("model.embed_tokens.weight", "embed.weight"),
    Rule("model.final_layernorm.weight", "final_norm.weight"),
    Rule("lm_head.weight", "lm_head.weight"),
)
# every layer a plain Mamba2 one: what is read before a config says which layers are hybrid
TENSORS = TensorTable((*EDGE_RULES, Rule("model.layers.{}.input_layernorm.weight", "layers.{}.attn_norm.weight"),
                       *mamba2.mixer_rules("model.layers.{}.mamba", MIXER_PARAMS)))


# ----------------------------------------------------------------------------- config
MIXER_KEYS = (Key("n_mamba_heads", int, 8), Key("mamba_expand", int, 2), Key("mamba_d_state", int, 64),
              Key("mamba_ngroups", int, 1), Key("mamba_d_conv", int, 4), Key("chunk_size", int, 256),
              Key("time_step_min", float, 0.001, bound="non_negative"), Key("add_bias_linear", bool, False))


def mixer_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Zamba2MambaMixer's settings; its FFN's biases go with add_bias_linear too."""
    d, heads, expand = fields["d_model"], hf.get("n_mamba_heads"), hf.get("mamba_expand")
    if (expand * d) % heads:
        raise MappingError(f"config.json: mamba_expand={expand} x hidden_size={d} does not split into n_mamba_heads="
                           f"{heads} heads, which transformers' Zamba2 mixer needs; fix the sizes")
    bias = hf.get("add_bias_linear")
    return {"mixer": "mamba2", "mlp_bias": bias, "mixer_settings": {
        "n_heads": heads, "head_dim": expand * d // heads, "d_state": hf.get("mamba_d_state"),
        "n_groups": hf.get("mamba_ngroups"), "conv_kernel": hf.get("mamba_d_conv"), "chunk_size": hf.get("chunk_size"),
        "conv_bias": True, "in_bias": bias, "out_bias": bias, "norm_eps": 1e-5,
        "time_step_min": hf.get("time_step_min"), "time_step_max": None}}


def mixer_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """A mixer other than Zamba2's (its conv bias, norm eps, no dt upper bound, one bias switch) reads back
    otherwise: export refuses it by name."""
    s = cfg.mixer_settings if cfg.mixer == "mamba2" else None
    if s is None:
        return {}
    return {**sizes_to_hf(cfg), "mamba_ngroups": s.n_groups, "chunk_size": s.chunk_size,
            "time_step_min": s.time_step_min, "add_bias_linear": s.in_bias}


def sizes_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    """The keys Zamba and Zamba2 give their mixers' sizes alike (`mamba_expand`: d_inner / hidden_size)."""
    s = cfg.mixer_settings
    return {"n_mamba_heads": s.n_heads, "mamba_expand": s.d_inner // cfg.d_model if s.d_inner % cfg.d_model == 0
            else DEFAULT, "mamba_d_state": s.d_state, "mamba_d_conv": s.conv_kernel}


SCHEDULE_KEYS = (Key("layers_block_type", list, None, nullable=True), Key("num_mem_blocks", int, 1),
                 Key("use_shared_attention_adapter", bool, False), Key("adapter_rank", int, 128),
                 Key("use_mem_rope", bool, False))


def schedule_from_hf(hf: HfConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """Every layer Mamba2's, the hybrid ones calling the shared blocks; the attention's head_dim 2 d / heads and
    its scale (head_dim / 2)^-0.5, RoPE on the calls where use_mem_rope."""
    n, d, heads = fields["n_layers"], fields["d_model"], fields["n_heads"]
    types = hf.get("layers_block_type")
    types = DEFAULT_TYPES if types is None else types
    odd = [t for t in types if t not in (*MIXER_TYPES, "hybrid")]
    if odd or len(types) != n:
        raise MappingError(f"config.json: layers_block_type={show(types)} should name each of the num_hidden_layers="
                           f"{n} layers 'hybrid', 'mamba' or 'linear_attention' (transformers builds one layer per "
                           "entry); fix the list")
    hybrid = tuple(i for i, t in enumerate(types) if t == "hybrid")
    if (2 * d) % heads:
        raise MappingError(f"config.json: num_attention_heads={heads} does not divide the shared attention's width "
                           f"2 x hidden_size={2 * d}; fix the sizes")
    head_dim = 2 * d // heads
    blocks = {"n_blocks": hf.get("num_mem_blocks"), "layers": hybrid, "adapter_rank": hf.get("adapter_rank"),
              "attn_adapters": hf.get("use_shared_attention_adapter")}
    if not hybrid:  # no layer calls a block: a plain Mamba2 stack
        blocks = None
    elif blocks["n_blocks"] > len(hybrid):
        raise MappingError(f"config.json: num_mem_blocks={blocks['n_blocks']} exceeds the {len(hybrid)} hybrid "
                           "layers of layers_block_type; transformers builds no such block: lower it")
    return {"layer_mixers": ("mixer",) * n, "layer_ffns": ("none",) * n, "shared_blocks": blocks,
            "head_dim": head_dim, "attn_scale": (head_dim / 2) ** -0.5,
            "layer_positions": ("rope" if hf.get("use_mem_rope") else "none",) * n}


def schedule_to_hf(cfg: ArchConfig) -> dict[str, Any]:
    shared = cfg.shared_blocks
    hybrid = () if shared is None else shared.layers
    return {"layers_block_type": ["hybrid" if i in hybrid else "linear_attention" for i in range(cfg.n_layers)],
            "num_mem_blocks": DEFAULT if shared is None else shared.n_blocks,
            "use_shared_attention_adapter": DEFAULT if shared is None else shared.attn_adapters,
            "adapter_rank": DEFAULT if shared is None else shared.adapter_rank,
            "use_mem_rope": "rope" in cfg.layer_positions}


LONG_CONTEXT = Entry("long context", (Key("use_long_context", bool, False),),
                     lambda hf, _: {"max_positions": 16384} if hf.get("use_long_context") else {},
                     lambda cfg: {"use_long_context": False})

CONFIG = llama.CONFIG.but(
    drop=("head_dim", "attention_bias", "mlp_bias"),
    add=(Entry("intermediate_size", (Key("intermediate_size", int, None, nullable=True),),
               lambda hf, fields: {"d_ff": hf.get("intermediate_size") or 4 * fields["d_model"]},
               lambda cfg: {"intermediate_size": cfg.d_ff}),
         llama.norm(1e-5), llama.activation("hidden_act", "gelu"),
         Entry("mixer", MIXER_KEYS, mixer_from_hf, mixer_to_hf),
         Entry("layer schedule", SCHEDULE_KEYS, schedule_from_hf, schedule_to_hf), LONG_CONTEXT),
    defaults={"vocab_size": 32000, "hidden_size": 2560, "num_hidden_layers": 54, "max_position_embeddings": 4096,
              "tie_word_embeddings": True},
    nullable={"attention_dropout": False},
)

NO_GGUF = "llama.cpp has no Zamba2 architecture (its converter reads no zamba model: no shared blocks, no adapters)"
# measured (tests/test_zamba2.py): under accelerate's offload hooks transformers' Zamba2 generate decodes otherwise
# than without them (its cached steps move by ~1e-4 in fp32 on the test model, its prefill logits do not)
NO_OFFLOAD = ("transformers' Zamba2 decodes otherwise under accelerate's offload hooks than without them (its cached "
              "steps move by ~1e-4 in fp32), so no offloaded reference can judge it")
FAMILY = Family("zamba2", ("zamba2",), "Zamba2ForCausalLM", TENSORS, CONFIG, layout=layout_table, no_gguf=NO_GGUF,
                no_offload=NO_OFFLOAD)
