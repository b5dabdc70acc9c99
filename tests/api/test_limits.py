"""Every cost bounded, on a server started with small limits: bodies over
the cap get 413 before they are sent, slow headers and bodies 408, idle
connections close, a stream whose client reads nothing is cut and stops,
a chat socket that floods frames and reads nothing is paced and closed;
turns, prompt characters and socket fields are capped;
client chat templates render in a killable process with a time budget (and
are refused by default, see test_hardening); a grammar that compiles too
slowly fails its own request, never the others', and its compile is stopped."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import websockets

from tests.helpers import ServerProcess, children_running, server_env

LIMITS = {"HEARTH_MAX_BODY_BYTES": str(1 << 20), "HEARTH_HEADER_TIMEOUT": "1", "HEARTH_BODY_TIMEOUT": "1",
          "HEARTH_IDLE_TIMEOUT": "2", "HEARTH_WRITE_TIMEOUT": "1", "HEARTH_MAX_MESSAGES": "50",
          "HEARTH_MAX_PROMPT_CHARS": "20000",
          "HEARTH_MAX_SOCKET_TEXT": "1000", "HEARTH_TEMPLATE_TIMEOUT": "3", "HEARTH_GRAMMAR_TIMEOUT": "1",
          "HEARTH_MAX_GRAMMAR_CHOICES": "20000", "HEARTH_MAX_GRAMMAR_BYTES": str(1 << 20)}
CHAT = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4}
# Three nested loops of 10^5: a render that would never end.
FOREVER = ("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
           "{% endfor %}{% endfor %}{% endfor %}")


@pytest.fixture(scope="module")
def small(homes, tiny_model, tmp_path_factory):
    env = {**server_env(*homes), **LIMITS}
    proc = ServerProcess(env, tiny_model, "--no-worker", "--allow-client-templates", "--response-ttl", "7",
                         log_path=tmp_path_factory.mktemp("limits") / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.output()


def test_the_operator_s_settings_reach_the_runtime(small):
    """What /stats reports is what the protocol modules were handed: the bounds and the store's lifetime."""
    stats = httpx.get(small.url + "/stats").json()
    assert stats["limits"]["max_messages"] == 50 and stats["limits"]["max_prompt_chars"] == 20000
    assert stats["limits"]["allow_client_templates"] is True
    assert stats["response_store"]["ttl_ms"] == 7000


def _connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        out += chunk
    return out


@pytest.mark.parametrize("path,shape", [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"),
                                        ("/api/hub/download", "api")])
def test_a_body_over_the_cap_is_refused_before_it_is_sent(small, path, shape):
    sock = _connect(small)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {10**12}\r\nExpect: 100-continue\r\n\r\n".encode())
    answer = _read_all(sock).decode()  # no body was sent: the answer cannot have waited for one
    sock.close()
    head, body = answer.split("\r\n\r\n", 1)
    assert head.startswith("HTTP/1.1 413") and "100 Continue" not in answer, answer
    body = json.loads(body)
    if shape == "openai":
        assert body["error"]["code"] == "request_too_large" and "--max-body-bytes" in body["error"]["message"]
    elif shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "request_too_large"
    else:
        assert body["ok"] is False and "bytes" in body["error"]


def test_a_chunked_body_is_cut_off_at_the_cap(small):
    with httpx.Client(timeout=30) as client:
        def chunks():
            for _ in range(40):
                yield b" " * 65536  # 2.5 MiB in all, never announced

        r = client.post(small.url + "/v1/chat/completions", content=chunks())
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        ok = client.post(small.url + "/v1/chat/completions", json=CHAT)  # a new connection serves normally
        assert ok.status_code == 200


def test_slow_headers_slow_bodies_and_idle_connections_are_dropped(small):
    slow = _connect(small)
    slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
    assert _read_all(slow).startswith(b"HTTP/1.1 408")
    body = json.dumps(CHAT).encode()
    drip = _connect(small)
    drip.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
    answer = _read_all(drip)
    assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer
    idle = _connect(small)
    started = time.monotonic()
    assert _read_all(idle) == b""  # closed by the server, with nothing to say
    assert time.monotonic() - started < 8
    assert httpx.get(small.url + "/health").status_code == 200


@pytest.mark.parametrize("path,shape", [("/v1/models", "openai"), ("/v1/messages", "anthropic"),
                                        ("/api/jobs", "api")])
