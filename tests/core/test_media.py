"""The remote-media policy (core/media.py) against real sockets on loopback:
what is refused by default, what --allow-private-media opens, redirects
checked hop by hop, the byte cap and the deadline."""
from __future__ import annotations

import base64
import ipaddress
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from core import limits, media

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/"
                       "iZk9HQAAAABJRU5ErkJggg==")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/pixel.png":
            self._send(200, PNG, "image/png; charset=binary")
        elif self.path.startswith("/to/"):  # /to/<host:port>/<path>: a redirect there
            self.send_response(302)
            self.send_header("Location", "http://" + self.path[4:])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/big":
            self._send(200, b"x" * 5000, "application/octet-stream")
        elif self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", "10")
            self.end_headers()
            self.wfile.write(b"x")
            self.wfile.flush()
            time.sleep(3)
        else:
            self._send(404, b"no", "text/plain")

    def _send(self, status, body, kind):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def servers():
    """Two media servers on two loopback addresses (Linux routes all of 127/8 to lo)."""
    started = []
    for host in ("127.0.0.1", "127.0.0.2"):
        server = ThreadingHTTPServer((host, 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
    yield [f"{s.server_address[0]}:{s.server_address[1]}" for s in started]
    for server in started:
        server.shutdown()


def test_loopback_is_refused_by_default_and_says_how_to_open_it(servers):
    with pytest.raises(media.MediaRefused, match="loopback address.*--allow-private-media"):
        media.load_media(f"http://{servers[0]}/pixel.png", allow_private=False)


def test_allowing_private_media_fetches_with_the_content_type(servers):
    data, kind = media.load_media(f"http://{servers[0]}/pixel.png", allow_private=True)
    assert data == PNG and kind == "image/png"


def test_every_redirect_hop_is_checked(servers):
    first = ipaddress.ip_address("127.0.0.1")
    only_first = lambda address: address == first  # noqa: E731 - the policy under test
    url = f"http://{servers[0]}/to/{servers[1]}/pixel.png"
    with pytest.raises(media.MediaRefused, match="127.0.0.2"):
        media.fetch(url, cap=1 << 20, timeout_s=5, allowed=only_first)
    assert media.fetch(url, cap=1 << 20, timeout_s=5, allowed=lambda a: True)[0] == PNG
    with pytest.raises(media.MediaRefused, match="more than 5 redirects"):
        media.fetch(f"http://{servers[0]}/loop", cap=1 << 20, timeout_s=5, allowed=lambda a: True)


def test_cap_deadline_and_status(servers):
    with pytest.raises(media.MediaRefused, match="over the 1000-byte cap"):
        media.fetch(f"http://{servers[0]}/big", cap=1000, timeout_s=5, allowed=lambda a: True)
    started = time.monotonic()
    with pytest.raises(media.MediaRefused, match="longer than the time allowed"):
        media.fetch(f"http://{servers[0]}/slow", cap=1000, timeout_s=0.5, allowed=lambda a: True)
    assert time.monotonic() - started < 2.5
    with pytest.raises(media.MediaRefused, match="answered HTTP 404"):
        media.fetch(f"http://{servers[0]}/nothing", cap=1000, timeout_s=5, allowed=lambda a: True)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "192.168.0.9", "172.16.0.1", "169.254.169.254",
                                     "100.64.0.1", "0.0.0.0", "224.0.0.1", "::1", "fd00::1", "fe80::1",
                                     "::ffff:127.0.0.1", "::ffff:169.254.169.254"])
def test_non_public_addresses_are_not_allowed(address):
    assert not media.public_only(ipaddress.ip_address(address))


def test_public_addresses_are_allowed():
    assert media.public_only(ipaddress.ip_address("93.184.215.14"))
    assert media.public_only(ipaddress.ip_address("2606:4700::1111"))


@pytest.mark.parametrize("url,message", [
    ("file:///etc/passwd", "only http, https and data URLs"), ("ftp://example.com/a.png", "only http"),
    ("gopher://x", "only http"), ("", "empty"), ("data:image/png;base64", "comma"),
    ("data:image/png;base64,@@@@", "not valid base64"), ("http:///x.png", "names no host"),
    ("http://example.com:99999/x", "invalid port"),
])
def test_bad_urls_say_why(url, message):
    with pytest.raises(media.MediaRefused, match=message):
        media.load_media(url)


def test_data_urls_decode_locally_within_the_cap():
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert media.load_media(url) == (PNG, "image/png")
    assert media.load_media("data:,hello%20there") == (b"hello there", None)
    small = limits.Limits(max_media_bytes=10)
    with pytest.raises(media.MediaRefused, match="more than 10 bytes"):
        media.decode_data_url(url, small.max_media_bytes)


def test_the_server_setting_comes_from_the_environment(monkeypatch, servers):
    monkeypatch.setattr(limits, "_current", limits.Limits(allow_private_media=True))
    assert media.load_media(f"http://{servers[0]}/pixel.png")[0] == PNG
    monkeypatch.setattr(limits, "_current", limits.Limits())
    with pytest.raises(media.MediaRefused, match="loopback"):
        media.load_media(f"http://{servers[0]}/pixel.png")
    assert limits.from_env({"HEARTH_ALLOW_PRIVATE_MEDIA": "1"}).allow_private_media is True
