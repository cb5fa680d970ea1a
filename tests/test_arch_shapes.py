"""`arch.shapes.parameter_shapes` restates the Decoder's tensor inventory without torch; these tests
hold it to `Decoder(cfg).state_dict()` built on the meta device (names, order and shapes) over
every variant axis of ArchConfig, and check that the module really imports no torch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from arch_helpers import tiny
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmconvert.arch import ArchConfig, Decoder, MoeConfig, NormConfig, RopeConfig, attention_kinds
from lmconvert.arch import config as config_module
from lmconvert.arch import shapes as shapes_module
from lmconvert.arch.augment_config import AltUpConfig, PleConfig
from lmconvert.arch.shapes import parameter_shapes

ROOT = Path(__file__).resolve().parent.parent


def decoder_shapes(cfg: ArchConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = Decoder(cfg)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def assert_same_inventory(cfg: ArchConfig) -> None:
    expected, got = decoder_shapes(cfg), parameter_shapes(cfg)
    assert list(got.items()) == list(expected.items())  # same names, same order, same shapes


# ---------------------------------------------------------------------------------- explicit cases
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{f"placement_{p}": dict(norm_placement=p, final_norm=p != "post") for p in config_module.NORM_PLACEMENTS},
    "no_final_norm": dict(final_norm=False),
    "layer_norm_with_bias": dict(norm=NormConfig(kind="layer", bias=True)),
    "layer_norm_bias_only": dict(norm=NormConfig(kind="layer", weight=False, bias=True)),
    "norm_without_parameters": dict(norm=NormConfig(kind="layer", weight=False), norm_placement="sandwich"),
    "gemma_offset_norm": dict(norm=NormConfig(weight_offset=1.0, dtype_order="scale_then_cast")),
    "qk_norm_head": dict(qk_norm="head", n_kv_heads=2),
    "qk_norm_projection": dict(qk_norm="projection", n_kv_heads=2),
    "qk_norm_weight_per_head": dict(qk_norm="head", qk_norm_weight="per_head", n_kv_heads=2,
                                    norm=NormConfig(kind="layer", written_out=True, dtype_order="scale_then_cast")),
    "qk_norm_projection_layer_bias": dict(qk_norm="projection", n_kv_heads=1,
                                          norm=NormConfig(kind="layer", bias=True)),
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "head_dim_independent_of_d_model": dict(d_model=40, n_heads=3, head_dim=16, n_kv_heads=1),
    "all_biases": dict(q_bias=True, k_bias=True, v_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=True),
    "qkv_bias_only": dict(q_bias=True, k_bias=True, v_bias=True),
    "o_bias_last_layer_only": dict(o_bias=True, o_bias_layers=(1,)),  # GPT-NeoX-Japanese
    "plain_mlp": dict(gated=False, activation="gelu"),
    "plain_mlp_bias": dict(gated=False, mlp_bias=True),
    "gated_mlp_bias": dict(gated=True, mlp_bias=True),
    "tied": dict(tie_embeddings=True),
    "untied_head_bias": dict(lm_head_bias=True),
    "tied_head_bias": dict(tie_embeddings=True, lm_head_bias=True),  # CTRL
    "head_transform": dict(head_transform="gelu", head_transform_bias=True, norm=NormConfig(kind="layer", bias=True)),
    "no_first_attn_norm": dict(unnormed_attn_layers=(0,), embed_norm=True),  # ModernBERT decoder
    "sinusoidal": dict(absolute_positions="sinusoidal", layer_positions=("none", "none")),
    "learned": dict(absolute_positions="learned", layer_positions=("none", "none")),
    "learned_with_offset": dict(absolute_positions="learned", position_offset=2, max_positions=50),
    **{f"layers_{p}": dict(layer_positions=(p, p)) for p in config_module.LAYER_POSITIONS},
    "relative_in_one_layer": dict(layer_positions=("relative", "rope"), relative_buckets=8,
                                  relative_max_distance=20),
    "relative_many_layers": dict(n_layers=3, layer_positions=("relative", "alibi", "relative")),
    "local_global_two_ropes": dict(layer_kinds=("local", "global"), sliding_window=8,
                                   rope_local=RopeConfig(theta=1e4, fraction=0.5)),
    "partial_rope_interleaved": dict(rope=RopeConfig(fraction=0.5, layout="interleaved")),
    # Gemma 4: the global layers' own head_dim and KV heads, K = V there (no v), the last two layers without k, v and
    # k_norm and with double-wide MLPs, a scalar per block
    "gemma4_like": dict(n_layers=4, layer_kinds=("local", "global", "local", "global"), sliding_window=4,
                        qk_norm="head", v_norm=True, global_head_dim=24, global_kv_heads=1, k_eq_v="global",
                        kv_shared_layers=2, shared_ffn_factor=2, layer_scalar=True, attn_scale=1.0,
                        rope=RopeConfig(scaling="proportional", fraction=0.25)),
    # Gemma 3n: AltUp's streams in and out and each block's altup, LAuReL, per-layer embeddings (tables and gates),
    # an FFN width per layer, the last two layers without k, v and k_norm; Gemma 4's per-layer embeddings alone
    "gemma3n_like": dict(n_layers=4, layer_kinds=("local", "global", "local", "global"), sliding_window=4,
                         norm_placement="sandwich", qk_norm="head", v_norm=True, kv_shared_layers=2, attn_scale=1.0,
                         altup=AltUpConfig(n_inputs=3, active=1), ple=PleConfig(vocab_size=50, dim=6), laurel_rank=5,
                         d_ff_layers=(32, 40, 24, 32), gate_sparsity=(0.9, 0.0, 0.5, 0.0)),
    "gemma4_ple": dict(norm_placement="sandwich", layer_scalar=True, ple=PleConfig(vocab_size=64, dim=4,
                                                                                   scales="python")),
    # Zamba2: two shared blocks called by layers 1-3 (0, 1, 0), each call's adapters and linear, MLP biases
    "zamba2_like": dict(n_layers=4, n_kv_heads=4, head_dim=16, d_model=32, mixer="mamba2", mlp_bias=True,
                        mixer_settings=dict(n_heads=4, head_dim=16, d_state=8, chunk_size=8),
                        layer_mixers=("mixer",) * 4, layer_ffns=("none",) * 4,
                        shared_blocks=dict(n_blocks=2, layers=(1, 2, 3), adapter_rank=3, attn_adapters=True)),
    "one_layer_one_head": dict(n_layers=1, n_heads=1, d_model=8, d_ff=3, vocab_size=5),
    "gpt2_like": dict(norm=NormConfig(kind="layer", eps=1e-5, bias=True), activation="gelu_tanh", gated=False,
                      q_bias=True, k_bias=True, v_bias=True, o_bias=True, mlp_bias=True,
                      absolute_positions="learned", layer_positions=("none", "none"), tie_embeddings=True),
    "opt_like": dict(norm=NormConfig(kind="layer", bias=True), gated=False, activation="relu",
                     absolute_positions="learned", position_offset=2, layer_positions=("none", "none"),
                     q_bias=True, k_bias=True, v_bias=True, o_bias=True, mlp_bias=True),
    "bloom_like": dict(norm=NormConfig(kind="layer", bias=True), embed_norm=True, residual_after_norm=True,
                       layer_positions=("alibi", "alibi"), alibi="bloom", gated=False, activation="gelu_bloom"),
    "falcon_like": dict(norm=NormConfig(kind="layer", bias=True), norm_placement="parallel_separate",
                        parallel_sum="mlp+attn+h", q_bias=True, k_bias=True, v_bias=True, o_bias=True,
                        mlp_bias=True, bias_separate=True, gated=False),
    # Gemma 4's MoE block: the dense MLP, then the router with its scales, the experts and three norms
    "moe_beside_dense": dict(
        norm_placement="sandwich", moe=dict(n_experts=3, top_k=2, d_expert=5, weights_fp32=True, router_norm=True,
                                            expert_scale=True, beside_dense=True, output_norm=True,
                                            dense_layers=(1,))),
    "rich": dict(
        vocab_size=100, d_model=48, n_layers=3, n_heads=6, d_ff=37, n_kv_heads=2, head_dim=12, max_positions=96,
        norm=NormConfig(kind="layer", eps=1e-5, weight=True, bias=True, dtype_order="scale_then_cast"),
        norm_placement="sandwich", final_norm=True, qk_norm="head",
        q_bias=True, k_bias=True, v_bias=False, o_bias=True, mlp_bias=True, lm_head_bias=True,
        activation="gelu_tanh", gated=False, absolute_positions="learned", position_offset=2,
        layer_positions=("rope", "alibi", "relative"), relative_buckets=16, relative_max_distance=64,
        layer_kinds=("local", "global", "local"), sliding_window=7, tie_embeddings=False),
}


@pytest.mark.parametrize("overrides", list(CASES.values()), ids=list(CASES))
def test_matches_decoder(overrides: dict[str, Any]) -> None:
    assert_same_inventory(tiny(**overrides))


# ---------------------------------------------------------------------------------- every combination
@st.composite
def arch_configs(draw: st.DrawFn) -> ArchConfig:
    """Valid ArchConfigs over every field that can change a name or a shape (and a few that cannot)."""
    n_layers = draw(st.integers(1, 4))
    n_heads = draw(st.integers(1, 6))
    n_kv_heads = draw(st.sampled_from([None] + [k for k in range(1, n_heads + 1) if n_heads % k == 0]))
    fraction = draw(st.sampled_from([1.0, 0.5]))
    head_dim = draw(st.sampled_from([None, 4, 8, 12]))
    if head_dim is None:  # d_model must divide into heads of an even (rotated) size
        d_model = n_heads * draw(st.sampled_from([4, 8]))
    else:
        d_model = draw(st.integers(1, 40))
    norm_kind = draw(st.sampled_from(config_module.NORM_KINDS))
    weight = draw(st.booleans())
    norm = NormConfig(kind=norm_kind, weight=weight, bias=norm_kind == "layer" and draw(st.booleans()),
                      weight_offset=draw(st.sampled_from([0.0, 1.0])) if weight else 0.0)
    placement = draw(st.sampled_from(config_module.NORM_PLACEMENTS))
    tie = draw(st.booleans())
    layer_kinds = tuple(draw(st.lists(st.sampled_from(config_module.LAYER_KINDS),
                                      min_size=n_layers, max_size=n_layers)))
    buckets = draw(st.integers(2, 12))
    fields: dict[str, Any] = dict(
        vocab_size=draw(st.integers(1, 50)), d_model=d_model, n_layers=n_layers, n_heads=n_heads,
        d_ff=draw(st.integers(1, 40)), n_kv_heads=n_kv_heads, head_dim=head_dim,
        max_positions=draw(st.integers(1, 40)),
        norm=norm, norm_placement=placement, final_norm=placement != "post" and draw(st.booleans()),
        qk_norm=draw(st.sampled_from(config_module.QK_NORMS)),
        q_bias=draw(st.booleans()), k_bias=draw(st.booleans()), v_bias=draw(st.booleans()),
        o_bias=draw(st.booleans()), mlp_bias=draw(st.booleans()), lm_head_bias=draw(st.booleans()),
        activation=draw(st.sampled_from(config_module.ACTIVATIONS)), gated=draw(st.booleans()),
        absolute_positions=draw(st.sampled_from(config_module.ABSOLUTE_POSITIONS)),
        position_offset=draw(st.integers(0, 3)),
        layer_positions=tuple(draw(st.lists(st.sampled_from(config_module.LAYER_POSITIONS),
                                            min_size=n_layers, max_size=n_layers))),
        rope=RopeConfig(fraction=fraction),
        rope_local=draw(st.sampled_from([None, RopeConfig(theta=1e4, fraction=fraction)])),
        relative_buckets=buckets, relative_max_distance=draw(st.integers(buckets // 2 + 1, 64)),
        attention=draw(st.sampled_from(sorted(attention_kinds.KINDS))),
        layer_kinds=layer_kinds, sliding_window=8 if "local" in layer_kinds else None,
        tie_embeddings=tie, embed_dim=draw(st.sampled_from([None, 1, 6])),  # OPT-350m's narrower embeddings
        embed_norm=draw(st.booleans()),
        head_transform=draw(st.sampled_from([None, "gelu"])), head_transform_bias=draw(st.booleans()),
    )
    if placement == "pre" and draw(st.booleans()):  # ModernBERT decoder: no attention norm on some layers
        fields["unnormed_attn_layers"] = tuple(draw(st.sets(st.integers(0, n_layers - 1))))
    if fields["qk_norm"] == "head" and draw(st.booleans()):  # Cohere's weights, one per head
        fields["qk_norm_weight"] = "per_head"
    if fields["absolute_positions"] == "none":  # an offset needs a table to offset
        fields["position_offset"] = 0
    if fields["absolute_positions"] == "sinusoidal_fairseq" and d_model < 4:  # fairseq's table needs d/2 - 1 > 0
        fields["absolute_positions"] = "sinusoidal"
    if fields["attention"] in ("latent", "sparse"):  # what MLA has: RoPE on every layer, one kv head per head,
        # no window (DSA: interleaved RoPE, its q LoRA always)
        sparse = fields["attention"] == "sparse"
        fields.update(
            n_kv_heads=None, head_dim=draw(st.sampled_from([4, 8])),
            rope=RopeConfig(layout="interleaved") if sparse else RopeConfig(), rope_local=None,
            qk_norm="none", qk_norm_weight="shared", q_bias=False, k_bias=False, v_bias=False, o_bias=False,
            layer_positions=("rope",) * n_layers, layer_kinds=("global",) * n_layers, sliding_window=None,
            attention_settings=dict(kv_lora_rank=draw(st.integers(1, 12)), qk_nope_head_dim=draw(st.integers(1, 8)),
                                    v_head_dim=draw(st.integers(1, 8)), bias=draw(st.booleans()),
                                    q_lora_rank=draw(st.sampled_from([3, 10] if sparse else [None, 3, 10])),
                                    norm_eps=draw(st.sampled_from([1e-6, 1e-5]))))
        if sparse:
            fields["attention_settings"].update(index_n_heads=draw(st.integers(1, 3)),
                                                index_head_dim=draw(st.sampled_from([8, 12])),
                                                index_topk=draw(st.integers(1, 8)))
    if fields["attention"] == "head_mixture":  # JetMoE's: top_k experts' queries over the kv heads, RoPE or none,
        # no window, no bias but the output's
        kv, top_k = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        fields.update(
            n_heads=kv * top_k, n_kv_heads=kv, head_dim=draw(st.sampled_from([4, 8])), qk_norm="none",
            qk_norm_weight="shared", q_bias=False, k_bias=False, v_bias=False, rope_local=None,
            layer_positions=tuple(draw(st.lists(st.sampled_from(("rope", "none")), min_size=n_layers,
                                                max_size=n_layers))),
            layer_kinds=("global",) * n_layers, sliding_window=None,
            attention_settings=dict(n_experts=draw(st.integers(top_k, 4)), top_k=top_k))
    if fields["attention"] == "standard":  # BitNet's sub-norms; HunYuan's QK norm after RoPE
        fields["sub_norms"] = draw(st.booleans())
        if fields["qk_norm"] == "head" and fields.get("qk_norm_weight", "shared") == "shared":
            fields["qk_norm_after_rope"] = draw(st.booleans())
    if not tie:  # Apertus 1.5's narrower LM head
        fields["output_vocab"] = draw(st.sampled_from([None, max(1, fields["vocab_size"] - 3)]))
    if fields["gated"] and not fields["mlp_bias"] and not fields.get("sub_norms") \
            and fields["activation"] not in config_module.ACTIVATION_PARAMETERS and draw(st.booleans()):  # experts
        n_experts, shared = draw(st.integers(1, 4)), draw(st.sampled_from(config_module.SHARED_EXPERTS))
        sigmoid = draw(st.booleans())
        fields["moe"] = MoeConfig(
            n_experts=n_experts, top_k=draw(st.integers(1, n_experts)), d_expert=draw(st.integers(1, 12)),
            router="sigmoid" if sigmoid else "softmax", selection_bias=sigmoid and draw(st.booleans()),
            shared=shared, d_shared=None if shared == "none" else draw(st.integers(1, 12)),
            dense_layers=tuple(draw(st.sets(st.integers(0, n_layers - 1)))), output_norm=draw(st.booleans()),
            sum_bias=draw(st.booleans()), router_norm=draw(st.booleans()), expert_scale=draw(st.booleans()))
        if shared == "none" and fields["norm_placement"] in config_module.SEQUENTIAL_PLACEMENTS and \
                not fields.get("residual_after_norm") and not fields.get("residual_fp32") and draw(st.booleans()):
            fields["moe"] = replace(fields["moe"], beside_dense=True, output_norm=True, sum_bias=False)  # Gemma 4
    if fields["o_bias"] and draw(st.booleans()):  # the o bias on some layers only (GPT-NeoX-Japanese)
        fields["o_bias_layers"] = tuple(draw(st.sets(st.integers(0, n_layers - 1), min_size=1)))
    return ArchConfig(**fields)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=arch_configs())
def test_matches_decoder_for_any_config(cfg: ArchConfig) -> None:
    assert_same_inventory(cfg)


# ---------------------------------------------------------------------------------- tables kept in step
def test_every_norm_placement_has_slots():
    assert set(shapes_module.NORM_SLOTS) == set(config_module.NORM_PLACEMENTS)


# each registered kind with every optional part it has
KIND_CASES: dict[str, list[dict[str, Any]]] = {
    "standard": [dict(qk_norm="head", q_bias=True, o_bias=True),
                 dict(qk_norm="head", qk_norm_after_rope=True, sub_norms=True),
                 *(dict(qk_norm="head", attn_output_gate=g) for g in ("projection", "q_heads"))],
    "latent": [dict(head_dim=8, attention_settings=dict(kv_lora_rank=6, qk_nope_head_dim=4, v_head_dim=5,
                                                         q_lora_rank=q_lora_rank, bias=bias))
               for q_lora_rank, bias in ((None, False), (7, True))],
    "sparse": [dict(head_dim=8, rope=dict(layout="interleaved"),
                    attention_settings=dict(kv_lora_rank=6, qk_nope_head_dim=4, v_head_dim=5, q_lora_rank=7,
                                            bias=True, index_n_heads=3, index_head_dim=10, index_topk=2))],
    "head_mixture": [dict(n_heads=6, n_kv_heads=2, head_dim=8, o_bias=bias,
                          attention_settings=dict(n_experts=4, top_k=3)) for bias in (False, True)],
}


def test_every_attention_kind_has_cases():
    assert set(KIND_CASES) == set(attention_kinds.KINDS)


@pytest.mark.parametrize(("kind", "overrides"), [(k, o) for k, cases in KIND_CASES.items() for o in cases])
def test_every_attention_kind_builds_the_parts_it_declares(kind, overrides):
    """One declaration gives both sides their attention tensors; this holds each kind's module to it."""
    assert_same_inventory(tiny(attention=kind, **overrides))


