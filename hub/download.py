"""Downloading a model repo into the HF cache, resumably.

The cache layout is the one `huggingface_hub` writes (blobs named by their
hash, a snapshot per commit of relative symlinks, `refs/<branch>`), so the
library, `mlx_lm.load` and `huggingface_hub` all see the result as a normal
download. Unlike `hf_hub_download`, a partial file keeps a stable name
(`blobs/<hash>.incomplete`), so a download killed mid-file continues from
where it stopped, with an HTTP range request, after a restart. Every file is
checked against its size and hash before it becomes a blob, and the
snapshot's links are made only once every blob is in, so a stopped download
is never listed as a model with files missing.
"""
from __future__ import annotations

import hashlib
import os
import re
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from core.fs import write_atomically

CHUNK = 1 << 20
RATE_WINDOW_S = 5.0
HEX = re.compile(r"^[0-9a-f]{40,64}$")
REVISION = re.compile(r"^[A-Za-z0-9._-][A-Za-z0-9._/-]{0,127}$")


@dataclass
class RemoteFile:
    path: str
    size: int
    etag: str  # the blob name: the LFS sha256, or the git blob id
    lfs: bool


@dataclass
class Progress:
    """What a download reports while it runs. `received_bytes` counts what is
    on disk, including what an earlier run left; the rate counts only the
    bytes this run moved, so a resumed download reports its real speed."""

    files_total: int = 0
    files_done: int = 0
    total_bytes: int = 0
    received_bytes: int = 0
    current_file: str | None = None
    bytes_per_sec: float = 0.0
    moved_bytes: int = 0  # fetched over the network by this run
    _samples: deque = field(default_factory=deque)

    def add(self, n: int) -> None:
        """`n` bytes just arrived from the hub (0: a request starts, so its wait counts as time)."""
        self.received_bytes += n
        self.moved_bytes += n
        now = time.monotonic()
        self._samples.append((now, self.moved_bytes))
        while len(self._samples) > 2 and now - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()
        first_t, first_b = self._samples[0]
        self.bytes_per_sec = (self.moved_bytes - first_b) / (now - first_t) if now > first_t else 0.0

    def found(self, n: int) -> None:
        """`n` bytes already on disk from an earlier run (negative: a partial file dropped): they
        count toward `received_bytes`, never toward the rate."""
        self.received_bytes += n


