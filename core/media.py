"""Media that a request names by URL (images, audio, video): `data:` URLs
are decoded here, `http(s)` URLs are fetched under a destination policy.

A media URL is the caller's input, so fetching it lets a caller make this
server reach whatever the server can reach (SSRF: a router's admin page, a
cloud metadata service, a database on the LAN). The policy:

- only `http`, `https` and `data` URLs;
- every address the host name resolves to must be public: loopback,
  private, link-local (which holds the cloud metadata address
  169.254.169.254), shared (CGNAT), unique-local, multicast, reserved and
  unspecified addresses are refused unless private media is allowed
  (`--allow-private-media`, HEARTH_ALLOW_PRIVATE_MEDIA);
- the connection goes to the address that was checked, so a name server
  cannot answer the check with one address and the connect with another;
- every redirect is checked the same way (at most `MAX_REDIRECTS`);
- one deadline for the whole fetch, and a byte cap (video has its own,
  larger one), both from `core.limits`.

Written here rather than taken from urllib or httpx: both resolve the host
name again when they connect, and neither can pin the connection to the
address a policy approved. No Django, and no imports of the project's apps.
"""
from __future__ import annotations

import base64
import binascii
import http.client
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable
from urllib.parse import unquote_to_bytes, urljoin, urlsplit

from core import limits

MAX_REDIRECTS = 5
CHUNK = 1 << 16
USER_AGENT = "hearth-media/1"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class MediaRefused(ValueError):
    """A media URL that is not fetched or cannot be read; the text says why."""


def load_media(url: str, kind: str = "image", *, allow_private: bool | None = None) -> tuple[bytes, str | None]:
    """The bytes a media URL names, and their content type when known.

    `kind` ("image", "audio", "video") picks the byte cap; `allow_private`
    defaults to this server's setting."""
    if not isinstance(url, str) or not url.strip():
        raise MediaRefused("the url is empty")
    bounds = limits.current()
    cap = bounds.max_video_bytes if kind == "video" else bounds.max_media_bytes
    scheme = url.split(":", 1)[0].strip().lower() if ":" in url else ""
    if scheme == "data":
        return decode_data_url(url, cap)
    if scheme not in ("http", "https"):
        raise MediaRefused(f"only http, https and data URLs are fetched, not {scheme or 'a relative'!r} ones")
    allowed = public_only if not (bounds.allow_private_media if allow_private is None else allow_private) \
        else _any_address
    return fetch(url, cap=cap, timeout_s=bounds.media_timeout_s, allowed=allowed)


def decode_data_url(url: str, cap: int) -> tuple[bytes, str | None]:
    """`data:[<type>][;base64],<payload>`, decoded without any network."""
    head, sep, payload = url.partition(",")
    if not sep:
        raise MediaRefused("a data: URL needs a comma before its payload")
    params = head[5:].split(";")
    media_type = params[0].strip().lower() or None
    if "base64" in (p.strip().lower() for p in params[1:]):
        text = "".join(payload.split())
        if len(text) * 3 // 4 > cap:
            raise MediaRefused(f"the data: URL holds more than {cap} bytes")
        try:
            data = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise MediaRefused("the data: URL's payload is not valid base64") from None
    else:
        data = unquote_to_bytes(payload)
    if len(data) > cap:
        raise MediaRefused(f"the data: URL holds more than {cap} bytes")
    return data, media_type


def public_only(address: Address) -> bool:
    """Whether the policy lets a fetch connect to `address` by default."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def _any_address(address: Address) -> bool:
    return True


def fetch(url: str, *, cap: int, timeout_s: float, allowed: Callable[[Address], bool]) -> tuple[bytes, str | None]:
    """GET `url`, following redirects, each hop to an address `allowed` accepts."""
    deadline = time.monotonic() + timeout_s
    for _ in range(MAX_REDIRECTS + 1):
        status, headers, body = _get(url, cap, deadline, allowed)
        if status in (301, 302, 303, 307, 308):
            target = headers.get("location")
            if not target:
                raise MediaRefused(f"{_show(url)} redirected (HTTP {status}) without a Location")
            url = urljoin(url, target)
            if urlsplit(url).scheme.lower() not in ("http", "https"):
                raise MediaRefused(f"a redirect led to a non-http URL ({_show(url)})")
            continue
        if not 200 <= status < 300:
            raise MediaRefused(f"{_show(url)} answered HTTP {status}")
        return body, (headers.get("content-type") or "").split(";")[0].strip().lower() or None
    raise MediaRefused(f"more than {MAX_REDIRECTS} redirects")


def _get(url: str, cap: int, deadline: float, allowed) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        raise MediaRefused(f"{_show(url)} names no host")
    try:
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError:
        raise MediaRefused(f"{_show(url)} has an invalid port") from None
    address = _resolve(host, port, allowed)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = None
    try:
        conn = _pinned(parts.scheme.lower(), host, port, address, _left(deadline))
        conn.request("GET", target, headers={"User-Agent": USER_AGENT, "Accept": "*/*"})
        resp = conn.getresponse()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        if resp.status in (301, 302, 303, 307, 308):
            return resp.status, headers, b""
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > cap:
            raise MediaRefused(f"{_show(url)} is {int(length)} bytes, over the {cap}-byte cap")
        body = bytearray()
        while chunk := _read(conn, resp, deadline):
            body += chunk
            if len(body) > cap:
                raise MediaRefused(f"{_show(url)} is over the {cap}-byte cap")
        return resp.status, headers, bytes(body)
    except (TimeoutError, socket.timeout):
        raise MediaRefused(f"fetching {_show(url)} took longer than the time allowed") from None
    except (OSError, http.client.HTTPException) as exc:
        raise MediaRefused(f"fetching {_show(url)} failed: {exc or type(exc).__name__}") from None
    finally:
        if conn is not None:
            conn.close()


def _read(conn, resp, deadline: float) -> bytes:
    if conn.sock is not None:
        conn.sock.settimeout(_left(deadline))
    return resp.read1(CHUNK) if hasattr(resp, "read1") else resp.read(CHUNK)


def _resolve(host: str, port: int, allowed) -> str:
    """The address to connect to: every address `host` has must be allowed."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise MediaRefused(f"cannot resolve {host!r}: {exc}") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    for address in addresses:
        if not allowed(address):
            raise MediaRefused(f"{host} resolves to {address}, {_describe(address)}; start the server with "
                               "--allow-private-media to fetch media from this network")
    return str(addresses[0])


def _describe(address: Address) -> str:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for name in ("loopback", "link_local", "private", "multicast", "unspecified", "reserved"):
        if getattr(address, f"is_{name}"):
            return f"a {name.replace('_', '-')} address"
    return "not a public address"


def _pinned(scheme: str, host: str, port: int, address: str, timeout: float) -> http.client.HTTPConnection:
    """A connection to `host` that connects to the checked `address` only."""
    if scheme == "https":
        return _PinnedHTTPS(host, port, address, timeout)
    return _PinnedHTTP(host, port, address, timeout)


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _show(url: str) -> str:
    """The URL for an error message, without credentials and cut short."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]  # no user:password@
    shown = f"{parts.scheme}://{host}{parts.path}"
    return shown if len(shown) <= 120 else shown[:117] + "..."
