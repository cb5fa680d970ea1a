"""The decoder-only model types transformers ships that lmconvert does not read yet, and what each
lacks, so that a refusal names the missing variant rather than only the type. From reading each
type's modeling code against the decoder's variants (transformers 5.24); a type leaves this table
when a family reads it (tests/test_config_table.py checks that the two never overlap)."""

from __future__ import annotations

WHAT: dict[str, str] = {
    "conv": "a short-convolution token mixer",
    "dsa-shared": "DeepSeek sparse attention whose 'shared' layers reuse the previous layer's top-k",
    "exotic": "a block topology of its own",
    "gated-attn": "a gated attention output",
    "geometry": "attention geometry that differs by layer",
    "hyper": "multi-stream residuals (hyper-connections, AltUp)",
    "kv-share": "keys and values shared across layers",
    "l2-qk": "a weightless L2 QK norm",
    "linear": "a linear-attention token mixer (gated delta-net, lightning attention)",
    "loop": "a looped layer stack",
    "mla-ext": "latent-attention extensions (gated, NoPE or windowed MLA)",
    "moe-ext": "a mixture-of-experts structure MoeConfig lacks",
    "norm-ext": "a residual or norm topology of its own",
    "ple": "per-layer embeddings",
    "quant": "a quantized-weight reader",
    "recurrent": "a recurrent token mixer (RG-LRU, RWKV, xLSTM)",
    "router": "a router kind of its own",
    "sinks": "attention sinks",
    "sparse": "a sparse-attention kind of its own",
    "temperature": "an attention temperature on its NoPE layers",
}

NEEDS: dict[str, tuple[str, ...]] = {
    "axk2": ("mla-ext", "gated-attn", "norm-ext"),
    "blt": ("exotic",), "cpmant": ("exotic",),
    "deepseek_v4": ("sparse", "hyper", "sinks", "moe-ext", "geometry", "quant"), "diffllama": ("exotic",),
    "doge": ("exotic", "moe-ext", "norm-ext"), "dory": ("loop", "norm-ext", "gated-attn", "l2-qk"),
    "dots3_note_text": ("mla-ext", "gated-attn", "geometry"),
    "glm_moe_dsa": ("dsa-shared",), "hrm_text": ("loop", "gated-attn"),
    "hy_v4": ("hyper", "mla-ext", "gated-attn", "sinks", "dsa-shared"),
    "inkling2_loop_text": ("conv", "exotic", "sinks", "gated-attn", "moe-ext", "loop"),
    "inkling2_text": ("conv", "exotic", "sinks", "gated-attn", "moe-ext"),
    "inkling_text": ("conv", "exotic", "geometry", "temperature", "moe-ext"),
    "longcat_flash": ("moe-ext", "router"),
    "minimax": ("linear",),
    "minimax_m3_vl_text": ("sparse", "moe-ext"),
    "qwen4_exp_text": ("linear", "sparse", "hyper", "ple"),
    "recurrent_gemma": ("recurrent",), "reformer": ("exotic",), "rwkv": ("recurrent",), "xlstm": ("recurrent",),
    "zaya": ("conv", "l2-qk", "moe-ext", "norm-ext"),
}


def missing(model_type: str) -> str | None:
    """What the decoder lacks for a model type transformers ships, or None if it is not known here."""
    needs = NEEDS.get(model_type)
    return None if needs is None else ", ".join(WHAT[n] for n in needs)
