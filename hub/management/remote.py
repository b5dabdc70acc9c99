"""A running Hearth server as the command line sees it: its address (`--url`,
else HEARTH_URL, else http://127.0.0.1:8080), its key (`--api-key`, else
HEARTH_API_KEY, sent as a bearer token) and its models (`GET /models`).
`hearth ls`, `ps`, `rm` and `run` ask through here; they need the server's
HTTP contract, never its code, so the commands sit in `hub` (or `config`)
without importing the layers that serve.

Also the few helpers the commands print with: sizes, durations, tables, and
the one-line error that ends a command. No Django here, and no imports of
the project's apps."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import httpx

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT_S = 2.0  # a server that takes longer to list its models counts as absent
ACTIVE = frozenset({"loaded", "loading"})  # the states in which a server holds a model's files
DASH = "—"


class NoServer(Exception):
    """Nothing answered at the address; `refused` when nothing listens there."""

    def __init__(self, message: str, refused: bool):
        super().__init__(message)
        self.refused = refused


class ServerError(Exception):
    """The server answered an error; the message is the server's own."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def add_arguments(parser) -> None:
    parser.add_argument("--url", default=None,
                        help=f"the running server's address (default: HEARTH_URL, else {DEFAULT_URL})")
    parser.add_argument("--api-key", default=None, help="the server's API key (default: HEARTH_API_KEY)")


def error_message(response: httpx.Response) -> str:
    """The message of an error answer, whichever of Hearth's shapes it has."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for value in (error, body.get("detail"), body.get("message")):
            if isinstance(value, str) and value:
                return value
    text = response.text.strip()
    return text[:300] if text else f"HTTP {response.status_code}"


@dataclass(frozen=True)
class Server:
    url: str
    api_key: str | None = None

    @classmethod
    def from_options(cls, opts: dict) -> Server:
        url = opts.get("url") or os.environ.get("HEARTH_URL") or DEFAULT_URL
        return cls(url.rstrip("/"), opts.get("api_key") or os.environ.get("HEARTH_API_KEY") or None)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = TIMEOUT_S) -> dict:
        """The JSON answer; NoServer when nothing answers, ServerError on an error status."""
        try:
            response = httpx.request(method, self.url + path, json=body, headers=self.headers, timeout=timeout)
        except httpx.ConnectError:
            raise NoServer(f"no server at {self.url}", refused=True) from None
        except httpx.TimeoutException:
            raise NoServer(f"the server at {self.url} did not answer within {timeout:g} s", refused=False) from None
        except httpx.TransportError as exc:
            raise NoServer(f"no answer from {self.url}: {exc}", refused=False) from None
        if response.status_code >= 400:
            raise ServerError(error_message(response), response.status_code)
        try:
            return response.json()
        except ValueError:
            raise ServerError(f"{self.url}{path} did not answer JSON; is it a Hearth server?",
                              response.status_code) from None

    def healthy(self, timeout: float = TIMEOUT_S) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def models(self) -> dict:
        """`GET /models`. A server without that route (single-model mode
        before router mode) is read from `/v1/models`, where the row of the
        model it serves carries the engine's fields."""
        try:
            return self.request("GET", "/models")
        except ServerError as exc:
            if exc.status != 404:
                raise
        rows = self.request("GET", "/v1/models").get("data") or []
        return {"object": "list", "mode": "single",
                "data": [{**row, "status": row.get("status") if isinstance(row.get("status"), dict)
                          else {"value": "loaded" if "batch_mode" in row else "unloaded"}} for row in rows]}


def status_value(row: dict) -> str:
    status = row.get("status")
    return str(status.get("value") or "unknown") if isinstance(status, dict) else str(status or "unknown")


def find(rows: list[dict], model: str) -> dict | None:
    """The row whose id or one of whose aliases is `model`."""
    for row in rows:
        if row.get("id") == model or model in (row.get("aliases") or ()):
            return row
    return None


def human_size(n: float | None) -> str:
    """Bytes as people read them, in powers of 1024 like the dashboard: `1.2 GB`."""
    if n is None:
        return DASH
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return DASH  # not reached


def duration(seconds: float | None) -> str:
    """`42s`, `3m 12s`, `2h 5m`, `3d 4h`."""
    if seconds is None:
        return DASH
    s = max(0, int(seconds))
    for size, unit, smaller, small_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s")):
        if s >= size:
            return f"{s // size}{unit} {s % size // smaller}{small_unit}"
    return f"{s}s"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns two spaces apart, the last one unpadded."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in [headers, *rows]]
    return "\n".join(lines) + "\n"


def fail(command: str, message: str, code: int = 1) -> NoReturn:
    """End `hearth COMMAND` with one line on stderr."""
    sys.stdout.flush()
    sys.stderr.write(f"hearth {command}: {message}\n")
    sys.exit(code)
