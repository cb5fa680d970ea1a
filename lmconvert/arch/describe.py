"""Human names for the variants an ArchConfig uses: the lines of the architecture card."""

from __future__ import annotations

from math import prod

from .attention_kinds import attention_kind
from .config import PARALLEL_MIXING, ArchConfig, MoeConfig, NormConfig, RopeConfig
from .mixer_kinds import mixer_kind
from .shapes import parameter_shapes

ACTIVATION_NAMES = {"relu": "ReLU", "gelu": "GeLU (erf)", "gelu_tanh": "GeLU (tanh)", "silu": "SiLU",
                    "relu2": "squared ReLU", "gelu_new": "GeLU (tanh, written out)",
                    "gelu_bloom": "GeLU (tanh, BLOOM's constants)",
                    "xielu": "xIELU (learned alpha_p, alpha_n per layer)"}
GATED_NAMES = {"relu": "ReGLU", "gelu": "GeGLU (erf)", "gelu_tanh": "GeGLU (tanh)", "silu": "SwiGLU",
               "relu2": "gated squared ReLU", "gelu_new": "GeGLU (tanh, written out)",
               "gelu_bloom": "GeGLU (BLOOM's tanh)", "xielu": "gated xIELU (learned alpha_p, alpha_n per layer)"}
# boolean ArchConfig values and the card line each gives when set
ORDER_FLAGS = (("scale_by_inverse_layer", "score scale divided by layer index + 1"),
               ("scale_query", "score scale applied to q before q.k"), ("scores_fp32", "q.k in fp32"),
               ("scale_in_product", "score scale inside q.k's product (baddbmm)"))
# ArchConfig's muP multipliers (config.MULTIPLIERS), as the card names them
MULTIPLIER_NAMES = (("attn_in_multiplier", "attention input"), ("attn_out_multiplier", "attention output"),
                    ("key_multiplier", "k"), ("mixer_out_multiplier", "mixer output"),
                    ("mlp_gate_multiplier", "FFN gate"), ("mlp_down_multiplier", "FFN output"))
BLOCK_FLAGS = (("residual_after_norm", "residual taken after the norm"),
               ("residual_fp32", "residual stream in fp32"), ("embed_norm", "embedding norm"),
               ("bias_separate", "linear biases added after the matmul"),
               ("mlp_fused", "gate and up as one fused output"),
               ("conv1d_linears", "linears as Conv1D (addmm over weights held [in, out])"),
               ("layer_scalar", "layer scalar: each block's output times a learned scalar"))  # Gemma 4
ALIBI_NAMES = {"distance": "slope x (k - q)", "bloom": "BLOOM's: slope x k, inside the score matmul",
               "mpt": "MPT's slopes, slope x (k - last k), in fp32",
               "falcon": "Falcon's: bf16 slope x k, added before the scaling and again with the mask"}
PLACEMENT_NAMES = {"pre": "pre-norm", "post": "post-norm", "sandwich": "sandwich norm (pre + post)",
                   "output": "norm on sublayer output only", "parallel_shared": "parallel attn+MLP, shared norm",
                   "parallel_separate": "parallel attn+MLP, separate norms"}

POSITION_NAMES = {"learned": "learned", "sinusoidal": "sinusoidal (sin/cos interleaved)",
                  "sinusoidal_fairseq": "sinusoidal (fairseq: sin half, cos half)",
                  "sinusoidal_halves": "sinusoidal (CTRL: sin half, cos half, 10000^(-2i/d))"}


# ArchConfig.attn_temperature_form -> its card line (beta, floor)
TEMPERATURE_LINES = {"ministral3": "attention temperature: q x (1 + {:g} log(1 + floor(pos / {})))",
                     "llama4": "attention temperature: q x (1 + {:g} log1p(floor((pos + 1) / {}))), in fp32, "
                               "layers without positions only",
                     "beam": "attention temperature: q x exp({:g} log1p((pos + 1) / {})), in fp32, layers without "
                             "positions only"}


def _norm(n: NormConfig) -> str:
    kind = {"rms": "RMSNorm", "layer": "LayerNorm"}[n.kind]
    parts = [kind, f"eps={n.eps:g}"]
    if n.weight_offset:
        parts.append(f"scale (w + {n.weight_offset:g})")
    if not n.weight:
        parts.append("no scale")
    if n.bias:
        parts.append("bias")
    if n.written_out:
        parts.append("mean/variance written out")
    if n.power:  # Gemma 4
        parts.append("1/sqrt as pow(-0.5)")
    parts.append("weight in fp32" if n.dtype_order == "scale_then_cast" else "weight after cast")
    return ", ".join(parts)


