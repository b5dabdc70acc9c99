"""The chat as a daily user drives it, in headless Chromium against the
session server: a reply with a wide code block and table on a phone, reading
back up while a reply streams, regenerate and edit replacing the branch they
leave, a message typed while the socket is down, the phone's list of chats,
and a temperature out of range."""
from __future__ import annotations

import json

import httpx

from tests.browser import pages
from tests.helpers import ARTIFACTS

# Every arrangement of the conversation while a reply is being written: each message as role:question text.
_WATCH = """() => {
  window.seen = [];
  new MutationObserver(() => {
    const rows = [...document.querySelectorAll(".messages article.msg")];
    if (!rows.some((a) => a.querySelector(".who")?.textContent.includes("writing"))) return;
    const shown = rows.map((a) => a.classList.contains("user") ? `user:${a.querySelector(".body").textContent}`
      : "assistant");
    if (window.seen.at(-1) !== shown.join("|")) window.seen.push(shown.join("|"));
  }).observe(document.querySelector(".messages"), { childList: true, subtree: true });
}"""


def _written(page) -> list[str]:
    """What the conversation showed while the reply was written, once it is stored."""
    page.wait_for_function("window.seen.length > 0", timeout=30_000)
    page.wait_for_selector("text=Model · writing…", state="detached", timeout=120_000)
    return page.evaluate("window.seen")


def test_regenerate_and_edit_show_only_the_branch_being_written(page, base_url):
    pages.open_chat(page, base_url)
    page.click("text=New chat")
    pages.send(page, "first question")
    page.evaluate(_WATCH)
    page.click(".msg.assistant button:has-text('Regenerate')")
    assert set(_written(page)) == {"user:first question|assistant"}  # the old reply is not shown above the new

    page.evaluate(_WATCH)
    page.click(".msg.user button:has-text('Edit')")
    page.fill("textarea[aria-label='Edit message']", "a better question")
    page.click("button:has-text('Send edit')")
    assert set(_written(page)) == {"user:a better question|assistant"}  # nor the question it was edited from
    page.wait_for_selector(".msg.user:has-text('2/2')")


def test_a_reader_who_scrolled_up_is_left_there_while_the_reply_streams(browser, base_url):
    context = browser.new_context(viewport={"width": 1280, "height": 500})
    page = context.new_page()
    try:
        pages.open_chat(page, base_url)
        page.click("text=New chat")
        page.fill("textarea[aria-label=Message]", "a long question\n" * 40)
        page.keyboard.press("Enter")
        page.wait_for_selector("text=Model · writing…", timeout=30_000)
        page.evaluate("document.querySelector('.messages').scrollTop = 0")
        page.wait_for_selector(".msg.assistant .perf", timeout=120_000)  # streamed, stored, drawn again
        page.wait_for_timeout(300)
        assert page.evaluate("document.querySelector('.messages').scrollTop") == 0
        assert page.is_visible("button:has-text('Latest')")
        page.click("button:has-text('Latest')")
        page.wait_for_function("(() => { const m = document.querySelector('.messages');"
                               " return m.scrollHeight - m.scrollTop - m.clientHeight < 40; })()")
        assert not page.is_visible("button:has-text('Latest')")
        page.evaluate("document.querySelector('.messages').scrollTop = 0")
        page.fill("textarea[aria-label=Message]", "and a short one")  # one's own message goes to the end again
        page.keyboard.press("Enter")
        page.wait_for_selector("text=Model · writing…", timeout=30_000)
        page.wait_for_selector("text=Model · writing…", state="detached", timeout=120_000)
        page.wait_for_timeout(300)
        assert page.evaluate("(() => { const m = document.querySelector('.messages');"
                             " return m.scrollHeight - m.scrollTop - m.clientHeight; })()") < 40
    finally:
        context.close()


