"""`lmconvert pull`: fetch a checkpoint from the Hugging Face Hub into the shared HF cache, then convert it.

Downloads go through huggingface_hub, into the cache transformers uses (HF_HOME / HF_HUB_CACHE), so
a repo already fetched by either is not fetched again, and HF_HUB_OFFLINE=1 works from the cache.
Only what the conversion needs is fetched: config.json, the weights (safetensors, or
pytorch_model*.bin when a repo has no safetensors), their index and the shards it lists, and the
tokenizer and generation files; from a GGUF repo (`--file PATTERN`), the one .gguf file the
pattern names, or every part of the one split set it names (`NAME-00001-of-0000N.gguf`).
`remote_checkpoint` (`inspect REPO_ID`) fetches config.json and the safetensors headers only.
The resolved commit sha is recorded in lmconvert.json.
The Hub announces each LFS file's sha256, and huggingface_hub checks only the size of what it
downloads; the conversion hashes what it reads against the announced sha256 (whole_file.py).
"""

from __future__ import annotations

import glob
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from lmconvert.formats.atomic import check_output
from lmconvert.formats.checkpoint import Checkpoint, checkpoint_of
from lmconvert.formats.checkpoint_files import SIDECAR_PATTERNS
from lmconvert.formats.dtypes import DTYPES
from lmconvert.formats.errors import InputError
from lmconvert.formats.jsonfile import read_json_object, read_weight_map
from lmconvert.formats.quantized import quantized_view
from lmconvert.formats.source import Loadable, Source
from lmconvert.formats.whole_file import Announced, AnnouncedMismatch

from .ingest import to_canonical

T = TypeVar("T")

CONFIG = "config.json"
# (index, single file) per weight format, in order of preference: .bin only when there is no safetensors
WEIGHT_FILES = (("model.safetensors.index.json", "model.safetensors"),
                ("pytorch_model.bin.index.json", "pytorch_model.bin"))
SHA256 = re.compile("[0-9a-f]{64}")
# llama.cpp's split files (gguf-split, convert_hf_to_gguf.py --split-max-size): every part is needed
SPLIT_PART = re.compile(r"(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})(?P<suffix>\.gguf)", re.IGNORECASE)
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass(frozen=True)
class Snapshot:
    """A downloaded revision: the snapshot directory in the HF cache and where it came from."""

    path: Path
    repo: str
    sha: str
    ref: str  # what was asked for: a branch, tag or sha
    files: tuple[str, ...]
    lfs: dict[str, str] = field(default_factory=dict)  # file -> the sha256 the repo listing announces

    def announced(self) -> list[Announced]:
        """Every fetched file with an announced sha256: an LFS file's, from the repo listing, or
        from a cached listing (which keeps none) the name of its blob in the HF cache: the sha256
        the Hub announced (X-Linked-Etag) when huggingface_hub downloaded it."""
        files = []
        for name in self.files:
            blob = Path(os.path.realpath(self.path / name))
            sha256 = self.lfs.get(name) or (blob.name if SHA256.fullmatch(blob.name) else None)
            if sha256 is not None:
                files.append(Announced(blob, sha256, f"{self.repo}@{self.sha}: {name}"))
        return files

    def source_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"repo": self.repo, "revision": self.sha}
        if self.ref != self.sha:
            info["ref"] = self.ref
        return info


def default_out(repo_id: str) -> Path:
    return Path(repo_id.rstrip("/").rsplit("/", 1)[-1])


