"""Per-family mappings, found by looking up config.json's model_type. No file I/O here."""

from __future__ import annotations

from . import (
    bloom,
    cohere,
    cohere2,
    deepseek_v2,
    deepseek_v3,
    deepseek_v32,
    falcon,
    gemma,
    gemma2,
    gemma3,
    gpt2,
    gpt_neo,
    gpt_neox,
    gptj,
    granite,
    llama,
    minicpm3,
    mistral,
    mixtral,
    mpt,
    nemotron,
    olmo,
    olmo2,
    olmoe,
    opt,
    phi,
    phi3,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_moe,
    smollm3,
    stablelm,
    starcoder2,
    xglm,
)
from .errors import Inexpressible, MappingError
from .family import Family

FAMILIES: dict[str, Family] = {f.name: f for f in (llama.FAMILY, mistral.FAMILY, gemma.FAMILY, gemma2.FAMILY,
                                                   gemma3.FAMILY, olmo2.FAMILY, qwen2.FAMILY, qwen3.FAMILY,
                                                   smollm3.FAMILY, starcoder2.FAMILY, nemotron.FAMILY, stablelm.FAMILY,
                                                   granite.FAMILY, olmo.FAMILY, deepseek_v2.FAMILY, deepseek_v3.FAMILY,
                                                   phi3.FAMILY, cohere.FAMILY, cohere2.FAMILY, opt.FAMILY,
                                                   xglm.FAMILY, gpt_neo.FAMILY, gpt2.FAMILY, gptj.FAMILY, phi.FAMILY,
                                                   gpt_neox.FAMILY, bloom.FAMILY, mpt.FAMILY, falcon.FAMILY,
                                                   mixtral.FAMILY, qwen2_moe.FAMILY, qwen3_moe.FAMILY, olmoe.FAMILY,
                                                   minicpm3.FAMILY, deepseek_v32.FAMILY)}
BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES.values() for t in f.model_types}


def family_for(model_type: object) -> Family:
    try:
        return BY_MODEL_TYPE[model_type]  # type: ignore[index]
    except (KeyError, TypeError):
        raise MappingError(f"config.json: model_type {model_type!r} is not supported; "
                           f"supported: {', '.join(sorted(BY_MODEL_TYPE))}") from None


def family_named(name: str) -> Family:
    if name not in FAMILIES:
        raise MappingError(f"--family {name!r} is not known; choose one of {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


__all__ = ["BY_MODEL_TYPE", "FAMILIES", "Family", "Inexpressible", "MappingError", "family_for", "family_named"]
