"""What every format reader returns: an HF config dict and tensors under HF names.

The family mapping takes it from there (`checkpoint.py`), so a new format is one reader and never
a new code path through the families. A reader also says how transformers loads the same files
(the reference for parity) and where their tokenizer is, so nobody above asks which format it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .checkpoint_files import sidecar_files
from .dtypes import DTYPES, of_torch

if TYPE_CHECKING:
    import torch

    from .canonical import CanonicalMeta

# files whose presence means transformers' AutoTokenizer can load the directory
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "tokenizer.tiktoken")

CANNOT_LOAD_META = ("Meta's format (params.json + consolidated.*.pth), which transformers cannot load; "
                    "pass --reference HF_DIR holding the same model in HF layout")


class TensorReader(Protocol):
    """Tensors by HF name, each read only when asked for."""

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def get(self, name: str) -> torch.Tensor: ...

    def where(self, name: str) -> Path: ...  # the file that holds the tensor, for error messages

    def close(self) -> None: ...


class LastRead:
    """A reader that keeps the last tensor it read, for plans that read one stored tensor several
    times (transformers 5's fused experts give every expert's weights): each is read once while its
    readers follow one another, and memory holds one stored tensor more, never more. Reads go one
    at a time (threads wanting the same tensor wait for it rather than read it again)."""

    def __init__(self, reader: TensorReader) -> None:
        import threading

        self.reader = reader
        self._lock = threading.Lock()
        self._last: tuple[str | None, Any] = (None, None)

    def get(self, name: str) -> torch.Tensor:
        with self._lock:
            if self._last[0] != name:
                self._last = (None, None)  # let the previous one go before reading the next
                self._last = (name, self.reader.get(name))
            return self._last[1]

    def __getattr__(self, attr: str) -> Any:  # names, shape, where, raw_location... are the reader's
        return getattr(self.reader, attr)


@dataclass(frozen=True)
class Loadable:
    """How transformers' `from_pretrained` loads some files: a directory and keyword arguments
    (GGUF's `gguf_file=`), or the reason it cannot (`refusal`, a sentence for the user)."""
    where: Path | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    refusal: str | None = None
    origin: Path | None = None  # the path as the user knows it (the .gguf file itself), for reports
    # the file's own weights, dequantized, written out in the family's HF layout for transformers to
    # load (verify builds that directory): the reference of a quantized GGUF file transformers cannot read,
    # whose float source differs from it by the quantization error
    dequantized: bool = False

    def __str__(self) -> str:
        return str(self.origin or self.where)


def directory_tokenizer(path: Path) -> Loadable | None:
    """The tokenizer files of a directory, which transformers reads: each checked to lie inside it."""
    if not path.is_dir():
        return None
    return Loadable(path) if any(p.name in TOKENIZER_FILES for p in sidecar_files(path)) else None


@dataclass
class Source:
    path: Path
    format: str
    config: dict[str, Any]
    tensors: TensorReader
    info: dict[str, Any] = field(default_factory=dict)  # recorded in lmconvert.json's "source"
    sidecars: Callable[[Path], list[str]] | None = None  # writes tokenizer/generation files into a dir
    reference: Loadable | None = None  # None: transformers loads `path` as it is
    tokenizer: Loadable | None = None  # None: the tokenizer files in `path`, if any
    canonical: CanonicalMeta | None = None  # lmconvert.json, for a canonical directory

    def __post_init__(self) -> None:
        if self.reference is None:
            self.reference = Loadable(self.path)
        if self.tokenizer is None:
            self.tokenizer = directory_tokenizer(self.path)

    def close(self) -> None:
        self.tensors.close()


def dtype_name(reader: TensorReader, name: str) -> str:
    """A tensor's dtype as safetensors names it: from the file where the reader knows it (no torch
    needed), else from the reader's torch dtype."""
    if hasattr(reader, "dtype_name"):
        return reader.dtype_name(name)
    dtype = getattr(reader, "dtype", None)
    return of_torch(dtype(name) if dtype is not None else reader.get(name).dtype).name


def stored_type(reader: TensorReader, name: str) -> str:
    """A tensor's type as its file stores it, in the words its users know: a GGUF tensor's ggml type
    (Q8_0, F16, ...; the reader hands it over dequantized), else torch's dtype name (bfloat16, ...)."""
    own = getattr(reader, "stored_type", None)
    return own(name) if own is not None else DTYPES[dtype_name(reader, name)].torch_name
