"""The kimi_linear test model (see tests/specs/__init__.py): Kimi Linear's 3 KDA : 1 NoPE MLA stack,
the first layer dense and the others mixtures of experts with DeepSeek-V3's grouped router and two
shared experts; the original files' config style (linear_attn_config, first_k_dense_replace) as the
older one."""

from __future__ import annotations

from specs import F, GgufNaming, Spec

L = "linear_attention"
KDA = dict(linear_num_heads=4, linear_head_dim=16, linear_conv_kernel_dim=4)
MLA = dict(num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10)
MOE = dict(mlp_layer_types=["dense", "sparse", "sparse", "sparse"], num_experts=8, num_experts_per_token=3,
           moe_intermediate_size=32, num_shared_experts=2, num_expert_group=4, topk_group=2,
           routed_scaling_factor=1.5)
SPEC = Spec(
    "kimi_linear",
    kwargs=dict(KDA, **MLA, **MOE, num_hidden_layers=4, layer_types=[L, L, L, F], eos_token_id=1,
                bos_token_id=2),
    old_style={"linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "head_dim": 16,
                                      "num_heads": 4, "short_conv_kernel_size": 4},
               "first_k_dense_replace": 1},
    old_drop=("layer_types", "mlp_layer_types", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim"),
    card=("mixer: Kimi delta attention, 4 heads x 16, conv 4 on q|k|v",
          "attention: latent (MLA), 4 heads, plain q projection, kv_lora_rank 16",
          "MLA head dims: q/k 12 + shared unrotated (no positions) 8, v 10",
          "layer pattern: MF MF MF AF", "positions: none (all layers)",
          "mixture of experts: 8 experts, top-3, d_expert 32 (layers [1, 2, 3])"),
    rope=False, selection_bias_buffer=True, own_spelling={"max_position_embeddings": "model_max_length"},
    not_a_key=("rope_parameters",),
    tp_refusal="the kimi_delta mixer layers have no tensor-parallel plan",
    # llama.cpp's kimi-linear normalises MLA's kv_a and KDA's q and k with rms_norm_eps, transformers with 1e-6
    gguf=dict(rms_norm_eps=1e-6),
    # KimiLinearModel.modify_tensors splits kv_b_proj itself, as attn_k_b and attn_v_b (absorbed MLA); the dense
    # MLPs under the Hub's name, `mlp.` (transformers 5 writes them under block_sparse_moe, which gguf does not map)
    gguf_naming=GgufNaming(converter_names={("self_attn.kv_b_proj.weight", "kv_b"): "attn_k_b.weight"},
                           aliases=tuple((f"block_sparse_moe.{n}_proj", f"mlp.{n}_proj")
                                         for n in ("gate", "up", "down"))),
    config_variants=(
        dict(KDA, **MLA, **MOE, num_hidden_layers=4, layer_types=[L, F, L, F]),
        dict(MLA, num_hidden_layers=2, q_lora_rank=24, attention_bias=True, mlp_layer_types=["dense", "dense"],
             layer_types=[F, F], rms_norm_eps=1e-6),
        dict(KDA, **MLA, num_hidden_layers=3, layer_types=[L, L, L], mlp_layer_types=["dense"] * 3,
             linear_conv_kernel_dim=3),
    ),
)