def select_files(files: Iterable[str], where: str) -> tuple[list[str], str | None]:
    """The files to fetch from a repo listing, and the weight index among them (whose shards come on
    top). Only top-level files: subfolders hold other formats (original/, onnx/, ...)."""
    files = list(files)
    top = {f for f in files if "/" not in f}
    if CONFIG not in top and any(f.lower().endswith(".gguf") for f in files):
        ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
        raise InputError(f"{where}: is a GGUF repo ({_listed(_models(ggufs), 4)}); pick a file with --file PATTERN, "
                         "e.g. --file '*Q4_K_M.gguf'")
    if CONFIG not in top:
        raise InputError(f"{where}: has no {CONFIG}; lmconvert pulls transformers checkpoints")
    for index, single in WEIGHT_FILES:
        weights = index if index in top else single if single in top else None
        if weights is not None:
            sidecars = sorted(f for f in top if any(fnmatch(f, p) for p in SIDECAR_PATTERNS))
            return [CONFIG, weights, *sidecars], weights if weights == index else None
    seen = sorted(f for f in top if f.endswith((".safetensors", ".bin", ".pt", ".pth", ".gguf")))
    found = f" (it has {', '.join(seen[:5])})" if seen else ""
    raise InputError(f"{where}: has no model.safetensors, model.safetensors.index.json, pytorch_model.bin or "
                     f"pytorch_model.bin.index.json{found}; lmconvert pulls transformers checkpoints")


def _listed(names: list[str], most: int = 6) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _models(ggufs: list[str]) -> list[str]:
    """GGUF file names, a split set's parts said once (`NAME-*-of-0000N.gguf (N parts)`)."""
    named: dict[str, None] = {}
    for name in ggufs:
        part = SPLIT_PART.fullmatch(name)
        split = f"{part['stem']}-*-of-{part['count']}{part['suffix']} ({int(part['count'])} parts)" if part else None
        named[split or name] = None
    return list(named)


def select_gguf(files: Iterable[str], pattern: str, where: str) -> list[str]:
    """The .gguf file a `--file` pattern names in a repo listing, or every part of the one split set
    it names (a pattern matching one part pulls the whole set), in order. A pattern without '/'
    matches a file's name in any folder, one with '/' its path (fnmatch, as huggingface_hub's
    allow_patterns). Anything else (no match, a file that is not GGUF, several models) is refused,
    naming what the pattern matched."""
    files = sorted(files)
    matched = [f for f in files if fnmatch(f, pattern) or ("/" not in pattern and fnmatch(f.rsplit("/", 1)[-1],
                                                                                           pattern))]
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    if not matched:
        has = f"its GGUF files are {_listed(_models(ggufs))}" if ggufs else "it has no .gguf file"
        raise InputError(f"{where}: --file {pattern!r} matches no file; {has}")
    other = [f for f in matched if not f.lower().endswith(".gguf")]
    if other:
        raise InputError(f"{where}: --file {pattern!r} matches {_listed(matched)}, and {other[0]} is not a .gguf "
                         "file; --file picks a GGUF file (pull REPO without --file converts a transformers repo)")
    models: dict[tuple[str, ...], list[str]] = {}
    for name in matched:
        part = SPLIT_PART.fullmatch(name)
        key = (part["stem"], part["count"], part["suffix"]) if part else (name,)
        models.setdefault(key, []).append(name)
    if len(models) > 1:
        raise InputError(f"{where}: --file {pattern!r} matches {len(matched)} files of {len(models)} models "
                         f"({_listed(_models(matched))}); narrow it to one file, or to the parts of one split model")
    (key, names), = models.items()
    if len(key) == 1:
        return names
    stem, count, suffix = key
    parts = [f"{stem}-{no:05d}-of-{count}{suffix}" for no in range(1, int(count) + 1)]
    missing = [f for f in parts if f not in files]
    if not parts or missing:
        lacking = f"lacks {_listed(missing, 3)}" if missing else "counts 0 parts"
        raise InputError(f"{where}: --file {pattern!r} matches {_listed(names, 3)}, part of a {int(count)}-way split "
                         f"GGUF, and the repo {lacking}; the upload is incomplete: try another --revision")
    return parts


def gguf_out(file: str) -> Path:
    """The default output of a GGUF pull: the file's name without the split numbering and the suffix."""
    name = file.rsplit("/", 1)[-1]
    part = SPLIT_PART.fullmatch(name)
    return Path(part["stem"] if part else name[: -len(".gguf")] if name.lower().endswith(".gguf") else name)


