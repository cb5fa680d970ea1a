"""One way to open a checkpoint, whatever its format: `open_checkpoint(path)`.

The format is detected here and nowhere else. What comes back knows its family and ArchConfig, its
tensors under canonical names (each read only when asked for), its tokenizer and side files, and
how transformers loads the same model as a reference, so callers never ask which format it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from importlib import import_module
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmconvert.arch import ArchConfig
from lmconvert.arch.shapes import parameter_shapes
from lmconvert.mappings import Family, MappingError, family_for, family_named
from lmconvert.mappings.family import tensor_sizes
from lmconvert.mappings.tables.table import IDENTITY, Transform, out_shape

from .canonical import META_FILE, CanonicalMeta, copy_sidecars, is_canonical, read_meta
from .claims import check_layer_claim, layers_held
from .dtypes import DTYPES, dominant
from .errors import InputError
from .hf import is_hf_safetensors, open_hf_safetensors
from .quantized import quantized_view
from .safetensors_dir import TensorSource
from .source import CANNOT_LOAD_META, LastRead, Loadable, Source, TensorReader, dtype_name, stored_type

if TYPE_CHECKING:
    import torch

Source_ = str | tuple[str, ...]  # a stored name, or the rows of one joined tensor


def _late(module: str, name: str) -> Callable[[Path], Any]:
    """A format module's function, imported on first call: those modules load torch (or gguf),
    which an HF safetensors conversion never needs."""
    def call(path: Path) -> Any:
        return getattr(import_module(f".{module}", __package__), name)(path)
    return call


def open_canonical(path: Path) -> Source:
    """A canonical directory as a format among the others: its tensors already carry canonical names
    (a quantized one's, seen through the same view as its source's: `quantized.py`)."""
    meta = read_meta(path)
    tensors = TensorSource(path)
    if not meta.quantization:
        return Source(path, "canonical", {}, tensors, canonical=meta)
    try:
        read, _ = quantized_view({"quantization_config": meta.quantization}, path / META_FILE, tensors, canonical=True)
    except BaseException:
        tensors.close()
        raise
    return Source(path, "canonical", {}, read, canonical=meta)


# (format name, detector, opener): the first detector that accepts the path wins
FORMATS: list[tuple[str, Callable[[Path], bool], Callable[[Path], Source]]] = [
    ("canonical", is_canonical, open_canonical),
    ("hf-safetensors", is_hf_safetensors, open_hf_safetensors),
    # after safetensors: preferred when a directory has both
    ("hf-bin", _late("torch_bin", "is_hf_bin"), _late("torch_bin", "open_hf_bin")),
    ("meta", _late("meta", "is_meta"), _late("meta", "open_meta")),
    ("gguf", _late("gguf", "is_gguf"), _late("gguf", "open_gguf")),  # a .gguf file, or a directory holding one
]


def open_source(path: Path) -> Source:
    """The format's own view (HF config and HF tensor names), before any family mapping."""
    if not path.exists():
        raise InputError(f"{path}: does not exist; give the path of a checkpoint directory or of a .gguf file")
    for _, detect, opener in FORMATS:
        if detect(path):
            return opener(path)
    names = ", ".join(name for name, _, _ in FORMATS)
    if path.is_dir() and (path / "config.json").is_file():
        raise InputError(f"{path}: has config.json but no weights in a supported format ({names})")
    raise InputError(f"{path}: not a checkpoint in a supported format ({names}); "
                     "point at an HF directory with config.json and weights")


