"""The canonical checkpoint on disk: lmconvert.json (ArchConfig, family, source, hashes),
safetensors shards with canonical tensor names, and the source's tokenizer files unchanged."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field, fields, replace
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from lmconvert.arch import ArchConfig, ConfigError, RopeConfig
from lmconvert.mappings import MappingError, family_named

from . import schema
from .checkpoint_files import SIDECAR_PATTERNS, checkpoint_file, inside, sidecar_files
from .claims import check_layer_claim, layers_held
from .digest import HASH, HASHES, file_digest
from .dtypes import DTYPES
from .errors import InputError, IntegrityError
from .jsonfile import read_json_object

META_FILE = "lmconvert.json"
FORMAT = "lmconvert-canonical"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: sha256 throughout, and whole-file sums for the shards
FLOAT_DTYPES = tuple(d.torch_name for d in DTYPES.values() if d.nonfinite is not None)  # what "dtype" may say


@dataclass
class CanonicalMeta:
    arch: ArchConfig
    family: str
    dtype: str
    source: dict[str, Any] = field(default_factory=dict)
    hf_extras: dict[str, Any] = field(default_factory=dict)
    # a quantized checkpoint kept as it is: config.json's quantization_config, unchanged (the tensors
    # hold each quantized weight's stored parts under its canonical name: formats/quantized.py)
    quantization: dict[str, Any] = field(default_factory=dict)
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
              "hf_extras": schema.MapOf(), "quantization": schema.MapOf(), "tensors": schema.MapOf(schema.String()),
              "files": schema.MapOf(schema.String()),
              "shards": schema.MapOf(schema.Object(required={"header": schema.String(), "bytes": schema.COUNT}))})


def read_meta(path: Path) -> CanonicalMeta:
    file = path / META_FILE
    if not file.is_file():
        raise InputError(f"{path}: not a canonical checkpoint (no {META_FILE}); convert it first")
    data = read_json_object(inside(path, file))
    if data.get("format") != FORMAT:
        raise InputError(f"{file}: not an lmconvert canonical checkpoint description")
    if data.get("format_version") not in READABLE_VERSIONS:
        raise InputError(f"{file}: format_version {data.get('format_version')!r} is newer than this lmconvert "
                         f"reads ({', '.join(map(str, READABLE_VERSIONS))}); upgrade lmconvert")
    schema.validate(data, DESCRIPTION, str(file), "convert the source again")
    tensors = data.get("tensors", {})
    check_layer_claim(data["arch"]["n_layers"], layers_held(tensors), path, META_FILE, "arch.n_layers")
    try:
        arch = predated_fields(ArchConfig.from_dict(data["arch"]), data["arch"], data["family"])
    except (TypeError, ConfigError) as exc:
        raise InputError(f"{file}: invalid description ({exc})") from None
    return CanonicalMeta(arch=arch, family=data["family"], dtype=data["dtype"], source=data.get("source", {}),
                         hf_extras=data.get("hf_extras", {}), quantization=data.get("quantization", {}),
                         hash=data.get("hash", "sha256"),  # format 1: sha256
                         tensors=tensors, files=data.get("files", {}), shards=data.get("shards", {}))


def predated_fields(arch: ArchConfig, stored: dict[str, Any], family: str) -> ArchConfig:
    """A description written before a field existed (GPT-2's `conv1d_linears`, DeepSeek-V2's
    `rope.complex_product`) gives it the value its family's config table gives it, not the field's
    default: the family's own model as it is computed now, and exportable to that family again."""
    missing = [f.name for f in fields(ArchConfig) if f.name not in stored]
    missing_rope = [f.name for f in fields(RopeConfig) if f.name not in (stored.get("rope") or {})]
    if not missing and not missing_rope:
        return arch
    try:
        own = family_named(family)
        current = own.from_hf(own.to_hf(arch))
    except (MappingError, ConfigError, TypeError, ValueError, KeyError):  # not the family's model at all
        return arch
    changes = {name: getattr(current, name) for name in missing}
    if missing_rope and "rope" not in changes:
        changes["rope"] = replace(arch.rope, **{name: getattr(current.rope, name) for name in missing_rope})
    return replace(arch, **changes)


def listed_file(path: Path, name: object) -> Path:
    """A file that the canonical checkpoint `path`'s lmconvert.json lists (its `files` or `shards`):
    a plain name inside the checkpoint, never `../x` or `/etc/passwd`."""
    return checkpoint_file(path, name, f"{META_FILE} lists")


def copy_listed(path: Path, meta: CanonicalMeta, name: str, dst: Path) -> None:
    """Copy a file lmconvert.json lists into `dst`, checking what was copied against its digest."""
    source = listed_file(path, name)
    if not source.is_file():
        raise IntegrityError(f"{source}: is listed in {META_FILE} but missing; the checkpoint changed after "
                             "conversion: run `lmconvert verify --files` and re-convert")
    shutil.copyfile(source, dst / name)  # a new file, with the umask's mode
    if file_digest(dst / name, meta.hash) != meta.files[name]:
        raise IntegrityError(f"{source}: differs from the digest {META_FILE} records; the checkpoint changed after "
                             "conversion: run `lmconvert verify --files` and re-convert")


def copy_sidecars(src: Path, dst: Path, meta: CanonicalMeta | None = None) -> list[str]:
    """The tokenizer and generation files of `src`, copied into `dst`, each read from inside `src`
    only. From a canonical checkpoint (`meta`): exactly the side files its lmconvert.json lists,
    each checked against its digest; a file added since is left behind."""
    if meta is None:
        names = [item.name for item in sidecar_files(src)]
        for name in names:
            shutil.copyfile(src / name, dst / name)
        return names
    names = sorted(name for name in meta.files if any(fnmatch(str(name), p) for p in SIDECAR_PATTERNS))
    for name in names:
        copy_listed(src, meta, name, dst)
    return names