def index_shards(index: Path, where: str) -> list[str]:
    try:
        return sorted(set(read_weight_map(index).values()))
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _file_of(exc: Any) -> str:
    """The repo file a failed /resolve request was for, or the request's URL."""
    try:
        url = str(exc.response.request.url)
    except Exception:  # noqa: BLE001 - no request attached
        return "a file"
    path = unquote(urlsplit(url).path)
    return path.split("/resolve/", 1)[1].split("/", 1)[-1] if "/resolve/" in path else url


@contextmanager
def hub_errors(repo_id: str, revision: str | None, token: str | None) -> Iterator[None]:
    """huggingface_hub's exceptions as one-line InputErrors that say what to do."""
    import httpx2
    from huggingface_hub import constants, get_token
    from huggingface_hub.errors import (
        CachedRepoTreeNotFoundError,
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
        RevisionResolutionError,
    )

    page = f"{constants.ENDPOINT}/{repo_id}"
    ref = revision or constants.DEFAULT_REVISION
    try:
        yield
    except GatedRepoError as exc:  # before RepositoryNotFoundError, its base class
        if token or get_token():
            raise InputError(f"{repo_id}: gated repo, and the token in use has no access to it; accept the licence "
                             f"on {page} with the account the token (HF_TOKEN or --token) belongs to") from exc
        raise InputError(f"{repo_id}: gated repo; accept the licence on {page}, then set HF_TOKEN or pass --token "
                         "with a token of that account") from exc
    except RepositoryNotFoundError as exc:
        if token or get_token():
            raise InputError(f"{repo_id}: no such model repo on {constants.ENDPOINT}, or it is private and the token "
                             "in use (HF_TOKEN or --token) cannot see it; check the name and the token") from exc
        raise InputError(f"{repo_id}: no such model repo on {constants.ENDPOINT}, or it is private; check the name, "
                         "or for a private repo set HF_TOKEN or pass --token") from exc
    except RevisionNotFoundError as exc:
        raise InputError(f"{repo_id}: revision {ref!r} does not exist; pass a branch, tag or commit sha of the repo "
                         "to --revision") from exc
    except EntryNotFoundError as exc:
        if isinstance(exc, LocalEntryNotFoundError):  # not on the Hub reachable, and not in the cache
            raise InputError(_not_cached(repo_id, ref, exc)) from exc
        raise InputError(f"{repo_id}@{ref}: {_file_of(exc)} is listed in the repo but cannot be downloaded (not "
                         "found); the repo is inconsistent: try another --revision") from exc
    except (CachedRepoTreeNotFoundError, RevisionResolutionError) as exc:
        raise InputError(_not_cached(repo_id, ref, exc)) from exc
    except OfflineModeIsEnabled as exc:
        raise InputError(_not_cached(repo_id, ref, exc)) from exc
    except HFValidationError as exc:
        raise InputError(f"{repo_id!r}: not a valid repo id ({_first_line(exc)}); write it as owner/name") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "an error"
        raise InputError(f"{repo_id}: {constants.ENDPOINT} answered {status} ({_first_line(exc)}); try again later")\
            from exc
    except httpx2.HTTPError as exc:  # connection refused or cut, timeouts, redirect loops
        raise InputError(f"{repo_id}: downloading from {constants.ENDPOINT} failed ({type(exc).__name__}: "
                         f"{_first_line(exc)}); check the connection and re-run (finished files stay in the HF cache), "
                         "or set HF_HUB_OFFLINE=1 to use the cache") from exc
    except OSError as exc:  # a size mismatch after a download, a full disk, a read-only cache
        raise InputError(f"{repo_id}: download failed ({_first_line(exc)}); re-run to retry, after checking free "
                         f"space and permissions in the HF cache {constants.HF_HUB_CACHE}") from exc
    except ValueError as exc:
        if "too large to be downloaded" not in str(exc):  # huggingface_hub's refusal of a file over 50 GB over
            raise  # plain HTTP: anything else is ours
        raise InputError(f"{repo_id}@{ref}: the Hub announces a file over huggingface_hub's limit for plain HTTP "
                         "downloads (50 GB); pip install hf_xet, which downloads such files, and re-run") from exc


