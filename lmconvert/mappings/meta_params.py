"""Meta's `params.json` <-> the transformers llama config.json that computes the same model. Pure
functions (no file I/O); the tensor side of Meta's layout is mappings/meta.py.

Read from Meta's llama-models (`models/llama3/args.py`, `model.py`) and transformers'
`models/llama/convert_llama_weights_to_hf.py`.
"""

from __future__ import annotations

from typing import Any

from .meta import MetaLayoutError

# Meta's apply_scaling (llama-models models/llama3/model.py): use_scaled_rope means llama3 scaling
# with these constants; later llama-models versions read the factors from params.json.
SCALED_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def _value(params: dict[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    if key not in params or params[key] is None:
        if default is ...:
            raise MetaLayoutError(f"params.json lacks {key!r}")
        return default
    value = params[key]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, (int, float) if kind is float else kind):
        raise MetaLayoutError(f"params.json: {key}={value!r} should be of type {kind.__name__}")
    return float(value) if kind is float else value


def intermediate_size(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """Meta's FeedForward: int(2 * 4 * dim / 3), times ffn_dim_multiplier, rounded up to multiple_of
    (transformers' compute_intermediate_size gives the same)."""
    hidden = int(8 * dim / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def model_params(params: dict[str, Any]) -> dict[str, Any]:
    """Some releases nest the model's params under "model" (as transformers' script accepts)."""
    return params["model"] if isinstance(params.get("model"), dict) else params


def max_positions(params: dict[str, Any], vocab_size: int) -> int:
    """params.json's max_seq_len when present (Meta sets it at run time). Otherwise the context
    transformers' conversion script assigns each LLaMA generation, recognised by its params:
    3.1+ (use_scaled_rope) 131072, 3 (128k vocab) 8192, Code Llama (theta > 1e4) 16384,
    2 (norm_eps 1e-5) 4096, 1 2048."""
    if params.get("max_seq_len") is not None:
        return _value(params, "max_seq_len", int)
    theta = _value(params, "rope_theta", float, 10000.0)
    if params.get("use_scaled_rope"):
        return 131072
    if vocab_size >= 128000:
        return 8192
    if theta > 10000.0:
        return 16384
    return 4096 if _value(params, "norm_eps", float, 1e-5) >= 1e-5 else 2048


def hf_config(params: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The transformers llama config.json that computes what Meta's code computes with `params`."""
    dim, heads = _value(params, "dim", int), _value(params, "n_heads", int)
    multiple_of = _value(params, "multiple_of", int, 256)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": _value(params, "rope_theta", float, 10000.0)}
    if _value(params, "use_scaled_rope", bool, False):
        rope.update(rope_type="llama3", **SCALED_ROPE)
        rope["factor"] = _value(params, "rope_scaling_factor", float, SCALED_ROPE["factor"])
        rope["high_freq_factor"] = _value(params, "rope_high_freq_factor", float, SCALED_ROPE["high_freq_factor"])
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": dim, "num_attention_heads": heads, "head_dim": dim // heads,
        "num_key_value_heads": _value(params, "n_kv_heads", int, heads),
        "num_hidden_layers": _value(params, "n_layers", int),
        "intermediate_size": intermediate_size(dim, multiple_of, _value(params, "ffn_dim_multiplier", float, None)),
        "vocab_size": vocab_size, "rms_norm_eps": _value(params, "norm_eps", float, 1e-5),
        "rope_parameters": rope, "max_position_embeddings": max_positions(params, vocab_size),
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
    }


def ffn_params(dim: int, d_ff: int) -> tuple[int, float | None]:
    """A (multiple_of, ffn_dim_multiplier) for which Meta's formula gives d_ff: a plain power-of-two
    multiple_of when one does, else the shortest multiplier with the largest multiple_of dividing
    d_ff (LLaMA 3 8B: 14336 -> 1024, 1.3)."""
    powers = [2**k for k in range(10, -1, -1)]
    for m in powers[2:]:  # 256 first: LLaMA 1/2's value
        if intermediate_size(dim, m, None) == d_ff:
            return m, None
    base = int(8 * dim / 3)
    for m in (p for p in powers if d_ff % p == 0):
        for digits in range(1, 7):
            multiplier = round(d_ff / base, digits)
            if intermediate_size(dim, m, multiplier) == d_ff:
                return m, multiplier
    return 1, (d_ff + 0.5) / base  # int() of this times base is d_ff exactly


def params_for(config: dict[str, Any]) -> dict[str, Any]:
    """params.json for an HF llama config; MetaLayoutError names what Meta's format cannot hold."""
    dim, heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise MetaLayoutError("Meta's format has no biases, and this model has attention or MLP biases")
    if config.get("hidden_act") != "silu":
        raise MetaLayoutError(f"Meta's format uses SiLU, and this model uses {config.get('hidden_act')!r}")
    if dim % heads or config.get("head_dim", dim // heads) != dim // heads:
        raise MetaLayoutError(f"Meta's format needs head_dim = dim / n_heads = {dim}/{heads}, and this model has "
                          f"head_dim={config.get('head_dim')}")
    rope = config["rope_parameters"]
    kind = rope.get("rope_type", "default")
    fixed = {k: rope.get(k) for k in ("low_freq_factor", "original_max_position_embeddings")}
    if kind not in ("default", "llama3") or kind == "llama3" and any(
            fixed[k] != SCALED_ROPE[k] for k in fixed):
        raise MetaLayoutError(f"Meta's format has RoPE scaling only as use_scaled_rope (llama3 with low_freq_factor 1 "
                          f"and original_max_position_embeddings 8192), and this model uses {rope}")
    multiple_of, multiplier = ffn_params(dim, config["intermediate_size"])
    params: dict[str, Any] = {
        "dim": dim, "n_layers": config["num_hidden_layers"], "n_heads": heads,
        "n_kv_heads": config["num_key_value_heads"], "vocab_size": config["vocab_size"], "multiple_of": multiple_of,
        "ffn_dim_multiplier": multiplier, "norm_eps": config["rms_norm_eps"], "rope_theta": rope["rope_theta"],
    }
    if multiplier is None:
        del params["ffn_dim_multiplier"]
    if kind == "llama3":
        params["use_scaled_rope"] = True
        for key, name in (("factor", "rope_scaling_factor"), ("high_freq_factor", "rope_high_freq_factor")):
            if rope[key] != SCALED_ROPE[key]:
                params[name] = rope[key]
    return params
