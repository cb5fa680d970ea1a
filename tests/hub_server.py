"""A small, real HTTP server that speaks the part of the Hugging Face Hub protocol huggingface_hub uses
to download a model repo, so that the real client code path runs in tests.

Endpoints (as huggingface_hub 2.x calls them):

- GET  /api/models/{owner}/{name}                      repo info at the default branch (sha, siblings)
- GET  /api/models/{owner}/{name}/revision/{rev}       repo info at a branch, tag or commit sha
- GET  /api/models/{owner}/{name}/tree/{rev}[/{path}]  file listing (?recursive=true), JSON list, one page
- HEAD/GET /{owner}/{name}/resolve/{rev}/{path}        a file: X-Repo-Commit and ETag (git blob sha1) with
                                                       the body for regular files; for LFS files (weights)
                                                       a 302 to the "CDN" with X-Linked-Etag (sha256) and
                                                       X-Linked-Size, as the Hub answers
- GET  /lfs/{owner}/{name}/{sha256}                    on a second port (another origin, like a CDN, so the
                                                       client drops the Authorization header): LFS bodies

Every body supports `Range: bytes=N-[M]` (206 with Content-Range). Errors carry the `X-Error-Code`
header the client maps to its exceptions: RepoNotFound (401, as the Hub answers for missing and
private repos alike), RevisionNotFound (404), EntryNotFound (404), GatedRepo (401 without a token,
403 with a token that has no access).

Repos live in memory: `add_repo(name, [files of commit 1, files of commit 2, ...], branches)`.
Per-repo faults: `gated_token` (downloads need `Authorization: Bearer <token>`), `unavailable` (files
listed in the tree whose download answers 404), `cut_once` ({path: n}: the first GET of the file sends
n bytes of the body, then drops the connection), `cut_always` (every GET of these files drops the
connection after the headers), `tampered` ({path: other bytes}: the tree listing and the HEAD announce the
sha256 of the file, and the CDN serves these bytes under it, as a corrupted or altered download would be),
`slow` (paths sent 64 KiB every 0.2 s, a slow link; `sent` counts what reached the client), `oversized`
(paths whose size the Hub announces as 1 PB, more than any disk here has free).
Every request is logged in `requests`.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(path: str) -> bool:
    return path.endswith(LFS_SUFFIXES)


def lfs_pointer(data: bytes) -> bytes:
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
            f"size {len(data)}\n").encode()


@dataclass
class Repo:
    name: str
    commits: dict[str, dict[str, bytes]]  # sha -> {path: content}
    refs: dict[str, str]  # branch or tag -> sha
    gated_token: str | None = None
    unavailable: set[str] = field(default_factory=set)
    cut_once: dict[str, int] = field(default_factory=dict)  # by sha256 of the content (add_repo takes paths)
    cut_always: set[str] = field(default_factory=set)  # idem
    slow: set[str] = field(default_factory=set)  # idem
    oversized: set[str] = field(default_factory=set)  # by path
    sent: dict[str, int] = field(default_factory=dict)  # sha256 -> bytes of a slow file that reached a client
    blobs: dict[str, bytes] = field(default_factory=dict)  # sha256 -> content, for the CDN
    _cut_done: set[str] = field(default_factory=set)

    def resolve(self, rev: str) -> str | None:
        if rev in self.refs:
            return self.refs[rev]
        return rev if rev in self.commits else None


@dataclass
class Request:
    method: str
    path: str
    port: int
    headers: dict[str, str]

    @property
    def range(self) -> str | None:
        return self.headers.get("range")

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


class HubServer:
    """`with HubServer() as hub:` serves on 127.0.0.1 (hub.url) with a CDN on another port."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self._servers: list[ThreadingHTTPServer] = []

    def add_repo(self, name: str, commits: list[dict[str, bytes]], branches: dict[str, int] | None = None,
                 **faults: Any) -> list[str]:
        """Commits in order; branches map a name to a commit's position (default: main -> the last)."""
        shas = []
        for i, files in enumerate(commits):
            digest = hashlib.sha1(f"{name}\0{i}".encode())
            for path in sorted(files):
                digest.update(path.encode() + b"\0" + hashlib.sha1(files[path]).digest())
            shas.append(digest.hexdigest())
        refs = {branch: shas[i] for branch, i in (branches or {"main": len(commits) - 1}).items()}
        cut_once, cut_always = dict(faults.pop("cut_once", {})), set(faults.pop("cut_always", ()))
        tampered, slow = dict(faults.pop("tampered", {})), set(faults.pop("slow", ()))
        repo = Repo(name, dict(zip(shas, commits, strict=True)), refs, **faults)
        for files in commits:
            for path, data in files.items():
                sha256 = hashlib.sha256(data).hexdigest()
                if is_lfs(path):
                    repo.blobs[sha256] = tampered.get(path, data)
                if path in cut_once:
                    repo.cut_once[sha256] = cut_once[path]
                if path in cut_always:
                    repo.cut_always.add(sha256)
                if path in slow:
                    repo.slow.add(sha256)
        self.repos[name] = repo
        return shas

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def start(self) -> HubServer:
        for _ in range(2):
            server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
            server.daemon_threads = True
            server.hub = self  # type: ignore[attr-defined]
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self._servers.append(server)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self, since: int = 0, port: str = "any") -> list[Request]:
        """Requests since index `since`, to the hub, the cdn, or any."""
        ports = {"hub": {self._servers[0].server_address[1]}, "cdn": {self._servers[1].server_address[1]},
                 "any": {s.server_address[1] for s in self._servers}}[port]
        return [r for r in self.requests[since:] if r.port in ports]