def _not_cached(repo_id: str, ref: str, exc: BaseException) -> str:
    from huggingface_hub import constants

    why = "HF_HUB_OFFLINE is set" if constants.is_offline_mode() else f"the Hub cannot be reached ({_first_line(exc)})"
    return (f"{repo_id}@{ref}: not (completely) in the HF cache {constants.HF_HUB_CACHE}, and {why}; "
            "pull it once with network access")


def _list_files(api: Any, repo_id: str, sha: str, offline: bool) -> dict[str, str | None]:
    """The repo's files at a commit, each with the sha256 the listing announces for an LFS file:
    from the cached listing when there is one (a commit never changes; it keeps no sha256)."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError
    from huggingface_hub.hf_api import RepoFile

    try:
        return dict.fromkeys(f.path for f in get_cached_repo_tree(repo_id, revision=sha))
    except CachedRepoTreeNotFoundError:
        if offline:
            raise
    return {f.path: f.lfs.sha256 if f.lfs is not None else None
            for f in api.list_repo_tree(repo_id, revision=sha) if isinstance(f, RepoFile)}


@contextmanager
def _hub_output(quiet: bool) -> Iterator[None]:
    """With `quiet`, no progress bars, no retry messages and no warnings from huggingface_hub (its
    `warnings.warn` of a full cache put two lines before ours): an error stays one line."""
    from huggingface_hub import constants
    from huggingface_hub.utils import disable_progress_bars
    from huggingface_hub.utils import logging as hf_logging

    if not quiet or constants.HF_HUB_DISABLE_PROGRESS_BARS is False:  # =0 in the environment asks for bars
        yield
        return
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with disable_progress_bars(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)


def interruptible(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:  # noqa: ANN401
    """`fn` run in a daemon thread while this one waits in short steps: Ctrl-C then reaches the CLI
    at once, which leaves without waiting for huggingface_hub's download threads (a multi-GB shard
    would otherwise finish first); the partial file stays as its resumable `.incomplete`."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - raised again in the waiting thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="lmconvert-download", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if "error" in box:
        raise box["error"]
    return box["value"]


class _Downloads:
    """The bytes a pull downloads, over its huggingface_hub calls (the index, then the snapshot), as
    one (bytes, bytes in all) count. Each call gets a `tqdm_class` of its own (`bars`): tqdm
    look-alikes that draw nothing. Within a call, the bars counting bytes (unit "B": the bytes
    written of all its files, and with hf_xet those received too) count as the larger of them; each
    file adds its size to the total as its download starts, and a cached file is not downloaded."""

    def __init__(self, fetching: Callable[[int, int], None]) -> None:
        self._fetching = fetching
        self._calls: list[list[_Bar]] = []
        self._lock = threading.Lock()

    def bars(self) -> Callable[..., _Bar]:
        call: list[_Bar] = []
        self._calls.append(call)
        return lambda *_args, **kwargs: _Bar(self, call, kwargs)

    def add(self, call: list[_Bar], bar: _Bar) -> None:
        with self._lock:
            call.append(bar)

    def report(self) -> None:
        done = total = 0
        with self._lock:
            for call in self._calls:
                counted = [b for b in call if b.unit == "B"]
                done += max((int(b.n) for b in counted), default=0)
                total += max((int(b.total or 0) for b in counted), default=0)
        self._fetching(done, total)


class _Bar:
    format_dict: dict[str, Any] = {}  # noqa: RUF012 - read (the rate), never written

    def __init__(self, owner: _Downloads, call: list[_Bar], kwargs: dict[str, Any]) -> None:
        self._owner = owner
        self.unit, self.total, self.n = kwargs.get("unit", "it"), kwargs.get("total") or 0, kwargs.get("initial") or 0
        owner.add(call, self)

    def update(self, n: float | None = 1) -> None:
        self.n += n or 0
        if self.unit == "B":
            self._owner.report()

    def refresh(self, *_args: Any, **_kwargs: Any) -> None:  # noqa: ANN401
        if self.unit == "B":  # a total grew
            self._owner.report()

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def close(self) -> None:
        return None

    def set_description(self, *_args: Any, **_kwargs: Any) -> None:  # noqa: ANN401
        return None

    set_description_str = set_postfix_str = set_description