def test_a_message_sent_while_the_socket_is_down_stays_in_the_box(page, base_url):
    page.route_web_socket("**/ws/chat", lambda ws: ws.close())  # the server is gone: every socket closes
    page.goto(base_url + "/#/chat")
    page.wait_for_selector("text=disconnected; reconnecting…")
    page.fill("textarea[aria-label=Message]", "typed while the server was away")
    page.keyboard.press("Enter")
    page.wait_for_selector("#toast:has-text('Not connected')")
    assert page.input_value("textarea[aria-label=Message]") == "typed while the server was away"
    assert page.locator(".msg.user").count() == 0  # nothing shown as sent
    toast, box = (page.locator(sel).bounding_box() for sel in ("#toast", "textarea[aria-label=Message]"))
    assert toast and box and toast["y"] + toast["height"] <= box["y"]  # the toast leaves the text in view


WIDE = ("Here is a table and a long line of code.\n\n| zebrafish | b | c |\n|---|---|---|\n| "
        + " | ".join(["a rather long cell " * 4] * 3) + " |\n\n```\n" + "x = 1  # " + "y" * 300 + "\n```\n")


def test_a_wide_reply_scrolls_inside_itself_on_a_phone(browser, base_url):
    entries = [{"type": "session", "title": "Wide things"},
               {"type": "message", "id": "q", "parentId": None, "message": {"role": "user", "content": "show me"}},
               {"type": "message", "id": "a", "parentId": "q", "message": {"role": "assistant", "content": WIDE}}]
    r = httpx.post(base_url + "/api/sessions/import", json={"entries": entries}, timeout=30)
    assert r.status_code == 200, r.text
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        pages.open_chat(page, base_url)
        page.click("button.sessions-toggle")
        page.fill("input[aria-label='Search chats']", "zebrafish")
        page.click(".hits button:has-text('Wide things')")
        page.wait_for_selector(".msg.assistant pre")
        assert "show-sessions" not in page.get_attribute(".chat", "class")  # the list closes, as a row's click does
        boxes = page.evaluate("""() => ({
          page: document.documentElement.scrollWidth,
          send: [...document.querySelectorAll(".composer form button")].find((b) => b.textContent === "Send")
            .getBoundingClientRect().right,
          convo: document.querySelector(".convo").getBoundingClientRect().right,
          pre: document.querySelector(".msg.assistant pre").getBoundingClientRect().right,
          table: document.querySelector(".msg.assistant table").getBoundingClientRect().right,
          code: (({ scrollWidth, clientWidth }) => scrollWidth > clientWidth)(
            document.querySelector(".msg.assistant pre code")),
        })""")
        assert boxes["page"] <= 390 and max(boxes["send"], boxes["convo"], boxes["pre"], boxes["table"]) <= 390, boxes
        assert boxes["send"] > 0 and boxes["code"], boxes  # the long line scrolls sideways in its block
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "phone-chat-wide-reply.png"))

        page.click("button.sessions-toggle")
        page.click("text=New chat")
        page.wait_for_selector("text=Start a conversation")
        assert "show-sessions" not in page.get_attribute(".chat", "class")
    finally:
        context.close()
    assert not errors, errors


def test_a_temperature_out_of_range_is_said_at_the_field_and_not_sent(page, base_url):
    sent: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(json.loads(payload))))
    pages.open_chat(page, base_url)
    temp = "input[aria-label=Temperature]"
    page.wait_for_function(f"document.querySelector({json.dumps(temp)}).max !== ''")  # the server's range arrived
    page.fill(temp, "5")
    page.keyboard.press("Tab")
    assert page.get_attribute(temp, "aria-invalid") == "true"
    assert "between 0 and 2" in page.evaluate(f"document.querySelector({json.dumps(temp)}).validationMessage")
    page.fill(temp, "0.7")
    page.keyboard.press("Tab")
    page.wait_for_timeout(300)
    assert page.get_attribute(temp, "aria-invalid") == "false"
    temperatures = [f["temperature"] for f in sent if f.get("type") == "set_sampling"]
    assert temperatures == [0.7], temperatures