def _rope(r: RopeConfig) -> str:
    text = f"RoPE {r.layout}, theta={r.theta:g}"
    if r.fraction != 1:
        text += f", {r.fraction:g} of head_dim"
    if r.rotary_dims is not None:
        text += f", {r.rotary_dims} rotary dims"
    if r.scaling not in ("none", "ntk_alpha"):
        text += f", {r.scaling} x{r.factor:g}"
    if r.scaling == "longrope":
        text += (f" (short factors up to {r.original_max_positions} positions, long beyond; "
                 f"cos/sin x{r.longrope_attention_factor():.6g})")
    if r.fp32_rotation:
        text += ", q/k rotated in fp32"
    if r.complex_product:
        text += ", pairs rotated as fp32 complex products (torch.polar tables)"
    if r.alpha is not None:
        text += f" (NTK alpha {r.alpha:g}: static base)"
    if r.reverse:
        text += ", reversed rotation ([x2, -x1])"
    return text


ROUTER_NAMES = {"softmax": "softmax then top-k", "sigmoid": "sigmoid then top-k",
                "sparsemixer": "SparseMixer: top-1, then top-2 of the rest, each a masked softmax",
                "topk_softmax": "top-k on logits then softmax over the k",
                "topk_sigmoid": "top-k on logits then their sigmoids",
                "sigmoid_fp32": "sigmoid in fp32 then top-k", "logits": "top-k on logits, then sigmoid",
                "topk_sigmoid_fp32": "top-k on logits then their sigmoids in fp32",
                "sigmoid_fp32_sorted": "sigmoid in fp32 then sorted top-k",
                "sigmoid_sorted": "sigmoid then sorted top-k (sum guarded by 1e-6)",
                "sigmoid_grouped_sorted": "sigmoid then sorted top-k"}
SHARED_NAMES = {"gated": "one shared expert, sigmoid-gated", "plain": "shared experts, ungated",
                "averaged": "shared experts, averaged with the routed experts' sum"}


def _moe(cfg: ArchConfig, moe: MoeConfig) -> list[str]:
    sparse = [i for i in range(cfg.n_layers) if moe.sparse(i)]
    where = "all layers" if len(sparse) == cfg.n_layers else f"layers {sparse}"
    router = ROUTER_NAMES[moe.router]
    if moe.router != "topk_softmax":  # its weights sum to 1 by construction
        router += ", renormalised" if moe.norm_topk else ", not renormalised"
    router += ", weights in fp32" if moe.weights_fp32 else ", weights in activation dtype"
    if moe.n_group > 1:
        router += f", best {moe.topk_group} of {moe.n_group} groups"
    if moe.selection_bias:
        router += ", selection bias"
    if moe.scale != 1.0:
        router += f", scaled x{moe.scale:g}" + (" (the weighted sum)" if moe.scale_after_sum else "")
    if moe.router_fp32:
        router += ", logits in fp32"
    if moe.sparsemixer_eps is not None:
        router += f", masked beyond a relative 2 x {moe.sparsemixer_eps:g}"
    if not moe.softmax_fp32:
        router += ", softmax in activation dtype"
    if moe.norm_p is not None:
        router += f", renormalised by the {moe.norm_p:g}-norm"
    if moe.norm_min:
        router += f", sum clamped to >= {moe.norm_min:g}"
    if moe.kept_fp32 is not None:
        router += f", kept in fp32: {', '.join(moe.kept_fp32) or 'nothing'}"
    if moe.router_bias:
        router += ", with a bias"
    if moe.router_norm:
        router += ", input normalised and scaled"
    if moe.expert_scale:
        router += ", per-expert scale"
    if moe.router_softcap is not None:
        router += f", logits soft-capped at {moe.router_softcap:g} in fp32"
    if moe.norm_eps is not None:
        router += f", renormalised by the sum + {moe.norm_eps:g}"
    lines = [f"mixture of experts: {moe.n_experts} experts, top-{moe.top_k}, d_expert {moe.d_expert} ({where})",
             f"router: {router}"]
    if moe.glu == "clamped_swiglu":
        lines.append(f"experts: clamped SwiGLU (alpha {moe.glu_alpha:g}, limit {moe.glu_limit:g}, up + 1) over "
                     "interleaved gate/up")
    if moe.weight_input:
        lines.append("experts: router weight multiplies each expert's input, not its output")
    if moe.expert_bias:
        lines.append("experts: biases on gate, up and down, added after each product")
    if moe.sum_bias:
        lines.append("experts: a bias added to their weighted sum")
    if moe.beside_dense:
        lines.append("experts beside the dense MLP: each output normalised, then summed")
    if moe.d_shared is not None:
        lines.append(f"{SHARED_NAMES[moe.shared]}, width {moe.d_shared}"
                     + (", gate and up as one projection's halves" if moe.shared_fused else ""))
    if moe.output_norm:
        lines.append("the mixture's output normalised (sparse layers)")
    if moe.aux_loss:
        lines.append(f"load-balancing loss x{moe.aux_loss:g} in the training loss")
    total, active = parameter_counts(cfg)
    lines.append(f"parameters: {total:,} total, {active:,} active per token")
    return lines


