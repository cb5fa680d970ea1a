"""A checkpoint's tokenizer through transformers, wherever its format keeps it (tokenizer files in
a directory, or the metadata of a GGUF file): the checkpoint says where (`Checkpoint.tokenizer`).

Whatever is wrong with the files ends in one InputError line: the JSON files are read first
through lmconvert's own reader (so nesting, encoding and structure fail as every JSON input does);
transformers is told never to run the checkpoint's code (left to itself it asks on a terminal), and
what it raises is cut to one line: for a tokenizer that needs custom code (`auto_map`) a sentence
that says so, for anything else its first line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmconvert.formats import schema
from lmconvert.formats.errors import InputError
from lmconvert.formats.jsonfile import read_json_object
from lmconvert.formats.source import Loadable

# the tokenizer files that are JSON, and the structure transformers needs of each
JSON_FILES = {
    "tokenizer.json": schema.Object(required={"model": schema.Object(required={"type": schema.String()})},
                                    optional={"added_tokens": schema.Array(schema.Object(
                                        required={"id": schema.COUNT, "content": schema.String()}))}),
    "tokenizer_config.json": schema.Object(),
    "special_tokens_map.json": schema.Object(),
    "added_tokens.json": schema.MapOf(schema.COUNT),
}


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(exc).__name__


def check_files(directory: Path) -> bool:
    """The JSON tokenizer files in `directory`, read and checked before transformers sees them;
    whether tokenizer_config.json names custom code (`auto_map`)."""
    custom = False
    for name, spec in JSON_FILES.items():
        path = directory / name
        if path.exists():
            data = read_json_object(path, name)
            schema.validate(data, spec, str(path), "re-download the tokenizer files")
            custom = custom or (name == "tokenizer_config.json" and "auto_map" in data)
    return custom


def gguf_tokenizer(path: Path) -> Any:  # noqa: ANN401 - transformers' tokenizer classes
    """The tokenizer a GGUF file's metadata describes, built as `convert` builds it."""
    from lmconvert.formats.gguf import HUGE_ARRAYS, build_tokenizer
    from lmconvert.formats.gguf_header import read_header
    from lmconvert.formats.gguf_vocab import Unbuildable

    try:
        header = read_header(path, counted=HUGE_ARRAYS)
        return build_tokenizer(path, header.meta, header.counts.get("tokenizer.ggml.tokens", 0))[0]
    except Unbuildable as exc:
        raise InputError(f"{path}: its tokenizer cannot be rebuilt ({exc}); convert it and put the original "
                         "model's tokenizer files beside the output") from None


def load_tokenizer(where: Loadable) -> Any:  # noqa: ANN401 - transformers' tokenizer classes
    from transformers import AutoTokenizer

    if "gguf_file" in where.kwargs:
        return gguf_tokenizer(Path(str(where.where)) / where.kwargs["gguf_file"])

    directory = Path(str(where.where))
    custom = check_files(directory) if directory.is_dir() and not where.kwargs else False
    try:  # never asks on a terminal whether to run the checkpoint's code: it never does
        return AutoTokenizer.from_pretrained(str(where.where), trust_remote_code=False, **where.kwargs)
    except Exception as exc:  # noqa: BLE001 - transformers and tokenizers raise anything on bad files
        if custom:
            raise InputError(f"{directory / 'tokenizer_config.json'}: the tokenizer needs custom code (auto_map), "
                             "which lmconvert never runs; use a checkpoint whose tokenizer transformers loads "
                             "without it") from None
        raise InputError(f"{where}: its tokenizer cannot be loaded ({_first_line(exc)}); "
                         "re-download the tokenizer files") from None