def test_a_request_line_or_headers_over_16_kib_are_answered_in_the_route_s_shape(small, path, shape):
    """Twisted caps a line at 16 KiB and a request's head at 16 KiB: past them it dropped the
    connection without a word (a query string of 20 KB), or answered a bare 400."""
    def refusal(head: bytes) -> tuple[str, dict]:
        sock = _connect(small)
        sock.sendall(head)
        answer = _read_all(sock).decode()
        sock.close()
        status, body = answer.split("\r\n\r\n", 1)
        return status.split("\r\n", 1)[0], json.loads(body)

    long_query = f"GET {path}?q={'x' * 20_000} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    many_headers = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
                    + b"".join(f"X-Pad-{i}: {'y' * 1000}\r\n".encode() for i in range(20)) + b"\r\n")
    long_header = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: {'z' * 20_000}\r\n\r\n".encode()
    for head, status, code in [(long_query, "414", "uri_too_long"), (many_headers, "431", "headers_too_large"),
                               (long_header, "431", "headers_too_large")]:
        line, body = refusal(head)
        assert line.startswith(f"HTTP/1.1 {status} "), (line, body)
        if shape == "openai":
            assert body["error"]["code"] == code and "bytes" in body["error"]["message"]
        elif shape == "anthropic":
            assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
            assert "bytes" in body["error"]["message"]
        else:
            assert body["ok"] is False and "bytes" in body["error"]
    assert httpx.get(small.url + "/v1/models?" + "q=1&" * 1000).status_code == 200  # 5 KB of query: served


