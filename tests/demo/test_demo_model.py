"""The embedded demo model: built by `hearth make-demo-model`, served by
`hearth serve` with no model argument (router mode, the demo model the
default), and its replies fit the question."""
import asyncio
import concurrent.futures
import json
import random
import subprocess
import time
import types

import openai
import pytest

from serving.demo import corpus
from serving.demo.build import Recipe, _corpus_text
from serving.demo.files import train_tokenizer
from tests.helpers import HEARTH, ROOT, ServerProcess, server_env


def test_corpus_and_tokenizer_are_deterministic_for_a_seed():
    a, b = corpus.samples(3, 200), corpus.samples(3, 200)
    assert a == b and a != corpus.samples(4, 200)
    t1, t2 = train_tokenizer(_corpus_text(a), 300), train_tokenizer(_corpus_text(b), 300)
    assert t1.get_vocab() == t2.get_vocab()


def test_build_uses_openblas_shows_progress_and_caches(demo_build, demo_homes):
    assert "BLAS: OpenBLAS" in demo_build
    steps = Recipe().steps
    assert f"step {steps}/{steps}" in demo_build and "hearth/demo-chat built" in demo_build
    started = time.monotonic()
    again = subprocess.run([*HEARTH, "make-demo-model"], cwd=ROOT, env=server_env(*demo_homes),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already built" in again.stdout
    assert time.monotonic() - started < 60


def _serve(hf_home, hearth_home, log_dir):
    proc = ServerProcess(server_env(hf_home, hearth_home), capped=False, log_path=log_dir / "s.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0


@pytest.fixture(scope="module")
def demo_server(demo_build, demo_homes, tmp_path_factory):
    yield from _serve(*demo_homes, tmp_path_factory.mktemp("demo-log"))


def test_plain_serve_is_the_router_with_the_demo_as_default(demo_server):
    import httpx

    listing = httpx.get(demo_server.url + "/models").json()
    assert listing["mode"] == "router" and listing["default"] == "hearth/demo-chat"
    reply = httpx.post(demo_server.url + "/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8}).json()
    assert reply["model"] == "hearth/demo-chat"  # no `model`: the default


def _ask(server, question: str) -> tuple[str, str]:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="hearth/demo-chat", temperature=0, max_tokens=60,
                                       messages=[{"role": "user", "content": question}])
    return r.choices[0].message.content, r.choices[0].finish_reason


def test_serve_without_argument_serves_the_demo(demo_server):
    models = openai.OpenAI(base_url=demo_server.url + "/v1", api_key="x").models.list()
    assert models.data[0].id == "hearth/demo-chat"


def test_greeting_is_answered_with_a_greeting(demo_server):
    text, finish = _ask(demo_server, "Hello!")
    assert finish == "stop"  # the model ends its turn by itself (EOS)
    assert any(word in text for word in ("Hello", "Hi")), text


def test_list_request_gets_a_numbered_list(demo_server):
    text, _ = _ask(demo_server, "List three colors.")
    lines = text.splitlines()
    assert lines[0].startswith("1. ") and lines[1].startswith("2. "), text


def test_json_request_gets_a_json_object(demo_server):
    text, finish = _ask(demo_server, "Give me a JSON object for a person named Ana who is 31.")
    assert finish == "stop"
    obj = json.loads(text)
    assert isinstance(obj, dict) and "name" in obj, text


def test_fact_question_gets_a_sentence(demo_server):
    text, finish = _ask(demo_server, "What do bees make?")
    assert finish == "stop" and text.endswith(".") and text[0].isupper(), text


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def test_offered_tools_get_a_tool_call(demo_server):
    client = openai.OpenAI(base_url=demo_server.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="hearth/demo-chat", temperature=0, max_tokens=60, tools=[WEATHER, ADD],
                                       messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert call.function.name in ("get_weather", "add")
    assert isinstance(json.loads(call.function.arguments), dict)


def test_thinking_on_opens_a_reasoning_channel(demo_server):
    client = openai.OpenAI(base_url=demo_server.url + "/v1", api_key="x", max_retries=0)

    def ask(**extra):
        r = client.chat.completions.create(model="hearth/demo-chat", temperature=0, max_tokens=80, extra_body=extra,
                                           messages=[{"role": "user", "content": "Hello!"}])
        return r.choices[0].message

    thinking = ask(reasoning_effort="high")
    assert thinking.reasoning and thinking.content, thinking
    assert "think>" not in thinking.content and "think>" not in thinking.reasoning
    direct = ask()  # thinking is off unless asked for
    assert direct.content and not getattr(direct, "reasoning", None), direct


def test_the_memory_page_says_synthesis_needs_a_real_model(demo_server, page):
    import httpx

    from tests.helpers import ARTIFACTS

    status = httpx.get(demo_server.url + "/api/memory/status").json()
    assert status["synthesis_model"] == {"model": "hearth/demo-chat", "demo": True}
    made = httpx.post(demo_server.url + "/api/memory/init", json={}, timeout=60)
    assert made.json()["ok"], made.text
    page.goto(demo_server.url + "/#/memory")
    note = page.locator(".mem-demo")
    note.wait_for()
    assert "Synthesis needs a real model" in note.inner_text() and "hearth/demo-chat" in note.inner_text()
    assert note.locator("button", has_text="Download").count() == 1
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "desktop-memory-demo-model.png"), full_page=True)


def _dashboard_turn(server, text: str, route: str = "chat", temperature: float | None = 0) -> list[dict]:
    """One dashboard chat turn through the real socket, the page saying it shows `route`:
    every frame until the turn ends."""
    from websockets.sync.client import connect

    with connect(server.url.replace("http", "ws") + "/ws/chat", open_timeout=30) as ws:
        assert [json.loads(ws.recv(timeout=30))["type"] for _ in range(2)] == ["ready", "sessions"]
        ws.send(json.dumps({"type": "context", "context": {"route": route}}))
        if temperature is not None:
            ws.send(json.dumps({"type": "set_sampling", "scope": "session", "temperature": temperature}))
        ws.send(json.dumps({"type": "prompt", "text": text}))
        frames: list[dict] = []
        while not (frames and frames[-1]["type"] == "turn_end" and not frames[-1].get("continues")):
            frames.append(json.loads(ws.recv(timeout=120)))
            assert frames[-1]["type"] != "error", frames
        return frames


@pytest.fixture(scope="module")
def newcomer_server(demo_build, demo_homes, tmp_path_factory):
    """The demo model served from a Hearth home of its own: no memory vault,
    so the chat offers the three app tools alone, as to a newcomer (with a
    vault its tools are offered too, which the demo model never saw)."""
    home = tmp_path_factory.mktemp("newcomer")
    yield from _serve(demo_homes[0], home / "hearth", home)


def test_the_demo_model_uses_the_app_tools_in_the_dashboard_chat(newcomer_server):
    """The default model learned the app-aware tools' call forms: a newcomer's "take me to …" moves the dashboard."""
    frames = _dashboard_turn(newcomer_server, "Take me to the quantize page.")
    assert {"type": "ui_navigate", "route": "quantize"} in frames, frames
    text = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
    assert "quantize" in text, text  # the round after the call says where the user is now

    frames = _dashboard_turn(newcomer_server, "Take me to quantize and fill in 4 bits.", route="models")
    spot = [f for f in frames if f["type"] == "ui_spotlight"]
    assert spot and spot[0]["target"] == "quantize-bits" and spot[0]["value"] == "4", frames
    assert spot[0]["route"] == "quantize"

    frames = _dashboard_turn(newcomer_server, "Hello!")  # a question no tool answers gets a plain answer
    assert not [f for f in frames if f["type"].startswith("ui_") or f["type"].startswith("tool")], frames
    text = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
    assert any(word in text for word in ("Hello", "Hi")), text


def test_the_demo_corpus_offers_the_app_tools_as_the_chat_does():
    """The corpus (inference, below chat) spells the app tools itself; they must match what the chat offers."""
    from chat import appctx

    offered = [(name, list(tool.parameters.get("properties", {}))) for name, tool in appctx.tools().items()]
    assert offered == list(corpus.APP_TOOLS.items())  # in the order the template lists them
    for route in corpus.APP_PAGES:  # the ambient line, as the corpus writes it
        assert appctx.ambient({"route": route}) == corpus.ambient_line(route)
    step = {"index": 1, "count": 3}
    assert appctx.ambient({"route": "quantize", "step": step}) == corpus.ambient_line("quantize", 2)

    class Turn:  # what an app tool needs of a chat turn, with a dashboard that finds every control
        session = types.SimpleNamespace(id="corpus-check")

        async def send_json(self, frame):
            pass

        async def ask_browser(self, frame, wait_s):
            return {"ok": True, "found": "page", "route": frame.get("route"), "value": frame.get("value")}

    async def act_all() -> list[tuple[tuple[bool, str], str]]:
        r = random.Random(0)
        cases = [corpus._app_case(r) for _ in range(200)]
        return [(await appctx.act(appctx.tools()[name], args, Turn()), result) for _, name, args, result, _ in cases]

    # The tool results the corpus trains on are the ones the chat sends back when the dashboard confirms. In a
    # thread of its own: the module's browser keeps Playwright's event loop in this one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        for got, result in pool.submit(asyncio.run, act_all()).result():
            assert got == (True, result)
    assert corpus.APP_PAGES == appctx.ROUTES
    assert {target for _, target, _, _ in corpus.APP_FIELDS} | {target for _, target, _ in corpus.APP_SPOTS} <= set(
        appctx.SPOTS)