def parameter_counts(cfg: ArchConfig) -> tuple[int, int]:
    """All parameters, and those one token uses: each sparse layer's unchosen experts left out, and
    the attention's parameters a token does not use (a mixture of attention heads' unchosen experts)."""
    total = sum(prod(shape) for shape in parameter_shapes(cfg).values())
    unused = cfg.n_layers * attention_kind(cfg.attention).unused(cfg)
    moe = cfg.moe
    if moe is not None:
        per_expert = (3 if cfg.gated else 2) * cfg.d_model * moe.d_expert
        if moe.expert_bias:  # gate and up biases of its width, the down bias of d_model
            per_expert += (2 if cfg.gated else 1) * moe.d_expert + cfg.d_model
        unused += sum(moe.sparse(i) for i in range(cfg.n_layers)) * (moe.n_experts - moe.top_k) * per_expert
    return total, total - unused


def _runs(layers: list[int]) -> str:
    """[0, 1, 2, 5] as "0-2, 5"."""
    runs: list[list[int]] = []
    for i in layers:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _layers(layers: list[int]) -> str:
    return f"{len(layers)} layer{'s' * (len(layers) != 1)}"


def schedule(cfg: ArchConfig) -> list[str]:
    """Which layers attention, the mixer or nothing mixes, which have an FFN, and the state each
    keeps; nothing for a stack of attention-and-FFN layers."""
    if set(cfg.layer_mixers) == {"attention"} and set(cfg.layer_ffns) == {"ffn"}:
        return []
    names = {"attention": "attention", "mixer": cfg.mixer, "none": "no mixer",
             PARALLEL_MIXING: f"attention and {cfg.mixer} side by side (outputs summed)"}
    letters = {"attention": "A", "mixer": "M", "none": "-", PARALLEL_MIXING: "AM"}
    pattern = " ".join(letters[m] + ("F" if f == "ffn" else "") for m, f in zip(cfg.layer_mixers, cfg.layer_ffns,
                                                                              strict=True))
    alone = {m: [i for i, x in enumerate(cfg.layer_mixers) if x == m] for m in names}  # a parallel layer: its own
    kinds = [f"{names[m]} on {len(ls)} ({_runs(ls)})" for m, ls in alone.items() if ls]
    ffns = [i for i, f in enumerate(cfg.layer_ffns) if f == "ffn"]
    where = "all layers" if len(ffns) == cfg.n_layers else f"{len(ffns)} layers ({_runs(ffns)})" if ffns else "none"
    lines = [f"layer schedule: {'; '.join(kinds)}; FFN on {where}",
             f"layer pattern: {pattern} (A attention, M {cfg.mixer or 'mixer'}, F an FFN after it)"]
    attention, mixers = cfg.layers_mixed_by("attention"), cfg.layers_mixed_by("mixer")
    calls = () if cfg.shared_blocks is None else cfg.shared_blocks.layers  # Zamba2: each call caches its own K/V
    state = []
    if attention or calls:
        where = [f"{_layers(attention)} of attention"] if attention else []
        where += [f"{len(calls)} shared-block call{'s' * (len(calls) != 1)}"] if calls else []
        state.append(f"{cfg.kv_cache_bytes_per_token(1):,} entries per token (KV cache, {', '.join(where)})")
    if mixers:
        state.append(f"{cfg.state_bytes_per_sequence(1):,} entries per sequence, whatever its length "
                     f"({_layers(mixers)} of {cfg.mixer})")
    lines.append(f"decoding state: {' + '.join(state)}")
    return lines


