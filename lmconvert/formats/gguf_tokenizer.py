"""The tokenizer into GGUF metadata, as llama.cpp's converter puts it there, so that llama.cpp
tokenizes as transformers does:
- a SentencePiece `tokenizer.model`: `tokenizer.ggml.model` "llama", every piece with its score
  and type (normal, unknown, control, unused, byte), then the added tokens of `added_tokens.json`
  and `tokenizer_config.json` (control when special, user-defined otherwise);
- a byte-level BPE `tokenizer.json`: "gpt2", the vocabulary as transformers lists it (added
  tokens typed as above, holes as `[PAD{i}]`), the merges, and `tokenizer.ggml.pre`, the
  pre-tokenizer llama.cpp should run: named the way llama.cpp's converter names it, by hashing the
  tokenizer's ids for a fixed text (mappings/gguf_pretokenizers.py); an unknown one is refused
  unless the user names it;
- both: the special token ids, add-BOS/EOS flags and chat template, read by gguf's `SpecialVocab`.
A checkpoint without tokenizer files gets `tokenizer.ggml.model` "none", llama.cpp's no-vocabulary model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from lmconvert.mappings.gguf.pretokenizers import CHECK_TEXT, PRE_TOKENIZERS

from .errors import InputError
from .jsonfile import read_json_object

SPM, BPE = "tokenizer.model", "tokenizer.json"


def typed_values(fill: Any) -> dict[str, Any]:  # noqa: ANN401 - gguf's writer
    """What gguf's writer methods store, as typed values: `fill` calls them on a scratch writer."""
    import gguf

    writer = gguf.GGUFWriter(None, "scratch")
    fill(writer)
    return {k: v for k, v in writer.kv_data[0].items() if k != "general.architecture"}


# what llama.cpp's loader assumes where a file states no add-BOS flag (llama-vocab.cpp): a SentencePiece
# vocabulary adds BOS, a byte-level BPE one only with these pre-tokenizers; neither adds EOS
BOS_BY_DEFAULT = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                            "jina-v5-nano", "tekken", "chameleon"})


def _special(directory: Path, n_vocab: int, merges: bool, adds: dict[str, bool], default: dict[str, bool]) -> Any:  # noqa: ANN401
    """Merges, special token ids, the chat template and the add-BOS/EOS flags, as llama.cpp's
    converter reads them (gguf's `SpecialVocab`: tokenizer_config.json's flags, or tokenizer.json's
    post-processor); a flag that reads otherwise than the tokenizer behaves (`adds`), or that is
    absent where llama.cpp's default (`default`) is not how it behaves, is stated as it behaves."""
    import gguf

    special = gguf.SpecialVocab(directory, load_merges=merges, n_vocab=n_vocab)
    for kind, behaves in adds.items():
        if special.add_special_token.get(kind, default[kind]) != behaves:
            special.add_special_token[kind] = behaves
    return special


SEEM_SPECIAL = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")  # added tokens some models leave unmarked
SPECIAL_SHAPES = (("<|", "|>"), ("<\uff5c", "\uff5c>"), ("<unused", ">"))


def _looks_special(token: str) -> bool:
    """llama.cpp's `does_token_look_special`: control tokens that some models do not mark special."""
    return token in SEEM_SPECIAL or any(token.startswith(a) and token.endswith(b) for a, b in SPECIAL_SHAPES)


def _fits(where: Path, ids: int, vocab_size: int) -> None:
    """A token list longer than the embedding would be cut (ids past its rows have no vector):
    llama.cpp's converter stops on it, and so does this. A shorter one is padded with `[PAD{i}]`
    unused tokens, as llama.cpp's converter pads it (embeddings are often rounded up)."""
    if ids > vocab_size:
        raise InputError(f"{where}: the tokenizer has token ids up to {ids - 1}, past the model's {vocab_size} "
                         f"embedding rows, so GGUF would lose ids {vocab_size}-{ids - 1}; convert with the "
                         "tokenizer that belongs to this model")


