"""How `generate` chooses the next token, as transformers' `generate` does (generation/utils.py,
`_get_logits_processor` and `_sample`; the warpers of generation/logits_process.py, op for op).

The settings start from transformers' defaults (GenerationConfig._get_default_generation_params:
greedy, temperature 1.0, top_k 50, top_p 1.0), overlaid with the checkpoint's generation_config.json,
then with the command line's options: any of --temperature, --top-k, --top-p turns sampling on,
--temperature 0 turns it off. The last position's logits, cast to float32 as transformers does,
go through the processors in transformers' order:

- always: the repetition penalty;
- when sampling: temperature, top-k, top-p, min-p, typical-p, epsilon and eta cutoffs;

then greedy takes the argmax, sampling draws `torch.multinomial(softmax(scores), 1)` from torch's
global RNG, so with the same seed the same tokens come out as from transformers. What else a
generation config may ask of transformers' generate (beam search, n-gram bans, forced or
suppressed tokens, ...) is not applied here, and `ignored` names it, for one line on stderr.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from lmconvert.formats import schema
from lmconvert.formats.errors import InputError

Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_UNIT = schema.Nullable(schema.Number(minimum=0.0))
# the keys this module applies, as generation_config.json may hold them (null: transformers' default)
SAMPLING_KEYS = {
    "do_sample": schema.Nullable(schema.Boolean()),
    "temperature": _UNIT,
    "top_k": schema.Nullable(schema.COUNT),
    "top_p": _UNIT,
    "min_p": _UNIT,
    "typical_p": _UNIT,
    "epsilon_cutoff": _UNIT,
    "eta_cutoff": _UNIT,
    "repetition_penalty": schema.Nullable(schema.POSITIVE),
}
_AT_MOST_ONE = ("top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")

# what transformers' generate would act on in a generation config and lmconvert does not: each key
# with the values that leave it off (transformers' defaults; null always does)
NOT_APPLIED: dict[str, tuple[Any, ...]] = {
    "num_beams": (1,), "num_beam_groups": (1,), "diversity_penalty": (0,), "num_return_sequences": (1,),
    "penalty_alpha": (), "top_h": (), "no_repeat_ngram_size": (0,), "bad_words_ids": (), "sequence_bias": (),
    "min_length": (0,), "min_new_tokens": (0,), "forced_bos_token_id": (), "forced_eos_token_id": (),
    "suppress_tokens": (), "begin_suppress_tokens": (), "exponential_decay_length_penalty": (),
    "remove_invalid_values": (False,), "renormalize_logits": (False,), "guidance_scale": (1,),
    "watermarking_config": (), "stop_strings": (), "token_healing": (False,), "dola_layers": (),
}


@dataclass(frozen=True)
class Sampling:
    """The settings, with transformers' defaults."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    min_p: float | None = None
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    repetition_penalty: float = 1.0

    def describe(self) -> str:
        """One phrase for stderr: how tokens are chosen."""
        if not self.do_sample:
            return "greedy"
        parts = [f"temperature {self.temperature:g}", f"top-k {self.top_k}", f"top-p {self.top_p:g}"]
        parts += [f"{name} {getattr(self, name):g}" for name in ("min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")
                  if getattr(self, name) != getattr(Sampling, name)]
        return "sampling: " + ", ".join(parts)


def from_config(config: Mapping[str, Any], where: str) -> Sampling:
    """The settings generation_config.json gives (already checked against SAMPLING_KEYS); a null
    or absent key keeps transformers' default."""
    given = {name: config[name] for name in SAMPLING_KEYS if config.get(name) is not None}
    for name in _AT_MOST_ONE:
        if name in given and given[name] > 1:
            raise InputError(f"{where}: {name} is {given[name]}; expected a number from 0 to 1; fix or delete it")
    if given.get("temperature") == 0:  # transformers' TemperatureLogitsWarper refuses 0; it means greedy
        given["do_sample"] = False
    return Sampling(**{name: float(value) if isinstance(value, int) and name not in ("top_k", "do_sample") else value
                       for name, value in given.items()})


def with_options(base: Sampling, temperature: float | None, top_k: int | None, top_p: float | None) -> Sampling:
    """The command line over the checkpoint's settings: any option given samples, --temperature 0
    is greedy (whatever else is given)."""
    given = {name: value for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p))
             if value is not None}
    if not given:
        return base
    if temperature == 0:
        return replace(base, do_sample=False)
    return replace(base, do_sample=True, **given)


def ignored(config: Mapping[str, Any]) -> list[str]:
    """The keys of a generation config that transformers' generate would act on and lmconvert does not."""
    return [f"{name}={config[name]!r}" for name, off in NOT_APPLIED.items()
            if config.get(name) is not None and config[name] not in off]


