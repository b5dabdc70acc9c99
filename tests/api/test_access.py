"""Access control against real servers: API keys on every route (deny by
default, walked from the URL conf), in the caller's protocol shape, through
the official SDKs; the chat socket; the bind policy; the Host check off
loopback; CORS for the named origins only; the Django admin's own login."""
from __future__ import annotations

import asyncio
import re
import subprocess

import anthropic
import httpx
import openai
import pytest

from tests.helpers import HEARTH, ROOT, ServerProcess, free_port, server_env
from tests.inproc import refusal

KEY = "test-key-0123456789abcdef"
ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def keyed(homes, tiny_model, tmp_path_factory):
    """A server that needs KEY, allowing ORIGIN cross-origin."""
    hf_home, _ = homes
    home = tmp_path_factory.mktemp("keyed-home")
    env = dict(server_env(hf_home, home), HEARTH_API_KEY=KEY)
    proc = ServerProcess(env, tiny_model, "--no-worker", "--cors-origin", ORIGIN,
                         log_path=tmp_path_factory.mktemp("logs") / "keyed.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.output()


def _routes() -> list[str]:
    """Every URL the project routes, parameters filled with a placeholder."""
    import django
    from django.urls import URLPattern, URLResolver, get_resolver

    django.setup()
    found = []

    def walk(patterns, prefix):
        for p in patterns:
            route = prefix + re.sub(r"<(?:\w+:)?\w+>", "x", str(p.pattern)).lstrip("^").rstrip("$")
            if isinstance(p, URLResolver):
                walk(p.url_patterns, route)
            elif isinstance(p, URLPattern):
                found.append("/" + route.replace("\\Z", "").replace("\\", ""))
    walk(get_resolver().url_patterns, "")
    return sorted(set(found))


def test_every_route_but_the_public_ones_needs_the_key(keyed):
    from hearth.access import is_public

    routes = _routes()
    assert "/v1/chat/completions" in routes and "/api/jobs" in routes and "/stats" in routes
    guarded = [r for r in routes if not is_public(r)]
    assert len(guarded) > 60
    with httpx.Client(base_url=keyed.url, timeout=30) as http:
        for route in guarded + ["/v1/a-route-added-later", "/api/not-yet"]:
            for method in ("GET", "POST"):
                r = http.request(method, route, json={})
                assert r.status_code == 401, (method, route, r.status_code, r.text[:200])
        assert http.get("/health").json() == {"status": "ok"}


def test_refusals_speak_the_callers_protocol(keyed):
    with httpx.Client(base_url=keyed.url, timeout=30) as http:
        body = http.post("/v1/chat/completions", json={"messages": []}).json()
        assert body["error"]["code"] == "invalid_api_key" and "API key is required" in body["error"]["message"]
        wrong = http.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "invalid API key"
        assert wrong.headers["WWW-Authenticate"].startswith("Bearer")
        anth = http.post("/v1/messages", json={}, headers={"x-api-key": "nope"}).json()
        assert anth == {"type": "error", "error": {"type": "authentication_error", "message": "invalid API key"}}
        assert http.get("/api/jobs").json()["ok"] is False
        page = http.get("/", headers={"Accept": "text/html"})
        assert page.status_code == 302 and page.headers["Location"] == "/signin?next=/"
        assert http.get("/v1/models", headers={"x-api-key": KEY}).status_code == 200
        assert http.get("/api/jobs", headers={"Authorization": f"Bearer {KEY}"}).json()["ok"] is True


def test_official_sdks_with_and_without_the_key(keyed):
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert reply.choices[0].message.content is not None
    chunks = list(client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, stream=True))
    assert chunks
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="wrong", max_retries=0).models.list()

    for claude in (anthropic.Anthropic(base_url=keyed.url, api_key=KEY, max_retries=0),
                   anthropic.Anthropic(base_url=keyed.url, auth_token=KEY, max_retries=0)):
        message = claude.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert message.type == "message"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=keyed.url, api_key="wrong", max_retries=0).messages.create(
            model="x", max_tokens=4, messages=[{"role": "user", "content": "hi"}])


