"""A minimal Hugging Face Hub-compatible HTTP server for tests, on loopback.

Point the real `huggingface_hub` client at it with `HF_ENDPOINT=<server.endpoint>` (read when `huggingface_hub` is
imported, so set it in the environment of a fresh process) and `HF_HUB_DISABLE_XET=1`: huggingface_hub 2.4 uploads
large files through Xet whenever `hf_xet` is installed, without asking the server, and this server speaks only the
git-LFS "basic" transfer (its Xet token route answers 501 saying so). Downloads need nothing else: the server never advertises Xet, so the client uses plain HTTP.

It implements the endpoints that `create_repo`, `create_commit`/`upload_file`/`upload_folder` (and so every
`push_to_hub`), `ModelCard.push_to_hub`, `model_info`/`repo_info`, `list_repo_tree`/`list_repo_files`,
`hf_hub_download` and `snapshot_download` use, as huggingface_hub 2.4 calls them (read from its source):

API origin (`endpoint`):
    POST /api/repos/create                                  create a repo (409 with its url when it exists)
    POST /api/validate-yaml                                 README.md metadata check before a commit
    GET  /api/{type}s/{ns}/{name}[/revision/{rev}]          repo info (`sha`, `siblings`, card metadata, tags)
    GET  /api/{type}s/{ns}/{name}/tree/{rev}[/{path}]       tree listing (`?recursive=`), LFS info per file
    POST /api/{type}s/{ns}/{name}/preupload/{rev}           "regular" or "lfs" upload mode and remote oid per file
    POST /api/{type}s/{ns}/{name}/commit/{rev}              NDJSON commit: header, file (base64), lfsFile, deleted*
    POST /[{type}s/]{ns}/{name}.git/info/lfs/objects/batch  LFS batch API: where to PUT each missing object
    POST /[{type}s/]{ns}/{name}.git/info/lfs/objects/verify LFS verify after an upload
    HEAD/GET /[{type}s/]{ns}/{name}/resolve/{rev}/{path}    a file: regular files served here with `ETag` (git blob
                                                            sha1), LFS files redirected (302) to the storage origin
                                                            with `X-Linked-Etag` (sha256) and `X-Linked-Size`;
                                                            `X-Repo-Commit` always, also on 404 EntryNotFound
Storage origin (`storage_endpoint`, another port: the client treats it like the Hub's CDN / S3 and sends no token):
    PUT  /upload/{sha256}                                   an LFS object (checked against its sha256)
    HEAD/GET /objects/{sha256}                              an LFS object, with `Range` support

Errors carry `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound) and `X-Error-Message` as on the Hub, so
the client raises its usual exceptions. Writes need `Authorization: Bearer <token>`; public repos are readable
without one. Not implemented: pull requests, branch and tag creation, Xet, pagination of long listings.

Use it as a context manager: `with HubServer(tmp_path) as hub: ...`, then inspect what was pushed with
`hub.list_files(repo_id)` / `hub.read_file(repo_id, path)` and what the client asked for with `hub.requests`.
`python tests/hub_server.py` serves until interrupted.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import json
import re
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

DEFAULT_NAMESPACE = "test-user"
DEFAULT_TOKEN = "hf_test_token"
REPO_TYPES = ("model", "dataset", "space")
# What the Hub's default .gitattributes sends to LFS (abridged); binary or large files go to LFS too.
LFS_PATTERNS = (
    "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.gguf", "*.npy",
    "*.npz", "*.pkl", "*.pickle", "*.tar", "*.tar.gz", "*.zip", "*.arrow", "*.parquet", "*.model", "*.tflite",
)  # fmt: skip
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024
LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob, which the Hub uses as the ETag of regular files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class HubError(Exception):
    """An HTTP error answered the way the Hub does (JSON body, `X-Error-Code` / `X-Error-Message` headers)."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


