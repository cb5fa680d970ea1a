"""The tokenizer a GGUF file describes, rebuilt from its own metadata with the `tokenizers` library,
as llama.cpp's tokenizer reads that metadata (llama.cpp's src/llama-vocab.cpp):
- `tokenizer.ggml.model` "llama" (SentencePiece): spaces written as U+2581, one more in front of
  the text unless `tokenizer.ggml.add_space_prefix` says false (llama.cpp's default is true), then
  the pieces merged best score first (`tokenizer.ggml.scores`), bytes for a character no piece
  holds (`<0xXX>` tokens). The space in front is put as transformers' SentencePiece tokenizers put
  it (Metaspace, prepend_scheme "first": not before a text that starts with a space, nor after a
  special token), where llama.cpp always puts one: the HF tokenizer is the reference;
- "gpt2" with the SentencePiece-shaped pre-tokenizers ("gemma4", "sarvam-moe") and "gemma4":
  the same spaces, the text cut at runs of newlines, then the file's own merges
  (`tokenizer.ggml.merges`) over raw UTF-8 with byte fallback. This is the layout llama.cpp's
  converter writes for a Gemma 3 checkpoint without `tokenizer.model` (a byte-level vocabulary
  builder, such as transformers' GGUF tokenizer builder, fails on it);
- in both, control tokens (type 3) are special and user-defined ones (type 4) are matched whole
  in the raw text, as llama.cpp matches them; BOS and EOS are added as `add_bos_token` and
  `add_eos_token` say.
Byte-level BPE ("gpt2" with a GPT-2-style pre-tokenizer) is left to transformers' builder, which
holds the split regexes of llama.cpp's pre-tokenizers; anything else is `Unbuildable`, with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPACE = "\u2581"  # SentencePiece's visible space
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # gguf.TokenType
SPM_SHAPED_PRE = ("gemma4", "sarvam-moe")  # llama.cpp's BPE pre-tokenizers that escape spaces, no byte encoding
TOKEN_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
              "pad_token": "padding_token_id", "sep_token": "seperator_token_id", "mask_token": "mask_token_id"}


class Unbuildable(Exception):
    """The file's tokenizer is one this module does not rebuild; the message says why."""


def kind_of(meta: dict[str, Any]) -> str | None:
    """"spm" or "spm-bpe" for the layouts rebuilt here; None for those left to transformers."""
    model, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "default")
    if model == "llama":
        return "spm"
    if model == "gemma4" or (model == "gpt2" and pre in SPM_SHAPED_PRE):
        return "spm-bpe"
    return None


def _array(meta: dict[str, Any], key: str, kind: type, required: bool = True) -> list[Any] | None:
    value = meta.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise Unbuildable(f"{key} is missing or not an array of {kind.__name__}")
    return value


def _vocabulary(tokens: list[str]) -> dict[str, int]:
    """Text -> id; a text listed twice keeps its last id, as llama.cpp's `token_to_id` does."""
    return {text: i for i, text in enumerate(tokens)}