def test_cors_only_for_the_named_origin(keyed):
    with httpx.Client(base_url=keyed.url, timeout=30) as http:
        pre = http.options("/v1/chat/completions", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert pre.status_code == 204
        assert pre.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert "POST" in pre.headers["Access-Control-Allow-Methods"]
        assert pre.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        ok = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 2},
                       headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.headers["Access-Control-Allow-Origin"] == ORIGIN
        denied = http.get("/v1/models", headers={"Origin": ORIGIN})  # the page can read why
        assert denied.status_code == 401 and denied.headers["Access-Control-Allow-Origin"] == ORIGIN

        assert "Origin" in http.get("/health").headers["Vary"]  # caches keep origins apart

        other = "https://evil.example"
        pre = http.options("/v1/chat/completions", headers={"Origin": other, "Access-Control-Request-Method": "POST"})
        assert "Access-Control-Allow-Origin" not in pre.headers
        write = http.post("/api/settings/hf-token", json={"token": "hf_x"},
                          headers={"Origin": other, "Authorization": f"Bearer {KEY}"})
        assert write.status_code == 403 and "Access-Control-Allow-Origin" not in write.headers


def test_the_curve_designer_needs_the_key_but_not_for_its_preflight(keyed):
    lab = "https://lab.example"  # an origin the operator did not name: these two routes answer any
    with httpx.Client(base_url=keyed.url, timeout=60) as http:
        for path in ("/signal", "/generate"):
            pre = http.options(path, headers={"Origin": lab, "Access-Control-Request-Method": "POST",
                                              "Access-Control-Request-Headers": "authorization, content-type"})
            assert pre.status_code == 204 and pre.headers["Access-Control-Allow-Origin"] == "*", path
            assert "authorization" in pre.headers["Access-Control-Allow-Headers"]
            assert http.post(path, json={"prompt": "hi"}, headers={"Origin": lab}).status_code == 401
            body = {"prompt": "hi"} if path == "/signal" else {"prompt": "hi", "n": 1, "max_tokens": 2}
            ok = http.post(path, json=body,
                           headers={"Origin": lab, "Authorization": f"Bearer {KEY}"})
            assert ok.status_code == 200 and ok.headers["Access-Control-Allow-Origin"] == "*", ok.text
        assert http.options("/v1/chat/completions", headers={"Origin": lab}).status_code == 401  # only those two
        page = http.get("/curves", headers={"Accept": "text/html"})
        assert page.status_code == 302 and page.headers["Location"] == "/signin?next=/curves"