def _gemma3n(cfg: ArchConfig) -> list[str]:
    """The card lines of Gemma 3n's sparse gates, AltUp, per-layer embeddings and LAuReL."""
    out = []
    if cfg.gate_sparsity is not None:
        sparse = {i: s for i, s in enumerate(cfg.gate_sparsity) if s}
        out.append("gate sparsity: g -> relu(g - mean - std x icdf_N(s)) on layers "
                   + ", ".join(f"{i} (s={s:g})" for i, s in sparse.items()))
    if cfg.altup is not None:
        scale = ", the corrected active stream scaled" if cfg.altup.correct_scale else ""
        out.append(f"AltUp: {cfg.altup.n_inputs} residual streams, stream {cfg.altup.active} active (predict, "
                   f"block, correct{scale}); merged by projection and mean before the final norm")
    if cfg.ple is not None:
        where = "AltUp's streams 1 and up" if cfg.altup is not None else "the residual"
        out.append(f"per-layer embeddings: {cfg.ple.dim} per layer from a {cfg.ple.vocab_size}-row table and the "
                   f"projected embedding, gated into {where} ({cfg.ple.scales} scales)")
    if cfg.laurel_rank is not None:
        out.append(f"LAuReL: rank {cfg.laurel_rank} branch beside attention, the sum over sqrt(2)")
    return out


def _shared_blocks(cfg: ArchConfig) -> list[str]:
    """Zamba2's shared blocks: how many, who calls which, what one computes, the calls' adapters."""
    shared = cfg.shared_blocks
    if shared is None:
        return []
    wide = cfg.shared_attention_config()
    ffn = GATED_NAMES[cfg.activation]
    adapted = "q, k, v and gate_up" if shared.attn_adapters else "gate_up"
    fused = " (gate and up one projection)" if shared.fused_gate_up else ""
    return [f"shared blocks: {shared.n_blocks}, called by layers {_runs(list(shared.layers))} (block "
            f"{', '.join(str(shared.block_of(i)) for i in shared.layers)})",
            f"shared block: concat(h, embeddings) -> norm ({2 * cfg.d_model}) -> attention from {2 * cfg.d_model} "
            f"-> norm -> {ffn}{fused}, d_ff {cfg.d_ff}; then the call's linear, added to its "
            "layer's input before the norm (the residual unchanged)",
            *(f"shared {line}" for line in attention_kind(wide.attention).describe(wide)),
            f"adapters of rank {shared.adapter_rank} on {adapted}, each call its own" if shared.adapter_rank is not None
            else "no adapters: every call runs its block as it is"]


