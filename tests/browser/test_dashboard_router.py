"""The dashboard against a ROUTER server (`hearth serve` with no model) in a
real headless Chromium (Debian's, driven by Playwright): the Models page
shows each library model's live status from /models/sse and loads, unloads,
pins and makes default from its buttons (with --models-max 1, loading one
model unloads the other); a refused load shows the server's message; the
chat page's per-session model picker sends `set_model`, the reply comes
from the picked model, and the pick survives a reload. In single mode the
page keeps its restart-to-serve buttons and the chat has no picker.
Screenshots of both pages at phone and desktop widths land in
tests/artifacts/screenshots (look at them)."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.helpers import ARTIFACTS, ServerProcess, build_tiny_model, server_env

TINY_A = "hearth-test/tiny-a"
TINY_B = "hearth-test/tiny-b"
PICKER = "select[aria-label='Model for this chat']"
# A refused POST shows in the page as a toast; Chromium also logs the failed request as a console error.
EXPECTED_CONSOLE = "Failed to load resource: the server responded with a status of 503"


def _models(url: str) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(url + "/models", timeout=10).json()["data"]}


def _wait_status(url: str, model: str, value: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _models(url)[model]["status"]["value"] == value:
            return
        time.sleep(0.3)
    raise AssertionError(f"{model} is not {value} after {timeout}s: {_models(url)[model]}")


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """A router over two tiny models in its own HF cache: at most one loaded, tiny-a the default at start."""
    root = tmp_path_factory.mktemp("router")
    hf, hearth = root / "hf", root / "hearth"
    build_tiny_model(hf / "hub", repo_id=TINY_A)
    build_tiny_model(hf / "hub", repo_id=TINY_B)
    proc = ServerProcess(server_env(hf, hearth), "--models-max", "1", "--default-model", TINY_A,
                         "--max-tokens", "24", "--no-worker", log_path=root / "router.log")
    try:
        proc.wait_ready()
        _wait_status(proc.url, TINY_A, "loaded")  # the default loads at start
        yield proc.url
    finally:
        code = proc.stop()
        assert code == 0, f"router exited {code} on SIGTERM:\n{proc.output()}"


@pytest.fixture
def page(browser):
    """A desktop-sized page; a page error or an unexpected console error fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text)
            if m.type == "error" and not m.text.startswith(EXPECTED_CONSOLE) else None)
    yield page
    context.close()
    assert not errors, errors


# Counts the page's EventSources, so a test can see the Models page close its stream when left.
TRACK_EVENT_SOURCES = """window.eventSources = [];
window.EventSource = class extends window.EventSource {
  constructor(...args) { super(...args); window.eventSources.push(this); }
};"""


def _default_and_other(url: str) -> tuple[str, str]:
    """The router's default model now, and the other one (the Models page test leaves tiny-b the default)."""
    default = httpx.get(url + "/models", timeout=10).json()["default"]
    return default, TINY_B if default == TINY_A else TINY_A


def _open_chat(page, url: str, default: str | None = None) -> None:
    """The chat page, ready (its picker filled, naming `default` as the default where given) and with its
    one /v1 request answered, so closing the page right after cuts no request short."""
    with page.expect_response(lambda r: r.url.endswith("/v1/adapters")):
        page.goto(url + "/#/chat")
    option = f"option:text-is('Default ({default})')" if default else "option[value='']"
    page.wait_for_selector(f"{PICKER} {option}", state="attached")


def _row(model: str) -> str:
    return f"tr[data-model='{model}']"


def _badge(model: str, value: str) -> str:
    return f"{_row(model)} .status-cell .badge:text-is('{value}')"


