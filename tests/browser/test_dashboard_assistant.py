"""The dashboard's assistant in a real headless Chromium: one chat and one
socket for the whole app (on #/chat it is the page, elsewhere it sits in the
dock), `context` frames on every route and wizard step change with a snapshot
of the page, the `ui_navigate` / `ui_spotlight` handlers (called as the socket
would call them: the tiny random model calls no tools), and messages queued
while a turn streams (a scripted socket sends the server's queue frames).
Screenshots go to tests/artifacts/screenshots."""
from __future__ import annotations

import json
import time

from tests.helpers import ARTIFACTS

MODEL = "text=hearth-test/tiny-random"
UI = "async (f) => (await import('/assets/js/appctx.js')).handleUiFrame(f)"


def _watch(page) -> dict:
    """Every chat socket the page opens, and the frames sent and received on them."""
    seen: dict = {"sockets": [], "sent": [], "received": []}

    def opened(ws):
        if not ws.url.endswith("/ws/chat"):
            return
        seen["sockets"].append(ws)
        ws.on("framesent", lambda payload: seen["sent"].append(json.loads(payload)))
        ws.on("framereceived", lambda payload: seen["received"].append(json.loads(payload)))

    page.on("websocket", opened)
    return seen


def _contexts(seen: dict) -> list[dict]:
    return [f["context"] for f in seen["sent"] if f.get("type") == "context"]


def _wait_context(page, seen: dict, test, timeout: float = 10.0) -> dict:
    """The first context frame sent from now on that passes `test`."""
    start = len(_contexts(seen))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ctx in _contexts(seen)[start:]:
            if test(ctx):
                return ctx
        page.wait_for_timeout(50)
    raise AssertionError(f"no such context frame; sent: {_contexts(seen)[start:]}")


def _blank_ids(tiny_model: str) -> list[int]:
    """The newline's tokens: a random model that only writes newlines shows nothing."""
    from huggingface_hub import try_to_load_from_cache
    from tokenizers import Tokenizer

    return Tokenizer.from_file(try_to_load_from_cache(tiny_model, "tokenizer.json")).encode("\n").ids


def test_one_socket_follows_the_user_and_a_running_turn_keeps_streaming(page, base_url, eos_id, tiny_model):
    seen = _watch(page)
    page.goto(base_url + "/#/chat")
    page.wait_for_selector(MODEL)
    page.click("text=New chat")
    page.wait_for_selector("text=Start a conversation")
    page.click("button[aria-label='Sampling settings']")  # a long turn: the end-of-text token is never picked
    panel = page.locator("form.sampling-panel")
    panel.locator("input[aria-label='max tokens']").fill("4000")
    panel.locator("textarea[aria-label='Logit bias by token text']").fill(
        "\n".join(f"{token} = -100" for token in [eos_id, *_blank_ids(tiny_model)]))
    panel.locator("button", has_text="Save for this chat").click()
    page.wait_for_selector("#toast:has-text('Sampling saved')")
    panel.locator("button", has_text="Close").click()
    page.fill("textarea[aria-label=Message]", "Tell me a very long story")
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Model · writing…", timeout=30_000)

    page.click(".top nav a:text-is('Status')")
    page.wait_for_selector("#main h1")
    assert page.locator("#main .chat").count() == 0  # the chat left the page...
    toggle = page.locator("button.dock-toggle")
    toggle.wait_for()
    assert toggle.locator(".spinner").is_visible()  # the closed dock says a reply is being written
    page.screenshot(path=str(ARTIFACTS / "desktop-dock-closed-busy.png"))
    toggle.click()  # ...and waits in the dock, still writing
    dock = page.locator("aside.dock")
    assert dock.is_visible() and toggle.is_hidden()
    dock.locator(".msg.assistant:has-text('writing…')").wait_for()
    assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Message"  # the keyboard lands there
    deltas = sum(f["type"] == "text_delta" for f in seen["received"])
    deadline = time.monotonic() + 30
    while sum(f["type"] == "text_delta" for f in seen["received"]) <= deltas and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert sum(f["type"] == "text_delta" for f in seen["received"]) > deltas, "the turn stopped streaming"

    page.click(".top nav a:text-is('Quantize')")
    page.wait_for_selector("#main h1:text-is('Quantize')")
    assert dock.is_visible()  # open stays open from page to page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "desktop-dock-streaming.png"))
    # Streaming across pages was shown above; the 4000 tokens may be done by now on a quick machine.
    stop = dock.locator("button:text-is('Stop')")
    if stop.is_visible():
        stop.click()
    dock.locator(".msg.assistant .perf").wait_for(timeout=60_000)  # the stored turn, shown in the dock

    # The nav link clicked last holds the focus (Stop, had it been clicked, would have hidden itself):
    # put it in the dock, as a user typing there would, so Escape is the dock's.
    dock.locator("textarea[aria-label=Message]").focus()
    page.keyboard.press("Escape")  # focus is in the dock: Escape closes it and the button takes the focus
    assert dock.is_hidden() and toggle.is_visible()
    assert page.evaluate("document.activeElement.classList.contains('dock-toggle')")
    page.reload()
    page.wait_for_selector("#main h1:text-is('Quantize')")
    page.wait_for_selector("button.dock-toggle")
    assert page.locator("aside.dock").is_hidden()  # closed is remembered
    page.click("button.dock-toggle")
    page.reload()
    page.wait_for_selector("aside.dock .composer")
    assert page.locator("aside.dock").is_visible()  # and so is open

    page.click(".top nav a:text-is('Chat')")
    page.wait_for_selector("#main .chat .msg.assistant .perf")  # the same chat, back on its page
    assert page.locator("aside.dock").is_hidden() and page.locator("button.dock-toggle").is_hidden()
    assert len(seen["sockets"]) == 3, seen["sockets"]  # one per load of the app (three), none per page


