"""The files of a checkpoint directory, read only from inside it.

A checkpoint is untrusted input that names files: an index names its shards, lmconvert.json lists
its files, and any file may be a symlink. Followed blindly, a symlinked `tokenizer.json` copies
/etc/passwd into the output, an entry `../../x` reads another user's files, and a link to a FIFO
blocks forever. So every file lmconvert reads or copies out of a checkpoint is looked up here:
its name must be a plain file name, and after resolving symlinks it must lie inside the checkpoint
directory. The one exception is the Hugging Face cache, whose snapshot files are symlinks into
the same repo's `blobs/` folder (`models--org--name/snapshots/<sha>/x -> ../../blobs/<hash>`):
exactly that folder is allowed, for a checkpoint inside a snapshot.

The path the user names (SRC, a .gguf file) is theirs to choose and is not checked; what it holds is.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path

from .errors import InputError

# files that travel unchanged with the weights
SIDECAR_PATTERNS = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
                    "generation_config.json", "chat_template*", "*.tiktoken", "spiece.model")


def plain_name(name: object) -> bool:
    """A file name without any directory part: never `..`, absolute, nested or empty."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "\0" not in name and Path(name).name == name)


def _hf_blobs(root: Path) -> Path | None:
    """The `blobs/` folder of the HF cache repo whose snapshot holds `root` (resolved), if it is in one."""
    for folder in (root, *root.parents):
        if folder.parent.name == "snapshots" and "--" in folder.parent.parent.name:
            blobs = folder.parent.parent / "blobs"
            return blobs if blobs.is_dir() else None
    return None


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise InputError(f"{path}: cannot be resolved ({exc}); fix or remove the symlink") from None


def inside(root: Path, path: Path) -> Path:
    """`path`, once it is known to resolve inside the checkpoint directory `root` (or into the HF
    cache blobs of the snapshot `root` is in)."""
    base, real = _resolved(root), _resolved(path)
    if base in real.parents:
        return path
    blobs = _hf_blobs(base)
    if blobs is not None and real.parent == blobs:
        return path
    raise InputError(f"{path}: resolves to {real}, outside the checkpoint {root}; refusing to read it "
                     "(copy the file into the checkpoint if you trust it)")


def checkpoint_file(root: Path, name: object, what: str = "names the file") -> Path:
    """The checkpoint's file `name` (a name a file gave, so untrusted), checked to be plain and inside."""
    if not plain_name(name):
        raise InputError(f"{root}: {what} {name!r}, which is not a plain file name in the checkpoint; "
                         "refusing to follow it")
    assert isinstance(name, str)
    return inside(root, root / name)


def within(root: Path, *names: str) -> None:
    """Check those of `names` that exist in `root` (a format's fixed file names) before reading any."""
    for name in names:
        path = root / name
        if path.exists() or path.is_symlink():
            inside(root, path)


def sidecar_files(directory: Path, names: Iterable[str] | None = None) -> list[Path]:
    """The side files (tokenizer, generation config) in `directory`, each checked to lie inside it;
    with `names`, only those of them."""
    wanted = None if names is None else set(names)
    found = sorted(p for p in directory.iterdir()
                   if any(fnmatch(p.name, pattern) for pattern in SIDECAR_PATTERNS)
                   and (wanted is None or p.name in wanted))
    return [inside(directory, p) for p in found if p.is_file()]
