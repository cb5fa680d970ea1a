"""Text generation with the checkpoint's own tokenizer: greedy or sampled as transformers'
generate (sampling.py), the prompt wrapped in the tokenizer's chat template when it has one, the
text streamed as it comes.

What is asked is checked before the model is loaded: the prompt's tokens must fit the model's
positions (max_positions) with room for --max-new-tokens, and their KV cache must fit in memory.
An empty prompt starts from the tokenizer's BOS token, as transformers' generate does with no
input; a tokenizer without one cannot start, and says so. In chat the prompt is the user's
message, rendered as `tokenizer.apply_chat_template(..., add_generation_prompt=True)` renders it.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmconvert.arch import ArchConfig
from lmconvert.formats import schema
from lmconvert.formats.checkpoint import open_checkpoint
from lmconvert.formats.dtypes import parse_dtype
from lmconvert.formats.errors import InputError
from lmconvert.formats.jsonfile import read_json_object

from .load import load_checkpoint
from .memory import available_memory, size_text
from .sampling import SAMPLING_KEYS, Sampling, chooser, from_config, ignored, unused, with_options
from .tokenizer import load_tokenizer

TOKEN_ID = schema.Nullable(schema.Either((schema.COUNT, schema.Array(schema.COUNT))))
GENERATION_CONFIG = schema.Object(optional={"eos_token_id": TOKEN_ID, "bos_token_id": TOKEN_ID, **SAMPLING_KEYS})


def _generation_config(path: Path) -> tuple[dict[str, Any], str]:
    """generation_config.json beside the checkpoint, checked ({} when there is none), and its path."""
    gen = path / "generation_config.json" if path.is_dir() else path.parent / "generation_config.json"
    if not gen.is_file():
        return {}, str(gen)
    config = read_json_object(gen, "generation config")
    schema.validate(config, GENERATION_CONFIG, str(gen), "fix or delete it")
    return config, str(gen)


def _eos_ids(config: dict[str, Any], tokenizer: Any) -> list[int]:  # noqa: ANN401 - transformers' tokenizers
    """Every EOS id the generation config names (transformers stops on any of them), else the tokenizer's."""
    eos = config.get("eos_token_id")
    if eos is not None and eos != []:
        return eos if isinstance(eos, list) else [eos]
    eos = getattr(tokenizer, "eos_token_id", None)
    return [] if eos is None else [eos]


def has_chat_template(tokenizer: Any) -> bool:  # noqa: ANN401
    return bool(getattr(tokenizer, "chat_template", None))


def chat_ids(tokenizer: Any, prompt: str, system: str | None) -> list[int]:  # noqa: ANN401
    """The user's message (after the system's, if any) as the chat template renders it, with the
    assistant's turn opened: transformers' `apply_chat_template(..., add_generation_prompt=True)`."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": prompt}]
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    except Exception as exc:  # noqa: BLE001 - a template raises what its author wrote (raise_exception)
        what = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise InputError(f"--chat: the tokenizer's chat template refuses the conversation ({what})"
                         + ("; drop --system" if system is not None else "; try --no-chat")) from None
    return list(ids)


def prompt_ids(tokenizer: Any, prompt: str, arch: ArchConfig, max_new_tokens: int,  # noqa: ANN401
               itemsize: int, chat: bool = False, system: str | None = None) -> list[int]:
    """The prompt's token ids, once they and the tokens to come fit the model and the memory."""
    ids = chat_ids(tokenizer, prompt, system) if chat else list(tokenizer.encode(prompt))
    if not ids:
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is None:
            raise InputError(f"--prompt {prompt!r}: gives no tokens, and the tokenizer has no BOS token to start "
                             "from; give a prompt")
        ids = [bos]
    if max(ids) >= arch.vocab_size:
        raise InputError(f"--prompt: the tokenizer gives token id {max(ids)}, outside the model's vocabulary of "
                         f"{arch.vocab_size}; the tokenizer belongs to another model")
    if len(ids) > arch.max_positions:
        raise InputError(f"--prompt: {len(ids)} tokens, more than the model's max_positions {arch.max_positions}; "
                         "shorten it")
    room = arch.max_positions - len(ids)
    if max_new_tokens > room:
        raise InputError(f"--max-new-tokens {max_new_tokens}: the prompt's {len(ids)} tokens leave room for at most "
                         f"{room} within the model's max_positions {arch.max_positions}; lower it")
    cache = arch.cache_bytes(len(ids) + max_new_tokens, itemsize)  # the KV cache and any mixer's state
    available = available_memory()
    if available is not None and cache > available:
        raise InputError(f"--max-new-tokens {max_new_tokens}: the KV cache for {len(ids) + max_new_tokens} tokens "
                         f"needs {size_text(cache)}, more than the {size_text(available)} available; lower it")
    return ids