def test_context_frames_carry_the_route_the_wizard_step_and_a_snapshot(page, base_url):
    seen = _watch(page)
    page.goto(base_url + "/#/status")
    first = _wait_context(page, seen, lambda c: c["route"] == "status")  # sent after the ready frame
    assert any(f["type"] == "ready" for f in seen["received"])
    assert "step" not in first and first["snapshot"]["route"] == "status" and first["snapshot"]["capturedAt"]
    for el in first["snapshot"]["elements"]:
        assert {"ref", "label", "kind", "selector"} <= set(el)
        assert el["kind"] in {"input", "select", "button", "link", "textarea"}
        assert page.locator(el["selector"]).count() >= 1, el
        assert page.locator(f"[data-ref='{el['ref']}']").count() == 1
    assert not any(el["label"] == "Message" for el in first["snapshot"]["elements"])  # the dock is not the page

    page.click(".top nav a:text-is('Fine-tune')")
    step0 = _wait_context(page, seen, lambda c: c["route"] == "finetune")
    assert step0["step"] == {"index": 0, "count": 4, "label": "Model"}
    spots = {el.get("spotlightId"): el for el in step0["snapshot"]["elements"]}
    assert spots["finetune-model"]["kind"] == "input" and spots["finetune-model"]["label"] == "Base model"
    assert spots["finetune-model"]["selector"] == "[data-spot=\"finetune-model\"]"
    assert len(step0["snapshot"]["elements"]) <= 120
    page.wait_for_function("document.querySelector('#main input').value.length > 0")
    page.click("#main button:text-is('Next')")
    step1 = _wait_context(page, seen, lambda c: c["route"] == "finetune" and c.get("step", {}).get("index") == 1)
    assert step1["step"] == {"index": 1, "count": 4, "label": "Data"}
    assert "finetune-data" in {el.get("spotlightId") for el in step1["snapshot"]["elements"]}
    # A ref given once stays on its element: the Next button keeps the same ref from step to step.
    nexts = [[el["ref"] for el in c["snapshot"]["elements"] if el["label"] == "Next"] for c in (step0, step1)]
    assert nexts[0] == nexts[1] and len(nexts[0]) == 1

    page.goto(base_url + "/#/status/engine")  # a sub-path is the view
    status = _wait_context(page, seen, lambda c: c["route"] == "status")
    assert status.get("view") == "engine" and "step" not in status
    page.click(".top nav a:text-is('Chat')")
    chat = _wait_context(page, seen, lambda c: c["route"] == "chat")
    assert "chat-input" in {el.get("spotlightId") for el in chat["snapshot"]["elements"]}  # on #/chat it is the page
    assert not [f for f in seen["received"] if f["type"] == "error"], seen["received"]  # the server took each one