def download(repo_id: str, revision: str | None = None, token: str | None = None, quiet: bool = False,
             file: str | None = None, fetching: Callable[[int, int], None] | None = None) -> Snapshot:
    """Fetch what a conversion needs from `repo_id` at `revision` into the HF cache: with `file`, the
    GGUF file (or split set) that pattern names (`select_gguf`). huggingface_hub resumes cut-off
    downloads, serves cached files, and (unless `quiet`) shows its progress bars; with `fetching`,
    none: the bytes downloaded (bytes, bytes in all) go to it instead."""
    from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download

    offline = constants.is_offline_mode()
    api = HfApi(token=token)
    with hub_errors(repo_id, revision, token), _hub_output(quiet):
        resolved = api.resolve_revision(repo_id, revision=revision, local_files_only=offline)
        sha = resolved.resolved
        where = f"{repo_id}@{sha}"
        listing = _list_files(api, repo_id, sha, offline)
        if file is not None:
            wanted, index = select_gguf(listing, file, where), None
        else:
            wanted, index = select_files(listing, where)
        downloads = None if fetching is None else _Downloads(fetching)

        def bars() -> dict[str, Any]:
            return {} if downloads is None else {"tqdm_class": downloads.bars()}

        if index is not None:
            index_path = Path(hf_hub_download(repo_id, index, revision=resolved, token=token, **bars()))
            shards = index_shards(index_path, where)
            missing = [s for s in shards if s not in listing]
            if missing:
                raise InputError(f"{where}: {index} lists {', '.join(missing[:3])}, which the repo does not have; "
                                 "the upload is incomplete: try another --revision")
            wanted += shards
        path = interruptible(snapshot_download, repo_id, revision=resolved,
                             allow_patterns=[glob.escape(f) for f in wanted], token=token, **bars())
    lfs = {f: sha256 for f in wanted if (sha256 := listing.get(f)) is not None}
    return Snapshot(Path(path), repo_id, sha, str(resolved), tuple(wanted), lfs)


def _corrupt(exc: AnnouncedMismatch) -> InputError:
    """The one line for a file that is not what the Hub announced. Its blob in the HF cache is named
    by the announced sha256, so huggingface_hub would serve it as such from now on: it goes."""
    blob = exc.announced.path
    removed = blob.parent.name == "blobs" and blob.name == exc.announced.sha256
    if removed:
        blob.unlink(missing_ok=True)
    return InputError(f"{exc.announced.label}: its sha256 is {exc.found}, not the {exc.announced.sha256} the Hub "
                      "announces; the download is corrupt or was altered on the way"
                      f"{' (removed from the HF cache)' if removed else ''}: pull again")


def pull(repo_id: str, out: Path | None = None, *, revision: str | None = None, token: str | None = None,
         dtype: str | None = None, max_shard_bytes: int = 5 * 10**9, force: bool = False,
         progress: Callable[[int, int], None] | None = None, quiet: bool = False,
         file: str | None = None, fetching: Callable[[int, int], None] | None = None) -> tuple[Snapshot, Path]:
    """Download `repo_id` and convert it into a canonical checkpoint at `out` (default ./<repo name>),
    recording the repo and the commit sha; the snapshot stays the recorded source for `verify`.
    With `file`, a pattern naming one GGUF file or split set of a GGUF repo: that file is converted
    as `convert FILE.gguf OUT` converts it (default OUT: ./<file name without .gguf>)."""
    if out is not None:
        check_output(out, force)  # before downloading anything
    elif file is None:
        out = default_out(repo_id)
        check_output(out, force)
    snapshot = download(repo_id, revision, token, quiet, file, fetching)
    src = snapshot.path / snapshot.files[0] if file is not None else snapshot.path  # a split set: its first part
    if out is None:  # a GGUF pull's default output is named after the file the pattern matched
        out = gguf_out(snapshot.files[0])
        check_output(out, force)
    info = snapshot.source_info()
    if file is not None:  # the file as the snapshot names it, not its blob (named by its sha256, without the
        # split numbering that finds the other parts)
        info |= {"file": snapshot.files[0], "path": str(src.absolute())}
    try:
        to_canonical(src, out, dtype=dtype, max_shard_bytes=max_shard_bytes, force=force,
                     source_info=info, progress=progress, announced=snapshot.announced())
    except AnnouncedMismatch as exc:
        raise _corrupt(exc) from None
    return snapshot, out