@dataclass
class StoredFile:
    """A file in a commit. `blob_id` is what git stores: the content's blob sha1, or the LFS pointer's."""

    blob_id: str
    size: int
    lfs_oid: str | None = None
    pointer_size: int | None = None

    @property
    def remote_oid(self) -> str:
        # The oid the preupload endpoint reports, which the client compares with its own to skip unchanged files.
        return self.lfs_oid if self.lfs_oid is not None else self.blob_id


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    description: str
    date: str
    files: dict[str, StoredFile]


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    created_at: str
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)

    @property
    def url_prefix(self) -> str:
        return "" if self.repo_type == "model" else f"{self.repo_type}s/"


class HubServer:
    """A Hub-compatible server on 127.0.0.1 (two free ports: the API and the LFS storage), in background threads.

    Args:
        root: folder where blobs and LFS objects are stored (a temporary one when not given).
        token: the only token accepted for writes (`None` accepts any bearer token).
        namespace: the user a repo created without a namespace belongs to.
    """

    def __init__(self, root: str | Path | None = None, token: str | None = DEFAULT_TOKEN, namespace=DEFAULT_NAMESPACE):
        self._tmp = tempfile.TemporaryDirectory(prefix="hub-server-") if root is None else None
        self.root = Path(root if root is not None else self._tmp.name)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        (self.root / "lfs").mkdir(parents=True, exist_ok=True)
        self.token, self.namespace = token, namespace
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[tuple[str, str, str, int]] = []  # (origin, method, path, status)
        self.errors: list[str] = []
        self.lock = threading.RLock()
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []
        self.endpoint = self.storage_endpoint = ""

    # -- lifecycle --------------------------------------------------------------------------------------------------
    def start(self) -> HubServer:
        for role in ("api", "storage"):
            server = ThreadingHTTPServer(("127.0.0.1", 0), HubRequestHandler)
            server.daemon_threads = True
            server.hub, server.role = self, role
            url = f"http://127.0.0.1:{server.server_address[1]}"
            if role == "api":
                self.endpoint = url
            else:
                self.storage_endpoint = url
            thread = threading.Thread(target=server.serve_forever, name=f"hub-server-{role}", daemon=True)
            thread.start()
            self._servers.append(server)
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers, self._threads = [], []
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- inspection, for tests ----------------------------------------------------------------------------------------
    def list_files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> list[str]:
        """Paths of the files at `revision`, sorted."""
        with self.lock:
            return sorted(self._commit(self._repo(repo_type, repo_id), revision).files)

    def read_file(self, repo_id: str, path: str, revision: str = "main", repo_type: str = "model") -> bytes:
        """The content of `path` at `revision` (the real bytes for LFS files, not the pointer)."""
        with self.lock:
            stored = self._file(self._commit(self._repo(repo_type, repo_id), revision), path)
        return self._content_path(stored).read_bytes()

    def head(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> str:
        """The commit oid `revision` points to."""
        with self.lock:
            return self._commit(self._repo(repo_type, repo_id), revision).oid

    def lfs_oid(self, repo_id: str, path: str, revision: str = "main", repo_type: str = "model") -> str | None:
        """The sha256 of `path` if it is stored through LFS, else None."""
        with self.lock:
            return self._file(self._commit(self._repo(repo_type, repo_id), revision), path).lfs_oid

    def lfs_files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> list[str]:
        """Paths of the files stored through LFS at `revision`."""
        with self.lock:
            files = self._commit(self._repo(repo_type, repo_id), revision).files
            return sorted(path for path, stored in files.items() if stored.lfs_oid is not None)

    # -- storage ------------------------------------------------------------------------------------------------------
    def _repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, f"Repository {repo_type} {repo_id!r} not found.", "RepoNotFound")
        return repo

    def _commit(self, repo: Repo, revision: str) -> Commit:
        oid = repo.branches.get(revision) or (revision if revision in repo.commits else None)
        if oid is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo.commits[oid]

    @staticmethod
    def _file(commit: Commit, path: str) -> StoredFile:
        stored = commit.files.get(path)
        if stored is None:
            raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        return stored

    def _content_path(self, stored: StoredFile) -> Path:
        if stored.lfs_oid is not None:
            return self.root / "lfs" / stored.lfs_oid
        return self.root / "blobs" / stored.blob_id

    def _store_regular(self, data: bytes) -> StoredFile:
        blob_id = git_blob_sha1(data)
        (self.root / "blobs" / blob_id).write_bytes(data)
        return StoredFile(blob_id=blob_id, size=len(data))

    def _lfs_entry(self, oid: str) -> StoredFile:
        path = self.root / "lfs" / oid
        if not path.is_file():
            raise HubError(422, f"LFS object {oid} was not uploaded before the commit.")
        size = path.stat().st_size
        pointer = LFS_POINTER.format(oid=oid, size=size).encode()
        return StoredFile(blob_id=git_blob_sha1(pointer), size=size, lfs_oid=oid, pointer_size=len(pointer))

    def _new_commit(self, repo: Repo, branch: str, title: str, description: str, files: dict) -> Commit:
        parent = repo.branches.get(branch)
        tree = {path: stored.blob_id for path, stored in sorted(files.items())}
        date = now_iso()
        digest = json.dumps([parent, tree, title, description, date, len(repo.commits)]).encode()
        commit = Commit(hashlib.sha1(digest).hexdigest(), parent, title, description, date, dict(files))
        repo.commits[commit.oid] = commit
        repo.branches[branch] = commit.oid
        return commit

    @staticmethod
    def is_lfs(path: str, size: int, sample: bytes) -> bool:
        name = path.rsplit("/", 1)[-1]
        matches = any(fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(path, pattern) for pattern in LFS_PATTERNS)
        return matches or size >= LFS_SIZE_THRESHOLD or b"\0" in sample

    # -- API ----------------------------------------------------------------------------------------------------------
    def create_repo(self, payload: dict) -> tuple[int, dict]:
        repo_type = payload.get("type") or "model"
        if repo_type not in REPO_TYPES:
            raise HubError(400, f"Invalid repo type {repo_type!r}.")
        name, namespace = payload.get("name"), payload.get("organization") or self.namespace
        if not name or "/" in name:
            raise HubError(400, f"Invalid repo name {name!r}.")
        repo_id = f"{namespace}/{name}"
        with self.lock:
            existing = self.repos.get((repo_type, repo_id))
            if existing is not None:
                url = f"{self.endpoint}/{existing.url_prefix}{repo_id}"
                return 409, {"error": "You already created this model repo", "url": url}
            repo = Repo(repo_type, repo_id, bool(payload.get("private")), now_iso())
            # Like the Hub: an initial commit with the .gitattributes that decides what goes to LFS.
            attributes = "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in LFS_PATTERNS)
            self._new_commit(
                repo, "main", "initial commit", "", {".gitattributes": self._store_regular(attributes.encode())}
            )
            self.repos[(repo_type, repo_id)] = repo
        return 200, {"url": f"{self.endpoint}/{repo.url_prefix}{repo_id}", "name": repo_id, "id": repo_id}

    def repo_info(self, repo: Repo, revision: str, files_metadata: bool) -> dict:
        commit = self._commit(repo, revision)
        card = self._card_metadata(commit)
        config = self._json_file(commit, "config.json")
        siblings = []
        for path, stored in sorted(commit.files.items()):
            sibling = {"rfilename": path}
            if files_metadata:
                sibling |= {"size": stored.size, "blobId": stored.blob_id}
                if stored.lfs_oid is not None:
                    sibling["lfs"] = {
                        "sha256": stored.lfs_oid,
                        "size": stored.size,
                        "pointerSize": stored.pointer_size,
                    }
            siblings.append(sibling)
        tags = list(card.get("tags") or [])
        for extra in (card.get("library_name"), "custom_code" if config.get("auto_map") else None):
            if extra and extra not in tags:
                tags.append(extra)
        namespace = repo.repo_id.split("/")[0]
        info = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": namespace,
            "sha": commit.oid,
            "lastModified": commit.date,
            "createdAt": repo.created_at,
            "private": repo.private,
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": tags,
            "cardData": card or None,
            "siblings": siblings,
        }
        if repo.repo_type == "model":
            info |= {
                "modelId": repo.repo_id,
                "library_name": card.get("library_name"),
                "pipeline_tag": card.get("pipeline_tag"),
            }
            if config:
                info["config"] = {
                    key: config[key] for key in ("architectures", "model_type", "auto_map") if key in config
                }
        return info

    def _json_file(self, commit: Commit, path: str) -> dict:
        stored = commit.files.get(path)
        if stored is None or stored.lfs_oid is not None:
            return {}
        try:
            return json.loads(self._content_path(stored).read_text(encoding="utf-8"))
        except ValueError:
            return {}

    def _card_metadata(self, commit: Commit) -> dict:
        stored = commit.files.get("README.md")
        if stored is None:
            return {}
        match = re.match(r"^---\s*\n(.*?)\n---\s*\n", self._content_path(stored).read_text(encoding="utf-8"), re.S)
        metadata = yaml.safe_load(match.group(1)) if match else None
        return metadata if isinstance(metadata, dict) else {}

    def tree(self, repo: Repo, revision: str, path: str, recursive: bool) -> list[dict]:
        commit = self._commit(repo, revision)
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        under = {p: stored for p, stored in commit.files.items() if p.startswith(prefix)}
        if prefix and not under:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        entries, folders = [], set()
        for file_path, stored in sorted(under.items()):
            parts = file_path[len(prefix) :].split("/")
            for depth in range(1, len(parts)):
                folders.add(prefix + "/".join(parts[:depth]))
            if len(parts) > 1 and not recursive:
                continue
            entry = {"type": "file", "oid": stored.blob_id, "size": stored.size, "path": file_path}
            if stored.lfs_oid is not None:
                entry["lfs"] = {"oid": stored.lfs_oid, "size": stored.size, "pointerSize": stored.pointer_size}
            entries.append(entry)
        if not recursive:
            folders = {folder for folder in folders if "/" not in folder[len(prefix) :]}
        directories = []
        for folder in sorted(folders):
            folder_oid = hashlib.sha1(f"{commit.oid}:{folder}".encode()).hexdigest()
            directories.append({"type": "directory", "oid": folder_oid, "size": 0, "path": folder})
        return directories + entries

    def preupload(self, repo: Repo, revision: str, payload: dict) -> dict:
        commit = self._commit(repo, revision)
        answers = []
        for item in payload.get("files", []):
            path, size = item["path"], int(item["size"])
            sample = base64.b64decode(item.get("sample", ""))
            existing = commit.files.get(path)
            answers.append(
                {
                    "path": path,
                    "uploadMode": "lfs" if self.is_lfs(path, size, sample) else "regular",
                    "shouldIgnore": False,
                    "oid": existing.remote_oid if existing is not None else None,
                }
            )
        return {"files": answers, "commitOid": commit.oid}

    def commit(self, repo: Repo, revision: str, body: bytes) -> dict:
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "A commit payload starts with a 'header' line.")
        header = lines[0]["value"]
        with self.lock:
            if revision not in repo.branches:
                raise HubError(
                    404,
                    f"Invalid rev id: {revision} (this server commits to existing branches only)",
                    "RevisionNotFound",
                )
            head = self._commit(repo, revision)
            parent = header.get("parentCommit")
            if parent is not None and parent != head.oid:
                raise HubError(412, f"Parent commit {parent} is not the head of {revision} ({head.oid}).")
            files = dict(head.files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value", {})
                path = value.get("path", "")
                if key == "file":
                    if value.get("encoding", "base64") != "base64":
                        raise HubError(400, f"Unsupported encoding {value.get('encoding')!r} for {path}.")
                    files[path] = self._store_regular(base64.b64decode(value["content"]))
                elif key == "lfsFile":
                    stored = self._lfs_entry(value["oid"])
                    if value.get("size") is not None and int(value["size"]) != stored.size:
                        raise HubError(422, f"LFS object {value['oid']} has size {stored.size}, not {value['size']}.")
                    files[path] = stored
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                elif key == "deletedFolder":
                    prefix = path.rstrip("/") + "/"
                    doomed = [p for p in files if p.startswith(prefix)]
                    if not doomed:
                        raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                    for doomed_path in doomed:
                        del files[doomed_path]
                else:
                    raise HubError(400, f"Unknown commit operation {key!r}.")
            commit = self._new_commit(repo, revision, header.get("summary", ""), header.get("description", ""), files)
        return {
            "success": True,
            "commitOid": commit.oid,
            "commitUrl": f"{self.endpoint}/{repo.url_prefix}{repo.repo_id}/commit/{commit.oid}",
            "pullRequestUrl": None,
        }

    def lfs_batch(self, repo: Repo, payload: dict) -> dict:
        if payload.get("operation") != "upload":
            raise HubError(400, "This server answers LFS batch requests for uploads only.")
        if "basic" not in payload.get("transfers", ["basic"]):
            raise HubError(400, "This server supports the 'basic' LFS transfer only.")
        verify_url = f"{self.endpoint}/{repo.url_prefix}{repo.repo_id}.git/info/lfs/objects/verify"
        objects = []
        for item in payload.get("objects", []):
            oid, size = item["oid"], int(item["size"])
            answer = {"oid": oid, "size": size, "authenticated": True}
            stored = self.root / "lfs" / oid
            if not (stored.is_file() and stored.stat().st_size == size):
                answer["actions"] = {
                    "upload": {"href": f"{self.storage_endpoint}/upload/{oid}", "header": {}},
                    "verify": {"href": verify_url, "header": {}},
                }
            objects.append(answer)
        return {"transfer": "basic", "objects": objects}

    def lfs_verify(self, payload: dict) -> dict:
        stored = self.root / "lfs" / payload.get("oid", "")
        if not stored.is_file() or stored.stat().st_size != int(payload.get("size", -1)):
            raise HubError(404, f"LFS object {payload.get('oid')} was not uploaded.")
        return {"success": True}

    def store_lfs_object(self, oid: str, data: bytes) -> None:
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, f"The uploaded content does not match its sha256 {oid}.")
        partial = self.root / "lfs" / f"{oid}.incomplete"
        partial.write_bytes(data)
        partial.replace(self.root / "lfs" / oid)