@dataclass
class Checkpoint:
    source: Source
    family: Family
    arch: ArchConfig
    plan: dict[str, tuple[Source_, Transform]]  # canonical name -> (name in the source, transform); a tuple
    #   of names: one tensor stored as one per row (StableLM's per-head LayerNorms), the transform stacks them
    dropped: list[str]  # source tensors the family does not use (rotary caches and the like)
    _shared: LastRead | None = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        return self.source.path

    @property
    def format(self) -> str:
        return self.source.format

    @property
    def config(self) -> dict[str, Any]:
        return self.source.config

    @property
    def note(self) -> str:
        """What the family says of a checkpoint of its source's model_type (a wrapper's towers left out)."""
        model_type = self.meta.source.get("model_type") if self.meta is not None else self.config.get("model_type")
        return self.family.note_for(model_type)

    @property
    def meta(self) -> CanonicalMeta | None:
        """lmconvert.json, for a canonical checkpoint."""
        return self.source.canonical

    @property
    def reader(self) -> TensorReader:
        """The source's tensors, read through a one-tensor memory when the plan reads some stored
        tensor more than once (fused experts), so that each is read once, not once per expert."""
        sources = [name for name, _ in self.plan.values()]  # rows of a joined tensor: each read once anyway
        if len(set(sources)) == len(sources):
            return self.source.tensors
        if self._shared is None:
            self._shared = LastRead(self.source.tensors)
        return self._shared

    def tensors(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Canonical (name, tensor) pairs, one at a time, in the source's order."""
        reader = self.reader
        for canonical, (name, transform) in self.plan.items():
            t = transform.forward(_get(reader, name))
            yield canonical, t if dtype is None else t.to(dtype)

    def shape(self, canonical: str) -> tuple[int, ...]:
        """A canonical tensor's shape, from the files' headers: nothing is read."""
        name, transform = self.plan[canonical]
        tensors = self.source.tensors
        return out_shape(transform.forward, [tensors.shape(one) for one in name] if isinstance(name, tuple)
                         else tensors.shape(name))

    def stored_type(self, canonical: str) -> str:
        """The type a canonical tensor is stored as (`source.stored_type`); for one joined from rows,
        the first row's (`_check_shapes` holds them all to float types)."""
        return stored_type(self.source.tensors, _names(self.plan[canonical][0])[0])

    def stored_names(self, canonical: str) -> tuple[str, ...]:
        """The source's tensor(s) a canonical tensor is read from."""
        return _names(self.plan[canonical][0])

    def tensor(self, canonical: str, reader: TensorReader | None = None) -> torch.Tensor:
        """One canonical tensor, read (and dequantized) now, through `reader` if given (one that
        wraps the source's tensors, to keep some of them for later reads)."""
        name, transform = self.plan[canonical]
        return transform.forward(_get(reader or self.reader, name))

    def weights(self) -> dict[str, Callable[[], torch.Tensor]]:
        """A reader per canonical tensor, for loading one stage at a time."""
        return {c: partial(self._read, name, t.forward) for c, (name, t) in self.plan.items()}

    def _read(self, name: str, forward: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return forward(_get(self.reader, name))

    def dtype(self) -> str:
        """The model's dtype (torch's name), as config.json means it: recorded for a canonical
        checkpoint, else the float dtype holding most of the stored bytes (for GGUF, what its
        tensors dequantize to)."""
        if self.meta is not None:
            return self.meta.dtype
        sized = []
        for name, _ in self.plan.values():
            for one in _names(name):
                stored = dtype_name(self.source.tensors, one)
                sized.append((stored, prod(self.source.tensors.shape(one)) * DTYPES[stored].itemsize))
        return DTYPES[dominant(sized)].torch_name

    def reference(self) -> Loadable:
        """How transformers loads this model: the files themselves, or for a canonical checkpoint
        the source it was converted from, as lmconvert.json records it."""
        if self.meta is None:
            assert self.source.reference is not None
            return self.source.reference
        recorded = self.meta.source.get("path")
        if self.meta.source.get("format") == "meta":
            return Loadable(None, refusal=f"{self.path}: was converted from {CANNOT_LOAD_META}")
        if not recorded or not Path(recorded).exists():  # a directory, or a single-file format such as GGUF
            return Loadable(None, refusal=f"{self.path}: the recorded source {recorded!r} is not available; "
                                          "pass --reference SRC")
        with open_checkpoint(Path(recorded)) as source:
            return source.reference()

    @property
    def tokenizer(self) -> Loadable | None:
        """Where transformers' AutoTokenizer finds this checkpoint's tokenizer, if it has one."""
        return self.source.tokenizer

    def write_sidecars(self, directory: Path) -> list[str]:
        """The tokenizer and generation files, written beside converted weights."""
        if self.source.sidecars is not None:
            return self.source.sidecars(directory)
        return copy_sidecars(self.path if self.path.is_dir() else self.path.parent, directory)

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_checkpoint(path: Path) -> Checkpoint:
    """Any supported checkpoint, mapped onto the canonical decoder by its family's tensor table."""
    return checkpoint_of(open_source(path))


def checkpoint_of(source: Source) -> Checkpoint:
    """A source (a format's view, or one built from headers fetched over HTTP) mapped onto the
    canonical decoder; the source is closed if that fails."""
    try:
        return _map(source)
    except BaseException:
        source.close()
        raise


def _map(source: Source) -> Checkpoint:
    config_file = source.path / "config.json" if source.path.is_dir() else source.path
    names = source.tensors.names()
    held = layers_held(names)
    described_by, key = (META_FILE, "arch.n_layers") if source.canonical is not None else \
        ("config.json", "num_hidden_layers")
    try:
        if source.canonical is not None:
            family, arch = family_named(source.canonical.family), source.canonical.arch
        else:
            family = family_for(source.config.get("model_type"), source.config)
            # before the ArchConfig, whose per-layer tables grow with what the config claims
            check_layer_claim(source.config.get(key), held, source.path, described_by, key)
            arch = own_head(family, family.arch_config(source.config), names)
    except MappingError as exc:
        raise InputError(f"{config_file}: {str(exc).removeprefix('config.json: ')}") from None
    check_layer_claim(arch.n_layers, held, source.path, described_by, key)  # as the family read it
    shapes = parameter_shapes(arch)  # what the decoder needs, without building it or importing torch
    if source.canonical is not None:
        missing = sorted(set(shapes) - set(names))
        if missing:
            raise InputError(f"{source.path}: checkpoint lacks tensor(s): {', '.join(missing[:5])}")
        plan = {name: (name, IDENTITY) for name in names}
        dropped: list[str] = []
    else:
        try:
            plan, dropped = family.tensors_for(arch).plan_import(names, shapes, tensor_sizes(arch))
        except MappingError as exc:
            raise InputError(f"{source.path}: {exc}") from None
    checkpoint = Checkpoint(source, family, arch, plan, dropped)
    _check_shapes(checkpoint, shapes)
    return checkpoint


def own_head(family: Family, arch: ArchConfig, names: list[str]) -> ArchConfig:
    """The config as transformers 5 loads it against these tensors: it ties the LM head to the
    embeddings only when the file holds no head of its own, and keeps a stored head whose values
    differ (Mistral Small 3.x as published: Mistral3Config ties by default, the file holds
    `language_model.lm_head.weight`). So a tying config with a stored head is read untied; where
    the two are equal, the numbers are the same either way."""
    if not arch.tie_embeddings:
        return arch
    heads = set(family.tensors_for(arch).stored_names("lm_head.weight"))
    return replace(arch, tie_embeddings=False) if heads & set(names) else arch


# what the decoder computes with: every tensor it reads is a float parameter (embeddings, norms,
# projections), so an integer, bool or float8 (quantized, its scales elsewhere) tensor is wrong
PARAMETER_DTYPES = ("F64", "F32", "F16", "BF16")


def _check_shapes(checkpoint: Checkpoint, shapes: dict[str, tuple[int, ...]]) -> None:
    """Every tensor the decoder reads, in the shape the config implies and a float dtype."""
    tensors = checkpoint.source.tensors
    for canonical, (names, transform) in checkpoint.plan.items():
        for name in _names(names):
            stored = dtype_name(tensors, name)
            if stored not in PARAMETER_DTYPES:
                raise InputError(f"{tensors.where(name)}: tensor {name!r} is {DTYPES[stored].torch_name}, but the "
                                 "decoder uses it as a float parameter; re-export the checkpoint with float16, "
                                 "bfloat16, float32 or float64 weights")
        first = _names(names)[0]
        shape = [tensors.shape(name) for name in names] if isinstance(names, tuple) else tensors.shape(names)
        if isinstance(names, tuple) and not transform.gathers and len(set(shape)) > 1:  # rows torch.stack cannot join
            odd = next(name for name, one in zip(names, shape, strict=True) if one != shape[0])
            raise InputError(f"{tensors.where(odd)}: tensor {odd!r} has shape {list(tensors.shape(odd))}, but "
                             f"{first!r}, another row of {canonical}, has {list(shape[0])}; the checkpoint is "
                             "inconsistent")
        got = out_shape(transform.forward, shape)
        if canonical in shapes and got != shapes[canonical]:
            what = f"(and {len(names) - 1} more rows of {canonical}) " if isinstance(names, tuple) else ""
            raise InputError(f"{tensors.where(first)}: tensor {first!r} {what}has shape {list(tensors.shape(first))}, "
                             f"but config.json implies {list(shapes[canonical])}; check that they match")


def _names(name: Source_) -> tuple[str, ...]:
    return name if isinstance(name, tuple) else (name,)


def _get(reader: TensorReader, name: Source_) -> torch.Tensor | list[torch.Tensor]:
    """The stored tensor, or the rows of a joined one, in order."""
    return [reader.get(one) for one in name] if isinstance(name, tuple) else reader.get(name)


@contextmanager
def opened(src: Path | Checkpoint) -> Iterator[Checkpoint]:
    """A path, opened here and closed after, or a checkpoint the caller opened and will close."""
    if isinstance(src, Checkpoint):
        yield src
        return
    with open_checkpoint(src) as checkpoint:
        yield checkpoint