def repo_dir(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def listing(repo_id: str, revision: str, token: str | None) -> tuple[str, list[RemoteFile]]:
    """(commit, files) of a revision, from the hub's API."""
    from huggingface_hub import HfApi

    info = HfApi(token=token).model_info(repo_id, revision=revision, files_metadata=True)
    files = []
    for sibling in info.siblings or []:
        lfs = sibling.lfs
        etag = lfs.sha256 if lfs is not None else sibling.blob_id
        size = lfs.size if lfs is not None else sibling.size
        if not etag or size is None:
            raise ValueError(f"the hub listed {sibling.rfilename} without a hash or size")
        files.append(RemoteFile(sibling.rfilename, int(size), etag, lfs is not None))
    if not info.sha or not HEX.match(info.sha):
        raise ValueError(f"the hub gave no usable commit for {repo_id}@{revision}")
    for f in files:  # names from the network become paths: nothing may leave the repo folder
        parts = Path(f.path).parts
        if not HEX.match(f.etag) or not parts or f.path.startswith("/") or ".." in parts:
            raise ValueError(f"the hub listed an unsafe file entry: {f.path!r} ({f.etag!r})")
    return info.sha, files


def check_revision(revision: str) -> None:
    if not REVISION.match(revision) or ".." in revision.split("/"):
        raise ValueError(f"revision {revision!r} is not a branch, tag or commit name")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # followed by hand, so credentials never travel to another host


_opener = urllib.request.build_opener(_NoRedirect)


def _open(url: str, headers: dict, hops: int = 5):
    """GET `url`, following redirects; `Authorization` only goes to the first host."""
    from urllib.parse import urljoin, urlsplit

    first_host = urlsplit(url).netloc
    for _ in range(hops):
        sent = {k: v for k, v in headers.items() if k != "Authorization" or urlsplit(url).netloc == first_host}
        try:
            return _opener.open(urllib.request.Request(url, headers=sent), timeout=60)
        except urllib.error.HTTPError as exc:
            if exc.code in (301, 302, 303, 307, 308) and exc.headers.get("Location"):
                url = urljoin(url, exc.headers["Location"])
                continue
            raise
    raise RuntimeError("too many redirects")


def _verify(path: Path, remote: RemoteFile) -> None:
    size = path.stat().st_size
    if size != remote.size:
        raise ValueError(f"{remote.path}: got {size} bytes, expected {remote.size}")
    if remote.lfs:
        digest = hashlib.sha256()
    else:  # git's blob id: sha1 over a header and the content
        digest = hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    if digest.hexdigest() != remote.etag:
        raise ValueError(f"{remote.path}: content hash {digest.hexdigest()} does not match {remote.etag}")


def _fetch(url: str, part: Path, remote: RemoteFile, token: str | None, progress: Progress | _Reporting,
           stop: Callable[[], bool]) -> None:
    if part.is_symlink() or (part.exists() and not part.is_file()):  # a FIFO or a link put there: never opened
        part.unlink()
    have = part.stat().st_size if part.exists() else 0
    if have > remote.size:
        part.unlink()
        have = 0
    progress.found(have)  # what an earlier run already fetched
    if have == remote.size:
        part.touch()  # an empty file has nothing to fetch
        return
    headers = {"User-Agent": "hearth"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if have:
        headers["Range"] = f"bytes={have}-"
    progress.add(0)  # the rate's clock starts with the request
    try:
        response = _open(url, headers)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the range is past the end: start over
            part.unlink()
            progress.found(-have)
            return _fetch(url, part, remote, token, progress, stop)
        raise RuntimeError(f"{remote.path}: the hub answered {exc.code} {exc.reason}") from None
    with response:
        if have and response.status != 206:  # no range support: start over
            progress.found(-have)
            have = 0
        with open(part, "ab" if have else "wb") as f:
            while block := response.read1(CHUNK):
                f.write(block)
                progress.add(len(block))
                if stop():
                    raise InterruptedError("download stopped")
            f.flush()
            os.fsync(f.fileno())


def _link(snapshot: Path, remote: RemoteFile) -> None:
    target = snapshot / remote.path
    target.parent.mkdir(parents=True, exist_ok=True)
    depth = len(Path(remote.path).parts) - 1
    relative = Path(*([".."] * (depth + 2)), "blobs", remote.etag)
    if target.is_symlink() and os.readlink(target) == str(relative):
        return
    if target.is_symlink() or target.exists():
        target.unlink()
    target.symlink_to(relative)


def download(repo_id: str, revision: str, cache: Path, token: str | None, progress: Progress,
             report: Callable[[Progress], None], stop: Callable[[], bool] = lambda: False) -> tuple[str, Path]:
    """Fetch every file of `repo_id`@`revision` into `cache`; (commit, snapshot)."""
    check_revision(revision)
    root = repo_dir(cache, repo_id)
    from hub.locks import repo_lock

    with repo_lock(root):  # GC leaves the repo alone while this runs
        return _download(repo_id, revision, root, token, progress, report, stop)


def _download(repo_id, revision, root, token, progress, report, stop) -> tuple[str, Path]:
    from huggingface_hub import constants

    commit, files = listing(repo_id, revision, token)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = root / "snapshots" / commit
    progress.files_total, progress.total_bytes = len(files), sum(f.size for f in files)
    report(progress)
    for remote in files:
        progress.current_file = remote.path
        report(progress)
        blob = root / "blobs" / remote.etag
        if blob.exists() and blob.stat().st_size == remote.size:
            progress.found(remote.size)
        else:
            part = root / "blobs" / f"{remote.etag}.incomplete"
            url = f"{constants.ENDPOINT}/{repo_id}/resolve/{commit}/{quote(remote.path)}"
            _fetch(url, part, remote, token, _Reporting(progress, report), stop)
            try:
                _verify(part, remote)
            except ValueError:
                part.unlink(missing_ok=True)  # a bad copy is not worth resuming
                raise
            os.replace(part, blob)
        progress.files_done += 1
        report(progress)
    # The snapshot appears once every blob is here: a download stopped half-way leaves blobs only,
    # which no listing shows as a model (its first revision) and the next run links.
    snapshot.mkdir(parents=True, exist_ok=True)
    for remote in files:
        _link(snapshot, remote)
    if revision != commit:
        write_atomically(root / "refs" / revision, commit)  # creates refs/ and a branch name's folders
    progress.current_file = None
    report(progress)
    return commit, snapshot


class _Reporting:
    """A Progress that also reports (at most every 0.25 s) while bytes arrive."""

    def __init__(self, progress: Progress, report: Callable[[Progress], None]):
        self.progress, self.report, self.last = progress, report, 0.0

    def found(self, n: int) -> None:
        self.progress.found(n)

    def add(self, n: int) -> None:
        self.progress.add(n)
        now = time.monotonic()
        if now - self.last >= 0.25:
            self.last = now
            self.report(self.progress)