def test_a_stream_nobody_reads_is_cut_and_its_generation_stops(small, eos_id):
    """A client that reads nothing of its stream holds no more than a full
    send buffer in the server: its writes wait, and after --write-timeout
    its connection is cut and its rows stop, while other clients are served."""
    def stats() -> dict:
        return httpx.get(small.url + "/stats").json()["engine"]

    before = stats()["generated_tokens_total"]
    rows, most = 8, 1900  # all the rows one request may ask for, nearly to the tiny model's 2048-token window
    body = json.dumps({**CHAT, "stream": True, "n": rows, "max_tokens": most, "temperature": 1.0,
                       "logprobs": True, "top_logprobs": 11, "logit_bias": {str(eos_id): -100}}).encode()
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect(("127.0.0.1", small.port))
    reader.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    reader.settimeout(30)
    assert reader.recv(12).startswith(b"HTTP/1.1 200")  # streaming; from now on nothing is read for a while
    other = httpx.post(small.url + "/v1/chat/completions", json=CHAT, timeout=60)
    assert other.status_code == 200 and other.json()["usage"]["completion_tokens"] == 4
    # Nothing is read until the server has cut the connection (a reset: the socket's pending error) once
    # the send buffer stayed full past the 1 s write timeout. (A fixed wait was too short on a busy machine:
    # the reads that followed drained the buffer before the cut and the stream ran to its end.)
    deadline = time.monotonic() + 60
    while not reader.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) and time.monotonic() < deadline:
        time.sleep(0.1)
    rest = _read_all(reader)
    reader.close()
    assert b"data: [DONE]" not in rest  # cut before its end
    deadline = time.monotonic() + 60
    while stats()["active"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stats()["active"] == 0
    assert stats()["generated_tokens_total"] - before < rows * most  # its rows stopped at the cut


def _ws_frame(payload: bytes) -> bytes:
    """A client's text frame, masked with a zero key (the payload as it is)."""
    n = len(payload)
    size = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big") if n < 65536 \
        else bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return b"\x81" + size + b"\0\0\0\0" + payload


def test_a_socket_that_floods_frames_and_reads_nothing_is_paced_then_closed(small):
    """A chat socket's client that sends frame after frame and reads none of
    the answers: the server writes no more once the send buffer is full,
    reads no more once a few frames wait for the app (so the client's own
    sends stall), and closes the socket after --write-timeout; others are
    served meanwhile."""
    sock = _connect(small)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(f"GET /ws/chat HTTP/1.1\r\nHost: 127.0.0.1:{small.port}\r\nUpgrade: websocket\r\n"
                 "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 f"Sec-WebSocket-Version: 13\r\nOrigin: {small.url}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    # Each frame is answered with an error frame that names its 100,000-character type.
    frame = _ws_frame(json.dumps({"type": "x" * 100_000}).encode())
    sock.settimeout(120)  # only against a hang: the server ends this by closing
    sent, cut = 0, None
    while sent < 100 << 20:
        try:
            sock.sendall(frame)
        except OSError as exc:  # reset or broken pipe: the server closed the socket
            cut = exc
            break
        sent += len(frame)
    assert httpx.get(small.url + "/health").status_code == 200
    sock.close()
    assert isinstance(cut, (ConnectionResetError, BrokenPipeError)), (sent, cut)
    assert sent < 32 << 20  # what the server took before it stopped reading: not the 100 MiB sent at it


def test_turns_and_prompt_characters_are_capped(small):
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(51)]
    r = httpx.post(small.url + "/v1/chat/completions", json={**CHAT, "messages": many})
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_messages"
    long = [{"role": "user", "content": "x" * 20_001}]
    r = httpx.post(small.url + "/v1/chat/completions", json={**CHAT, "messages": long})
    assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_large"
    r = httpx.post(small.url + "/v1/messages", json={**CHAT, "messages": long})
    assert r.status_code == 400 and "--max-prompt-chars" in r.json()["error"]["message"]
    r = httpx.post(small.url + "/v1/completions", json={"prompt": "x" * 20_001})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    tools = [{"type": "function", "function": {"name": "f", "description": "d" * 20_000}}]
    r = httpx.post(small.url + "/v1/chat/completions", json={**CHAT, "tools": tools})
    assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_large"


def test_socket_fields_are_capped(small):
    async def run():
        async with websockets.connect(small.url.replace("http", "ws") + "/ws/chat") as ws:
            await _until(ws, "sessions")
            await ws.send(json.dumps({"type": "prompt", "text": "x" * 1001}))
            first = await _until(ws, "error")
            await ws.send(json.dumps({"type": "set_system_prompt", "text": "x" * 1001}))
            second = await _until(ws, "error")
            return first, second

    first, second = asyncio.run(run())
    assert "over 1000 characters" in first["message"] and "over 1000 characters" in second["message"]


async def _until(ws, kind: str, timeout: float = 30):
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if frame.get("type") == kind:
            return frame


def _template_body(template: str) -> dict:
    return {**CHAT, "chat_template_kwargs": {"chat_template": template}}


def test_a_client_template_renders_in_the_sandbox(small):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ eos_token }}<assistant>"
    r = httpx.post(small.url + "/v1/chat/completions", json=_template_body(template), timeout=60)
    assert r.status_code == 200, r.text
    count = httpx.post(small.url + "/v1/messages/count_tokens", json={
        "messages": CHAT["messages"], "chat_template_kwargs": {"chat_template": template}}).json()["input_tokens"]
    assert r.json()["usage"]["prompt_tokens"] == count
    broken = httpx.post(small.url + "/v1/chat/completions", json=_template_body("{% for %}"), timeout=60)
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "chat_template_kwargs.chat_template"
    huge = httpx.post(small.url + "/v1/chat/completions", json=_template_body(
        "{% for i in range(100000) %}aaaa{% endfor %}"), timeout=60)
    assert huge.status_code == 400 and "characters" in huge.json()["error"]["message"]


def test_a_template_that_never_ends_costs_its_own_request_only(small):
    results: dict[str, object] = {}
    order: list[str] = []

    def attack(i: int):
        r = httpx.post(small.url + "/v1/chat/completions", json=_template_body(FOREVER), timeout=60)
        results[f"attack{i}"] = r
        order.append(f"attack{i}")

    attackers = [threading.Thread(target=attack, args=(i,)) for i in range(4)]  # more than the sandbox's workers
    for t in attackers:
        t.start()
    time.sleep(0.5)  # let them take every render worker
    plain = httpx.post(small.url + "/v1/chat/completions", json=CHAT, timeout=60)
    order.append("plain")
    for t in attackers:
        t.join(60)
    assert plain.status_code == 200
    assert order.index("plain") < min(order.index(f"attack{i}") for i in range(4)), order
    for i in range(4):
        r = results[f"attack{i}"]
        assert r.status_code == 503 and r.json()["error"]["code"] == "template_timeout", r.text
    after = httpx.post(small.url + "/v1/chat/completions", json=_template_body("{{ messages[0].content }}"),
                       timeout=60)
    assert after.status_code == 200  # fresh workers replaced the killed ones


def _template_workers(server) -> set[int]:
    return {p.pid for p in children_running(server.proc.pid, "inference.protocols.template_worker")}


