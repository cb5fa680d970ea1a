"""Config translation as data: every family's key table, checked against transformers' own config
classes.

Both directions are derived from one table, so they must be inverses. For configs that
transformers itself writes, `to_hf(from_hf(c))` gives back every key the table declares that `c`
states, and `from_hf(to_hf(arch)) == arch`. A key that has no effect on the model (a window no layer
uses, the RoPE of a layer type no layer has) cannot survive ArchConfig, which keeps only what
computes; such configs are checked by the second property alone. The table's defaults and its null
rules are transformers' own; a value of the wrong type or range is refused naming the key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from family_specs import SPECS
from hf_models import TINY
from transformers import AutoConfig

from lmconvert.mappings import BY_MODEL_TYPE, FAMILIES, MappingError, family_for

S, F = "sliding_attention", "full_attention"
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32, "rope_theta": 500000.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 1e6}
LINEAR = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}
# 4 factors: head_dim 16 * 0.5 / 2 (Phi3Config checks hidden_size / heads, whatever head_dim says)
PHI3_LONGROPE = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0, 1.1, 1.2, 1.3],
                 "long_factor": [2.0, 2.5, 3.0, 3.5]}
QWEN_WINDOW = dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=4, max_window_layers=1)
GEMMA = dict(head_dim=16, sliding_window=4, query_pre_attn_scalar=24)
DEEPSEEK = dict(num_key_value_heads=4, first_k_dense_replace=2)  # every layer dense; MLA has one kv head per head
DEEPSEEK_MOE = dict(num_key_value_heads=4, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=3,
                    moe_intermediate_size=24, n_shared_experts=2, routed_scaling_factor=1.5, n_group=4, topk_group=2)

# model_type -> variants in which every stated key takes effect
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "llama": [{}, dict(attention_bias=True, mlp_bias=True, rope_parameters=LLAMA3),
              dict(head_dim=32, num_key_value_heads=1, tie_word_embeddings=True, rope_parameters=YARN),
              dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}, rms_norm_eps=1e-5)],
    "mistral": [{}, dict(sliding_window=None), dict(sliding_window=4, head_dim=24, layer_types=[F, S])],
    "qwen2": [{}, QWEN_WINDOW, dict(tie_word_embeddings=True, rope_parameters=YARN)],
    "qwen3": [{}, dict(QWEN_WINDOW, head_dim=16, attention_bias=True, rope_parameters=LINEAR)],
    "gemma": [{}, dict(head_dim=16, attention_bias=True, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 20000.0})],
    "gemma2": [{}, dict(GEMMA, attention_bias=True, attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
               dict(GEMMA, attn_logit_softcapping=None, final_logit_softcapping=None, layer_types=[F, S])],
    "gemma3_text": [dict(num_hidden_layers=6),
                    dict(GEMMA, num_hidden_layers=3, sliding_window_pattern=2, final_logit_softcapping=3.0,
                         rope_parameters={S: {"rope_type": "default", "rope_theta": 20000.0}, F: LINEAR})],
    "smollm3": [{}, dict(num_hidden_layers=4, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=4,
                         attention_bias=True, mlp_bias=True, tie_word_embeddings=False, rope_parameters=LINEAR),
                dict(num_hidden_layers=5, no_rope_layers=[0, 1, 1, 0, 1], rope_parameters=YARN)],
    "starcoder2": [{}, dict(sliding_window=4, use_bias=False, tie_word_embeddings=False, norm_epsilon=1e-6,
                            hidden_act="gelu", residual_dropout=0.1, embedding_dropout=0.2, rope_parameters=LINEAR)],
    "nemotron": [{}, dict(attention_bias=True, mlp_bias=True, norm_eps=1e-6, hidden_act="relu", head_dim=32,
                          tie_word_embeddings=True, rope_parameters={**LINEAR, "partial_rotary_factor": 0.75}),
                 dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0})],
    "stablelm": [{}, dict(use_parallel_residual=True, use_qkv_bias=True, layer_norm_eps=1e-6, tie_word_embeddings=True,
                          rope_parameters={**LINEAR, "partial_rotary_factor": 0.5}),
                 dict(qk_layernorm=True, layer_norm_eps=1e-6)],
    "granite": [{}, dict(embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.22,
                         logits_scaling=16.0, attention_bias=True, rope_parameters=LINEAR)],
    "olmo": [{}, dict(attention_bias=True, tie_word_embeddings=True, rope_parameters=LINEAR),
             dict(clip_qkv=8.0)],
    "phi3": [{}, dict(sliding_window=4, resid_pdrop=0.1, tie_word_embeddings=True, rms_norm_eps=1e-6,
                      original_max_position_embeddings=32,
                      rope_parameters={**PHI3_LONGROPE, "partial_rotary_factor": 0.5, "attention_factor": 1.5}),
             dict(head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                "partial_rotary_factor": 0.75})],
    "cohere": [{}, dict(use_qk_norm=True, attention_bias=True, logit_scale=0.5, layer_norm_eps=1e-6,
                        tie_word_embeddings=False, head_dim=32, rope_parameters=LINEAR)],
    "cohere2": [{}, dict(num_hidden_layers=4, sliding_window=4, attention_bias=True, logit_scale=0.5,
                         layer_types=[S, F, F, S], rope_parameters=LINEAR)],
    "olmo2": [{}, dict(attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 5e5})],
    "deepseek_v3": [DEEPSEEK, dict(DEEPSEEK, q_lora_rank=None, attention_bias=True, rope_interleave=False,
                                   kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
                                   rope_parameters={**YARN, "mscale": 0.8, "mscale_all_dim": 0.7}),
                    dict(DEEPSEEK_MOE, norm_topk_prob=False)],
    "deepseek_v2": [DEEPSEEK, dict(DEEPSEEK, q_lora_rank=None, attention_bias=True, mlp_bias=True, kv_lora_rank=16,
                                   qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, rope_parameters=YARN),
                    dict(DEEPSEEK_MOE, topk_method="group_limited_greedy"),
                    dict(DEEPSEEK_MOE, first_k_dense_replace=0, n_group=None, topk_group=None)],
    "deepseek_v32": [dict(DEEPSEEK, index_topk=4, index_head_dim=64, index_n_heads=2),
                     dict(DEEPSEEK, attention_bias=True, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8,
                          v_head_dim=10, rope_parameters=YARN, index_topk=8, index_head_dim=24, index_n_heads=3),
                     dict(DEEPSEEK_MOE, mlp_layer_types=["sparse", "dense"], norm_topk_prob=False)],
    "minicpm3": [dict(num_key_value_heads=4), dict(num_key_value_heads=4, q_lora_rank=None, attention_bias=True,
                                                mlp_bias=True, kv_lora_rank=16, qk_nope_head_dim=12,
                                                qk_rope_head_dim=8, v_head_dim=10, scale_emb=2.5, scale_depth=1.7,
                                                dim_model_base=48, tie_word_embeddings=False,
                                                rope_parameters={**PHI3_LONGROPE,
                                                                 "original_max_position_embeddings": 32})],
    "mixtral": [{}, dict(num_local_experts=4, num_experts_per_tok=3, sliding_window=4, head_dim=32,
                         rope_parameters=LINEAR)],
    "qwen2_moe": [{}, dict(QWEN_WINDOW, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=32,
                           shared_expert_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[1],
                           qkv_bias=False, rope_parameters=YARN)],
    "qwen3_moe": [{}, dict(num_hidden_layers=4, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=32,
                           norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[3], head_dim=16,
                           attention_bias=True, use_sliding_window=True, sliding_window=4, rope_parameters=LINEAR)],
    "olmoe": [{}, dict(num_experts=6, num_experts_per_tok=3, norm_topk_prob=True, attention_bias=True,
                       rms_norm_eps=1e-6, rope_parameters=LINEAR)],
    "gptj": [dict(rotary_dim=16), dict(rotary_dim=8, n_inner=80, layer_norm_epsilon=1e-6, activation_function="gelu",
                      resid_pdrop=0.1, embd_pdrop=0.2, attn_pdrop=0.05)],
    "phi": [{}, dict(qk_layernorm=True, layer_norm_eps=1e-6, hidden_act="gelu", resid_pdrop=0.1, embd_pdrop=0.2,
                     rope_parameters={**LINEAR, "partial_rotary_factor": 0.75})],
    "gpt_neox": [{}, dict(use_parallel_residual=False, attention_bias=False, layer_norm_eps=1e-6, hidden_act="relu",
                          hidden_dropout=0.1, tie_word_embeddings=True,
                          rope_parameters={**LINEAR, "partial_rotary_factor": 0.5})],
    "bloom": [{}, dict(apply_residual_connection_post_layernorm=True, layer_norm_epsilon=1e-6, hidden_dropout=0.1,
                       attention_dropout=0.2, tie_word_embeddings=False)],
    "mpt": [{}, dict(layer_norm_epsilon=1e-6, tie_word_embeddings=False, max_seq_len=64,
                     attn_config={"softmax_scale": 0.2, "attn_pdrop": 0, "clip_qkv": 6.0})],  # attn_pdrop: an int
    "falcon": [{}, dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1, bias=True,
                        ffn_hidden_size=96, layer_norm_epsilon=1e-6, activation="relu", hidden_dropout=0.1,
                        attention_dropout=0.2, tie_word_embeddings=False, rope_parameters=LINEAR),
               dict(parallel_attn=False, multi_query=False, bias=True, alibi=True)],
    "gpt2": [{}, dict(n_inner=96, scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True,
                      reorder_and_upcast_attn=True, activation_function="gelu", layer_norm_epsilon=1e-6,
                      tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.2, attn_pdrop=0.05)],
    "gpt_neo": [dict(num_hidden_layers=24),  # transformers' default attention_types covers 24 layers
                dict(num_hidden_layers=3, attention_types=[[["global", "local", "local"], 1]], window_size=4,
                     intermediate_size=96, activation_function="gelu", layer_norm_epsilon=1e-6,
                     tie_word_embeddings=False, embed_dropout=0.1, resid_dropout=0.2, attention_dropout=0.05)],
    "opt": [{}, dict(ffn_dim=96, do_layer_norm_before=False, word_embed_proj_dim=48, enable_bias=False,
                     layer_norm_elementwise_affine=False, activation_function="gelu", tie_word_embeddings=False,
                     dropout=0.0, attention_dropout=0.1),
            dict(_remove_final_layer_norm=True)],
    "xglm": [{}, dict(ffn_dim=96, scale_embedding=False, activation_function="relu", tie_word_embeddings=False,
                      dropout=0.0, attention_dropout=0.2)],
}
# configs with keys that have no effect, as Hub files have them: same ArchConfig, not the same keys
for _spec in SPECS.values():  # a family added with its spec alone brings its variants with it
    if _spec.config_variants:
        assert _spec.model_type not in VARIANTS, f"{_spec.model_type}: variants in its spec and in VARIANTS"
        VARIANTS[_spec.model_type] = list(_spec.config_variants)
INERT: dict[str, list[dict[str, Any]]] = {
    "bloom": [dict(pretraining_tp=4)],  # without slow_but_exact the slices are never used
    "mpt": [dict(expansion_ratio=2, no_bias=False, learned_pos_emb=False, logit_scale=2.0, emb_pdrop=0.1,
                 resid_pdrop=0.1, attn_config={"alibi_bias_max": 16, "qk_ln": True})],  # MptModel never reads them
    "qwen2": [dict(use_sliding_window=False, sliding_window=4, max_window_layers=1)],
    "gemma3_text": [{}],  # two layers, both sliding: the full-attention RoPE is unused
    "mistral": [dict(sliding_window=4, layer_types=[S, S])],  # the pattern without layer_types
    "deepseek_v3": [dict(num_key_value_heads=4)],  # first_k_dense_replace=3 past the two layers
    "deepseek_v2": [dict(DEEPSEEK, first_k_dense_replace=5)],  # past the two layers
    "deepseek_v32": [dict(num_key_value_heads=4, mlp_bias=True)],  # its MLPs have no biases
    "gpt_neo": [dict(attention_types=[[["global"], 2]], window_size=8)],  # a window no layer uses
    "opt": [dict(do_layer_norm_before=False, _remove_final_layer_norm=True, layerdrop=0.1)],  # post-norm: none
    "xglm": [dict(activation_dropout=0.1, layerdrop=0.2)],  # training only
    "qwen2_moe": [dict(use_sliding_window=False, sliding_window=4, max_window_layers=1)],
    "qwen3_moe": [dict(use_sliding_window=False, sliding_window=4), dict(mlp_only_layers=[1, 7])],  # 7: no such layer
}
CASES = [(t, v) for t, variants in VARIANTS.items() for v in variants]
ALL_CASES = CASES + [(t, v) for t, variants in INERT.items() for v in variants]


def case_id(case: Any) -> str:
    return ",".join(sorted(case)) or "defaults" if isinstance(case, dict) else str(case)


def transformers_config(model_type: str, variant: dict[str, Any]) -> dict[str, Any]:
    """config.json as transformers writes it for this variant of a tiny model."""
    return AutoConfig.for_model(model_type, **{**TINY, **variant}).to_dict()


def written_keys(model_type: str) -> list[str]:
    return [name for name, key in family_for(model_type).config.keys.items() if not key.legacy]


def test_every_model_type_has_variants() -> None:
    wrappers = {t for family in FAMILIES.values() for t in family.notes}  # read as their text decoder's type
    assert set(VARIANTS) == set(BY_MODEL_TYPE) - wrappers


@pytest.mark.parametrize(("model_type", "variant"), CASES, ids=case_id)
def test_to_hf_gives_back_every_declared_key(model_type: str, variant: dict[str, Any]) -> None:
    config = transformers_config(model_type, variant)
    family = family_for(model_type)
    out = family.to_hf(family.from_hf(config))
    declared = written_keys(model_type)
    assert set(out) <= set(declared)
    stated = [k for k in declared if k in config]
    assert len(stated) >= min(12, len(declared)), stated  # BLOOM's config has only 11 keys
    assert {k: out.get(k, "<absent>") for k in stated} == {k: sub_config(config[k], out.get(k)) for k in stated}


def sub_config(theirs: Any, ours: Any) -> Any:
    """A nested config class (MPT's attn_config) serialises with every PretrainedConfig attribute
    besides its own keys: those of its keys we write are compared, and we must write them all."""
    if isinstance(theirs, dict) and "architectures" in theirs and isinstance(ours, dict):
        return {k: theirs[k] for k in ours}
    return theirs


@pytest.mark.parametrize(("model_type", "variant"), ALL_CASES, ids=case_id)
def test_from_hf_of_to_hf_is_the_identity(model_type: str, variant: dict[str, Any]) -> None:
    family = family_for(model_type)
    arch = family.from_hf(transformers_config(model_type, variant))
    assert family.from_hf(family.to_hf(arch)) == arch


@pytest.mark.parametrize("model_type", VARIANTS)
def test_defaults_and_nulls_are_transformers_own(model_type: str) -> None:
    """For every key transformers' config class declares: the same default, and null accepted
    exactly where transformers accepts it (in the family's first variant, a model transformers
    can build)."""
    config_class = type(AutoConfig.for_model(model_type))
    theirs = {f.name: f for f in dataclasses.fields(config_class)}
    checked = []
    for name in written_keys(model_type):
        if name not in theirs:  # e.g. head_dim in qwen2: an extra key transformers reads if stated
            continue
        key = family_for(model_type).config.keys[name]
        if theirs[name].default is not dataclasses.MISSING:
            assert key.default == theirs[name].default, name
        try:
            AutoConfig.for_model(model_type, **{**TINY, **VARIANTS[model_type][0], name: None})
            takes_null = True
        except Exception:  # noqa: BLE001 - transformers' strict validation raises its own types
            takes_null = False
        assert key.nullable == takes_null, name
        checked.append(name)
    assert len(checked) >= 10, checked


@pytest.mark.parametrize("model_type", VARIANTS)
def test_null_means_what_transformers_makes_of_it(model_type: str) -> None:
    """Where null is allowed, our reading of it equals our reading of the value transformers
    resolves it to (hidden_size / heads for head_dim, one KV head per head...), or both are refused
    (a null window for sliding layers, which transformers cannot run either)."""
    family = family_for(model_type)

    def reading(config: dict[str, Any]) -> object:
        try:
            return family.from_hf(config)
        except MappingError:
            return MappingError

    base = VARIANTS[model_type][0]  # a model transformers can run
    for name, key in family.config.keys.items():
        if not key.nullable or key.legacy:
            continue
        raw = {**transformers_config(model_type, base), name: None}
        # a key null beside its stated attribute_map alias (DBRX's n_heads beside TINY's num_attention_heads):
        # transformers takes the alias, so the file states it too
        entry = next(e for e in family.config.entries if key in e.keys)
        raw |= {k.name: TINY[k.name] for k in entry.keys if k.legacy and k.name in TINY}
        resolved = AutoConfig.for_model(model_type, **{**TINY, **base, name: None}).to_dict()
        assert reading(raw) == reading(resolved), name


# a key, a bad value, a fragment the message must hold
BAD_VALUES = [
    ("num_key_value_heads", 0, "positive integer"), ("head_dim", 0, "positive integer"),
    ("num_attention_heads", -4, "positive integer"), ("hidden_size", 64.0, "integer"),
    ("num_hidden_layers", True, "integer"), ("vocab_size", "128", "integer"),
    ("intermediate_size", None, "not allowed"), ("max_position_embeddings", 0, "positive integer"),
    ("rms_norm_eps", 0, "positive number"), ("rms_norm_eps", "1e-6", "number"),
    ("tie_word_embeddings", 1, "boolean"), ("attention_dropout", 1.5, "in [0, 1)"),
    ("rope_parameters", [10000.0], "JSON object"),
]


# each model_type's own spelling of those keys, the ones its config class never reads (OLMo's LayerNorm eps is fixed;
# the GPT-2-era families have neither RoPE nor GQA nor a free head_dim), and where transformers takes null for
# its default (GPT-Neo's intermediate_size): in its spec (tests/specs/__init__.py), with no list here to edit
OWN_SPELLING = {(spec.model_type, key): own for spec in SPECS.values() for key, own in spec.own_spelling.items()}
NOT_A_KEY = {(spec.model_type, key) for spec in SPECS.values() for key in spec.not_a_key}
CONVERTIBLE = {spec.model_type: spec.convertible for spec in SPECS.values() if spec.convertible}
NULL_IS_DEFAULT = {(spec.model_type, key) for spec in SPECS.values() for key in spec.null_is_default}


@pytest.mark.parametrize("model_type", VARIANTS)
@pytest.mark.parametrize(("key", "value", "fragment"), BAD_VALUES, ids=lambda x: str(x))
def test_bad_values_are_refused_naming_the_key(model_type: str, key: str, value: Any, fragment: str) -> None:
    key = OWN_SPELLING.get((model_type, key), key)
    config = {"model_type": model_type, key: value}
    if (model_type, key) in NOT_A_KEY:  # transformers never reads it, so neither value matters
        family = family_for(model_type)
        assert key not in family.config.keys
        base = {"model_type": model_type, **CONVERTIBLE.get(model_type, {})}
        assert family.arch_config({**base, key: value}) == family.arch_config(base)
        return
    if (model_type, key) in NULL_IS_DEFAULT and value is None:
        family = family_for(model_type)
        assert key in family.config.keys and family.config.keys[key].nullable
        assert family.arch_config(config) == family.arch_config({"model_type": model_type})
        return
    with pytest.raises(MappingError) as caught:
        family_for(model_type).arch_config(config)
    message = str(caught.value)
    assert message.startswith("config.json: ") and "\n" not in message
    assert key in message and fragment in message, message


@pytest.mark.parametrize(("model_type", "key", "value", "fragment"), [
    ("llama", "rope_parameters", {"rope_type": "default", "rope_theta": 0}, "rope_parameters.rope_theta=0"),
    ("llama", "rope_scaling", {"rope_type": "linear", "factor": 0}, "rope_scaling.factor=0"),
    ("llama", "rope_parameters", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": "1"},
     'rope_parameters.low_freq_factor="1"'),
    ("llama", "hidden_act", "swiglu", "not supported"),
    ("exaone", "num_layers", 0, "positive integer"), ("exaone", "layer_norm_epsilon", 0, "positive number"),
    ("exaone", "activation_function", "swiglu", "not supported"),
    ("mistral", "sliding_window", 0, "sliding_window=0"), ("mistral", "num_key_value_heads", None, "not allowed"),
    ("qwen2", "max_window_layers", -1, "non-negative integer"), ("qwen2", "use_sliding_window", "false", "boolean"),
    ("qwen3", "head_dim", None, "not allowed"),
    ("internlm3", "qkv_bias", True, "differ"), ("internlm3", "bias", "yes", "boolean"),
    ("iquestcoder", "clip_qkv", 8.0, "clip_qkv=8.0"), ("iquestcoder", "use_sliding_window", True, "not supported"),
    ("ministral", "sliding_window", None, "sliding_window=null"), ("cwm", "sliding_window", None, "not allowed"),
    ("cwm", "head_dim", None, "not allowed"), ("cwm", "layer_types", [S], "layer_types"),
    ("seed_oss", "attention_out_bias", "yes", "boolean"), ("seed_oss", "residual_dropout", 1.0, "in [0, 1)"),
    ("helium", "head_dim", 32, "o_proj"), ("helium", "num_key_value_heads", None, "not allowed"),
    ("jais2", "layer_norm_eps", 0, "positive number"),
    ("gemma2", "query_pre_attn_scalar", 0, "positive number"), ("gemma2", "final_logit_softcapping", 0, "positive"),
    ("gemma2", "head_dim", None, "not allowed"), ("gemma2", "layer_types", "sliding", "list"),
    ("smollm3", "no_rope_layers", [1, 2], "no_rope_layers=[1, 2]"), ("smollm3", "no_rope_layers", "all", "list"),
    ("smollm3", "no_rope_layer_interval", 0, "positive integer"), ("smollm3", "use_sliding_window", 1, "boolean"),
    ("smollm3", "head_dim", None, "not allowed"),
    ("starcoder2", "use_bias", "yes", "boolean"), ("starcoder2", "norm_epsilon", 0, "positive number"),
    ("starcoder2", "residual_dropout", 1.0, "in [0, 1)"), ("starcoder2", "sliding_window", 0, "sliding_window=0"),
    ("nemotron", "norm_eps", -1.0, "positive number"), ("nemotron", "partial_rotary_factor", 1.5, "partial_rotary"),
    ("stablelm", "qk_layernorm", "yes", "boolean"), ("stablelm", "use_parallel_residual", 1, "boolean"),
    ("stablelm", "hidden_dropout", 1.0, "in [0, 1)"),
    ("cohere_compass_text", "rope_parameters", {"sliding_attention": None}, "no 'full_attention' entry"),
    ("ministral3", "rope_parameters", {"rope_type": "yarn", "factor": 4.0}, "llama_4_scaling_beta"),
    ("ministral3", "rope_parameters", {"rope_theta": 1e4, "llama_4_scaling_beta": 0.1}, "original_max_position"),
    ("mellum", "rope_parameters", {"full_attention": {"rope_type": "default", "rope_theta": 1e4,
                                                      "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ("stablelm", "head_dim", 32, "head_dim=32 differs"),
    ("granite", "residual_multiplier", 0, "positive"), ("granite", "logits_scaling", "8", "number"),
    ("granite", "embedding_multiplier", None, "not allowed"),
    ("cohere", "use_qk_norm", 1, "boolean"), ("cohere", "logit_scale", None, "cannot run"),
    ("cohere2", "logit_scale", None, "not allowed"),
    ("cohere", "layer_norm_eps", 0, "positive number"), ("cohere", "head_dim", None, "not allowed"),
    ("cohere2", "sliding_window_pattern", 0, "positive integer"), ("cohere2", "layer_types", [S], "layer_types"),
    ("phi3", "rope_parameters", {"rope_type": "linear", "factor": 2.0}, "not supported by Phi-3"),
    ("phi3", "rope_parameters", {**PHI3_LONGROPE, "short_factor": [1.0]}, "short_factor"),
    ("phi3", "rope_scaling", {**PHI3_LONGROPE, "type": "su", "rope_type": "su"}, "type='su' without"),
    ("phi3", "original_max_position_embeddings", 0, "positive integer"), ("phi3", "embd_pdrop", 1.0, "in [0, 1)"),
    ("olmo", "clip_qkv", 0, "clip_qkv=0"), ("olmo", "clip_qkv", "8", "number"),  # 8.0 is read
    ("flex_olmo", "norm_topk_prob", "yes", "boolean"), ("flex_olmo", "num_experts", 0, "positive integer"),
    ("dots1", "n_routed_experts", None, "n_routed_experts=null"), ("dots1", "max_window_layers", None, "not allowed"),
    ("dots1", "routed_scaling_factor", 0, "positive number"),
    ("glm4_moe", "use_qk_norm", 1, "boolean"), ("glm4_moe", "first_k_dense_replace", None, "not allowed"),
    ("glm4_moe", "partial_rotary_factor", 1.5, "partial_rotary"),
    ("glm4_moe_lite", "mlp_layer_types", ["dense"], "mlp_layer_types"),
    ("glm4_moe_lite", "v_head_dim", None, "not allowed"), ("glm4_moe_lite", "rope_interleave", None, "not allowed"),
    ("sarvam_mla", "rope_scaling", {"type": "deepseek_yarn", "factor": 0}, "rope_scaling.factor=0"),
    ("sarvam_mla", "q_head_dim", 0, "positive integer"),
    ("hy_v3", "mlp_bias", True, "mlp_bias=true"), ("hy_v3", "num_experts", None, "num_experts=null"),
    ("hy_v3", "enable_moe_fp32_combine", "yes", "boolean"), ("hy_v3", "head_dim", None, "not allowed"),
    ("gptj", "rotary_dim", None, "not allowed"), ("gptj", "rotary_dim", 0, "positive integer"),
    ("gptj", "n_inner", 0, "positive integer"), ("gptj", "tie_word_embeddings", True, "tie_word_embeddings=true"),
    ("codegen", "rotary_dim", 0, "positive integer"), ("codegen", "tie_word_embeddings", True,
                                                        "tie_word_embeddings=true"),
    ("phi", "qk_layernorm", "yes", "boolean"), ("phi", "tie_word_embeddings", True, "tie_word_embeddings=true"),
    ("phi", "partial_rotary_factor", 1.5, "partial_rotary"), ("phi", "embd_pdrop", 1.0, "in [0, 1)"),
    ("persimmon", "qk_layernorm", "yes", "boolean"), ("persimmon", "partial_rotary_factor", 1.5, "partial_rotary"),
    ("persimmon", "hidden_dropout", 1.0, "in [0, 1)"),
    ("gpt_neox", "use_parallel_residual", "no", "boolean"), ("gpt_neox", "rotary_pct", 0, "rotary_pct=0"),
    ("gpt_neox", "rotary_emb_base", -1.0, "positive number"), ("gpt_neox", "hidden_dropout", 1.0, "in [0, 1)"),
    ("bloom", "pretraining_tp", 0, "positive integer"), ("bloom", "apply_residual_connection_post_layernorm", 1,
                                                          "boolean"),
    ("bloom", "n_embed", 0, "positive integer"),
    ("mpt", "attn_config", {"clip_qkv": -1.0}, "positive"), ("mpt", "attn_config", {"attn_pdrop": 1.0}, "[0, 1)"),
    ("mpt", "attn_config", {"softmax_scale": 0}, "positive"),
    ("falcon", "num_ln_in_parallel_attn", 0, "positive integer"),
    ("falcon", "new_decoder_architecture", "yes", "boolean"),
    ("falcon", "ffn_hidden_size", 0, "positive integer"), ("falcon", "activation", None, "activation=null"),
    ("gptj", "resid_pdrop", 1.0, "in [0, 1)"), ("gptj", "activation_function", "swiglu", "not supported"),
    ("gemma3_text", "sliding_window_pattern", 0, "positive integer"),
    ("gemma3_text", "rope_parameters", {F: {"rope_type": "default", "rope_theta": -1.0}},
     "rope_parameters.full_attention.rope_theta=-1.0"),
    ("gemma3", "tie_word_embeddings", "yes", "true or false"),
    ("gpt2", "n_inner", 0, "positive integer"), ("gpt2", "scale_attn_weights", "yes", "boolean"),
    ("gpt2", "add_cross_attention", True, "add_cross_attention=true"), ("gpt2", "n_embd", 64.0, "integer"),
    ("gpt_bigcode", "multi_query", "yes", "boolean"), ("gpt_bigcode", "attention_softmax_in_fp32", 1, "boolean"),
    ("gpt_bigcode", "add_cross_attention", True, "add_cross_attention=true"),
    ("openai-gpt", "afn", "swiglu", "afn"), ("openai-gpt", "n_embd", 64.0, "integer"),
    ("gpt_neo", "attention_types", [[["global", "sliding"], 12]], "attention_types="),
    ("gpt_neo", "attention_types", [[["global", "local"], 1]], "covers 2 layers but num_layers is 24"),
    ("gpt_neo", "window_size", 0, "positive integer"), ("gpt_neo", "num_layers", 0, "positive integer"),
    ("opt", "word_embed_proj_dim", 0, "positive integer"), ("opt", "do_layer_norm_before", "no", "boolean"),
    ("opt", "layerdrop", 1.0, "in [0, 1)"), ("opt", "enable_bias", 1, "boolean"),
    ("xglm", "scale_embedding", 1, "boolean"), ("xglm", "d_model", 64.0, "integer"),
    ("xglm", "activation_dropout", 1.5, "in [0, 1)"), ("xglm", "attention_heads", 0, "positive integer"),
    ("biogpt", "scale_embedding", 1, "boolean"), ("biogpt", "layer_norm_eps", 0, "positive number"),
    ("biogpt", "layerdrop", 1.0, "in [0, 1)"),
    ("gemma3", "text_config", {"num_key_value_heads": 0}, "num_key_value_heads=0"),
    ("granite_swa", "layer_rope_theta", [1e4] * 4, "each of the num_hidden_layers=24 layers"),
    ("granite_swa", "layer_rope_theta", [1e4] * 23 + [-1.0], "layer_rope_theta="),
    ("granite_swa", "layer_rope_theta", [0, 1e4, 2e4, 1e4] * 6, "gives the sliding layers several RoPE thetas"),
])
def test_family_keys_are_checked(model_type: str, key: str, value: Any, fragment: str) -> None:
    with pytest.raises(MappingError, match="^config.json: ") as caught:
        family_for(model_type).arch_config({"model_type": model_type, key: value})
    assert fragment in str(caught.value), str(caught.value)


def test_only_an_absent_or_null_head_dim_is_derived() -> None:
    llama = FAMILIES["llama"]
    base = {"model_type": "llama", **TINY}
    derived = llama.arch_config(base).head_dim
    assert derived == TINY["hidden_size"] // TINY["num_attention_heads"]
    assert llama.arch_config({**base, "head_dim": None}).head_dim == derived
    with pytest.raises(MappingError, match="head_dim=0"):
        llama.arch_config({**base, "head_dim": 0})
