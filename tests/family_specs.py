"""The tiny perturbed model of each mission family that the family, verify and GPU tests share:
its transformers config, what `inspect` must say of it, and the old config.json style it also
comes in. Every sequence is several windows long, and the soft-caps are small enough to bite."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hf_models import token_batch

WINDOW = 4
SEQ = 28  # seven windows long
IDS = token_batch(seq=SEQ)
FP32_TOL = 1e-5
FAITHFULNESS = 1.25
ATTN_CAP, FINAL_CAP = 2.0, 3.0


@dataclass(frozen=True)
class Spec:
    model_type: str
    kwargs: dict[str, Any]
    # transformers 4 keys that replace rope_parameters in a hand-written config.json, or the llama-era names
    # a GPT-2-era config class also reads (its attribute_map)
    old_style: dict[str, Any]
    card: tuple[str, ...]  # what `lmconvert inspect` must say
    old_drop: tuple[str, ...] = ()  # further keys a transformers 4 file lacks (derived by transformers)
    layer_types: tuple[list[str], tuple[str, ...]] | None = None  # a non-default layer_types, the kinds it means
    not_on_card: tuple[str, ...] = ()  # what it must not say
    sdpa: bool = True  # transformers runs it with SDPA (GPT-Neo and XGLM have only their own attention)
    rope: bool = True  # config.json states rope_parameters (the families with RoPE)
    bf16_exact: bool = True  # our bf16 logits equal transformers' bf16 logits bit for bit on CPU (False: say why)
    family: str = ""  # the lmconvert family, where the entry is a second model of one (stablelm_qk); "": its name


S, F = "sliding_attention", "full_attention"
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
YARN = {"factor": 4.0, "original_max_position_embeddings": 32}
LONGROPE = {"short_factor": [1.0, 1.25, 1.5, 2.0], "long_factor": [2.0, 3.0, 5.0, 8.0]}  # 4 = 16 * 0.5 / 2

SPECS: dict[str, Spec] = {
    "llama": Spec(
        "llama", dict(attention_bias=True, mlp_bias=True, rope_parameters={**LLAMA3, "rope_theta": 500000.0}),
        old_style={"rope_theta": 500000.0, "rope_scaling": LLAMA3},
        card=("pre-norm", "SwiGLU", "biases: q, k, v, o, mlp", "llama3 x8", "weight after cast")),
    "mistral": Spec(
        "mistral", dict(sliding_window=WINDOW, head_dim=24,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        old_style={"rope_theta": 1e6},
        card=("sliding window 4 on local layers; pattern LL", "head_dim 24", "biases: none"),
        layer_types=([F, S], ("global", "local"))),  # AutoConfig then loads it as Ministral
    "gemma": Spec(
        "gemma", dict(head_dim=16, attention_bias=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 20000.0}),
        old_style={"rope_theta": 20000.0, "hidden_act": "gelu"},  # the legacy spelling of tanh GELU
        card=("pre-norm", "scale (w + 1)", "weight in fp32", "GeGLU (tanh)", "embedding scale: 8",
              "biases: q, k, v, o", "embeddings: tied"),
        not_on_card=("soft-cap", "sliding")),
    "gemma2": Spec(
        "gemma2", dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24, attention_bias=True,
                       attn_logit_softcapping=ATTN_CAP, final_logit_softcapping=FINAL_CAP),
        old_style={"rope_theta": 10000.0}, old_drop=("layer_types",),
        card=("sandwich", "scale (w + 1)", "weight in fp32", "attention soft-cap: 2", "final-logit soft-cap: 3",
              "sliding window 4 on local layers; pattern LG", "GeGLU (tanh)", "embedding scale: 8",
              "score scale: 0.204124"),
        layer_types=([F, S], ("global", "local"))),
    "gemma3": Spec(
        "gemma3_text", dict(num_hidden_layers=3, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24,
                            sliding_window_pattern=2, attn_logit_softcapping=ATTN_CAP,  # ignored by transformers
                            final_logit_softcapping=FINAL_CAP,
                            rope_parameters={S: {"rope_type": "default", "rope_theta": 20000.0},
                                             F: {"rope_type": "linear", "factor": 8.0, "rope_theta": 500000.0}}),
        old_style={"rope_theta": 500000.0, "rope_local_base_freq": 20000.0,
                   "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window_pattern": 2},
        old_drop=("layer_types", "_sliding_window_pattern"),
        card=("sandwich", "QK norm: per head", "sliding window 4 on local layers; pattern LGL",
              "local layers: RoPE half, theta=20000", "linear x8", "final-logit soft-cap: 3"),
        not_on_card=("attention soft-cap",),
        layer_types=([F, F, S], ("global", "global", "local"))),
    "olmo2": Spec(
        "olmo2", dict(attention_bias=True, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
        old_style={"rope_theta": 500000.0},
        card=("norm on sublayer output only", "QK norm: over the whole projection", "eps=1e-05", "weight in fp32",
              "biases: q, k, v, o")),
    "qwen2": Spec(
        "qwen2", dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                      tie_word_embeddings=True, rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, **YARN}),
        old_style={"rope_theta": 1e6, "rope_scaling": {"type": "yarn", **YARN}}, old_drop=("layer_types",),
        card=("biases: q, k, v", "sliding window 4 on local layers; pattern GLL", "yarn x4", "embeddings: tied"),
        layer_types=([S, F, S], ("local", "global", "local"))),
    "qwen3": Spec(
        "qwen3", dict(head_dim=16, attention_bias=True, use_sliding_window=True, sliding_window=WINDOW,
                      max_window_layers=1, rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}),
        old_style={"rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        old_drop=("layer_types",),
        card=("QK norm: per head", "biases: q, k, v, o", "sliding window 4 on local layers; pattern GL", "linear x2"),
        layer_types=([S, F], ("local", "global"))),
    "smollm3": Spec(
        "smollm3", dict(num_hidden_layers=4, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=WINDOW,
                        attention_bias=True, mlp_bias=True, bos_token_id=2, eos_token_id=1,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        old_style={"rope_theta": 1e6}, old_drop=("layer_types", "no_rope_layers"),
        card=("positions: none (layers [1, 3])", "positions: RoPE half, theta=1e+06 (layers [0, 2])",
              "sliding window 4 on local layers; pattern GLGL", "biases: q, k, v, o, mlp", "embeddings: tied"),
        layer_types=([S, F, F, F], ("local", "global", "global", "global"))),
    "starcoder2": Spec(
        "starcoder2", dict(sliding_window=WINDOW, bos_token_id=2, eos_token_id=1,
                           rope_parameters={"rope_type": "default", "rope_theta": 1e5}),
        old_style={"rope_theta": 1e5},
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "FFN: GeLU (tanh), d_ff 96",
              "biases: q, k, v, o, mlp", "sliding window 4 on local layers; pattern LL", "embeddings: tied")),
    "nemotron": Spec(
        "nemotron", dict(attention_bias=True, mlp_bias=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
        old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.5},
        card=("LayerNorm, eps=1e-05, scale (w + 1), bias, weight in fp32", "pre-norm", "FFN: squared ReLU, d_ff 96",
              "RoPE half, theta=20000, 0.5 of head_dim", "biases: q, k, v, o, mlp", "embeddings: untied")),
    "stablelm": Spec(
        "stablelm", dict(use_parallel_residual=True, use_qkv_bias=True, eos_token_id=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
        old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.25},
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, shared norm", "SwiGLU",
              "RoPE half, theta=20000, 0.25 of head_dim", "biases: q, k, v", "embeddings: untied")),
    "stablelm_qk": Spec(  # qk_layernorm: one bias-free LayerNorm per head, stored one tensor per head
        "stablelm", dict(qk_layernorm=True, use_qkv_bias=True, eos_token_id=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
        old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.25},
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "QK norm: per head, a weight for each head, "
              "no bias", "RoPE half, theta=20000, 0.25 of head_dim", "biases: q, k, v", "embeddings: untied"),
        not_on_card=("parallel",), family="stablelm"),
    "granite": Spec(
        "granite", dict(embedding_multiplier=12.0, attention_multiplier=0.0625, residual_multiplier=0.22,
                        logits_scaling=8.0, attention_bias=True, mlp_bias=True,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
        old_style={"rope_theta": 1e4},
        card=("residual scale: 0.22", "score scale: 0.0625", "embedding scale: 12", "logit scale: 0.125",
              "pre-norm", "SwiGLU", "biases: q, k, v, o, mlp")),
    "olmo": Spec(
        "olmo", dict(attention_bias=True, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
        old_style={"rope_theta": 5e5},
        card=("LayerNorm, eps=1e-05, no scale", "pre-norm", "SwiGLU", "biases: q, k, v, o", "embeddings: untied")),
    "phi3": Spec(  # longrope in its short regime (SEQ < original 64); the long one: test_family_variants
        "phi3", dict(sliding_window=WINDOW, original_max_position_embeddings=64, bos_token_id=2, eos_token_id=1,
                     rope_parameters={**LONGROPE, "rope_type": "longrope", "rope_theta": 2e4,
                                      "partial_rotary_factor": 0.5}),
        old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.5,
                   "rope_scaling": {**LONGROPE, "type": "su", "original_max_position_embeddings": 64}},
        card=("pre-norm", "SwiGLU", "RoPE half, theta=20000, 0.5 of head_dim, longrope x2 (short factors up to 64 "
              "positions, long beyond; cos/sin x1.08012)", "sliding window 4 on local layers; pattern LL",
              "biases: none", "weight after cast", "embeddings: untied")),
    "cohere": Spec(
        "cohere", dict(use_qk_norm=True, attention_bias=True, logit_scale=0.25, bos_token_id=2, eos_token_id=1,
                       rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
        old_style={"rope_theta": 2e4},
        card=("LayerNorm, eps=1e-05, mean/variance written out, weight in fp32", "parallel attn+MLP, shared norm",
              "QK norm: per head, a weight for each head", "RoPE interleaved, theta=20000, q/k rotated in fp32",
              "logit scale: 0.25", "biases: q, k, v, o", "embeddings: tied"),
        not_on_card=("bias, weight", "sliding")),
    "cohere2": Spec(
        "cohere2", dict(num_hidden_layers=4, sliding_window=WINDOW, attention_bias=True, logit_scale=0.25,
                        bos_token_id=2, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 5e4}),
        old_style={"rope_theta": 5e4, "sliding_window_pattern": 4}, old_drop=("layer_types",),
        card=("LayerNorm, eps=1e-05, mean/variance written out, weight in fp32", "parallel attn+MLP, shared norm",
              "sliding window 4 on local layers; pattern LLLG", "positions: none (layers [3])",
              "positions: RoPE interleaved, theta=50000, q/k rotated in fp32 (layers [0, 1, 2])",
              "logit scale: 0.25", "embeddings: tied"),
        not_on_card=("QK norm",),
        layer_types=([F, S, S, F], ("global", "local", "local", "global"))),
    "gpt2": Spec(
        "gpt2", dict(num_hidden_layers=3, n_inner=96, scale_attn_by_inverse_layer_idx=True),
        old_style={"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "max_position_embeddings": 128},
        old_drop=("n_embd", "n_layer", "n_head", "n_positions"), rope=False, bf16_exact=True,
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "FFN: GeLU (tanh, written out), d_ff 96",
              "absolute positions: learned", "positions: none (all layers)", "score scale divided by layer index + 1",
              "biases: q, k, v, o, mlp", "embeddings: tied"),
        not_on_card=("index offset", "q.k in fp32")),
    "gpt_neo": Spec(
        "gpt_neo", dict(num_hidden_layers=3, attention_types=[[["global", "local"], 1], [["local"], 1]],
                        window_size=WINDOW, intermediate_size=96),
        old_style={"num_hidden_layers": 3, "num_attention_heads": 4}, old_drop=("num_layers", "num_heads"),
        sdpa=False, rope=False, bf16_exact=True,
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "sliding window 4 on local layers; pattern GLL",
              "score scale: 1", "q.k in fp32", "FFN: GeLU (tanh, written out), d_ff 96", "absolute positions: learned",
              "biases: o, mlp", "embeddings: tied"),
        not_on_card=("score scale applied to q",)),
    "opt": Spec(  # the opt-350m layout: post-norm, 48-wide embeddings projected in and out; head_dim 20, whose
        # scale is no power of two, so scaling q rather than q.k bites in bf16
        "opt", dict(hidden_size=80, num_hidden_layers=3, ffn_dim=96, do_layer_norm_before=False,
                    word_embed_proj_dim=48),
        old_style={}, rope=False, bf16_exact=True,
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "post-norm", "score scale applied to q before q.k",
              "absolute positions: learned, index offset 2", "embedding width 48, projected in and out of d_model 80",
              "FFN: ReLU, d_ff 96", "biases: q, k, v, o, mlp", "embeddings: tied")),
    "xglm": Spec(  # sqrt(48) is not a bf16 number: the unrounded embedding scale bites
        "xglm", dict(hidden_size=48, num_hidden_layers=3, ffn_dim=96),
        old_style={"hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4},
        old_drop=("d_model", "num_layers", "attention_heads"), sdpa=False, rope=False, bf16_exact=True,
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm",
              "absolute positions: sinusoidal (fairseq: sin half, cos half), index offset 2",
              "embedding scale: 6.9282 (a float multiply)",
              "score scale applied to q before q.k", "FFN: GeLU (erf), d_ff 96", "biases: q, k, v, o, mlp")),
    # head_dim 44 with 30 rotary dims: int(44 * 30/44) would be 29 (refused as odd)
    "gptj": Spec(  # q.k in fp32: our layers run eager under either backend, so compared with transformers' eager
        "gptj", dict(hidden_size=176, rotary_dim=30, n_inner=80, eos_token_id=1), sdpa=False, rope=False,
        old_style={"hidden_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "max_position_embeddings": 128},
        old_drop=("n_embd", "n_layer", "n_head", "n_positions"),
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, shared norm",
              "parallel sum: attn+mlp+h", "RoPE interleaved, theta=10000, 30 rotary dims", "q.k in fp32",
              "FFN: GeLU (tanh, written out), d_ff 80", "biases: mlp, lm_head", "embeddings: untied")),
    "phi": Spec(
        "phi", dict(qk_layernorm=True, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 2e4,
                                                                        "partial_rotary_factor": 0.5}),
        old_style={"rope_theta": 2e4, "partial_rotary_factor": 0.5},
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, shared norm",
              "parallel sum: attn+mlp+h", "QK norm: per head", "RoPE half, theta=20000, 0.5 of head_dim",
              "FFN: GeLU (tanh, written out), d_ff 96", "biases: q, k, v, o, mlp, lm_head")),
    "gpt_neox": Spec(
        "gpt_neox", dict(eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 2e4,
                                                          "partial_rotary_factor": 0.5}),
        old_style={"rotary_emb_base": 2e4, "rotary_pct": 0.5},
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, separate norms",
              "parallel sum: mlp+attn+h", "RoPE half, theta=20000, 0.5 of head_dim", "FFN: GeLU (erf), d_ff 96",
              "biases: q, k, v, o, mlp", "attention: MHA, 4 heads")),
    "bloom": Spec(  # six heads: ALiBi's interleaved extra slopes
        "bloom", dict(hidden_size=72, num_attention_heads=6, apply_residual_connection_post_layernorm=True,
                      eos_token_id=1), rope=False,
        old_style={"num_hidden_layers": 2, "num_attention_heads": 6}, old_drop=("n_layer", "n_head"),
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "pre-norm", "residual taken after the norm",
              "embedding norm", "positions: ALiBi (BLOOM's: slope x k, inside the score matmul) (all layers)",
              "FFN: GeLU (tanh, BLOOM's constants), d_ff 288", "biases: q, k, v, o, mlp", "embeddings: tied"),
        not_on_card=("RoPE",)),
    "mpt": Spec(  # six heads: MPT's slopes over eight, odd-numbered first
        "mpt", dict(hidden_size=72, num_attention_heads=6, attn_config={"softmax_scale": 0.2, "clip_qkv": 1.5},
                    eos_token_id=1), rope=False,
        old_style={"hidden_size": 72, "num_hidden_layers": 2, "num_attention_heads": 6},
        old_drop=("d_model", "n_layers", "n_heads"),
        card=("LayerNorm, eps=1e-05, weight in fp32", "pre-norm", "score scale: 0.2", "q, k, v clamped to +-1.5",
              "positions: ALiBi (MPT's slopes, slope x (k - last k), in fp32) (all layers)",
              "FFN: GeLU (erf), d_ff 288", "biases: none", "embeddings: tied"),
        not_on_card=("RoPE", "embedding norm")),
    "falcon": Spec(  # Falcon-40B/180B's layout; the 7B, RW and sequential ones are in test_parallel_alibi.py
        "falcon", dict(new_decoder_architecture=True, num_kv_heads=2, eos_token_id=1,
                       rope_parameters={"rope_type": "default", "rope_theta": 2e4}),
        old_style={"rope_theta": 2e4},
        card=("LayerNorm, eps=1e-05, bias, weight in fp32", "parallel attn+MLP, separate norms",
              "parallel sum: mlp+attn+h", "GQA (2 q heads per kv head)", "RoPE half, theta=20000",
              "FFN: GeLU (erf), d_ff 256", "biases: none", "embeddings: tied")),
    "minicpm3": Spec(  # longrope in its short regime (the long one: test_minicpm3.py); scaled embeddings,
        # residuals and LM-head input
        "minicpm3", dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12,
                         qk_rope_head_dim=8, v_head_dim=10, scale_emb=12, scale_depth=1.4, dim_model_base=24,
                         attention_bias=True, mlp_bias=True, eos_token_id=1,
                         rope_parameters={**LONGROPE, "rope_type": "longrope", "rope_theta": 2e4,
                                          "original_max_position_embeddings": 64}),
        old_style={"rope_theta": 2e4, "rope_scaling": {**LONGROPE, "type": "longrope",
                                                       "original_max_position_embeddings": 64}},
        old_drop=("qk_head_dim",),
        card=("attention: latent (MLA), 4 heads, q LoRA rank 24, kv_lora_rank 16", "q/k 12 + rotary 8, v 10",
              "biases: q_a, kv_a, o", "RoPE half, theta=20000, longrope x2",
              # c_kv 16 + k_rot 8 against MHA's 4 heads x (20 + 10)
              "latent KV cache: 24 entries per token and layer (c_kv 16 + k_rot 8); MHA with these heads: 120; "
              "20.0% of it", "KV cache          192 bytes per token (float32)",
              "embedding scale: 12 (rounded to weight dtype)", "residual scale: 0.989949 (each sublayer's output)",
              "LM-head input divided by 2.66667", "biases: mlp", "embeddings: tied"),
        not_on_card=("mixture of experts", "logit scale")),
    # mixtures of experts: more experts than chosen per token, each chosen somewhere in IDS
    # (tests/test_moe.py checks that), top-3 where the family allows it so the order of the adds shows
    "mixtral": Spec(  # bf16: bit-exact with transformers' eager experts (test_moe.py), not its default grouped_mm,
        # which sums each token's top-k in fp32
        "mixtral", bf16_exact=False,
        kwargs=dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        old_style={"rope_theta": 1e6},
        card=("mixture of experts: 4 experts, top-2, d_expert 96 (all layers)",
              "router: softmax then top-k, renormalised, weights in fp32", "sliding window 4 on local layers",
              "active per token")),
    "qwen2_moe": Spec(  # bf16: bit-exact with transformers' eager experts (test_moe.py), not its default grouped_mm,
        # which sums each token's top-k in fp32
        "qwen2_moe", bf16_exact=False,
        kwargs=dict(num_hidden_layers=3, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=32,
                          shared_expert_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[1],
                          use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        old_style={"rope_theta": 1e6}, old_drop=("layer_types",),
        card=("mixture of experts: 6 experts, top-3, d_expert 32 (layers [0, 2])", "FFN: SwiGLU, d_ff 96",
              "renormalised, weights in activation dtype", "one shared expert, sigmoid-gated, width 48",
              "biases: q, k, v", "sliding window 4 on local layers; pattern LGG"),
        layer_types=([F, S, S], ("global", "local", "local"))),
    "qwen3_moe": Spec(  # bf16: bit-exact with transformers' eager experts (test_moe.py), not its default grouped_mm,
        # which sums each token's top-k in fp32
        "qwen3_moe", bf16_exact=False,
        kwargs=dict(num_hidden_layers=4, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=32,
                          decoder_sparse_step=2, head_dim=16, attention_bias=True, use_sliding_window=True,
                          sliding_window=WINDOW, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        old_style={"rope_theta": 1e6},
        card=("mixture of experts: 6 experts, top-3, d_expert 32 (layers [1, 3])", "not renormalised",
              "QK norm: per head", "biases: q, k, v, o", "sliding window 4 on local layers; pattern LLLL")),
    "olmoe": Spec(  # bf16: bit-exact with transformers' eager experts (test_moe.py), not its default grouped_mm,
        # which sums each token's top-k in fp32
        "olmoe", bf16_exact=False,
        kwargs=dict(num_experts=6, num_experts_per_tok=3, norm_topk_prob=True, attention_bias=True, eos_token_id=1,
                      rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
        old_style={"rope_theta": 5e5},
        card=("mixture of experts: 6 experts, top-3, d_expert 96 (all layers)", "QK norm: over the whole projection",
              "renormalised, weights in activation dtype", "eps=1e-05", "biases: q, k, v, o")),
}
NAMES = list(SPECS)


def family_of(name: str) -> str:
    """The lmconvert family of a SPECS entry."""
    return SPECS[name].family or name
TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, head_dim=16, sliding_window=WINDOW,
            query_pre_attn_scalar=24, sliding_window_pattern=2, pad_token_id=0,
            final_logit_softcapping=FINAL_CAP)  # Gemma3ForConditionalGeneration never applies it
VISION = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
              num_attention_heads=2, image_size=28, patch_size=14)