def test_navigate_and_spotlight_frames_move_fill_and_highlight(browser, base_url):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(base_url + "/#/chat")
        page.wait_for_selector(MODEL)
        page.fill("textarea[aria-label=Message]", "half-typed question")
        page.focus("textarea[aria-label=Message]")
        assert page.evaluate(UI, {"type": "ui_navigate", "route": "quantize"}) == {"ok": True, "route": "quantize"}
        assert page.evaluate("location.hash") == "#/quantize"
        page.wait_for_selector("#main h1:text-is('Quantize')")
        dock = page.locator("aside.dock")
        assert dock.is_visible()  # the conversation stays in view, and the typing goes on where it was
        assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Message"
        assert page.input_value("aside.dock textarea[aria-label=Message]") == "half-typed question"

        # Bits lives on step 2: set there, the step lit in the rail, a toast that says where.
        done = page.evaluate(UI, {"type": "ui_spotlight", "target": "quantize-bits", "value": 8})
        assert done["ok"] and done["found"] == "step" and done["step"] == 1
        page.wait_for_selector("#toast:has-text('Bits set to 8 (step 2, Precision)')")
        assert page.locator(".steps span.spotlit:has-text('Precision')").count() == 1
        assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Message"  # no focus taken

        page.wait_for_function("document.querySelector('[data-spot=quantize-source]').value.length > 0")
        page.click("#main button:text-is('Next')")
        page.wait_for_selector("#main label:text-is('Bits')")
        assert page.input_value("[data-spot=quantize-bits]") == "8"  # the value set off-step is there
        done = page.evaluate(UI, {"type": "ui_spotlight", "label": "bits", "value": 4,
                                  "message": "Four bits keeps most of the quality"})
        assert done["ok"] and done["found"] == "page" and done["value"] == "4"
        assert page.input_value("[data-spot=quantize-bits]") == "4"
        assert page.locator("[data-spot=quantize-bits].spotlit").count() == 1
        bubble = page.locator(".spot-bubble[role=status]")
        assert bubble.inner_text() == "Four bits keeps most of the quality" and bubble.is_visible()
        page.screenshot(path=str(ARTIFACTS / "desktop-dock-spotlight.png"))

        # A ref from the last snapshot, a live CSS selector, a catalog id; a select picked by its option text.
        snap = page.evaluate("async () => (await import('/assets/js/appctx.js')).snapshot()")
        group = next(el for el in snap["elements"] if el.get("spotlightId") == "quantize-group")
        assert page.evaluate(UI, {"type": "ui_spotlight", "ref": group["ref"], "value": "128"})["value"] == "128"
        assert page.input_value("[data-spot=quantize-group]") == "128"
        done = page.evaluate(UI, {"type": "ui_spotlight", "selector": "#main select >> nonsense",
                                  "target": "quantize-mode", "value": "bits-per-weight target (mixed)"})
        assert done["found"] == "page" and page.input_value("[data-spot=quantize-mode]") == "bpw"
        assert page.evaluate(UI, {"type": "ui_spotlight", "selector": "[data-spot=quantize-group]"})["found"] == "page"
        assert not page.evaluate(UI, {"type": "ui_spotlight", "target": "no-such-field"})["ok"]
        page.wait_for_selector("#toast:has-text('Could not find')")

        # Another page first, then its element.
        done = page.evaluate(UI, {"type": "ui_spotlight", "route": "models", "target": "models-search",
                                  "message": "Search the hub here"})
        assert done["found"] == "page" and page.evaluate("location.hash") == "#/models"
        assert page.locator("[data-spot=models-search].spotlit").is_visible()
        # "Where do I add an API key?" (the demo's trained answer) lights the card about Hearth's keys, which
        # says whether this server needs one; the Hub token has a target of its own.
        done = page.evaluate(UI, {"type": "ui_spotlight", "route": "settings", "target": "settings-keys"})
        assert done["found"] == "page"
        keys = page.locator("[data-spot=settings-keys].spotlit")
        assert keys.locator("h2").inner_text() == "API keys"
        keys.locator("text=No key is needed here").wait_for()
        assert "HEARTH_API_KEY=KEY" in keys.inner_text()
        done = page.evaluate(UI, {"type": "ui_spotlight", "target": "settings-token"})
        assert done["found"] == "page"
        assert page.locator("[data-spot=settings-token].spotlit h2").inner_text() == "Hugging Face token"
        assert page.evaluate(UI, {"type": "ui_navigate", "route": "nowhere"}) == {"ok": False}
        assert page.evaluate("location.hash") == "#/settings"
    finally:
        context.close()
    assert not errors, errors


