"""Every JSON file lmconvert reads goes through here: config.json, lmconvert.json, params.json,
side files such as generation_config.json and tokenizer files, the JSON parts of golden files, and
sharded-checkpoint indexes (`*.index.json`).

One reader, so every way a JSON input can be broken ends the same way, in one line naming the
file: not UTF-8, not JSON, nested deeper than the parser's stack (200,000 `[` raise RecursionError
deep inside `json`), numbers past Python's digit limit, keys listed twice (json would keep the
last), larger than any file of this kind (`MAX_BYTES`), or a directory or device in its place.

An index is untrusted input that names files, so every entry must be a plain file name in the
same directory: `../`, absolute and nested paths are refused, never followed, and so is a shard
that is a symlink out of the checkpoint (checkpoint_files.py).
"""

from __future__ import annotations

import json
import stat
from collections import Counter
from pathlib import Path
from typing import Any

from .checkpoint_files import inside, plain_name
from .errors import InputError
from .schema import json_type

# The bound safetensors puts on its own JSON header. The largest JSON lmconvert reads (an
# lmconvert.json or index naming every tensor of a model with thousands of them) is a few MB;
# parsing costs about ten times a file's size in memory, so this also bounds that.
MAX_BYTES = 100_000_000


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) < len(pairs):  # linear, not quadratic: an index names thousands of tensors (MoE)
        repeated = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        raise ValueError(f"key(s) listed twice: {', '.join(repeated[:5])}")
    return found


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = " ".join(str(exc).split())
    return text[:200] or type(exc).__name__


def parse_json(text: str | bytes, where: str) -> Any:  # noqa: ANN401 - any JSON value
    """A JSON value from text already in memory (a golden file's metadata, say); `where` names it
    in the error. Bytes must be UTF-8 (or UTF-16/32, which json detects)."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InputError(f"{where}: not valid JSON ({_reason(exc)}); re-download or fix the file") from None


def read_json(path: Path, what: str = "file") -> Any:  # noqa: ANN401 - any JSON value
    """The JSON value in `path`; a missing, unreadable, oversized or broken file is an InputError."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: {what} is not a regular file; point at the file itself")
        if info.st_size > MAX_BYTES:
            raise InputError(f"{path}: {what} is {info.st_size:,} bytes, more than the {MAX_BYTES:,} any such "
                             "file needs; this is not the file lmconvert expects")
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise InputError(f"{path}: {what} cannot be read ({exc.strerror or exc}); check its permissions") from None
    if len(data) > MAX_BYTES:  # grew after the stat
        raise InputError(f"{path}: {what} is more than {MAX_BYTES:,} bytes; this is not the file lmconvert expects")
    return parse_json(data, str(path))


def read_json_object(path: Path, what: str = "file") -> dict[str, Any]:
    """A JSON object from `path` (see `read_json` for what is refused)."""
    data = read_json(path, what)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, found {json_type(data)}; re-download or fix the file")
    return data


def read_weight_map(index: Path) -> dict[str, str]:
    """{tensor name: shard file name}, every file name checked to be plain."""
    weight_map = read_json_object(index, "index").get("weight_map")
    if not isinstance(weight_map, dict):
        raise InputError(f"{index}: has no 'weight_map' object")
    plain: set[str] = set()  # each file name checked once, not once per tensor (MoE: thousands)
    for name, file in weight_map.items():
        if isinstance(file, str) and file in plain:
            continue
        if not plain_name(file):
            raise InputError(f"{index}: weight_map entry {name!r} -> {file!r} is not a plain file name; "
                             "refusing to follow it")
        plain.add(file)
    return weight_map


def shard_files(index: Path) -> dict[str, Path]:
    """{tensor name: existing shard path} for an index on disk."""
    out = {}
    shards: dict[str, Path] = {}  # each file checked once, not once per tensor (MoE: thousands)
    for name, file in read_weight_map(index).items():
        if file not in shards:
            shard = inside(index.parent, index.parent / file)
            if not shard.is_file():
                raise InputError(f"{index}: tensor {name!r} is listed in {file}, which does not exist")
            shards[file] = shard
        out[name] = shards[file]
    return out