def variants(cfg: ArchConfig) -> list[str]:
    mixing = ([*attention_kind(cfg.attention).describe(cfg)] if cfg.layers_mixed_by("attention") else []) + \
        (mixer_kind(cfg.mixer).describe(cfg) if cfg.layers_mixed_by("mixer") else []) + _shared_blocks(cfg)
    placement = PLACEMENT_NAMES[cfg.norm_placement]
    if cfg.mixer_norm_placement is not None:
        placement += f" ({cfg.mixer} layers: {PLACEMENT_NAMES[cfg.mixer_norm_placement]})"
    out = [f"norm: {_norm(cfg.norm)}", f"placement: {placement}", *mixing, *schedule(cfg)]
    if cfg.attn_scale is not None:
        out.append(f"score scale: {cfg.attn_scale:g}")
    out.extend(line for flag, line in ORDER_FLAGS if getattr(cfg, flag))
    if cfg.attn_softcap is not None:
        out.append(f"attention soft-cap: {cfg.attn_softcap:g}")
    if cfg.norm_placement.startswith("parallel"):
        out.append(f"parallel sum: {cfg.parallel_sum}")
    out.extend(line for flag, line in BLOCK_FLAGS if getattr(cfg, flag))
    if cfg.unnormed_attn_layers:
        out.append(f"no attention norm on layers {list(cfg.unnormed_attn_layers)}")
    if cfg.clip_qkv is not None:
        out.append(f"q, k, v clamped to +-{cfg.clip_qkv:g}")
    if cfg.attn_temperature is not None:
        out.append(TEMPERATURE_LINES[cfg.attn_temperature_form].format(cfg.attn_temperature,
                                                                        cfg.attn_temperature_floor))
    if cfg.qk_l2_norm:
        out.append(f"QK norm: weightless L2 (RMS) per head after RoPE, rotary layers only, eps={cfg.norm.eps:g}")
    if cfg.chunked_layers:
        where = "all layers" if len(cfg.chunked_layers) == cfg.n_layers else f"layers {list(cfg.chunked_layers)}"
        out.append(f"chunked local attention: chunks of {cfg.attention_chunk} positions ({where}); "
                   "KV cache keeps every token")
    if cfg.residual_scale != 1.0:
        out.append(f"residual scale: {cfg.residual_scale:g} (each sublayer's output)")
    muls = [f"{what} x {getattr(cfg, name):g}" for name, what in MULTIPLIER_NAMES if getattr(cfg, name) != 1.0]
    if muls:
        out.append(f"muP multipliers: {', '.join(muls)}")
    if cfg.residual_form == "depth_scaled":
        out.append("residual: depth-scaled, add k: sublayer / sqrt(k) + h * sqrt((k - 1) / k)")
    kinds = cfg.layer_kinds
    if "local" in kinds:
        pattern = "".join("L" if k == "local" else "G" for k in kinds)
        out.append(f"sliding window {cfg.sliding_window} on local layers; pattern {pattern}")
    positions = sorted(set(cfg.layer_positions))
    for kind in positions:
        layers = [i for i, p in enumerate(cfg.layer_positions) if p == kind]
        where = "all layers" if len(layers) == cfg.n_layers else f"layers {layers}"
        if kind == "rope":
            text = _rope(cfg.rope)
            if cfg.rope_local is not None:
                text += f"; local layers: {_rope(cfg.rope_local)}"
            out.append(f"positions: {text} ({where})")
        elif kind == "alibi":
            out.append(f"positions: ALiBi ({ALIBI_NAMES[cfg.alibi]}) ({where})")
        else:
            out.append(f"positions: {kind} ({where})")
    if cfg.absolute_positions != "none":
        offset = f", index offset {cfg.position_offset}" if cfg.position_offset else ""
        offset += ", numbered from the attention mask" if cfg.positions_from_mask else ""
        out.append(f"absolute positions: {POSITION_NAMES[cfg.absolute_positions]}{offset}")
    ffn = f"FFN: {(GATED_NAMES if cfg.gated else ACTIVATION_NAMES)[cfg.activation]}"
    ffn += ", product in fp32" if cfg.glu_fp32 else ""
    if cfg.moe is None and cfg.d_ff_layers is not None:
        out.append(f"{ffn}, FFN width per layer: {', '.join(map(str, cfg.d_ff_layers))}")
    elif cfg.moe is None:
        out.append(f"{ffn}, d_ff {cfg.d_ff}")
    else:  # d_ff is the dense layers' width, and means nothing where every layer is a mixture
        out.append(f"{ffn}, d_ff {cfg.d_ff} on dense layers" if cfg.moe.dense_layers else f"{ffn} experts")
        out.extend(_moe(cfg, cfg.moe))
    out.extend(_gemma3n(cfg))
    biases = [n for n in ("q", "k", "v", "o", "mlp", "lm_head") if getattr(cfg, f"{n}_bias")]
    if cfg.o_bias_layers is not None:
        biases[biases.index("o")] = f"o (layers {list(cfg.o_bias_layers)})"
    out.append(f"biases: {', '.join(biases) if biases else 'none'}")
    out.append("embeddings: tied" if cfg.tie_embeddings else "embeddings: untied")
    if cfg.embed_scale is not None:
        rounding = "a float multiply" if cfg.embed_scale_unrounded else "rounded to weight dtype"
        out.append(f"embedding scale: {cfg.embed_scale:g} ({rounding})")
    if cfg.projects_embeddings:
        out.append(f"embedding width {cfg.embed_dim}, projected in and out of d_model {cfg.d_model}")
    if cfg.output_vocab is not None:
        out.append(f"LM head: the first {cfg.output_vocab} of {cfg.vocab_size} ids")
    if cfg.final_softcap is not None:
        out.append(f"final-logit soft-cap: {cfg.final_softcap:g}" + (", in fp32" if cfg.softcap_fp32 else ""))
    if cfg.head_transform is not None:
        bias = ", with a bias" if cfg.head_transform_bias else ""
        out.append(f"LM-head transform: dense{bias}, {ACTIVATION_NAMES[cfg.head_transform]}, norm")
    if cfg.head_divisor != 1.0:
        out.append(f"LM-head input divided by {cfg.head_divisor:g}")
    if cfg.logit_scale != 1.0:
        out.append(f"logit scale: {cfg.logit_scale:g}")
    if cfg.z_loss:
        out.append(f"z-loss: {cfg.z_loss:g}")
    return out
