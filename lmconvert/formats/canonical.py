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

from .digest import HASH, HASHES
from .errors import InputError
from .jsonfile import read_json_object

META_FILE = "lmconvert.json"
FORMAT = "lmconvert-canonical"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: sha256 throughout, and whole-file sums for the shards
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
    try:
        arch = ArchConfig.from_dict(data["arch"])
        algorithm = data.get("hash", "sha256")  # format 1 had one algorithm and did not name it
        if algorithm not in HASHES:
            raise InputError(f"{file}: digest algorithm {algorithm!r} is not one of {', '.join(HASHES)}; "
                             "upgrade lmconvert")
        return CanonicalMeta(arch=arch, family=data["family"], dtype=data["dtype"],
                             source=data.get("source", {}), hf_extras=data.get("hf_extras", {}), hash=algorithm,
                             tensors=data.get("tensors", {}), files=data.get("files", {}),
                             shards=data.get("shards", {}))
    except (KeyError, TypeError, ConfigError) as exc:
        raise InputError(f"{file}: invalid description ({exc})") from None


def copy_sidecars(src: Path, dst: Path) -> list[str]:
    copied = []
    for item in sorted(src.iterdir()):
        if item.is_file() and any(fnmatch(item.name, p) for p in SIDECAR_PATTERNS):
            shutil.copy2(item, dst / item.name)
            copied.append(item.name)
    return copied