def _sentencepiece(directory: Path, vocab_size: int) -> tuple[list[str], list[float], list[int]]:
    from gguf import TokenType
    from sentencepiece import SentencePieceProcessor

    sp = SentencePieceProcessor()
    sp.LoadFromFile(str(directory / SPM))
    _fits(directory / SPM, sp.vocab_size(), vocab_size)
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores, types = [-10000.0] * vocab_size, [int(TokenType.UNUSED)] * vocab_size
    for i in range(min(sp.vocab_size(), vocab_size)):
        kind = (TokenType.UNKNOWN if sp.IsUnknown(i) else TokenType.CONTROL if sp.IsControl(i) else
                TokenType.UNUSED if sp.IsUnused(i) else TokenType.BYTE if sp.IsByte(i) else TokenType.NORMAL)
        tokens[i], scores[i], types[i] = sp.IdToPiece(i), sp.GetScore(i), int(kind)
    added = directory / "added_tokens.json"
    if added.is_file():
        for text, i in read_json_object(added, "added tokens").items():
            if isinstance(i, int) and i >= 0:
                _fits(added, i + 1, vocab_size)
                tokens[i], scores[i], types[i] = text, -1000.0, int(TokenType.USER_DEFINED)
    config = directory / "tokenizer_config.json"
    decoder = read_json_object(config, "tokenizer config").get("added_tokens_decoder", {}) if config.is_file() else {}
    for key, data in decoder.items():
        if not str(key).isdigit() or not isinstance(data, dict):
            continue
        i, text = int(key), str(data.get("content", ""))
        _fits(config, i + 1, vocab_size)
        special = data.get("special") or _looks_special(text)
        kind = TokenType.CONTROL if special else TokenType.USER_DEFINED
        text = text if special else text.replace("\u2581", " ")  # user-defined spaces pre-normalized
        tokens[i], scores[i], types[i] = text, -1000.0, int(kind)
    return tokens, scores, types


def _byte_level_bpe(tokenizer: Any, vocab_size: int, where: Path) -> tuple[list[str], list[int], str]:  # noqa: ANN401
    """llama.cpp's `get_vocab_base`: the vocabulary as transformers' tokenizer lists it."""
    from gguf import TokenType
    digest = hashlib.sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
    pre = PRE_TOKENIZERS.get(digest)
    by_id = {i: text for text, i in tokenizer.get_vocab().items()}
    _fits(where, max(by_id, default=-1) + 1, vocab_size)
    added, decoder = tokenizer.get_added_vocab(), tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(int(TokenType.UNUSED))
            continue
        text = by_id[i]
        kind = TokenType.NORMAL
        if text in added:
            if not decoder[i].normalized:
                text = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
            if decoder[i].special or _looks_special(text):
                kind = TokenType.CONTROL
            else:
                text, kind = text.replace("\u2581", " "), TokenType.USER_DEFINED
        tokens.append(text)
        types.append(int(kind))
    return tokens, types, pre or digest


def _loaded(directory: Path) -> Any:  # noqa: ANN401 - transformers' tokenizer classes
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def _adds(tokenizer: Any) -> dict[str, bool]:  # noqa: ANN401
    """Whether transformers' tokenizer adds BOS and EOS around a text."""
    ids = tokenizer("a")["input_ids"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return {"bos": bos is not None and ids[:1] == [bos], "eos": eos is not None and ids[-1:] == [eos] and len(ids) > 1}


def _space_prefix(tokenizer: Any) -> bool:  # noqa: ANN401
    """Whether transformers' SentencePiece tokenizer puts a space before a text (its first piece
    begins with SentencePiece's space, U+2581); Gemma's does not."""
    pieces = tokenizer.convert_ids_to_tokens(tokenizer("a", add_special_tokens=False)["input_ids"])
    return bool(pieces) and pieces[0].startswith("\u2581")


def _bpe_kind(directory: Path) -> str | None:
    data = json.loads((directory / BPE).read_text(encoding="utf-8"))
    model = data.get("model") or {}
    return model.get("type") if isinstance(model, dict) else None


def _values(directory: Path, tokenizer: Any, model: str, pre: str, tokens: list[str], types: list[int],  # noqa: ANN401
            scores: list[float] | None, merges: bool) -> dict[str, Any]:
    default = {"bos": model == "llama" or pre in BOS_BY_DEFAULT, "eos": False}
    special = _special(directory, len(tokens), merges, _adds(tokenizer), default)
    # llama.cpp puts a space before a SentencePiece text unless told not to (llama.cpp's converter tells
    # it so for Gemma 1 to 3)
    no_prefix = model == "llama" and not _space_prefix(tokenizer)

    def fill(w: Any) -> None:  # noqa: ANN401 - gguf's writer
        w.add_tokenizer_model(model)
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        if scores is not None:
            w.add_token_scores(scores)
        w.add_token_types(types)
        special.add_to_gguf(w, quiet=True)
        if no_prefix:
            w.add_add_space_prefix(False)
    return typed_values(fill)


# the tokens llama.cpp's Gemma4Model writes user-defined whatever the tokenizer says, so that llama.cpp renders them
# (its chat parser reads them)
GEMMA4_VISIBLE = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                            "<tool_response|>", '<|"|>'})


