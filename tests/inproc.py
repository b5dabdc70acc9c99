"""The serving stack in the test process: the ASGI application called
through httpx without a socket or a server process, for tests whose point
is what a route answers, not the process that answers it.

httpx's own `ASGITransport` is async and keeps a response until the app
has finished it, so neither the official SDKs (sync clients) nor a test
that reads a stream while it is produced could use it. `Bridge` is a sync
httpx transport instead: the app runs on one event loop in a background
thread, and a response's body is handed over chunk by chunk as the app
sends it; closing the response early is a client disconnect to the app.

`serving(argv)` fills the process's runtime from `hearth serve` flags, as
the command does before it starts daphne (`hearth.management.commands.serve`),
and puts everything back afterwards.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from typing import Any

import httpx

LOOPBACK = ("127.0.0.1", 40000)
BASE_URL = "http://127.0.0.1:8080"

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def loop() -> asyncio.AbstractEventLoop:
    """The one event loop the app runs on in this process, in a daemon thread."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="asgi-bridge", daemon=True).start()
        return _loop


def _transport(http):
    """`Bridge` for one httpx package: `httpx`, or `httpx2`, which the official SDKs use."""

    class Body(http.SyncByteStream):
        def __init__(self, chunks: queue.Queue, more: bool, hang_up, timeout: float):
            self.chunks, self.more, self.hang_up, self.timeout = chunks, more, hang_up, timeout

        def __iter__(self):
            while self.more:
                try:
                    kind, value = self.chunks.get(timeout=self.timeout)
                except queue.Empty:
                    raise http.ReadTimeout(f"no body from the app in {self.timeout}s") from None
                if kind == "error":
                    raise http.RemoteProtocolError(f"the app failed mid-response: {value!r}") from value
                body, self.more = value
                if body:
                    yield body

        def close(self) -> None:
            self.hang_up()

    class Bridge(http.BaseTransport):
        """A sync httpx transport onto an ASGI app (see the module's docstring)."""

        def __init__(self, app, client: tuple[str, int] | None = LOOPBACK, timeout: float = 120):
            self.app, self.client, self.timeout = app, client, timeout

        def handle_request(self, request: http.Request) -> http.Response:
            body = request.read()
            answers: queue.Queue = queue.Queue()
            gone = asyncio.Event()  # the client hung up (or the response was read to its end)
            scope = {
                "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
                "scheme": request.url.scheme, "path": request.url.path, "raw_path": request.url.raw_path.split(b"?")[0],
                "query_string": request.url.query, "root_path": "",
                "headers": [(k.lower(), v) for k, v in request.headers.raw],
                "client": list(self.client) if self.client else None,
                "server": [request.url.host, request.url.port or 80],
            }
            sent_body = False

            async def receive():
                nonlocal sent_body
                if not sent_body:
                    sent_body = True
                    return {"type": "http.request", "body": body, "more_body": False}
                await gone.wait()
                return {"type": "http.disconnect"}

            async def send(message):
                if message["type"] == "http.response.start":
                    answers.put(("start", message))
                elif message["type"] == "http.response.body":
                    answers.put(("body", (message.get("body", b""), message.get("more_body", False))))

            async def run():
                try:
                    await self.app(scope, receive, send)
                except BaseException as exc:  # surfaced to the reader, never lost in the loop's log
                    answers.put(("error", exc))
                    raise
                finally:
                    answers.put(("body", (b"", False)))  # an app that ended without finishing its body

            the_loop = loop()
            asyncio.run_coroutine_threadsafe(run(), the_loop)
            try:
                kind, start = answers.get(timeout=self.timeout)
            except queue.Empty:
                the_loop.call_soon_threadsafe(gone.set)
                raise http.ReadTimeout(f"no answer from the app in {self.timeout}s") from None
            if kind == "error":
                raise http.RemoteProtocolError(f"the app failed before answering: {start!r}") from start
            if kind != "start":
                raise http.RemoteProtocolError("the app sent a body before its status")
            return http.Response(start["status"], headers=start.get("headers", []), request=request,
                                  stream=Body(answers, True, lambda: the_loop.call_soon_threadsafe(gone.set),
                                               self.timeout))

    return Bridge