def _spotlight_script(received: list[dict], frames: list[dict]):
    """A socket that speaks as a turn calling the app tools would: after the page's first context frame it
    sends the first of `frames` (ui_spotlight with a callId), each next one once the page answered the last,
    and keeps what the page sends."""
    def handler(ws):
        def on_message(raw):
            f = json.loads(raw)
            received.append(f)
            first = f["type"] == "context" and [g["type"] for g in received].count("context") == 1
            if (first or f["type"] == "ui_result") and frames:
                ws.send(json.dumps(frames.pop(0)))

        ws.on_message(on_message)
        ws.send(json.dumps({"type": "ready", "model": "scripted-model", "vision": False, "audio": False,
                            "thinking": False, "transcription": False, "genDefaults": None}))
        ws.send(json.dumps({"type": "sessions", "items": [], "activePath": None}))

    return handler


def test_the_dock_answers_a_spotlight_with_what_it_did(browser, base_url):
    """From the Models page: the rank, on step 3 of Fine-tune, is set and its step lit; a control that is
    not on its page is not found. Each answer goes back as `ui_result` with the page it left the user on."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    received: list[dict] = []
    page.route_web_socket("**/ws/chat", _spotlight_script(received, [
        {"type": "ui_spotlight", "callId": "ui_1", "target": "finetune-rank", "value": "8", "route": "finetune"},
        {"type": "ui_spotlight", "callId": "ui_2", "target": "models-search", "route": "finetune"}]))
    try:
        page.goto(base_url + "/#/models")
        deadline = time.monotonic() + 15
        while len([f for f in received if f["type"] == "ui_result"]) < 2 and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        results = {f["callId"]: f["result"] for f in received if f["type"] == "ui_result"}
        assert results["ui_1"] == {"ok": True, "found": "step", "route": "finetune", "step": 2,
                                   "stepLabel": "Training", "value": "8"}, results
        assert results["ui_2"] == {"ok": False, "found": None, "route": "finetune"}
        assert page.evaluate("location.hash") == "#/finetune"
    finally:
        context.close()


def test_the_dock_on_a_phone(browser, base_url):
    context = browser.new_context(viewport={"width": 375, "height": 740})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(base_url + "/#/quantize")
        page.wait_for_selector("button.dock-toggle")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "phone-dock-closed.png"))
        page.click("button.dock-toggle")
        dock = page.locator("aside.dock")
        box = dock.bounding_box()
        assert box and (box["x"], box["y"], box["width"], box["height"]) == (0, 0, 375, 740)  # the whole screen
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, "the page scrolls sideways at 375px"
        page.wait_for_selector(MODEL, state="attached")
        page.screenshot(path=str(ARTIFACTS / "phone-dock-open.png"))
        page.click("aside.dock button:text-is('Options')")
        assert page.locator("aside.dock .chatbar").is_visible()
        page.screenshot(path=str(ARTIFACTS / "phone-dock-options.png"))
        page.click("aside.dock button:text-is('Options')")
        # A highlight on the page: the dock steps aside so it can be seen (nobody is typing).
        page.evaluate(UI, {"type": "ui_spotlight", "target": "quantize-source", "message": "Paste a repo id here"})
        assert dock.is_hidden()
        page.screenshot(path=str(ARTIFACTS / "phone-spotlight.png"))
        page.click("button.dock-toggle")
        page.click("aside.dock button[aria-label='Close the assistant']")
        assert dock.is_hidden()
    finally:
        context.close()
    assert not errors, errors


def _queue_script(received: list[dict]):
    """A socket that speaks the queue frames as the server does: a turn that keeps streaming, follow-ups held
    (queue_update), a steer delivered at once (the segment ends with `continues` and the stored reply, the
    steer's turn_start names its user row), and Stop that hands the held follow-ups back as `dropped`."""
    follow: list[str] = []
    rows: list[dict] = []

    def handler(ws):
        def send(**frame):
            ws.send(json.dumps(frame))

        def on_message(raw):
            f = json.loads(raw)
            received.append(f)
            behavior = f.get("streamingBehavior")
            if f["type"] == "prompt" and behavior is None:
                rows.append({"id": "u1", "role": "user", "content": f["text"], "siblingCount": 1})
                send(type="turn_start", sessionId="s1", userEntryId="u1", user=rows[-1])
                send(type="text_delta", delta="The first answer goes on")
            elif behavior == "followUp":
                follow.append(f["text"])
                send(type="queue_update", steering=[], followUp=follow)
            elif behavior == "steer":
                send(type="queue_update", steering=[f["text"]], followUp=follow)
                rows.append({"id": "a1", "role": "assistant", "content": "The first answer goes on", "siblingCount": 1,
                             "meta": {"ttft_ms": 4}})
                send(type="turn_end", sessionId="s1", continues=True, entry=rows[-1])
                send(type="queue_update", steering=[], followUp=follow)
                rows.append({"id": "u2", "role": "user", "content": f["text"], "siblingCount": 1})
                send(type="turn_start", sessionId="s1", userEntryId="u2", user=rows[-1])
                send(type="text_delta", delta="Steered answer")
            elif f["type"] == "abort":
                send(type="queue_update", steering=[], followUp=[], dropped=list(follow))
                follow.clear()
                rows.append({"id": "a2", "role": "assistant", "content": "Steered answer", "siblingCount": 1,
                             "meta": {"ttft_ms": 4, "aborted": True}})
                send(type="turn_end", sessionId="s1")
            elif f["type"] == "open_session":
                send(type="history", sessionId="s1", settings={}, items=rows)

        ws.on_message(on_message)
        send(type="ready", model="scripted-model", vision=False, audio=False, thinking=False, transcription=False,
             genDefaults=None)
        send(type="sessions", items=[], activePath=None)

    return handler


def _convo(page) -> list[str]:
    return page.eval_on_selector_all(
        ".msg.user, .msg.assistant",
        "els => els.map((e) => e.className.split(' ')[1] + ': ' + e.querySelector('.body').innerText.trim())")


def test_messages_typed_mid_turn_steer_or_follow_up(browser, base_url):
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    received: list[dict] = []
    page.route_web_socket("**/ws/chat", _queue_script(received))
    box = "textarea[aria-label=Message]"
    try:
        page.goto(base_url + "/#/chat")
        page.wait_for_selector("text=scripted-model")
        page.fill(box, "Tell me about tides")
        page.keyboard.press("Enter")
        page.wait_for_selector(".msg.assistant:has-text('writing…')")
        for label in ("Stop", "Steer", "Follow up"):
            assert page.locator(f".composer button:text-is('{label}')").is_visible()
        assert page.locator(".composer button:text-is('Send')").is_hidden()
        assert "follow-up" in page.get_attribute(box, "placeholder")

        page.fill(box, "And what about the moon?")
        page.keyboard.press("Alt+Enter")
        page.wait_for_selector(".queue .chip:has-text('Next: And what about the moon?')")
        assert page.input_value(box) == ""
        # The last prompt frame (a context frame the assistant sends on its own may come after it).
        assert [f for f in received if f["type"] == "prompt"][-1] == \
            {"type": "prompt", "text": "And what about the moon?", "streamingBehavior": "followUp"}
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "desktop-chat-queue.png"))

        page.fill(box, "Shorter, please")
        page.keyboard.press("Enter")  # steers the reply: delivered at once, in the same turn
        page.wait_for_selector(".msg.assistant:has-text('Steered answer')")
        assert _convo(page) == ["user: Tell me about tides", "assistant: The first answer goes on",
                                "user: Shorter, please", "assistant: Steered answer"]
        assert page.locator(".msg.assistant:has-text('writing…')").count() == 1  # still one turn, still going
        assert page.locator(".queue .chip").all_inner_texts() == ["Next: And what about the moon?"]
        assert page.locator(".msg.user").first.locator("button:text-is('Edit')").count() == 1  # it took its stored id
        assert not [f for f in received if f["type"] == "open_session"]  # a continued turn reloads nothing
        assert {"type": "prompt", "text": "Shorter, please", "streamingBehavior": "steer"} in received

        page.click(".composer button:text-is('Stop')")  # the held follow-up comes back into the empty box
        page.wait_for_function(f"document.querySelector({json.dumps(box)}).value === 'And what about the moon?'")
        assert page.locator(".queue").is_hidden()
        page.wait_for_selector(".msg.assistant .perf:has-text('stopped')")
        assert [f["type"] for f in received].count("open_session") == 1
        assert page.locator(".composer button:text-is('Send')").is_visible()
        assert page.locator(".composer button:text-is('Steer')").is_hidden()
        assert len(_convo(page)) == 4
    finally:
        context.close()
    assert not errors, errors