def test_models_page_loads_unloads_pins_and_makes_default(page, router):
    page.add_init_script(TRACK_EVENT_SOURCES)
    page.goto(router + "/#/models")
    page.wait_for_selector(_badge(TINY_A, "loaded"))
    page.wait_for_selector(_badge(TINY_B, "unloaded"))
    assert page.inner_text(f"{_row(TINY_A)} .markers") == "default"
    assert page.is_hidden(f"button[aria-label='Make {TINY_A} the default model']")
    assert "1 of 2 loaded" in page.inner_text(".fleet-line")

    # Every status tiny-b's badge shows on its way: "loading" comes only from the event stream.
    page.evaluate("""(sel) => { window.seen = [];
        new MutationObserver(() => window.seen.push(document.querySelector(sel)?.textContent))
          .observe(document.getElementById("main"), { childList: true, characterData: true, subtree: true }); }""",
                  f"{_row(TINY_B)} .status-cell .badge")
    page.focus(f"button[aria-label='Load {TINY_B}']")
    page.keyboard.press("Enter")  # from the keyboard; the row's buttons wait for the answer, the focus stays
    page.wait_for_selector(f"button[aria-label='Pin {TINY_B}'][aria-disabled=true]")
    assert page.evaluate("document.activeElement.closest('tr')?.dataset.model") == TINY_B
    page.wait_for_selector(_badge(TINY_B, "loaded"), timeout=120_000)
    page.wait_for_selector(_badge(TINY_A, "unloaded"), timeout=60_000)  # --models-max 1: evicted, seen over SSE
    assert "loading" in page.evaluate("window.seen"), page.evaluate("window.seen")
    page.wait_for_selector(f"{_row(TINY_B)} .status-detail:has-text('memory')")
    states = _models(router)
    assert states[TINY_B]["status"]["value"] == "loaded" and states[TINY_A]["status"]["value"] == "unloaded"

    page.click(f"button[aria-label='Unload {TINY_B}']")
    page.wait_for_selector(_badge(TINY_B, "unloaded"), timeout=60_000)
    assert _models(router)[TINY_B]["status"]["value"] == "unloaded"
    page.wait_for_selector(f"button[aria-label='Load {TINY_B}'][aria-disabled=false]")

    # Pin tiny-a and load it: with its one slot pinned, loading tiny-b is refused and the page says why.
    page.click(f"button[aria-label='Pin {TINY_A}']")
    page.wait_for_selector(f"button[aria-label='Unpin {TINY_A}']")
    assert "pinned" in page.inner_text(f"{_row(TINY_A)} .markers")
    assert _models(router)[TINY_A]["pinned"] is True
    page.click(f"button[aria-label='Load {TINY_A}']")
    page.wait_for_selector(_badge(TINY_A, "loaded"), timeout=120_000)
    page.click(f"button[aria-label='Load {TINY_B}']")
    page.wait_for_selector("#toast.show:has-text('model slots')", timeout=30_000)
    page.wait_for_selector(f"button[aria-label='Load {TINY_B}'][aria-disabled=false]")
    assert _models(router)[TINY_B]["status"]["value"] != "loaded"
    page.click(f"button[aria-label='Unpin {TINY_A}']")
    page.wait_for_selector(f"button[aria-label='Pin {TINY_A}']")
    assert _models(router)[TINY_A]["pinned"] is False
    assert page.inner_text(f"{_row(TINY_A)} .markers") == "default"

    # The tests below take whichever model is the default then: no load spent to put tiny-a back.
    page.click(f"button[aria-label='Make {TINY_B} the default model']")
    page.wait_for_selector(f"{_row(TINY_B)} .markers:has-text('default')", timeout=120_000)
    page.wait_for_selector(_badge(TINY_B, "loaded"), timeout=120_000)  # making it the default loads it
    assert "default" not in page.inner_text(f"{_row(TINY_A)} .markers")
    assert httpx.get(router + "/models", timeout=10).json()["default"] == TINY_B

    assert page.evaluate("window.eventSources.filter((s) => s.readyState !== 2).length") == 1
    # Leaving the page closes its event stream; the chat, whose socket said tiny-a was the default when the
    # page loaded, names the default as it is now.
    _open_chat(page, router, TINY_B)
    assert page.evaluate("window.eventSources.filter((s) => s.readyState !== 2).length") == 0


@pytest.mark.parametrize("width,height,name", [(375, 740, "phone"), (1280, 800, "desktop")])
def test_router_models_page_renders_at_phone_and_desktop_widths(browser, router, width, height, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(router + "/#/models")
    page.wait_for_selector(f"{_row(TINY_A)} .status-cell .badge:not(:empty)")
    page.wait_for_selector(f"{_row(TINY_B)} .status-cell .badge:not(:empty)")
    page.wait_for_timeout(300)
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the Models page scrolls sideways at {width}px"
    page.screenshot(path=str(ARTIFACTS / f"{name}-models-router.png"), full_page=True)
    page.emulate_media(color_scheme="dark")
    page.wait_for_timeout(200)
    page.screenshot(path=str(ARTIFACTS / f"{name}-models-router-dark.png"), full_page=True)
    context.close()
    assert not errors, errors


def test_the_assistant_button_covers_no_model_button(page, router):
    from tests.browser import pages

    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(router + "/#/models")
    page.wait_for_selector(f"button[aria-label='Make {_default_and_other(router)[1]} the default model']")
    assert pages.under_dock_button(page) == []
    page.click("button.dock-toggle")  # in reach, and it opens the dock
    page.wait_for_selector("aside.dock textarea[aria-label=Message]")
    page.screenshot(path=str(ARTIFACTS / "desktop-models-router-dock-open.png"))


def test_chat_picks_a_model_per_session_and_keeps_it(page, router):
    turns: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda frame: turns.append(json.loads(frame))
                                          if '"turn_end"' in frame else None))
    default, picked = _default_and_other(router)
    _open_chat(page, router, default)
    assert page.is_visible(PICKER)
    options = page.eval_on_selector_all(f"{PICKER} option", "els => els.map((e) => [e.value, e.textContent])")
    assert options[0] == ["", f"Default ({default})"] and {TINY_A, TINY_B} <= {v for v, _ in options}, options
    page.click("text=New chat")
    page.wait_for_selector("text=Start a conversation")
    assert page.input_value(PICKER) == ""
    page.select_option(PICKER, picked)
    page.fill("textarea[aria-label=Message]", "Which model answers this chat?")
    page.keyboard.press("Enter")
    page.wait_for_selector("article.msg.assistant .perf", timeout=180_000)  # the stored turn; it loads first
    assert picked in page.inner_text("article.msg.assistant .who")  # the model that answered
    assert turns and turns[-1]["model"] == picked, turns
    end = turns[-1]  # its speed: what the model's process decoded, over the time that took there
    if end["completion_tokens"] > 1:
        assert 0 < end["decode_ms"] and end["decode_tokens"] == end["completion_tokens"] - 1, end
        assert end["tokens_per_s"] == pytest.approx(end["decode_tokens"] / end["decode_ms"] * 1000, rel=0.02)
    stored = httpx.get(router + "/api/sessions/export", params={"path": turns[-1]["sessionId"]}, timeout=10).json()
    answer = [e for e in stored["entries"] if e.get("message", {}).get("role") == "assistant"]
    assert answer and answer[-1]["message"]["content"], stored  # a random model's text, maybe only whitespace
    assert answer[-1]["meta"]["model"] == picked and answer[-1]["meta"]["completion_tokens"] > 0
    states = _models(router)
    assert states[picked]["status"]["value"] == "loaded" and states[default]["status"]["value"] == "unloaded"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "desktop-chat-router.png"))

    with page.expect_response(lambda r: r.url.endswith("/v1/adapters")):
        page.reload()
    page.wait_for_selector(f"{PICKER} option:text-is('Default ({default})')", state="attached")
    page.click(".sessions button:has-text('Which model answers this chat?')")
    page.wait_for_selector(".msg.user:has-text('Which model answers this chat?')")
    page.wait_for_function("(sel) => document.querySelector(sel).value !== ''", arg=PICKER)
    assert page.input_value(PICKER) == picked
    page.click("text=New chat")  # a new chat starts on the default
    page.wait_for_selector("text=Start a conversation")
    assert page.input_value(PICKER) == ""
    page.click(".sessions button:has-text('Which model answers this chat?')")
    page.wait_for_function("(sel) => document.querySelector(sel).value !== ''", arg=PICKER)
    assert page.input_value(PICKER) == picked