Bridge = _transport(httpx)


class InProcess:
    """The whole ASGI application (`hearth.asgi`) called in this process:
    `get`, `post`, `request` and `stream` as on an httpx client at
    `BASE_URL`, and the official SDKs' clients on the same transport."""

    url = BASE_URL

    def __init__(self, app, client: tuple[str, int] | None = LOOPBACK):
        self.app, self.client = app, client
        self.http = httpx.Client(transport=Bridge(app, client), base_url=BASE_URL, timeout=120)
        self._sdk_http: Any = None  # the SDKs' httpx2 client, made at first use

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        return self.http.request(method, path, **kwargs)

    def get(self, path: str, **kwargs) -> httpx.Response:
        return self.http.get(path, **kwargs)

    def post(self, path: str, **kwargs) -> httpx.Response:
        return self.http.post(path, **kwargs)

    def delete(self, path: str, **kwargs) -> httpx.Response:
        return self.http.delete(path, **kwargs)

    def stream(self, method: str, path: str, **kwargs):
        return self.http.stream(method, path, **kwargs)

    def sdk_http(self):
        if self._sdk_http is None:
            import httpx2

            self._sdk_http = httpx2.Client(transport=_transport(httpx2)(self.app, self.client), timeout=120)
        return self._sdk_http

    def openai(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=BASE_URL + "/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0,
                             http_client=self.sdk_http(), **kwargs)

    def anthropic(self, **kwargs):
        import anthropic

        return anthropic.Anthropic(base_url=BASE_URL, api_key=kwargs.pop("api_key", "unused"), max_retries=0,
                                   http_client=self.sdk_http(), **kwargs)


@contextlib.contextmanager
def kept():
    """The runtime, the environment and the bounds as they were, put back when the block ends."""
    from core import limits
    from hearth.root import RUNTIME

    runtime_was, env_was, limits_was = dict(vars(RUNTIME)), dict(os.environ), limits._current
    try:
        yield RUNTIME
    finally:
        vars(RUNTIME).clear()
        vars(RUNTIME).update(runtime_was)
        os.environ.clear()
        os.environ.update(env_was)
        limits._current = limits_was


def _serve_command():
    import django

    django.setup()
    from hearth.management.commands.serve import Command

    return Command()


@contextlib.contextmanager
def serving(*argv: str):
    """`hearth serve ARGV` in this process, without daphne, its job worker or
    its signals: the runtime, the bounds and the environment it sets are
    this process's until the block ends, then put back as they were.
    Answers an `InProcess` on it."""
    from django.core.management import call_command

    command = _serve_command()
    opts = vars(command.create_parser("hearth", "serve").parse_args([*argv]))
    call_command("migrate", interactive=False, verbosity=0)
    with kept() as runtime:
        engine = None
        try:
            bounds = command.settle(opts)
            engine = command.load(opts, bounds)
            from hearth.asgi import application

            yield InProcess(application)
        finally:
            if engine is not None:
                engine.close(drain_seconds=0)
            if runtime.options.templates is not None:
                runtime.options.templates.close()
            _on_loop(runtime.streams.shutdown)


def _on_loop(fn) -> None:
    """Run `fn` on the app's event loop, and wait for it."""
    async def call():
        fn()

    asyncio.run_coroutine_threadsafe(call(), loop()).result(30)


def refusal(*argv: str) -> str:
    """Why `hearth serve ARGV` refuses to start: the checks it makes before
    it loads or starts anything (its flags, `settle`, then `preflight`: in
    router mode the presets and the library), run in this process. Fails
    the test if they pass."""
    from django.core.management.base import CommandError

    command = _serve_command()
    with kept():
        try:
            opts = vars(command.create_parser("hearth", "serve").parse_args([*argv]))
            command.settle(opts)
            command.preflight(opts)
        except CommandError as exc:
            return str(exc)
    raise AssertionError(f"hearth serve {' '.join(argv)} would start")