def test_the_queue_in_the_dock_on_a_phone(browser, base_url):
    context = browser.new_context(viewport={"width": 375, "height": 740})
    page = context.new_page()
    received: list[dict] = []
    page.route_web_socket("**/ws/chat", _queue_script(received))
    try:
        page.goto(base_url + "/#/status")
        page.click("button.dock-toggle")
        page.wait_for_selector("text=scripted-model", state="attached")
        page.fill("textarea[aria-label=Message]", "Tell me about tides")
        page.keyboard.press("Enter")
        page.wait_for_selector("aside.dock .msg.assistant:has-text('writing…')")
        page.fill("textarea[aria-label=Message]", "Then the moon, and why it pulls the sea twice a day")
        page.click("aside.dock button:text-is('Follow up')")
        page.wait_for_selector("aside.dock .queue .chip:has-text('Next:')")
        overflow = page.evaluate("(d => d.scrollWidth - d.clientWidth)(document.querySelector('aside.dock .chat'))")
        assert overflow <= 1, "the dock scrolls sideways at 375px"
        page.screenshot(path=str(ARTIFACTS / "phone-dock-queue.png"))
    finally:
        context.close()


def test_a_follow_up_typed_mid_turn_is_answered_after_the_turn(page, base_url, eos_id):
    seen = _watch(page)
    page.goto(base_url + "/#/chat")
    page.wait_for_selector(MODEL)
    page.click("text=New chat")
    page.wait_for_selector("text=Start a conversation")
    page.click("button[aria-label='Sampling settings']")  # a turn long enough to type into
    panel = page.locator("form.sampling-panel")
    panel.locator("input[aria-label='max tokens']").fill("600")
    panel.locator("textarea[aria-label='Logit bias by token text']").fill(f"{eos_id} = -100")
    panel.locator("button", has_text="Save for this chat").click()
    page.wait_for_selector("#toast:has-text('Sampling saved')")
    panel.locator("button", has_text="Close").click()
    page.fill("textarea[aria-label=Message]", "The first question")
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Model · writing…", timeout=30_000)
    page.fill("textarea[aria-label=Message]", "The follow-up question")
    page.keyboard.press("Alt+Enter")
    page.wait_for_selector(".queue .chip:has-text('Next: The follow-up question')")

    page.wait_for_function("document.querySelectorAll('.msg.assistant .perf').length === 2", timeout=180_000)
    assert page.locator(".queue").is_hidden()
    roles = page.eval_on_selector_all(".msg.user, .msg.assistant", "els => els.map((e) => e.classList[1])")
    users = page.locator(".msg.user .body").all_inner_texts()
    assert roles == ["user", "assistant", "user", "assistant"]
    assert users == ["The first question", "The follow-up question"]
    frames = seen["received"]
    seam = next(i for i, f in enumerate(frames) if f["type"] == "turn_end")
    assert frames[seam].get("continues") is True  # one turn, two segments
    start = next(f for f in frames[seam:] if f["type"] == "turn_start")
    assert start["user"]["content"] == "The follow-up question"
    assert [f["type"] for f in seen["sent"]].count("open_session") == 1  # after the last segment only
    page.screenshot(path=str(ARTIFACTS / "desktop-chat-follow-up.png"))