def test_unknown_attention_kind_is_a_config_error_naming_it():
    cfg = tiny()
    object.__setattr__(cfg, "attention", "hybrid")  # what a config could say once another kind is registered there
    with pytest.raises(config_module.ConfigError, match="'hybrid'"):
        parameter_shapes(cfg)


# ---------------------------------------------------------------------------------- no torch
def _imports_torch(code: str) -> bool:
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip() == "True"


def test_module_itself_imports_no_torch():
    """shapes.py and describe.py (and config.py, attention_kinds.py, parts.py, errors.py behind them)
    loaded from their files, with the package __init__ files bypassed: whatever those import, these
    modules need no torch."""
    code = textwrap.dedent(f"""
        import importlib.util, sys, types
        root = {str(ROOT / "lmconvert")!r}
        for name, path in (("lmconvert", root), ("lmconvert.arch", root + "/arch")):
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
        from lmconvert.arch.config import ArchConfig
        from lmconvert.arch.describe import variants
        from lmconvert.arch.shapes import parameter_shapes
        cfg = ArchConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=2, d_ff=8, qk_norm="head")
        parameter_shapes(cfg), variants(cfg), cfg.kv_cache_bytes_per_token()
        print("torch" in sys.modules)
    """)
    assert not _imports_torch(code)


def test_importing_shapes_does_not_import_torch():
    """The real import path: needs `lmconvert/__init__.py` and `lmconvert/arch/__init__.py` to
    import their torch-backed names (Decoder, KVCache, load) lazily."""
    code = "import sys; import lmconvert.arch.shapes; print('torch' in sys.modules)"
    assert not _imports_torch(code)
