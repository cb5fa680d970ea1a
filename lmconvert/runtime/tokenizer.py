"""A checkpoint's tokenizer through transformers, wherever its format keeps it (tokenizer files in
a directory, or the metadata of a GGUF file): the checkpoint says where (`Checkpoint.tokenizer`)."""

from __future__ import annotations

from typing import Any

from lmconvert.formats.source import Loadable


def load_tokenizer(where: Loadable) -> Any:  # noqa: ANN401 - transformers' tokenizer classes
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(where.where), **where.kwargs)