def test_chat_picker_at_phone_width(browser, router):
    context = browser.new_context(viewport={"width": 375, "height": 740})
    page = context.new_page()
    _open_chat(page, router, _default_and_other(router)[0])
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, "the chat page scrolls sideways at 375px"
    page.screenshot(path=str(ARTIFACTS / "phone-chat-router.png"))
    context.close()


def test_single_mode_keeps_serve_buttons_and_has_no_picker(page, base_url, tiny_model):
    page.goto(base_url + "/#/models")
    served = f"{_row(tiny_model)} .status-cell .badge:text-is('loaded')"
    page.wait_for_selector(served)
    assert page.locator(f"{_row(tiny_model)} .badge:text-is('serving')").count() == 1
    assert page.locator("#main button:text-is('Load'), #main button:text-is('Pin')").count() == 0
    assert page.is_hidden(".fleet-line")
    assert page.locator(f"{_row(tiny_model)} .markers .badge").count() == 0  # default and pinned are the router's
    page.goto(base_url + "/#/chat")
    page.wait_for_selector(f".chatbar span:has-text('{tiny_model}')")
    assert page.locator(PICKER).is_hidden()


def test_status_page_shows_each_loaded_models_cards_and_says_when_none_is(page, router):
    """A router's /stats has each loaded model's engine under `models`: the Status page shows that model's
    cards, only the named one on #/status/<id> (where the Lineage page links), and with nothing loaded says
    so, loading nothing by being open."""
    loaded = [m for m, row in _models(router).items() if row["status"]["value"] == "loaded"]
    if not loaded:
        httpx.post(router + "/models/load", json={"model": TINY_A}, timeout=120).raise_for_status()
        loaded = [TINY_A]
    model, other = loaded[0], TINY_B if loaded[0] == TINY_A else TINY_A
    page.goto(router + "/#/status")
    cards = f"[data-model='{model}']"
    page.wait_for_selector(f"{cards} dd:text-is('{model}')", timeout=15_000)
    assert page.locator(f"{cards} .card h2").all_inner_texts() == ["Model", "Rows", "Prompt cache", "Admission"]
    page.wait_for_selector(f"h2:text-is('Fit of {model}')")
    page.screenshot(path=str(ARTIFACTS / "desktop-status-router.png"), full_page=True)
    page.goto(router + f"/#/status/{other}")
    page.wait_for_selector(f".empty-state:has-text('{other} is not loaded')")
    assert page.locator("[data-model]").count() == 0

    httpx.post(router + "/models/unload", json={"model": model}, timeout=60).raise_for_status()
    page.goto(router + "/#/status")
    page.wait_for_selector(".empty-state:has-text('No model is loaded')")
    page.wait_for_timeout(1600)  # another poll of /stats
    assert {row["status"]["value"] for row in _models(router).values()} == {"unloaded"}
    page.screenshot(path=str(ARTIFACTS / "desktop-status-router-empty.png"), full_page=True)