def refusing_url() -> str:
    """A URL on which nothing listens: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server: ThreadingHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def do_HEAD(self) -> None:  # noqa: N802
        self._route(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._route(head=False)

    # responses

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, data: Any, head: bool = False) -> None:
        self._send(200, json.dumps(data).encode(), head=head)

    def _error(self, status: int, code: str | None, message: str, head: bool = False,
               headers: dict[str, str] | None = None) -> None:
        extra = {"X-Error-Message": message, **(headers or {})}
        if code:
            extra["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), extra, head)

    def _body(self, data: bytes, headers: dict[str, str], head: bool, repo: Repo | None = None) -> None:
        """The content with Range support, and the repo's cut-off faults."""
        status, start, end = 200, 0, len(data)
        spec = self.headers.get("Range")
        if spec and spec.startswith("bytes="):
            first, _, last = spec[len("bytes="):].partition("-")
            start = int(first) if first else 0
            end = int(last) + 1 if last else len(data)
            if start >= len(data):
                self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
                return
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
        part = data[start:end]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        if head:
            return
        sha256 = hashlib.sha256(data).hexdigest()
        if repo is not None and sha256 in repo.cut_always:
            cut: int | None = 0
        elif repo is not None and sha256 in repo.cut_once and sha256 not in repo._cut_done:
            repo._cut_done.add(sha256)
            cut = repo.cut_once[sha256]
        else:
            cut = None
        if cut is None and repo is not None and sha256 in repo.slow:
            self._trickle(part, repo, sha256)
            return
        if cut is None:
            self.wfile.write(part)
            return
        self.wfile.write(part[:cut])
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def _trickle(self, part: bytes, repo: Repo, sha256: str) -> None:
        """A slow link: 64 KiB every 0.2 s, until the whole body is sent or the client goes away."""
        for start in range(0, len(part), 1 << 16):
            try:
                self.wfile.write(part[start:start + (1 << 16)])
                self.wfile.flush()
            except OSError:  # the client hung up
                self.close_connection = True
                return
            repo.sent[sha256] = repo.sent.get(sha256, 0) + len(part[start:start + (1 << 16)])
            time.sleep(0.2)

    # routing

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.hub.requests.append(Request(self.command, unquote(url.path), self.server.server_address[1], headers))
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            self._api(f"{parts[2]}/{parts[3]}", parts[4:], query, head)
        elif parts[:1] == ["lfs"] and len(parts) == 4:
            self._cdn(f"{parts[1]}/{parts[2]}", parts[3], head)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), head)
        else:
            self._error(404, None, f"no route for {url.path}", head)

    def _repo(self, name: str, head: bool) -> Repo | None:
        repo = self.hub.repos.get(name)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found", head)
        return repo

    def _commit(self, repo: Repo, rev: str, head: bool) -> str | None:
        sha = repo.resolve(rev)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
        return sha

    def _api(self, name: str, rest: list[str], query: dict[str, str], head: bool) -> None:
        repo = self._repo(name, head)
        if repo is None:
            return
        if not rest or (rest[0] == "revision" and len(rest) == 2):
            sha = self._commit(repo, rest[1] if rest else "main", head)
            if sha is not None:
                self._json({"_id": sha[:24], "id": name, "modelId": name, "sha": sha, "private": False,
                            "gated": "manual" if repo.gated_token else False, "disabled": False,
                            "lastModified": "2025-01-01T00:00:00.000Z", "library_name": "transformers",
                            "tags": ["transformers", "safetensors"],
                            "siblings": [{"rfilename": p} for p in sorted(repo.commits[sha])]}, head)
        elif rest[0] == "tree" and len(rest) >= 2:
            sha = self._commit(repo, rest[1], head)
            if sha is not None:
                self._json(self._tree(repo.commits[sha], "/".join(rest[2:]), query.get("recursive") in ("true",
                                                                                                       "True")), head)
        else:
            self._error(404, None, f"no route for /api/models/{name}/{'/'.join(rest)}", head)

    @staticmethod
    def _tree(files: dict[str, bytes], prefix: str, recursive: bool) -> list[dict[str, Any]]:
        base = f"{prefix}/" if prefix else ""
        entries: dict[str, dict[str, Any]] = {}
        for path in sorted(files):
            if not path.startswith(base):
                continue
            rest = path[len(base):]
            if "/" in rest and not recursive:
                folder = base + rest.split("/", 1)[0]
                entries[folder] = {"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0,
                                   "path": folder}
                continue
            data = files[path]
            entry: dict[str, Any] = {"type": "file", "path": path, "size": len(data)}
            if is_lfs(path):
                pointer = lfs_pointer(data)
                entry["oid"] = git_blob_sha1(pointer)
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": len(pointer)}
            else:
                entry["oid"] = git_blob_sha1(data)
            entries[path] = entry
        return list(entries.values())

    def _resolve(self, name: str, rev: str, path: str, head: bool) -> None:
        repo = self._repo(name, head)
        if repo is None:
            return
        sha = self._commit(repo, rev, head)
        if sha is None:
            return
        commit_header = {"X-Repo-Commit": sha}
        if repo.gated_token is not None:
            auth = self.headers.get("Authorization")
            if auth is None:
                self._error(401, "GatedRepo", f"Access to model {name} is restricted. You must have access to it "
                            "and be authenticated to access it. Please log in.", head, commit_header)
                return
            if auth != f"Bearer {repo.gated_token}":
                self._error(403, "GatedRepo", f"Access to model {name} is restricted and you are not in the "
                            f"authorized list. Visit https://huggingface.co/{name} to ask for access.", head,
                            commit_header)
                return
        files = repo.commits[sha]
        if path not in files or path in repo.unavailable:
            self._error(404, "EntryNotFound", f"{path} does not exist on \"{rev}\"", head, commit_header)
            return
        data = files[path]
        if is_lfs(path):
            sha256 = hashlib.sha256(data).hexdigest()
            self._send(302, b"", {**commit_header, "Location": f"{self.hub.cdn_url}/lfs/{name}/{sha256}",
                                  "ETag": f'"{git_blob_sha1(lfs_pointer(data))}"', "X-Linked-Etag": f'"{sha256}"',
                                  "X-Linked-Size": str(10**15 if path in repo.oversized else len(data))}, head,
                       "text/plain")
        else:
            self._body(data, {**commit_header, "ETag": f'"{git_blob_sha1(data)}"'}, head, repo)

    def _cdn(self, name: str, sha256: str, head: bool) -> None:
        repo = self.hub.repos.get(name)
        data = repo.blobs.get(sha256) if repo else None
        if repo is None or data is None:
            self._error(404, None, "NoSuchKey", head)
            return
        self._body(data, {"ETag": f'"{sha256}"'}, head, repo)
