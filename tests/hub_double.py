"""A local stand-in for the Hugging Face Hub, on a loopback port.

Tests point `HF_ENDPOINT` at it. It serves the endpoints `huggingface_hub`
and Hearth call: model info with file metadata, file downloads with HTTP
ranges (optionally throttled, so progress can be watched), model search,
and repo creation plus commits (uploads land in `uploads`). Every request
is logged in `requests` as (method, path, Range header)."""
from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit


class Repo:
    def __init__(self, repo_id: str, files: dict[str, bytes], tags: tuple[str, ...] = ("mlx",)):
        self.repo_id, self.files, self.tags = repo_id, files, list(tags)
        self.sha = hashlib.sha1(json.dumps(sorted((k, hashlib.sha256(v).hexdigest())
                                                  for k, v in files.items())).encode()).hexdigest()

    @classmethod
    def from_dir(cls, repo_id: str, folder: Path, **kw) -> "Repo":
        return cls(repo_id, {str(p.relative_to(folder)): p.read_bytes()
                             for p in sorted(folder.rglob("*")) if p.is_file()}, **kw)

    @staticmethod
    def is_lfs(path: str) -> bool:
        return path.endswith(".safetensors")

    def sibling(self, path: str) -> dict:
        data = self.files[path]
        row = {"rfilename": path, "size": len(data),
               "blobId": hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()}
        if self.is_lfs(path):
            row["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 130}
        return row

    def etag(self, path: str) -> str:
        row = self.sibling(path)
        return row["lfs"]["sha256"] if "lfs" in row else row["blobId"]

    def info(self) -> dict:
        return {"id": self.repo_id, "modelId": self.repo_id, "sha": self.sha, "private": False, "tags": self.tags,
                "library_name": "mlx" if "mlx" in self.tags else None, "downloads": 7, "likes": 3,
                "siblings": [self.sibling(p) for p in sorted(self.files)]}


class HubDouble:
    def __init__(self, bytes_per_sec: float | None = None):
        self.repos: dict[str, Repo] = {}
        self.uploads: dict[str, dict[str, bytes]] = {}  # repo id -> path -> content
        self.requests: list[tuple[str, str, str | None]] = []
        self.bytes_per_sec = bytes_per_sec
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, repo: Repo) -> Repo:
        self.repos[repo.repo_id] = repo
        return repo

    def start(self) -> "HubDouble":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, body, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _missing(self, what: str = "Repository not found") -> None:
                data = json.dumps({"error": what}).encode()
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Error-Code", "RepoNotFound" if "Repository" in what else "EntryNotFound")
                self.send_header("X-Error-Message", what)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_HEAD(self):
                self._file(head=True)

            def do_GET(self):
                url = urlsplit(self.path)
                double.requests.append(("GET", url.path, self.headers.get("Range")))
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                if url.path == "/api/models":
                    return self._search(parse_qs(url.query))
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    repo = double.repos.get(f"{parts[2]}/{parts[3]}")
                    return self._json(repo.info()) if repo else self._missing()
                return self._file(head=False)

            def _search(self, query: dict) -> None:
                words = (query.get("search") or [""])[0].lower()
                library = (query.get("library") or query.get("filter") or [None])[0]
                limit = int((query.get("limit") or ["30"])[0])
                hits = [r.info() for r in double.repos.values()
                        if words in r.repo_id.lower() and (library is None or library in r.tags)]
                self._json([{k: h[k] for k in ("id", "modelId", "downloads", "likes", "tags")} for h in hits][:limit])

            def _file(self, head: bool) -> None:
                url = urlsplit(self.path)
                if head:
                    double.requests.append(("HEAD", url.path, self.headers.get("Range")))
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                if len(parts) < 5 or parts[2] != "resolve":
                    return self._missing("not found")
                repo = double.repos.get(f"{parts[0]}/{parts[1]}")
                path = "/".join(parts[4:])
                if repo is None or path not in repo.files or parts[3] not in (repo.sha, "main"):
                    return self._missing("Entry not found")
                data = repo.files[path]
                start, status = 0, 200
                wanted = self.headers.get("Range")
                if wanted and wanted.startswith("bytes="):
                    start = int(wanted[6:].split("-")[0] or 0)
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    status = 206
                body = data[start:]
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("X-Repo-Commit", repo.sha)
                self.send_header("ETag", f'"{repo.etag(path)}"')
                if repo.is_lfs(path):
                    self.send_header("X-Linked-Etag", f'"{repo.etag(path)}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if head:
                    return
                step = 16 << 10
                try:
                    for at in range(0, len(body), step):
                        self.wfile.write(body[at:at + step])
                        if double.bytes_per_sec:
                            time.sleep(step / double.bytes_per_sec)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self):
                url = urlsplit(self.path)
                double.requests.append(("POST", url.path, None))
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                body = self._body()
                if url.path == "/api/repos/create":
                    spec = json.loads(body or b"{}")
                    name = f"{spec.get('organization') or 'me'}/{spec['name']}" if "/" not in spec["name"] \
                        else spec["name"]
                    double.uploads.setdefault(name, {})
                    kind = spec.get("type") or "model"
                    prefix = "" if kind == "model" else f"{kind}s/"
                    return self._json({"url": f"{double.url}/{prefix}{name}", "name": name})
                if len(parts) >= 6 and parts[0] == "api" and parts[4] == "preupload":
                    files = json.loads(body or b"{}").get("files", [])
                    return self._json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                 for f in files], "commitOid": None})
                if len(parts) >= 6 and parts[0] == "api" and parts[4] == "commit":
                    repo_id = f"{parts[2]}/{parts[3]}"
                    store = double.uploads.setdefault(repo_id, {})
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item.get("key") == "file":
                            value = item["value"]
                            store[value["path"]] = base64.b64decode(value["content"])
                    oid = hashlib.sha1(body).hexdigest()
                    return self._json({"commitUrl": f"{double.url}/{repo_id}/commit/{oid}", "commitOid": oid,
                                       "pullRequestUrl": None})
                return self._missing("not found")

        return Handler