def test_a_rebinding_host_is_refused_even_with_the_key(keyed):
    r = httpx.get(keyed.url + "/v1/models", headers={"Host": "attacker.example", "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 403 and "attacker.example" in r.json()["error"]["message"]
    for host in ("[", "[::1", "[zz]:80"):  # does not parse: refused, never a 500
        assert httpx.get(keyed.url + "/api/jobs", headers={"Host": host}).status_code == 403, host
    bad_origin = httpx.post(keyed.url + "/api/settings/hf-token", json={"token": "hf_x"},
                            headers={"Origin": "http://[", "Authorization": f"Bearer {KEY}"})
    assert bad_origin.status_code == 403


def _signed_in(url: str) -> httpx.Client:
    """An httpx client that went through the sign-in form, as a browser does."""
    http = httpx.Client(base_url=url, timeout=30)
    form = http.get("/signin?next=/%23/chat")
    assert form.status_code == 200 and "csrfmiddlewaretoken" in form.text
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    done = http.post("/signin", data={"key": f" {KEY}\n", "next": "/#/chat", "csrfmiddlewaretoken": token})
    assert done.status_code == 302 and done.headers["Location"] == "/#/chat"
    return http


def test_the_session_cookie_works_only_for_this_servers_own_pages(keyed):
    http = _signed_in(keyed.url)
    try:
        assert http.get("/api/jobs").status_code == 200
        assert http.get("/auth").json() == {"keyRequired": True, "signedIn": True}
        # A page on an allowed origin may be same-site and send the cookie: it must bring a key.
        r = http.post("/api/settings/hf-token", json={"token": "hf_x"}, headers={"Origin": ORIGIN})
        assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert http.post("/signout").status_code == 302
        assert http.get("/api/jobs").status_code == 401
        assert http.get("/auth").json() == {"keyRequired": True, "signedIn": False}
    finally:
        http.close()


def test_sign_in_never_redirects_off_the_server(keyed):
    with httpx.Client(base_url=keyed.url, timeout=30) as http:
        for target in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
            form = http.get("/signin", params={"next": target})
            assert 'name="next" value="/"' in form.text, target


def test_the_admin_still_wants_a_django_login(keyed):
    r = httpx.get(keyed.url + "/admin/", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 302 and r.headers["Location"].startswith("/admin/login/")


def test_jobs_reach_the_served_model_with_a_key(keyed, monkeypatch):
    from jobs.llm import ServedModel

    monkeypatch.delenv("HEARTH_INTERNAL_KEY", raising=False)
    monkeypatch.delenv("HEARTH_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="401"):
        ServedModel(keyed.url, None).ask([{"role": "user", "content": "hi"}], max_tokens=2)
    monkeypatch.setenv("HEARTH_INTERNAL_KEY", KEY)
    assert isinstance(ServedModel(keyed.url, None).ask([{"role": "user", "content": "hi"}], max_tokens=2), str)
    # A prompt over the window comes back as a reply cut off at once, which jobs skip, not as a failed job.
    long = [{"role": "user", "content": "hello there " * 2000}]
    assert ServedModel(keyed.url, None).complete(long, max_tokens=2) == ("", "length")
    # The model a request that names none gets (`hearth memory synthesize` warns when it is a demo), with the key;
    # None where the server cannot say.
    served = httpx.get(keyed.url + "/props", headers={"Authorization": f"Bearer {KEY}"}).json()["model_alias"]
    assert ServedModel(keyed.url, None).served_name() == served
    monkeypatch.delenv("HEARTH_INTERNAL_KEY")
    assert ServedModel(keyed.url, None).served_name() is None


# -- the chat socket -------------------------------------------------------------------------------

def _socket(headers):
    from channels.testing import WebsocketCommunicator

    from hearth.asgi import application

    return WebsocketCommunicator(application, "/ws/chat", headers=headers)


def _with_keys(keys):
    from hearth.root import RUNTIME as runtime

    before = runtime.api_keys
    runtime.api_keys = frozenset(keys)
    return before


def test_the_chat_socket_needs_the_key_or_a_signed_in_session(django_db_ready):
    from django.conf import settings
    from django.contrib.sessions.backends.db import SessionStore

    from hearth.access import SESSION_KEY, digest
    from hearth.root import RUNTIME as runtime

    async def attempt(headers):
        """The close code the socket was refused with, or None when it stayed open."""
        ws = _socket([(b"host", b"testserver"), *headers])
        connected, _ = await ws.connect(timeout=10)
        assert connected  # refusals accept first, so a browser sees the code
        first = await ws.receive_output(timeout=10)
        await ws.disconnect()
        return first["code"] if first["type"] == "websocket.close" else None

    session = SessionStore()
    session[SESSION_KEY] = digest(KEY)
    session.create()
    stale = SessionStore()
    stale[SESSION_KEY] = digest("an-old-key-no-longer-configured")
    stale.create()
    before = _with_keys({KEY})
    try:
        cookie = settings.SESSION_COOKIE_NAME
        assert asyncio.run(attempt([])) == 4401
        assert asyncio.run(attempt([(b"authorization", b"Bearer wrong")])) == 4401
        assert asyncio.run(attempt([(b"cookie", f"{cookie}={stale.session_key}".encode())])) == 4401
        assert asyncio.run(attempt([(b"x-api-key", KEY.encode())])) is None
        # Another app's cookie that does not parse must not hide the session's.
        jar = f'theme={{"a": 1}}; {cookie}={session.session_key}'.encode()
        assert asyncio.run(attempt([(b"cookie", jar)])) is None
        assert asyncio.run(attempt([(b"origin", b"http://evil.example"), (b"x-api-key", KEY.encode())])) == 4403
    finally:
        runtime.api_keys = before


def test_the_settings_page_learns_whether_a_key_is_needed_and_never_a_key(django_db_ready, monkeypatch):
    from ninja.testing import TestClient

    from hearth.access import digest
    from hearth.api import api
    from hearth.root import RUNTIME as runtime

    client = TestClient(api)
    monkeypatch.setattr(runtime, "insecure_no_auth", False)
    monkeypatch.setattr(runtime, "api_keys", frozenset())
    assert client.get("/settings/api-keys").json() == {
        "ok": True, "required": False, "insecure_no_auth": False, "behind_proxy": False}
    monkeypatch.setattr(runtime, "api_keys", frozenset({KEY}))
    answer = client.get("/settings/api-keys")
    assert answer.json()["required"] is True
    assert KEY not in answer.text and digest(KEY) not in answer.text


@pytest.fixture(scope="module")
def django_db_ready():
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)


# -- bind policy -----------------------------------------------------------------------------------

def test_off_loopback_without_a_key_refuses_to_start(homes, tmp_path):
    hf_home, _ = homes
    env = server_env(hf_home, tmp_path / "home")
    env.pop("HEARTH_API_KEY", None)
    done = subprocess.run([*HEARTH, "serve", "--host", "0.0.0.0", "--port", str(free_port())], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "without an API key" in done.stderr and "--api-key" in done.stderr and "--insecure-no-auth" in done.stderr


def test_off_loopback_with_a_key_serves_and_refuses_other_hosts(homes, tiny_model, tmp_path):
    hf_home, _ = homes
    env = dict(server_env(hf_home, tmp_path / "home"), HEARTH_API_KEY=KEY)
    proc = ServerProcess(env, tiny_model, "--host", "0.0.0.0", "--no-worker", log_path=tmp_path / "s.log")
    try:
        proc.wait_ready()
        auth = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(proc.url + "/v1/models", headers=auth).status_code == 200
        assert httpx.get(proc.url + "/v1/models").status_code == 401
        for host in ("attacker.example", "attacker.example:8080", "10.9.8.7.nip.io"):
            r = httpx.get(proc.url + "/api/sessions", headers={**auth, "Host": host})
            assert r.status_code == 403, host
        import socket

        own = socket.gethostname()
        assert httpx.get(proc.url + "/v1/models", headers={**auth, "Host": f"{own}:{proc.port}"}).status_code == 200
    finally:
        assert proc.stop() == 0, proc.output()


def test_insecure_no_auth_serves_with_a_loud_warning(homes, tiny_model, tmp_path):
    hf_home, _ = homes
    env = server_env(hf_home, tmp_path / "home")
    env.pop("HEARTH_API_KEY", None)
    proc = ServerProcess(env, tiny_model, "--host", "0.0.0.0", "--no-worker", "--insecure-no-auth",
                         log_path=tmp_path / "s.log")
    try:
        proc.wait_ready()
        stats = httpx.get(proc.url + "/stats").json()
        assert stats["access"]["insecure_no_auth"] is True and "no API key" in stats["warning"]
        assert "WARNING" in proc.output() and "--insecure-no-auth" in proc.output()
        assert httpx.get(proc.url + "/health", headers={"Host": "attacker.example"}).status_code == 403
    finally:
        assert proc.stop() == 0, proc.output()


def test_behind_a_proxy_loopback_is_no_protection(monkeypatch):
    from django.conf import settings

    monkeypatch.delenv("HEARTH_API_KEY", raising=False)
    monkeypatch.setattr(settings, "HEARTH_BEHIND_PROXY", True)  # HEARTH_BEHIND_PROXY=1, read at start
    message = refusal("--port", str(free_port()))
    assert "behind a reverse proxy" in message and "--api-key" in message


def test_key_settings_that_cannot_work_stop_start_up(tmp_path):
    empty = tmp_path / "keys.txt"
    empty.write_text("# no keys here\n\n")
    for args, message in ((["--api-key-file", str(empty)], "holds no key"),
                          (["--api-key-file", str(tmp_path / "missing")], "cannot read it"),
                          (["--cors-origin", "not an origin"], "is not an origin"),
                          (["--allow-path", str(tmp_path / "nowhere")], "not a folder")):
        assert message in refusal("--port", str(free_port()), *args), args


# -- the dashboard ---------------------------------------------------------------------------------

def test_dashboard_sign_in_chat_and_sign_out(page, keyed):
    from tests.helpers import ARTIFACTS

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.goto(keyed.url + "/#/chat")
    page.wait_for_selector("form.signin-card")
    assert "/signin" in page.url
    page.screenshot(path=str(ARTIFACTS / "desktop-signin.png"))
    page.set_viewport_size({"width": 375, "height": 740})
    page.screenshot(path=str(ARTIFACTS / "phone-signin.png"))
    page.set_viewport_size({"width": 1280, "height": 800})
    page.fill("#key", "not-the-key")
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("text=not one this server accepts")

    page.fill("#key", KEY)
    page.click("button:has-text('Sign in')")
    page.wait_for_url("**/#/chat")
    page.wait_for_selector("text=hearth-test/tiny-random")  # the socket connected with the session cookie
    page.fill("textarea[aria-label=Message]", "Hello over a signed-in socket")
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant .perf", timeout=120_000)
    cookie = next(c for c in page.context.cookies() if c["name"] == "hearth_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.screenshot(path=str(ARTIFACTS / "desktop-chat-signed-in.png"))
    page.set_viewport_size({"width": 375, "height": 740})
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, "the header with Sign out scrolls sideways at 375px"
    page.screenshot(path=str(ARTIFACTS / "phone-chat-signed-in.png"))
    page.set_viewport_size({"width": 1280, "height": 800})

    page.click("button.signout")
    page.wait_for_selector("form.signin-card")
    page.goto(keyed.url + "/#/settings")
    page.wait_for_selector("form.signin-card")  # signed out for good
    r = page.request.get(keyed.url + "/api/jobs")
    assert r.status == 401
