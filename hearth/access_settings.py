"""The access settings `hearth serve` settles at start, before any model
loads: the API keys, the bind policy, the Host names answered and the
origins allowed cross-origin. Requests are checked against them by
hearth/access.py and the middleware; this module only builds them.

Bind policy: off loopback, a server with no key refuses to start unless the
operator says --insecure-no-auth; a Host check never admits any name (the
configured names, this machine's own names and addresses, loopback).
"""
from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from core import paths

log = logging.getLogger("hearth.serve")
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
SHORT_KEY = 16
INSECURE_WARNING = ("serving off loopback with no API key (--insecure-no-auth): anyone who can reach this "
                    "address can read chats, run jobs, push to the Hub with the saved token and use the chat's tools")


class AccessError(ValueError):
    """A setting that stops start-up, with the message to show."""


@dataclass(frozen=True)
class Access:
    api_keys: frozenset
    allowed_hosts: frozenset
    cors_origins: frozenset
    insecure_no_auth: bool
    internal_key: str | None  # what this server's own jobs send to its /v1 routes


def is_loopback(host: str) -> bool:
    name = host.strip("[]")
    try:
        return ipaddress.ip_address(name.split("%")[0]).is_loopback
    except ValueError:
        return name.lower() == "localhost"


def load_keys(given: list[str], files: list[str], environ: Mapping[str, str]) -> frozenset:
    """Keys from --api-key, --api-key-file (one a line; blank lines and
    `#` comments skipped) and HEARTH_API_KEY."""
    keys = [k.strip() for k in given]
    for name in files:
        try:
            text = Path(name).expanduser().read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise AccessError(f"--api-key-file {name}: cannot read it ({exc})") from None
        found = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if not found:
            raise AccessError(f"--api-key-file {name}: holds no key (one key per line)")
        keys += found
    if environ.get("HEARTH_API_KEY", "").strip():
        keys.append(environ["HEARTH_API_KEY"].strip())
    if any(not k or any(c.isspace() for c in k) for k in keys):
        raise AccessError("an API key may not be empty or contain spaces")
    if any(len(k) < SHORT_KEY for k in keys):
        log.warning("an API key is shorter than %d characters: anyone who can guess it can use this server",
                    SHORT_KEY)
    return frozenset(keys)


def normalize_origin(text: str) -> str:
    """`https://App.example:8443/` -> `https://app.example:8443`."""
    parts = urlsplit(text.strip())
    if not parts.scheme or not parts.netloc or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise AccessError(f"--cors-origin {text!r} is not an origin (scheme://host[:port], e.g. https://app.example)")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def machine_names() -> set[str]:
    """This machine's host names and the addresses of its interfaces."""
    import psutil

    names = set()
    for name in (socket.gethostname(), socket.getfqdn()):
        if name:
            names |= {name.lower(), f"{name.split('.')[0].lower()}.local"}
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                names.add(address.address.split("%")[0].lower())
    return names


def allowed_hosts(bound: str, listed: list[str]) -> frozenset:
    """Loopback names, the bound address, the names the operator listed and,
    off loopback, this machine's own names and addresses."""
    names = {*LOOPBACK_NAMES, bound.strip("[]").lower(), *(n.lower() for n in listed)}
    if not is_loopback(bound):
        names |= machine_names()
    return frozenset(names)


def settle(host: str, keys: list[str], key_files: list[str], cors: list[str], insecure: bool,
           environ: Mapping[str, str], behind_proxy: bool = False) -> Access:
    """Everything above, or an AccessError that names the fix. Behind a
    reverse proxy (HEARTH_BEHIND_PROXY) a loopback bind is no protection:
    every visitor arrives from the proxy."""
    api_keys = load_keys(keys, key_files, environ)
    exposed = behind_proxy or not is_loopback(host)
    if not api_keys and exposed and not insecure:
        where = "behind a reverse proxy (HEARTH_BEHIND_PROXY)" if behind_proxy else f"on {host}"
        raise AccessError(
            f"refusing to serve {where} without an API key: anyone on the network could use it. "
            "Set a key with --api-key KEY, --api-key-file FILE or HEARTH_API_KEY=KEY "
            "(for example HEARTH_API_KEY=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')), "
            "or pass --insecure-no-auth to serve without one")
    listed = [h.strip() for h in environ.get("HEARTH_ALLOWED_HOSTS", "").split(",") if h.strip()]
    origins = [o for o in cors + environ.get("HEARTH_CORS_ORIGINS", "").split(",") if o.strip()]
    internal = secrets.token_urlsafe(32) if api_keys else None
    return Access(api_keys=api_keys | ({internal} if internal else set()),
                  allowed_hosts=allowed_hosts(host, listed),
                  cors_origins=frozenset(normalize_origin(o) for o in origins),
                  insecure_no_auth=insecure and not api_keys and exposed,
                  internal_key=internal)


def export_for_children(access: Access, allow_paths: list[str], key_files: list[str]) -> None:
    """What the job worker and its children inherit: the key for this
    server's own /v1 routes, the folders requests may name, and the key
    files no request may name (core.paths.is_secret)."""
    if access.internal_key:
        os.environ["HEARTH_INTERNAL_KEY"] = access.internal_key
    if key_files:
        os.environ[paths.SECRET_FILES_ENV] = os.pathsep.join(str(Path(f).expanduser().resolve()) for f in key_files)
    if allow_paths:
        current = [p for p in os.environ.get("HEARTH_ALLOW_PATHS", "").split(os.pathsep) if p]
        folders = [str(Path(p).expanduser().resolve()) for p in allow_paths]
        missing = [p for p, f in zip(allow_paths, folders, strict=True) if not Path(f).is_dir()]
        if missing:
            raise AccessError(f"--allow-path {missing[0]}: not a folder")
        os.environ["HEARTH_ALLOW_PATHS"] = os.pathsep.join(current + folders)
