"""A checkpoint in any input format, seen through its family's mapping: canonical tensors, streamed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmconvert.arch import ArchConfig
from lmconvert.arch.shapes import parameter_shapes
from lmconvert.mappings import Family, MappingError, family_for
from lmconvert.mappings.table import Transform, out_shape

from .dtypes import parse_cast, torch_dtype
from .errors import InputError
from .sources import Source, open_source
from .weight_index import read_json_object

if TYPE_CHECKING:
    import torch


def parse_dtype(name: str | None) -> torch.dtype | None:
    cast = parse_cast(name)
    return None if cast is None else torch_dtype(cast)


def read_config(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory; point at a checkpoint directory")
    if not (directory / "config.json").is_file():
        raise InputError(f"{directory}: no config.json; point at an HF checkpoint or a canonical directory")
    return read_json_object(directory / "config.json")


@dataclass
class HfCheckpoint:
    source: Source
    family: Family
    arch: ArchConfig
    plan: dict[str, tuple[str, Transform]]  # canonical -> (hf name, transform)
    dropped: list[str]

    @property
    def config(self) -> dict[str, Any]:
        return self.source.config

    @classmethod
    def open(cls, path: Path) -> HfCheckpoint:
        source = open_source(path)
        try:
            return cls._map(source)
        except BaseException:
            source.close()
            raise

    @classmethod
    def _map(cls, source: Source) -> HfCheckpoint:
        config_file = source.path / "config.json" if source.path.is_dir() else source.path
        try:
            family = family_for(source.config.get("model_type"))
            arch = family.arch_config(source.config)
        except MappingError as exc:
            raise InputError(f"{config_file}: {str(exc).removeprefix('config.json: ')}") from None
        shapes = parameter_shapes(arch)  # what the decoder needs, without building it or importing torch
        try:
            plan, dropped = family.tensors.plan_import(source.tensors.names(), shapes)
        except MappingError as exc:
            raise InputError(f"{source.path}: {exc}") from None
        checkpoint = cls(source, family, arch, plan, dropped)
        checkpoint._check_shapes(shapes)
        return checkpoint

    def _check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        for canonical, (hf_name, transform) in self.plan.items():
            shape = self.source.tensors.shape(hf_name)
            got = out_shape(transform.forward, shape)
            if got != shapes[canonical]:
                raise InputError(f"{self.source.tensors.where(hf_name)}: tensor {hf_name!r} has shape {list(shape)}, "
                                 f"but config.json implies {list(shapes[canonical])}; check that they match")

    def tensors(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Canonical (name, tensor) pairs, one at a time, in the source's order."""
        for canonical, (hf_name, transform) in self.plan.items():
            t = transform.forward(self.source.tensors.get(hf_name))
            yield canonical, t if dtype is None else t.to(dtype)

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> HfCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
