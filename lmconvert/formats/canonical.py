"""The canonical checkpoint on disk: lmconvert.json (ArchConfig, family, source, hashes),
safetensors shards with canonical tensor names, and the source's tokenizer files unchanged."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from lmconvert.arch import ArchConfig, ConfigError

from . import schema
from .claims import check_layer_claim
from .digest import HASH, HASHES
from .dtypes import DTYPES
from .errors import InputError
from .jsonfile import read_json_object
from .safetensors_dir import TensorSource
from .source import Source

META_FILE = "lmconvert.json"
FORMAT = "lmconvert-canonical"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: sha256 throughout, and whole-file sums for the shards
FLOAT_DTYPES = tuple(d.torch_name for d in DTYPES.values() if d.nonfinite is not None)  # what "dtype" may say
# files that travel unchanged with the weights
SIDECAR_PATTERNS = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
                    "generation_config.json", "chat_template*", "*.tiktoken", "spiece.model")


@dataclass
class CanonicalMeta:
    arch: ArchConfig
    family: str
    dtype: str
    source: dict[str, Any] = field(default_factory=dict)
    hf_extras: dict[str, Any] = field(default_factory=dict)
    hash: str = HASH  # the digest algorithm of the three maps below
    tensors: dict[str, str] = field(default_factory=dict)  # name -> digest of its bytes
    files: dict[str, str] = field(default_factory=dict)  # file -> digest (every file but the shards)
    # shard file -> {"header": digest, "bytes": size}: with the tensors' digests these cover every
    # byte of a shard, so each byte is hashed once while converting instead of twice
    shards: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> str:
        data = {"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(self)}
        data["arch"] = self.arch.to_dict()
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def is_canonical(path: Path) -> bool:
    return (path / META_FILE).is_file()


# What read_meta accepts: lmconvert.json as lmconvert writes it (format_version is checked first,
# so that a newer file says "upgrade" rather than naming a key it does not know). `arch` is
# ArchConfig's to check, once its layer count is known to fit the tensors listed.
DESCRIPTION = schema.Object(
    required={"arch": schema.Object(required={"n_layers": schema.POSITIVE_INT}), "family": schema.String(),
              "dtype": schema.String(FLOAT_DTYPES)},
    optional={"hash": schema.String(tuple(HASHES)),
              "source": schema.Object(optional={"path": schema.Nullable(schema.String()),
                                                "format": schema.String()}),
              "hf_extras": schema.MapOf(), "tensors": schema.MapOf(schema.String()),
              "files": schema.MapOf(schema.String()),
              "shards": schema.MapOf(schema.Object(required={"header": schema.String(), "bytes": schema.COUNT}))})


def read_meta(path: Path) -> CanonicalMeta:
    file = path / META_FILE
    if not file.is_file():
        raise InputError(f"{path}: not a canonical checkpoint (no {META_FILE}); convert it first")
    data = read_json_object(file)
    if data.get("format") != FORMAT:
        raise InputError(f"{file}: not an lmconvert canonical checkpoint description")
    if data.get("format_version") not in READABLE_VERSIONS:
        raise InputError(f"{file}: format_version {data.get('format_version')!r} is newer than this lmconvert "
                         f"reads ({', '.join(map(str, READABLE_VERSIONS))}); upgrade lmconvert")
    schema.validate(data, DESCRIPTION, str(file), "convert the source again")
    tensors = data.get("tensors", {})
    check_layer_claim(data["arch"]["n_layers"], tensors, path, META_FILE, "arch.n_layers")
    try:
        arch = ArchConfig.from_dict(data["arch"])
    except (TypeError, ConfigError) as exc:
        raise InputError(f"{file}: invalid description ({exc})") from None
    return CanonicalMeta(arch=arch, family=data["family"], dtype=data["dtype"], source=data.get("source", {}),
                         hf_extras=data.get("hf_extras", {}), hash=data.get("hash", "sha256"),  # format 1: sha256
                         tensors=tensors, files=data.get("files", {}), shards=data.get("shards", {}))


def copy_sidecars(src: Path, dst: Path) -> list[str]:
    copied = []
    for item in sorted(src.iterdir()):
        if item.is_file() and any(fnmatch(item.name, p) for p in SIDECAR_PATTERNS):
            shutil.copy2(item, dst / item.name)
            copied.append(item.name)
    return copied


def open_canonical(path: Path) -> Source:
    """A canonical directory as a format among the others: its tensors already carry canonical names."""
    meta = read_meta(path)
    return Source(path, "canonical", {}, TensorSource(path), canonical=meta)
