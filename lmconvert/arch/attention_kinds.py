"""Attention kinds, each declared once: what `ArchConfig.attention` may name.

A kind is everything that differs between, say, standard multi-head attention and DeepSeek's
latent attention: the settings it adds to ArchConfig and the checks they need, the torch module
that computes it, the parts (so the tensors) that module holds, the lines the architecture card
says about it, and the size of its KV cache. `ArchConfig` validation, `shapes`, `Block` and
`describe` look the kind up here and name none, so adding a kind is one declaration below, plus
the file of its torch module.

Torch-free: the module is named ("package.module:Class") and imported when a model is built, as
`formats.checkpoint` names its readers, so checking a config or listing its tensors never loads torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .kinds import Kinds
from .parts import LinearPart, NormPart, ParamPart, Part

if TYPE_CHECKING:
    from torch import nn

    from .config import ArchConfig
    from .positions import RelativeBias
    from .rope import Rotary


@dataclass(frozen=True)
class AttentionKind:
    """One attention kind. Its callables take the whole ArchConfig, already validated (`check`
    runs last, on a config otherwise complete).

    The module is built as `Class(cfg, parts, layer, rotary, relative)`, with `parts = parts(cfg)`
    which it registers with `build.attach`; it has a `backend` attribute (set by
    `Decoder.set_attention`) and `forward(x, ctx, cache)`. `settings` is a frozen dataclass of the
    kind's own fields, held in `ArchConfig.attention_settings` and validating itself in
    `__post_init__`, or None for a kind that has none. `check` raises ConfigError for combinations
    of ArchConfig fields the kind cannot compute.
    """

    name: str
    module: str
    parts: Callable[[ArchConfig], dict[str, Part]]
    describe: Callable[[ArchConfig], list[str]]
    cache_elements: Callable[[ArchConfig], int]  # KV-cache entries per token and layer (keys and values)
    settings: type | None = None
    check: Callable[[ArchConfig], None] | None = None
    # the parameters of one layer's attention a token does not use (a mixture of heads' unchosen experts)
    unused: Callable[[ArchConfig], int] = lambda cfg: 0

    def build(self, cfg: ArchConfig, layer: int, rotary: Rotary | None, relative: RelativeBias | None) -> nn.Module:
        path, _, name = self.module.partition(":")
        cfg = cfg.layer_config(layer)  # this layer's parts (GPT-NeoX-Japanese's o bias on one layer)
        return getattr(import_module(path), name)(cfg, self.parts(cfg), layer, rotary, relative)


KINDS: Kinds[AttentionKind] = Kinds("attention kind", "attention")
register, unregister = KINDS.register, KINDS.unregister


def attention_kind(name: Any) -> AttentionKind:  # noqa: ANN401 - a config value, unchecked
    """The kind `ArchConfig.attention` names; a ConfigError naming the value when none is registered."""
    return KINDS.named(name)


# ----------------------------------------------------------------------------- standard: MHA / GQA / MQA
def _standard_parts(cfg: ArchConfig) -> dict[str, Part]:
    """The sinks (gpt-oss: a module's own parameters come first in its state_dict), the q, k, v, o
    projections, then the QK norms: over one head or over the whole projection; then the output
    gate's projection (AFMoE)."""
    # MiMo-V2-Flash: a layer left without a sink of its own (sink_layers "none")
    parts: dict[str, Part] = {"sinks": ParamPart((cfg.n_heads,))} if cfg.attn_sinks and cfg.sink_layers == "all" \
        else {}
    if cfg.attn_output_gate == "projection_head_bias":  # Beam's gate_bias, one per head (a parameter of its own)
        parts["out_gate_bias"] = ParamPart((cfg.n_heads,))
    parts |= {
        # Qwen3-Next: each head's query and its output gate side by side
        "q": LinearPart(cfg.d_model, cfg.q_dim * (2 if cfg.attn_output_gate == "q_heads" else 1), cfg.q_bias),
        "k": LinearPart(cfg.d_model, cfg.kv_dim, cfg.k_bias),
        "v": LinearPart(cfg.d_model, cfg.n_kv_heads * cfg.value_dim, cfg.v_bias),  # MiMo: values of their own width
        "o": LinearPart(cfg.o_dim, cfg.d_model, cfg.o_bias),
    }
    if cfg.kv_reused or cfg.k_eq_v == "all":  # Gemma 4: K/V from an earlier layer; v from k's projection
        del parts["v"]
    if cfg.kv_reused:
        del parts["k"]
    norm_dims = {"head": (cfg.head_dim, cfg.head_dim), "projection": (cfg.q_dim, cfg.kv_dim)}.get(cfg.qk_norm)
    if cfg.qk_norm_weight == "per_head":  # Cohere: each head its own weight, still normalised over head_dim
        norm_dims = ((cfg.n_heads, cfg.head_dim), (cfg.n_kv_heads, cfg.head_dim))
    if norm_dims:
        norm = replace(cfg.norm, bias=cfg.qk_norm_bias)  # the block norms' settings, but for the bias
        parts["q_norm"] = NormPart(norm_dims[0], norm)
        if not cfg.kv_reused:
            parts["k_norm"] = NormPart(norm_dims[1], norm)
    if cfg.attn_output_gate in ("projection", "projection_head_bias"):  # AFMoE's, Beam's gate_proj; never a bias
        parts["out_gate"] = LinearPart(cfg.d_model, cfg.o_dim, False)
    if cfg.attn_output_gate == "projection_head":  # Laguna's per-head g_proj: one gate per head
        parts["out_gate"] = LinearPart(cfg.d_model, cfg.n_heads, False)
    if cfg.sub_norms:  # BitNet: the attention output normalised before `o`
        parts["sub_norm"] = NormPart(cfg.o_dim, cfg.norm)
    return parts


def _gate_describe(cfg: ArchConfig) -> list[str]:
    """The attention output gate's line (standard and latent kinds), none without one."""
    if cfg.attn_output_gate == "none":
        return []
    source = {"projection": "a projection of the input", "q_heads": "q's second half per head",
              "projection_head_bias": "a projection of the input + a bias per head",
              "projection_head": "a projection of the input, one per head"}[cfg.attn_output_gate]
    act = {"sigmoid": "sigmoid({}) times", "softplus_fp32": "softplus({}) in fp32 times",
           "sigmoid_fp32": "sigmoid({}) in fp32 times"}[cfg.attn_gate_activation]
    return [f"attention output gate: {act.format(source)} each head's output, before o"]


def _standard_describe(cfg: ArchConfig) -> list[str]:
    if cfg.n_kv_heads == cfg.n_heads:
        kind = "MHA"
    elif cfg.n_kv_heads == 1:
        kind = "MQA"
    else:
        kind = f"GQA ({cfg.n_heads // cfg.n_kv_heads} q heads per kv head)"
    lines = [f"attention: {kind}, {cfg.n_heads} heads / {cfg.n_kv_heads} kv heads, head_dim {cfg.head_dim}"
             + ("" if cfg.v_head_dim is None else f", v head_dim {cfg.v_head_dim}")
             + ("" if cfg.attn_value_scale == 1.0 else f", v scaled x{cfg.attn_value_scale:g}")]
    if cfg.layer_heads is not None:
        lines.append(f"query heads per layer: {list(cfg.layer_heads)}")
    if cfg.qk_norm != "none":
        lines.append(f"QK norm: {'per head' if cfg.qk_norm == 'head' else 'over the whole projection'}"
                     + (", a weight for each head" if cfg.qk_norm_weight == "per_head" else "")
                     + ("" if cfg.qk_norm_bias == cfg.norm.bias else ", with a bias" if cfg.qk_norm_bias
                        else ", no bias")
                     + (", after RoPE" if cfg.qk_norm_after_rope else ""))
    if cfg.sub_norms:
        lines.append("sub-norms: before the output projection and before the MLP's down projection")
    lines += _gate_describe(cfg)
    lines += _gemma4_describe(cfg)
    if cfg.attn_sinks:
        lines.append("attention sinks: a learned logit per head in each softmax (eager)"
                     + (", as an output scale sigmoid(logsumexp - sink)" if cfg.sink_form == "scale" else "")
                     + (", kept in fp32" if cfg.sinks_fp32 else "")
                     + (" (sliding layers only; the others softmax alike)" if cfg.sink_layers == "local" else ""))
    return lines


def _gemma4_describe(cfg: ArchConfig) -> list[str]:
    """Gemma 4's per-layer geometry, K = V, the V norm and KV sharing (ArchConfig's Gemma 4 fields)."""
    lines = []
    if cfg.global_head_dim is not None or cfg.global_kv_heads is not None:
        glob = cfg.layer_config(cfg.layer_kinds.index("global")) if "global" in cfg.layer_kinds else cfg
        lines.append(f"global layers: {glob.n_heads} heads / {glob.n_kv_heads} kv heads, head_dim {glob.head_dim}")
    if cfg.k_eq_v != "none":
        lines.append(f"K = V on {cfg.k_eq_v} layers: no v projection, v is k's projection")
    if cfg.v_norm:
        lines.append("V norm: each head of v normalised, no weight")
    if cfg.kv_shared_layers:
        lines.append(f"KV sharing: the last {cfg.kv_shared_layers} layers reuse the K/V of the last earlier layer "
                     "of their kind" + (f"; FFN x{cfg.shared_ffn_factor} there" if cfg.shared_ffn_factor != 1 else ""))
    return lines


def _standard_cache(cfg: ArchConfig) -> int:
    return 0 if cfg.kv_reused else cfg.kv_dim + cfg.n_kv_heads * cfg.value_dim


register(AttentionKind(
    name="standard",
    module=f"{__package__}.attention:Attention",
    parts=_standard_parts,
    describe=_standard_describe,
    cache_elements=_standard_cache,
))


# ----------------------------------------------------------------------------- latent: MLA (DeepSeek-V2/V3)
def _count(name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"ArchConfig.attention_settings.{name}={value!r}: must be a positive integer")


@dataclass(frozen=True)
class LatentSettings:
    """Multi-head latent attention's own sizes, in transformers' DeepseekV3Config names.

    The rotary head dim (`qk_rope_head_dim`) is `ArchConfig.head_dim`, as DeepseekV3Config itself
    sets `head_dim = qk_rope_head_dim`: the Decoder's shared RoPE tables then serve latent layers
    unchanged, and the size is stated once. `bias` is transformers' `attention_bias`: it switches
    the biases of q_a_proj, kv_a_proj_with_mqa and o_proj together (q_proj, q_b_proj and kv_b_proj
    never have one). The two MLA-internal RMSNorms take `norm_eps`, 1e-6 in transformers whatever
    `rms_norm_eps` says. `deinterleave`: interleaved RoPE (`rope.layout="interleaved"`) writes its
    result de-interleaved, [evens | odds] (DeepSeek-V3's `rope_interleave`), or in place, pair by pair
    (DeepSeek-V2's complex rotation); the scores are the same sums in another order.
    """

    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    q_lora_rank: int | None = None  # None: one plain q projection, no q LoRA
    bias: bool = False
    norm_eps: float = 1e-6
    deinterleave: bool = True

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            _count(name, getattr(self, name))
        _count("q_lora_rank", self.q_lora_rank, allow_none=True)
        for name in ("bias", "deinterleave"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigError(f"ArchConfig.attention_settings.{name}={value!r}: must be true or false")
        _eps("norm_eps", self.norm_eps)


def _eps(name: str, eps: Any) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < math.inf:
        raise ConfigError(f"ArchConfig.attention_settings.{name}={eps!r}: must be a positive, finite number")


def latent_qk_head_dim(cfg: ArchConfig) -> int:
    """Each head's query and key: the non-rotary part, then the rotary part (`head_dim`)."""
    return cfg.attention_settings.qk_nope_head_dim + cfg.head_dim


def latent_score_scale(cfg: ArchConfig) -> float:
    """transformers' `yarn_apply_mscale`: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2
    when RoPE is scaled and `mscale_all_dim` is set (in Python floats, in its order)."""
    if cfg.attn_scale is not None:
        return cfg.attn_scale
    scale = latent_qk_head_dim(cfg) ** (-0.5)
    rope = cfg.rope
    if rope.scaling != "none" and rope.mscale_all_dim:
        mscale = 1.0 if rope.factor <= 1 else 0.1 * rope.mscale_all_dim * math.log(rope.factor) + 1.0
        scale = scale * mscale * mscale
    return scale


def _latent_parts(cfg: ArchConfig) -> dict[str, Part]:
    """transformers' module order: q (or q_a, q_a_norm, q_b), kv_a, kv_a_norm, kv_b, o; then Ling 3's
    output gate (`attn_output_gate="projection_head"`)."""
    s = cfg.attention_settings
    # DeepseekV3RMSNorm, whatever the block norms are: RMS, weight applied after the cast back. Every
    # field is set, on a copy of the config's NormConfig (config.py imports this module, not the reverse)
    norm = replace(cfg.norm, kind="rms", eps=s.norm_eps, weight=True, bias=False, weight_offset=0.0,
                   dtype_order="cast_then_scale")
    q_out = cfg.n_heads * latent_qk_head_dim(cfg)
    parts: dict[str, Part] = {}
    if s.q_lora_rank is None:
        parts["q"] = LinearPart(cfg.d_model, q_out)
    else:
        parts["q_a"] = LinearPart(cfg.d_model, s.q_lora_rank, s.bias)
        parts["q_a_norm"] = NormPart(s.q_lora_rank, norm)
        parts["q_b"] = LinearPart(s.q_lora_rank, q_out)
    parts["kv_a"] = LinearPart(cfg.d_model, s.kv_lora_rank + cfg.head_dim, s.bias)
    parts["kv_a_norm"] = NormPart(s.kv_lora_rank, norm)
    parts["kv_b"] = LinearPart(s.kv_lora_rank, cfg.n_heads * (s.qk_nope_head_dim + s.v_head_dim))
    parts["o"] = LinearPart(cfg.n_heads * s.v_head_dim, cfg.d_model, s.bias)
    if cfg.attn_output_gate == "projection_head":  # Ling 3's g_proj: one gate per head, after o in its module
        parts["out_gate"] = LinearPart(cfg.d_model, cfg.n_heads, False)
    return parts


def _latent_cache(cfg: ArchConfig) -> int:
    """The normed latent c_kv and the one rotary key all heads share."""
    return cfg.attention_settings.kv_lora_rank + cfg.head_dim


def _latent_mha_cache(cfg: ArchConfig) -> int:
    """What MHA with the same heads and head dims caches: every head's key and value."""
    return cfg.n_heads * (latent_qk_head_dim(cfg) + cfg.attention_settings.v_head_dim)


def _latent_describe(cfg: ArchConfig) -> list[str]:
    s = cfg.attention_settings
    q = "plain q projection" if s.q_lora_rank is None else f"q LoRA rank {s.q_lora_rank}"
    rotary = "shared unrotated (no positions)" if "rope" not in cfg.layer_positions else "rotary"
    lines = [f"attention: latent (MLA), {cfg.n_heads} heads, {q}, kv_lora_rank {s.kv_lora_rank}",
             f"MLA head dims: q/k {s.qk_nope_head_dim} + {rotary} {cfg.head_dim}, v {s.v_head_dim}; "
             f"score scale {latent_score_scale(cfg):.6g}",
             f"MLA norms: RMSNorm eps={s.norm_eps:g}; biases: {'q_a, kv_a, o' if s.bias else 'none'}"]
    if cfg.rope.layout == "interleaved" and "rope" in cfg.layer_positions:
        order = "and de-interleaved" if s.deinterleave else "in place"
        lines.append(f"MLA RoPE: rotary dims in pairs, rotated {order}")
    latent, mha = _latent_cache(cfg), _latent_mha_cache(cfg)
    lines.append(f"latent KV cache: {latent} entries per token and layer (c_kv {s.kv_lora_rank} + k_rot "
                 f"{cfg.head_dim}); MHA with these heads: {mha}; {latent / mha:.1%} of it")
    return lines + _gate_describe(cfg)


def _refuse(refusals: list[tuple[str, Any, bool, str]]) -> None:
    """The first of (field, value, whether it is wrong, why) that is wrong, as a ConfigError naming it."""
    for name, value, wrong, why in refusals:
        if wrong:
            raise ConfigError(f"ArchConfig.{name}={value!r}: {why}")


def _latent_check(cfg: ArchConfig) -> None:
    """What transformers' DeepseekV3Attention cannot be told: it has one kind of positions (RoPE on
    the whole rotary part, every layer; or none, as KimiLinearAttention, whose "rotary" key part is
    shared by the heads unrotated), no window, no cap, no QK norm, and its biases are
    `settings.bias`; `num_key_value_heads` other than the head count breaks its eager path."""
    refusals = [
        ("n_kv_heads", cfg.n_kv_heads, cfg.n_kv_heads != cfg.n_heads, "latent attention has n_kv_heads = n_heads"),
        ("layer_positions", cfg.layer_positions, set(cfg.layer_positions) not in ({"rope"}, {"none"}),
         "latent attention uses RoPE on every layer (DeepSeek) or on none (Kimi Linear's NoPE MLA)"),
        ("rope.fraction", cfg.rope.fraction, cfg.rope.fraction != 1,
         "latent attention rotates all of head_dim (its qk_rope_head_dim)"),
        ("layer_kinds", cfg.layer_kinds, "local" in cfg.layer_kinds, "latent attention has no sliding window"),
        ("attn_softcap", cfg.attn_softcap, cfg.attn_softcap is not None, "latent attention has no soft-cap"),
        ("qk_norm", cfg.qk_norm, cfg.qk_norm != "none", "latent attention has its own norms, no QK norm"),
    ]
    refusals.append(("attention_settings.deinterleave", False,
                     not cfg.attention_settings.deinterleave and cfg.rope.layout != "interleaved",
                     "only interleaved RoPE (rope.layout='interleaved') has a choice of output order"))
    refusals.append(("rope.complex_product", True, cfg.rope.complex_product and cfg.attention_settings.deinterleave,
                     "a complex product rotates the pairs in place (attention_settings.deinterleave=False)"))
    refusals += [(f"{p}_bias", True, getattr(cfg, f"{p}_bias"), "latent attention's biases are "
                  "attention_settings.bias") for p in "qkvo"]
    _refuse(refusals)


register(AttentionKind(
    name="latent",
    module=f"{__package__}.latent_attention:LatentAttention",
    parts=_latent_parts,
    describe=_latent_describe,
    cache_elements=_latent_cache,
    settings=LatentSettings,
    check=_latent_check,
))


# ----------------------------------------------------------------------------- sparse: DSA (DeepSeek-V3.2)
@dataclass(frozen=True)
class SparseSettings(LatentSettings):
    """DeepSeek Sparse Attention: latent attention (always through the q LoRA, whose normed
    residual the indexer reads) in which a lightning indexer keeps, for each query, the
    `index_topk` best-scored keys and masks the others. The indexer's sizes are DeepseekV32Config's:
    `index_n_heads` query heads of `index_head_dim`, one key head of `index_head_dim` whose
    LayerNorm (weight and bias) takes `index_norm_eps`, 1e-6 in transformers."""

    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 2048
    index_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("index_n_heads", "index_head_dim", "index_topk"):
            _count(name, getattr(self, name))
        _eps("index_norm_eps", self.index_norm_eps)
        if self.q_lora_rank is None:
            raise ConfigError("ArchConfig.attention_settings.q_lora_rank=None: sparse attention's indexer reads the "
                              "q LoRA's normed residual; set q_lora_rank")


def _sparse_parts(cfg: ArchConfig) -> dict[str, Part]:
    """The latent parts, then the indexer's in transformers' order: wq_b, wk, k_norm, weights_proj."""
    s = cfg.attention_settings
    key_norm = replace(cfg.norm, kind="layer", eps=s.index_norm_eps, weight=True, bias=True, weight_offset=0.0,
                       dtype_order="scale_then_cast", written_out=False)  # nn.LayerNorm: torch's kernel
    return {**_latent_parts(cfg),
            "index_q": LinearPart(s.q_lora_rank, s.index_n_heads * s.index_head_dim),
            "index_k": LinearPart(cfg.d_model, s.index_head_dim),
            "index_k_norm": NormPart(s.index_head_dim, key_norm),
            "index_weights": LinearPart(cfg.d_model, s.index_n_heads)}


def _sparse_cache(cfg: ArchConfig) -> int:
    """The latent, and the indexer's key (after its norm and RoPE) for every past token."""
    return _latent_cache(cfg) + cfg.attention_settings.index_head_dim


def _sparse_describe(cfg: ArchConfig) -> list[str]:
    s = cfg.attention_settings
    lines = [line.replace("latent (MLA)", "sparse (DSA: MLA with a lightning indexer)", 1)
             if line.startswith("attention:") else line for line in _latent_describe(cfg)]
    lines.append(f"DSA indexer: {s.index_n_heads} heads x {s.index_head_dim}, ReLU scores in fp32, each query keeps "
                 f"its top {s.index_topk} keys; cached with the latent: {s.index_head_dim} more entries per token "
                 f"and layer ({_sparse_cache(cfg)} in all)")
    return lines


def _sparse_check(cfg: ArchConfig) -> None:
    _latent_check(cfg)
    s = cfg.attention_settings
    if s.index_head_dim < cfg.head_dim:
        raise ConfigError(f"ArchConfig.attention_settings.index_head_dim={s.index_head_dim}: the indexer rotates "
                          f"its first head_dim={cfg.head_dim} dims; it must be at least that")
    if cfg.rope.layout != "interleaved" or not s.deinterleave:
        raise ConfigError(f"ArchConfig.rope.layout={cfg.rope.layout!r}: sparse attention is DeepSeek-V3.2's, whose "
                          "MLA RoPE is interleaved and written de-interleaved (attention_settings.deinterleave)")


register(AttentionKind(
    name="sparse",
    module=f"{__package__}.sparse_attention:SparseAttention",
    parts=_sparse_parts,
    describe=_sparse_describe,
    cache_elements=_sparse_cache,
    settings=SparseSettings,
    check=_sparse_check,
))


# ----------------------------------------------------------------------------- head_mixture: MoA (JetMoE)
@dataclass(frozen=True)
class HeadMixtureSettings:
    """A mixture of attention heads (arch/head_mixture.py): `n_experts` pairs of query and output
    projections, of which a top-k router picks `top_k` per token, over one shared k and v. Each
    expert's query makes `n_kv_heads` heads, so `n_heads` is `top_k * n_kv_heads` (JetMoeConfig's
    num_attention_heads). `ArchConfig.o_bias` is the one bias added after the experts' sum."""

    n_experts: int = 8
    top_k: int = 2

    def __post_init__(self) -> None:
        for name in ("n_experts", "top_k"):
            _count(name, getattr(self, name))
        if self.top_k > self.n_experts:
            raise ConfigError(f"ArchConfig.attention_settings.top_k={self.top_k}: cannot exceed "
                              f"n_experts={self.n_experts}")


def _mixture_parts(cfg: ArchConfig) -> dict[str, Part]:
    """The output bias (the module's own tensor, first in its state_dict), the router, each expert's
    q, the shared k and v, each expert's o: JetMoeMoA's and kv_proj's tensors, one per expert."""
    s = cfg.attention_settings
    parts: dict[str, Part] = {"bias": ParamPart((cfg.d_model,))} if cfg.o_bias else {}
    parts["router"] = LinearPart(cfg.d_model, s.n_experts)
    parts |= {f"q.{e}": LinearPart(cfg.d_model, cfg.kv_dim) for e in range(s.n_experts)}
    parts |= {"k": LinearPart(cfg.d_model, cfg.kv_dim), "v": LinearPart(cfg.d_model, cfg.kv_dim)}
    parts |= {f"o.{e}": LinearPart(cfg.kv_dim, cfg.d_model) for e in range(s.n_experts)}
    return parts


def _mixture_describe(cfg: ArchConfig) -> list[str]:
    s = cfg.attention_settings
    return [f"attention: mixture of attention heads (MoA), {s.n_experts} experts of {cfg.n_kv_heads} query heads, "
            f"top-{s.top_k} per token ({cfg.n_heads} heads), over {cfg.n_kv_heads} shared kv heads, head_dim "
            f"{cfg.head_dim}",
            "MoA router: top-k on logits then softmax over the k, weights in activation dtype; each chosen "
            "expert's q and o, the outputs weighted and summed" + (", then a bias" if cfg.o_bias else "")]


def _mixture_check(cfg: ArchConfig) -> None:
    """What JetMoeAttention computes and nothing else: its heads are the chosen experts' queries over
    shared kv heads, RoPE or nothing, no window, cap, QK norm or projection bias but the output's."""
    s = cfg.attention_settings
    refusals = [
        ("n_heads", cfg.n_heads, cfg.n_heads != s.top_k * cfg.n_kv_heads,
         f"a mixture of attention heads has top_k * n_kv_heads = {s.top_k * cfg.n_kv_heads} query heads"),
        ("layer_positions", cfg.layer_positions, not set(cfg.layer_positions) <= {"rope", "none"},
         "a mixture of attention heads has RoPE or no positions"),
        ("layer_kinds", cfg.layer_kinds, "local" in cfg.layer_kinds, "a mixture of attention heads has no "
         "sliding window"),
        ("attn_softcap", cfg.attn_softcap, cfg.attn_softcap is not None, "a mixture of attention heads has no "
         "soft-cap"),
        ("qk_norm", cfg.qk_norm, cfg.qk_norm != "none", "a mixture of attention heads has no QK norm"),
        ("clip_qkv", cfg.clip_qkv, cfg.clip_qkv is not None, "a mixture of attention heads does not clamp"),
    ]
    refusals += [(name, True, getattr(cfg, name), "a mixture of attention heads computes its scores plainly")
                 for name in ("scale_query", "scores_fp32", "scale_in_product", "scale_by_inverse_layer")]
    refusals += [(f"{p}_bias", True, getattr(cfg, f"{p}_bias"), "a mixture of attention heads' only bias is its "
                  "output's (o_bias)") for p in "qkv"]
    moe = cfg.moe
    refusals.append(("moe.aux_loss", moe and moe.aux_loss, moe is not None and moe.aux_loss != 0 and
                     (moe.n_experts, moe.top_k) != (s.n_experts, s.top_k), "the load balance counts the attention's "
                     "router with the experts' (JetMoE's): both need the same n_experts and top_k"))
    _refuse(refusals)


def _mixture_unused(cfg: ArchConfig) -> int:
    """The q and o of the experts a token was not routed to."""
    s = cfg.attention_settings
    return (s.n_experts - s.top_k) * 2 * cfg.d_model * cfg.kv_dim


# the cache: the shared keys and values, as plain GQA's
register(AttentionKind("head_mixture", f"{__package__}.head_mixture:HeadMixture", _mixture_parts, _mixture_describe,
                       lambda cfg: 2 * cfg.kv_dim, HeadMixtureSettings, _mixture_check, _mixture_unused))