def unused(config: Mapping[str, Any], s: Sampling) -> list[str]:
    """The sampling settings of a generation config that greedy decoding leaves unused (transformers
    warns of them too): a config that sets a temperature but not do_sample decodes greedily."""
    if s.do_sample:
        return []
    defaults = Sampling()
    return [f"{name}={config[name]!r}" for name in ("temperature", "top_k", "top_p", "min_p", "typical_p")
            if config.get(name) not in (None, 0 if name == "temperature" else None, getattr(defaults, name))]


# ------------------------------------------------------------------ the processors, as transformers'


def repetition_penalty(penalty: float) -> Processor:
    """RepetitionPenaltyLogitsProcessor on 2-D scores, over every id so far (prompt included)."""

    def apply(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        vocab = scores.shape[-1]
        ids = ids.clamp(max=vocab)  # ids past the head's vocabulary land in a padding column dropped below
        scores = torch.nn.functional.pad(scores, (0, 1))
        score = torch.gather(scores, 1, ids)
        score = torch.where(score < 0, score * penalty, score / penalty)
        return scores.scatter(1, ids, score)[..., :vocab]

    return apply


def temperature(value: float) -> Processor:
    return lambda _ids, scores: scores / value


def top_k(k: int) -> Processor:
    def apply(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        kept = min(max(k, 1), scores.size(-1))
        return scores.masked_fill(scores < torch.topk(scores, kept)[0][..., -1, None], -math.inf)

    return apply


def top_p(p: float) -> Processor:
    def apply(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - p)
        remove[..., -1:] = 0  # keep at least one
        return scores.masked_fill(remove.scatter(1, sorted_indices, remove), -math.inf)

    return apply


def min_p(p: float) -> Processor:
    def apply(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores, dim=-1)
        remove = probs < p * probs.amax(dim=-1, keepdim=True)
        remove.scatter_(-1, torch.topk(probs, 1, dim=-1).indices, False)
        return scores.masked_fill(remove, -math.inf)

    return apply


def typical_p(mass: float) -> Processor:
    def apply(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        normalized = torch.nn.functional.log_softmax(scores, dim=-1)
        p = torch.exp(normalized)
        ent = -(normalized * p).nansum(-1, keepdim=True)
        shifted = torch.abs((-normalized) - ent)
        sorted_scores, sorted_indices = torch.sort(shifted, descending=False)
        cumulative = scores.gather(-1, sorted_indices).softmax(dim=-1).cumsum(dim=-1)
        last = (cumulative < mass).sum(dim=1)
        last.clamp_(max=sorted_scores.shape[-1] - 1)
        remove = sorted_scores > sorted_scores.gather(1, last.view(-1, 1))
        remove[..., :1] = 0
        return scores.masked_fill(remove.scatter(1, sorted_indices, remove), -math.inf)

    return apply


def _cutoff(scores: torch.Tensor, threshold: torch.Tensor | float) -> torch.Tensor:
    remove = scores.softmax(dim=-1) < threshold
    remove = remove & (scores < torch.topk(scores, 1)[0][..., -1, None])
    return scores.masked_fill(remove, -math.inf)


def epsilon_cutoff(epsilon: float) -> Processor:
    return lambda _ids, scores: _cutoff(scores, epsilon)


def eta_cutoff(epsilon: float) -> Processor:
    def apply(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        eps = torch.tensor(epsilon, device=scores.device)
        entropy = torch.distributions.Categorical(logits=scores).entropy()
        return _cutoff(scores, torch.min(eps, torch.sqrt(eps) * torch.exp(-entropy))[..., None])

    return apply


def processors(s: Sampling) -> list[Processor]:
    """transformers' list for these settings, in its order (`_get_logits_processor`)."""
    chain = [repetition_penalty(s.repetition_penalty)] if s.repetition_penalty != 1.0 else []
    if not s.do_sample:
        return chain
    if s.temperature != 1.0:
        chain.append(temperature(s.temperature))
    if s.top_k != 0:
        chain.append(top_k(s.top_k))
    if s.top_p < 1.0:
        chain.append(top_p(s.top_p))
    if s.min_p is not None:
        chain.append(min_p(s.min_p))
    if s.typical_p < 1.0:
        chain.append(typical_p(s.typical_p))
    if 0.0 < s.epsilon_cutoff < 1.0:
        chain.append(epsilon_cutoff(s.epsilon_cutoff))
    if 0.0 < s.eta_cutoff < 1.0:
        chain.append(eta_cutoff(s.eta_cutoff))
    return chain


def chooser(s: Sampling) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """The next-token chooser for `Decoder.generate`; None for plain greedy (its own argmax)."""
    chain = processors(s)
    if not chain and not s.do_sample:
        return None

    def choose(ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        scores = logits.to(copy=True, dtype=torch.float32)
        for process in chain:
            scores = process(ids, scores)
        if not s.do_sample:
            return torch.argmax(scores, dim=-1, keepdim=True)
        return torch.multinomial(torch.nn.functional.softmax(scores, dim=-1), num_samples=1)

    return choose