def _gemma4(directory: Path, vocab_size: int) -> dict[str, Any]:
    """llama.cpp's Gemma4Model.set_vocab: tokenizer.json's SentencePiece-shaped BPE (byte fallback) as gguf's
    LlamaHfVocab lists it, with scores and types, `tokenizer.ggml.model` "gemma4", the merges and special tokens, no
    space prefix, BOS added. Ids past the tokenizer's up to the embedding's rows are `[PAD{i}]`, unused."""
    import gguf

    directory = Path(directory)
    try:
        vocab = gguf.LlamaHfVocab(directory)
    except (FileNotFoundError, TypeError) as exc:
        raise InputError(f"{directory / BPE}: llama.cpp's gemma4 tokenizer is a SentencePiece-shaped BPE with byte "
                         f"fallback, which this tokenizer is not ({exc}); convert with Gemma 4's own "
                         "tokenizer") from None
    tokens, scores, types = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text.decode("utf-8"))
        scores.append(score)
        types.append(int(gguf.TokenType.USER_DEFINED if tokens[-1] in GEMMA4_VISIBLE else kind))
    _fits(directory / BPE, len(tokens), vocab_size)
    for i in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{i}]")
        scores.append(-10000.0)
        types.append(int(gguf.TokenType.UNUSED))
    special = gguf.SpecialVocab(directory, load_merges=True, n_vocab=len(tokens))
    special.add_special_token["bos"] = True

    def fill(w: Any) -> None:  # noqa: ANN401 - gguf's writer
        w.add_tokenizer_model("gemma4")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        special.add_to_gguf(w, quiet=True)
        w.add_add_space_prefix(False)
    return typed_values(fill)


# tokenizer writers of llama.cpp's converter classes that write their own (GgufArch.tokenizer)
OWN_WRITERS = {"gemma4": _gemma4}


def tokenizer_values(directory: Path | None, vocab_size: int, pre: str | None = None, own: str = "") -> dict[str, Any]:
    """The tokenizer's GGUF metadata (typed values for gguf's writer); `pre` names the BPE
    pre-tokenizer when its hash is not one llama.cpp knows; `own`: the architecture's own writer
    (GgufArch.tokenizer), for tokenizer.json."""
    if directory is None or not ((directory / SPM).is_file() or (directory / BPE).is_file()):
        return typed_values(lambda w: w.add_tokenizer_model("none"))
    if own:
        return OWN_WRITERS[own](directory, vocab_size)
    if (directory / SPM).is_file():
        tokens, scores, types = _sentencepiece(directory, vocab_size)
        return _values(directory, _loaded(directory), "llama", "default", tokens, types, scores, merges=False)
    kind = _bpe_kind(directory)
    if kind != "BPE":
        raise InputError(f"{directory / BPE}: a {kind} tokenizer; lmconvert writes SentencePiece and byte-level "
                         "BPE tokenizers into GGUF")
    known = {"default", *PRE_TOKENIZERS.values()}
    if pre is not None and pre not in known:
        raise InputError(f"--gguf-pre {pre!r}: not a pre-tokenizer llama.cpp knows; choose one of "
                         f"{', '.join(sorted(known))}")
    tokenizer = _loaded(directory)
    tokens, types, found = _byte_level_bpe(tokenizer, vocab_size, directory / BPE)
    if pre is None and found not in PRE_TOKENIZERS.values():
        raise InputError(f"{directory / BPE}: its pre-tokenizer is not one llama.cpp knows (hash {found[:16]}...); "
                         "name llama.cpp's pre-tokenizer with --gguf-pre (e.g. --gguf-pre gpt-2) if you know it")
    return _values(directory, tokenizer, "gpt2", pre or found, tokens, types, None, merges=True)