def test_a_client_that_leaves_stops_its_render(small):
    before = _template_workers(small)
    started = time.monotonic()
    with pytest.raises(httpx.TimeoutException):
        httpx.post(small.url + "/v1/chat/completions", json=_template_body(FOREVER), timeout=0.5)
    deadline = started + 2.5  # under the 3 s budget: only the client leaving can explain it
    while time.monotonic() < deadline and not (before - _template_workers(small)):
        time.sleep(0.05)
    assert before - _template_workers(small), "the render outlived its client"


def test_a_slow_grammar_fails_its_request_only_and_its_compile_is_stopped(small):
    # Several seconds to compile even on an idle machine, where a JSON grammar takes a few
    # hundredths: the budget of 1 s lies far from both, so a loaded machine does not flip either.
    choices = [f"option {i} of many" for i in range(20_000)]
    slow = {**CHAT, "max_tokens": 40, "guided_choice": choices}
    order: list[str] = []
    results = {}

    def run_slow():
        results["slow"] = httpx.post(small.url + "/v1/chat/completions", json=slow, timeout=60)
        order.append("slow")

    thread = threading.Thread(target=run_slow)
    thread.start()
    deadline = time.monotonic() + 30
    while not httpx.get(small.url + "/stats").json()["grammar"]["compiling"]:
        assert time.monotonic() < deadline, "the slow grammar never started compiling"
        time.sleep(0.01)
    quick = httpx.post(small.url + "/v1/chat/completions", json={**CHAT, "response_format": {"type": "json_object"}},
                       timeout=60)
    order.append("quick")
    thread.join(60)
    assert quick.status_code == 200, quick.text
    r = results["slow"]
    assert r.status_code == 400 and r.json()["error"]["code"] == "grammar_timeout", r.text
    assert r.json()["error"]["param"] == "guided_choice" and "--grammar-timeout" in r.json()["error"]["message"]
    grammar = httpx.get(small.url + "/stats").json()["grammar"]
    assert grammar["compiling"] == 0 and grammar["timeouts"] == 1 and grammar["timeout_s"] == 1.0
    # The stopped compile is refused again at once, not compiled a second time.
    started = time.monotonic()
    again = httpx.post(small.url + "/v1/chat/completions", json=slow, timeout=60)
    assert again.status_code == 400 and again.json()["error"]["code"] == "grammar_timeout"
    assert time.monotonic() - started < 1 and httpx.get(small.url + "/stats").json()["grammar"]["misses"] == \
        grammar["misses"]
    assert httpx.get(small.url + "/stats").json()["limits"]["grammar_timeout_s"] == 1.0


def test_a_kv_budget_caps_the_rows_kv_and_the_context(served, tiny_model, eos_id):
    """--kv-budget: the running rows' KV bytes together. Here it holds 300
    tokens: the context cap follows (a longer reply is cut there, a longer prompt refused), two that
    together need more than it holds do not run at once, and /stats says so."""
    per_token = served("--no-worker").get("/stats").json()["admission"]["kv_bytes_per_token"]
    app = served("--no-worker", "--kv-budget", str(300 * per_token))
    stats = app.get("/stats").json()
    assert stats["admission"]["kv_budget_bytes"] == 300 * per_token
    assert stats["batch"]["kv_budget_bytes"] == 300 * per_token
    assert stats["admission"]["enforced_context_tokens"] == 300
    assert app.get("/props").json()["default_generation_settings"]["n_ctx"] == 300
    body = {"model": tiny_model, "prompt": "Hi", "temperature": 0, "logit_bias": {str(eos_id): -100}}
    cut = app.post("/v1/completions", json={**body, "max_tokens": 400}).json()
    assert cut["usage"]["total_tokens"] == 300 and cut["choices"][0]["finish_reason"] == "length"
    refused = app.post("/v1/completions", json={**body, "prompt": "Hi " * 400, "max_tokens": 4})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_over_budget", refused.text
    held = stats["batch"]["held_for_memory"]
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: app.post("/v1/completions", json={**body, "max_tokens": 180}), range(2)))
    assert [a.status_code for a in answers] == [200, 200]
    assert app.get("/stats").json()["batch"]["held_for_memory"] > held  # the second waited for the first


def test_a_kv_budget_below_one_token_or_on_the_routers_command_line_is_refused(served):
    from django.core.management.base import CommandError

    from tests.inproc import refusal

    with pytest.raises(CommandError, match="holds no token"):
        served("--no-worker", "--kv-budget", "1")
    assert "set `kv-budget` in that model's section of --models-preset" in refusal("--kv-budget", "1M")