class HeaderTensors:
    """A checkpoint's tensors as its safetensors headers describe them (name, shape, dtype), fetched
    over HTTP without their data: enough to map them and to size the model, nothing to read."""

    def __init__(self, where: str, tensors: dict[str, tuple[str, tuple[int, ...], str]]) -> None:
        self._where, self._tensors = where, tensors  # name -> (file, shape, dtype)

    def names(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._tensors[name][1]

    def dtype_name(self, name: str) -> str:
        file, _, kind = self._tensors[name]
        if kind not in DTYPES:
            raise InputError(f"{self._where}: {file}: tensor {name!r} has dtype {kind}, which lmconvert does not "
                             "handle")
        return kind

    def where(self, name: str) -> Path:
        return Path(self._where) / self._tensors[name][0]

    def get(self, name: str) -> Any:  # noqa: ANN401 - never returns
        raise InputError(f"{self._where}: only the headers were fetched; pull the repo to read {name!r}")

    def close(self) -> None:
        pass


def is_repo_id(text: str) -> bool:
    """Whether an argument that names no local path reads as a Hub repo id (owner/name)."""
    return REPO_ID.fullmatch(text) is not None and not text.endswith((".", "-")) and ".." not in text


def remote_checkpoint(repo_id: str, revision: str | None = None, token: str | None = None,
                      quiet: bool = False) -> Checkpoint:
    """`repo_id` at `revision` known from its config.json and safetensors headers, as huggingface_hub
    fetches them (`hf_hub_download` of config.json into the HF cache; `get_safetensors_metadata`:
    a range request for each weights file's header); no weights are downloaded. Mapped as a local
    checkpoint is, so its card (runtime/card.py) is the one the downloaded checkpoint would have."""
    from huggingface_hub import HfApi, constants, hf_hub_download
    from huggingface_hub.errors import NotASafetensorsRepoError, RemoteEntryNotFoundError, SafetensorsParsingError

    offline = constants.is_offline_mode()
    api = HfApi(token=token)
    with hub_errors(repo_id, revision, token), _hub_output(quiet):
        resolved = api.resolve_revision(repo_id, revision=revision, local_files_only=offline)
        where = f"{repo_id}@{resolved.resolved}"
        try:
            config = Path(hf_hub_download(repo_id, CONFIG, revision=resolved, token=token))
        except RemoteEntryNotFoundError:
            raise InputError(f"{where}: has no {CONFIG}; inspect reads transformers checkpoints (a GGUF repo: "
                             "pull a file with --file, then inspect it)") from None
        try:
            headers = api.get_safetensors_metadata(repo_id, revision=resolved.resolved, token=token)
        except NotASafetensorsRepoError:
            raise InputError(f"{where}: has no model.safetensors or model.safetensors.index.json, whose headers "
                             "inspect reads over HTTP; pull it, then inspect the local copy") from None
        except SafetensorsParsingError as exc:
            raise InputError(f"{where}: a safetensors header cannot be parsed ({_first_line(exc)}); the upload is "
                             "damaged") from None
    tensors = {name: (file, tuple(info.shape), info.dtype)
               for file, meta in sorted(headers.files_metadata.items()) for name, info in meta.tensors.items()}
    hf_config = read_json_object(config)
    read, quantization = quantized_view(hf_config, Path(where) / CONFIG, HeaderTensors(where, tensors))
    source = Source(Path(where), "hf-safetensors", hf_config, read,
                    info={"repo": repo_id, "revision": resolved.resolved, **quantization},
                    reference=Loadable(None, refusal=f"{where}: only its headers were fetched; pull it first"))
    return checkpoint_of(source)