class TextStream:
    """Decoded text as tokens come, printed once it cannot change, as transformers' TextStreamer
    decides: letters, digits and spaces at once, anything else (punctuation, a partial UTF-8
    character, which decodes to U+FFFD) once a space follows it. Each step decodes every token so
    far (TextStreamer restarts at each newline), so what was printed stays a prefix of the final text
    wherever decoding more tokens only appends to it (byte-level BPE, SentencePiece; a decoder that
    cleans up spaces before punctuation can rewrite a printed space, as under TextStreamer), and
    `end` prints the rest: the concatenation is `decode(new ids, skip_special_tokens=True)`."""

    def __init__(self, tokenizer: Any, write: Callable[[str], None]) -> None:  # noqa: ANN401
        self.tokenizer = tokenizer
        self.write = write
        self.ids: list[int] = []
        self.printed = 0

    def text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def put(self, token: int) -> None:
        self.ids.append(token)
        text = self.text()
        new = text[self.printed:]
        if not all(char.isspace() or unicodedata.category(char)[0] in "LMN" for char in new):
            new = new[:new.rfind(" ") + 1]
        self._show(new)

    def end(self) -> str:
        text = self.text()
        self._show(text[self.printed:])
        return text

    def _show(self, new: str) -> None:
        if new:
            self.write(new)
            self.printed += len(new)


@dataclass(frozen=True)
class Generated:
    """What one generation did, for the line on stderr."""

    text: str  # the new text (what was streamed)
    prompt_tokens: int
    new_tokens: int
    prefill_s: float  # the prompt's forward pass and the first token
    decode_s: float  # every token after the first
    how: str = "greedy"  # Sampling.describe()

    def rate(self) -> str:
        if self.new_tokens > 1 and self.decode_s > 0:
            speed = f"{(self.new_tokens - 1) / self.decode_s:.1f} tokens/s"
        else:
            speed = f"{self.new_tokens / max(self.prefill_s, 1e-9):.1f} tokens/s"
        tokens = f"{self.new_tokens} new token{'s' if self.new_tokens != 1 else ''}"
        return (f"{tokens} in {self.prefill_s + self.decode_s:.2f} s: {speed} "
                f"(first token after {self.prefill_s:.2f} s, prompt {self.prompt_tokens} tokens; {self.how})")


@dataclass(frozen=True)
class Request:
    """What the command line asks of `generate` beyond the prompt."""

    max_new_tokens: int = 32
    chat: bool | None = None  # None: chat when the tokenizer has a template
    system: str | None = None
    temperature: float | None = None  # None: the generation config's (or transformers' default)
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None


def settings(config: dict[str, Any], where: str, request: Request) -> Sampling:
    return with_options(from_config(config, where), request.temperature, request.top_k, request.top_p)


def _nothing(_: object) -> None:
    pass


def generate(path: Path, prompt: str, request: Request, dtype: str | None = None, device: str = "cpu",
             started: Callable[[bool], None] = _nothing, write: Callable[[str], None] = _nothing,
             note: Callable[[str], None] = _nothing) -> Generated:
    """Generate from `prompt`: `note` gets a line naming the generation config's settings that are
    not applied, `started(chat)` is called once the request is checked and the model loaded,
    `write` gets the new text as it comes."""
    with open_checkpoint(path) as checkpoint:
        if checkpoint.tokenizer is None:
            raise InputError(f"{path}: has no tokenizer files; convert from a source that has them")
        config, where = _generation_config(path)
        sampling = settings(config, where, request)
        tokenizer = load_tokenizer(checkpoint.tokenizer)
        chat = request.chat if request.chat is not None else has_chat_template(tokenizer)
        if chat and not has_chat_template(tokenizer):
            raise InputError(f"--chat: {path}'s tokenizer has no chat template; drop --chat")
        if request.system is not None and not chat:
            raise InputError(f"--system: {path}'s tokenizer has no chat template to put it in; drop --system")
        eos = _eos_ids(config, tokenizer)
        torch_dtype = parse_dtype(dtype)
        itemsize = torch.empty((), dtype=torch_dtype).element_size() if torch_dtype else 4
        ids = torch.tensor([prompt_ids(tokenizer, prompt, checkpoint.arch, request.max_new_tokens, itemsize,
                                       chat, request.system)], device=device)
        model = load_checkpoint(checkpoint, torch_dtype, device)
    skipped = ignored(config)
    if skipped:
        note(f"note: {where} also sets {', '.join(skipped)}, which lmconvert's generate does not apply "
             "(transformers' would)")
    asked = (request.temperature, request.top_k, request.top_p) != (None, None, None)
    idle = [] if asked else unused(config, sampling)
    if idle:
        why = "temperature 0" if config.get("do_sample") else "not do_sample"
        note(f"note: {where} sets {', '.join(idle)} but {why}: greedy, as transformers' generate; "
             "give --temperature, --top-k or --top-p to sample")
    started(chat)
    stream = TextStream(tokenizer, write)
    times = [time.perf_counter()]

    def on_token(token: torch.Tensor) -> None:
        times.append(time.perf_counter())
        stream.put(int(token[0, 0]))

    if request.seed is not None:
        torch.manual_seed(request.seed)  # torch's global RNG, which transformers' sampling draws from
    model.generate(ids, request.max_new_tokens, eos_token_id=eos, choose=chooser(sampling), on_token=on_token)
    text = stream.end()
    end = times[-1] if len(times) > 1 else time.perf_counter()
    first = times[1] if len(times) > 1 else end
    how = sampling.describe() + (f", seed {request.seed}" if request.seed is not None and sampling.do_sample else "")
    return Generated(text, ids.shape[1], len(times) - 1, first - times[0], end - first, how)