class HubRequestHandler(BaseHTTPRequestHandler):
    """Routes one request of the API or the storage origin to the [`HubServer`] that owns the socket."""

    protocol_version = "HTTP/1.1"  # keep-alive, like the Hub: every response carries a Content-Length

    @property
    def hub(self) -> HubServer:
        return self.server.hub

    def do_GET(self):
        self._dispatch()

    def do_HEAD(self):
        self._dispatch()

    def do_POST(self):
        self._dispatch()

    def do_PUT(self):
        self._dispatch()

    # -- plumbing -----------------------------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        body = self._read_body()
        url = urlsplit(self.path)
        # Split before unquoting: a quoted revision ("refs%2Fpr%2F1") is one segment.
        segments = [unquote(segment) for segment in url.path.split("/")[1:]]
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        try:
            if self.server.role == "storage":
                self._storage(segments, body)
            else:
                self._api(segments, query, body)
        except HubError as error:
            headers = {"X-Error-Message": error.message, **error.headers}
            if error.code:
                headers["X-Error-Code"] = error.code
            self._send_json(error.status, {"error": error.message}, headers)
        except Exception as error:  # a bug in this server: say so in the response and keep it for the test
            self.hub.errors.append(f"{self.command} {self.path}: {error!r}")
            self._send_json(500, {"error": f"test Hub server error: {error!r}"})

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _has_valid_token(self) -> bool:
        authorization = self.headers.get("Authorization", "")
        token = authorization[len("Bearer ") :] if authorization.startswith("Bearer ") else None
        return token is not None and (self.hub.token is None or token == self.hub.token)

    def _authorize_write(self) -> None:
        if not self.headers.get("Authorization", "").startswith("Bearer "):
            raise HubError(401, "You must be authenticated to write to the Hub (set HF_TOKEN).")
        if not self._has_valid_token():
            raise HubError(401, "Invalid credentials in Authorization header")

    def _readable(self, repo: Repo) -> Repo:
        if repo.private and not self._has_valid_token():
            raise HubError(404, f"Repository {repo.repo_id!r} not found.", "RepoNotFound")
        return repo

    def _send(self, status: int, data: bytes, headers: dict | None = None, content_type="application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_json(self, status: int, payload, headers: dict | None = None, content_type="application/json") -> None:
        self._send(status, json.dumps(payload).encode(), headers, content_type)

    def _send_file(self, path: Path, headers: dict) -> None:
        data = path.read_bytes()
        status, byte_range = 200, self.headers.get("Range")
        if byte_range:
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", byte_range.strip())
            if match is None:
                raise HubError(416, f"Unsupported Range {byte_range!r}.")
            start, end = int(match.group(1)), int(match.group(2) or len(data) - 1)
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
            data, status = data[start : end + 1], 206
        self._send(status, data, {"Accept-Ranges": "bytes", **headers}, "application/octet-stream")

    def log_request(self, code="-", size="-") -> None:
        status = code.value if isinstance(code, HTTPStatus) else int(code) if str(code).isdigit() else 0
        with self.hub.lock:
            self.hub.requests.append((self.server.role, self.command, urlsplit(self.path).path, status))

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's signature
        pass  # requests are recorded in `hub.requests`; keep test output clean

    # -- routes -------------------------------------------------------------------------------------------------------
    def _storage(self, segments: list[str], body: bytes) -> None:
        if len(segments) == 2 and segments[0] == "upload" and self.command == "PUT":
            self.hub.store_lfs_object(segments[1], body)
            self._send(200, b"")
        elif len(segments) == 2 and segments[0] == "objects" and self.command in ("GET", "HEAD"):
            path = self.hub.root / "lfs" / segments[1]
            if not re.fullmatch(r"[0-9a-f]{64}", segments[1]) or not path.is_file():
                raise HubError(404, "No such object.")
            self._send_file(path, {"ETag": f'"{segments[1]}"'})
        else:
            raise HubError(404, f"Unknown storage route {self.command} {self.path}.")

    def _api(self, segments: list[str], query: dict, body: bytes) -> None:
        hub, command = self.hub, self.command
        if segments[:1] == ["api"]:
            if segments[1:] == ["repos", "create"] and command == "POST":
                self._authorize_write()
                status, payload = hub.create_repo(json.loads(body or b"{}"))
                return self._send_json(status, payload)
            if segments[1:] == ["validate-yaml"] and command == "POST":
                content = json.loads(body or b"{}").get("content", "")
                match = re.match(r"^---\s*\n(.*?)\n---\s*\n", content, re.S)
                try:
                    metadata = yaml.safe_load(match.group(1)) if match else {}
                except yaml.YAMLError as error:
                    return self._send_json(400, {"errors": [{"message": f"Invalid YAML: {error}"}]})
                if metadata is not None and not isinstance(metadata, dict):
                    return self._send_json(400, {"errors": [{"message": "The metadata must be a YAML mapping."}]})
                return self._send_json(200, {"errors": [], "warnings": []})
            if len(segments) >= 4 and segments[1] in {f"{t}s" for t in REPO_TYPES}:
                return self._repo_api(segments[1][:-1], f"{segments[2]}/{segments[3]}", segments[4:], query, body)
            raise HubError(404, f"Unknown API route {command} {self.path}.")
        repo_type = "model"
        if segments[:1] in (["datasets"], ["spaces"]):
            repo_type, segments = segments[0][:-1], segments[1:]
        if len(segments) >= 2 and segments[1].endswith(".git") and segments[2:5] == ["info", "lfs", "objects"]:
            self._authorize_write()
            with hub.lock:
                repo = hub._repo(repo_type, f"{segments[0]}/{segments[1][: -len('.git')]}")
            payload = json.loads(body or b"{}")
            if segments[5:] == ["batch"] and command == "POST":
                return self._send_json(200, hub.lfs_batch(repo, payload), content_type="application/vnd.git-lfs+json")
            if segments[5:] == ["verify"] and command == "POST":
                return self._send_json(200, hub.lfs_verify(payload))
        if len(segments) >= 5 and segments[2] == "resolve" and command in ("GET", "HEAD"):
            return self._resolve(repo_type, f"{segments[0]}/{segments[1]}", segments[3], "/".join(segments[4:]))
        raise HubError(404, f"Unknown route {command} {self.path}.")

    def _repo_api(self, repo_type: str, repo_id: str, rest: list[str], query: dict, body: bytes) -> None:
        hub, command = self.hub, self.command
        if rest[:1] and rest[0].startswith("xet-"):
            raise HubError(501, "This test Hub has no Xet storage: set HF_HUB_DISABLE_XET=1 to upload through LFS.")
        if command == "POST" and rest[:1] in (["preupload"], ["commit"]) and len(rest) == 2:
            self._authorize_write()
            if "create_pr" in query:
                raise HubError(400, "This test Hub does not implement pull requests.")
        with hub.lock:
            repo = self._readable(hub._repo(repo_type, repo_id))
            if command == "GET" and (not rest or rest[0] == "revision"):
                files_metadata = query.get("blobs", "").lower() in ("1", "true")
                payload = hub.repo_info(repo, rest[1] if len(rest) > 1 else "main", files_metadata)
            elif command == "GET" and rest[:1] == ["tree"] and len(rest) >= 2:
                recursive = query.get("recursive", "").lower() in ("1", "true")
                payload = hub.tree(repo, rest[1], "/".join(rest[2:]), recursive)
            elif command == "POST" and rest[:1] == ["preupload"] and len(rest) == 2:
                payload = hub.preupload(repo, rest[1], json.loads(body or b"{}"))
            elif command == "POST" and rest[:1] == ["commit"] and len(rest) == 2:
                payload = hub.commit(repo, rest[1], body)
            else:
                raise HubError(404, f"Unknown repo route {command} {self.path}.")
        self._send_json(200, payload)

    def _resolve(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        hub = self.hub
        with hub.lock:
            repo = self._readable(hub._repo(repo_type, repo_id))
            commit = hub._commit(repo, revision)
            stored = hub._file(commit, path)
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{stored.blob_id}"'}
        if stored.lfs_oid is None:
            return self._send_file(hub._content_path(stored), headers)
        # LFS: like the Hub, redirect to storage on another origin; the redirect carries the file's metadata.
        headers |= {
            "Location": f"{hub.storage_endpoint}/objects/{stored.lfs_oid}",
            "X-Linked-Etag": f'"{stored.lfs_oid}"',
            "X-Linked-Size": str(stored.size),
        }
        self._send(302, b"", headers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="storage folder (a temporary one by default)")
    parser.add_argument("--token", default=DEFAULT_TOKEN, help="the token writes must carry")
    args = parser.parse_args()
    with HubServer(args.root, token=args.token) as hub:
        print(f"HF_ENDPOINT={hub.endpoint} HF_TOKEN={args.token} HF_HUB_DISABLE_XET=1 HF_HUB_OFFLINE=0", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