def _spm_merges(tokens: list[str], scores: list[float], types: list[int],
                vocab: dict[str, int]) -> list[tuple[str, str]]:
    """SentencePiece's merges, as llama.cpp's SPM tokenizer applies them: any two adjacent pieces
    whose text together is a token merge, the token with the best score first."""
    ranked = []
    for i, text in enumerate(tokens):
        if types[i] in (CONTROL, BYTE, UNKNOWN) or vocab.get(text) != i:
            continue
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, vocab[left], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _file_merges(meta: dict[str, Any], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The file's merges, cut as llama.cpp cuts them (at the first space after the first
    character); a merge whose parts or result the vocabulary lacks cannot fire and is left out."""
    merges = []
    for line in _array(meta, "tokenizer.ggml.merges", str) or []:
        cut = line.find(" ", 1)
        if cut < 0:
            continue
        left, right = line[:cut], line[cut + 1:]
        if left in vocab and right in vocab and left + right in vocab:
            merges.append((left, right))
    return merges


def _backend(meta: dict[str, Any], kind: str) -> Any:  # noqa: ANN401 - tokenizers.Tokenizer
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokens = _array(meta, "tokenizer.ggml.tokens", str)
    assert tokens is not None
    types = _array(meta, "tokenizer.ggml.token_type", int, required=False) or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise Unbuildable(f"{len(tokens)} tokens but {len(types)} token types")
    vocab = _vocabulary(tokens)
    if kind == "spm":
        scores = _array(meta, "tokenizer.ggml.scores", float, required=False)
        if scores is None or len(scores) != len(tokens):
            raise Unbuildable("a SentencePiece vocabulary needs one score per token (tokenizer.ggml.scores)")
        merges = _spm_merges(tokens, scores, types, vocab)
        prefix = meta.get("tokenizer.ggml.add_space_prefix", True) is not False
    else:
        merges, prefix = _file_merges(meta, vocab), False
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    unk_token = tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None
    bytes_held = all(f"<0x{b:02X}>" in vocab for b in range(256))  # typed BYTE by SentencePiece, NORMAL by BPE
    model = models.BPE(vocab=vocab, merges=merges, unk_token=unk_token, fuse_unk=True, byte_fallback=bytes_held,
                       dropout=None)
    backend = Tokenizer(model)
    if prefix:  # as transformers' SentencePiece tokenizers: spaces escaped, one in front of the text
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
    else:
        backend.normalizer = normalizers.Replace(" ", SPACE)
    if kind == "spm-bpe":  # llama.cpp's "[^\n]+|[\n]+"
        backend.pre_tokenizer = pre_tokenizers.Split(Regex("\n+"), behavior="isolated")
    after = [decoders.Strip(" ", 1, 0)] if prefix else []
    backend.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                         *after])
    added = [AddedToken(text, special=types[i] == CONTROL, normalized=False)
             for i, text in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED) and vocab[text] == i]
    backend.add_tokens(added)
    return backend


def build(meta: dict[str, Any]) -> Any:  # noqa: ANN401 - transformers' PreTrainedTokenizerFast
    """The tokenizer of the file whose full metadata (arrays decoded) is `meta`."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    kind = kind_of(meta)
    if kind is None:
        raise Unbuildable(f"tokenizer.ggml.model {meta.get('tokenizer.ggml.model')!r} with pre-tokenizer "
                          f"{meta.get('tokenizer.ggml.pre', 'default')!r} is not a layout lmconvert rebuilds")
    try:
        backend = _backend(meta, kind)
    except Unbuildable:
        raise
    except Exception as exc:  # noqa: BLE001 - what the tokenizers library refuses in the file's values
        said = str(exc).strip().replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")[:200]
        raise Unbuildable(said or type(exc).__name__) from None
    tokens = meta["tokenizer.ggml.tokens"]
    named, ids = {}, {}
    for name, key in TOKEN_KEYS.items():
        i = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(tokens):
            named[name], ids[name] = tokens[i], i
    # llama.cpp's defaults: BOS for SentencePiece and for the gemma4 pre-tokenizer, none for other BPE
    add_bos = meta.get("tokenizer.ggml.add_bos_token", True) is True and "bos_token" in named
    add_eos = meta.get("tokenizer.ggml.add_eos_token", False) is True and "eos_token" in named
    single = ["$A"]
    if add_bos:
        single.insert(0, named["bos_token"])
    if add_eos:
        single.append(named["eos_token"])
    specials = [(named[n], ids[n]) for n, on in (("bos_token", add_bos), ("eos_token", add_eos)) if on]
    pair = single + [t if t != "$A" else "$B" for t in single]
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    extra: dict[str, Any] = {}
    if isinstance(meta.get("tokenizer.chat_template"), str):
        extra["chat_template"] = meta["tokenizer.chat_template"]
    return PreTrainedTokenizerFast(tokenizer_object=backend, add_bos_token=add_bos, add_eos_token=add_eos,
                                   **named, **extra)


def full_metadata(path: Path) -> dict[str, Any]:
    """Every key of the file's header, the tokenizer's arrays decoded (bounded by the file's size)."""
    from .errors import InputError
    from .gguf_header import read_header

    try:
        return read_header(path).meta
    except InputError as exc:  # a token that is not UTF-8, say: the weights may still convert
        raise Unbuildable(str(exc)) from None
