"""Tool cards and the approval card in the dashboard chat, in a real
headless Chromium. The page is served by the real server; its /ws/chat is
replaced by a scripted socket (Playwright's route_web_socket), so the tool
frames arrive exactly as the protocol says, with no model to steer. The
server side of the same frames is tested in test_chat_tools.py.
Screenshots go to tests/artifacts/screenshots."""
from __future__ import annotations

import json
from pathlib import Path

ARTIFACTS = Path(__file__).parent / "artifacts" / "screenshots"
ROUNDS = [{"text": "Let me look. ", "calls": [
    {"id": "c1", "tool": "read", "args": {"path": "notes.txt"}, "ok": True, "result": "     1\talpha"},
    {"id": "c2", "tool": "bash", "args": {"command": "ls"}, "ok": True, "result": "a.txt\n"}]}]


def _scripted(received: list[dict]):
    def handler(ws):
        def send(**frame):
            ws.send(json.dumps(frame))

        def on_message(raw):
            f = json.loads(raw)
            received.append(f)
            if f["type"] == "prompt":
                send(type="turn_start", userEntryId="u1", sessionId="s1")
                send(type="text_delta", delta="Let me look. ")
                send(type="tool_start", callId="c1", tool="read", args={"path": "notes.txt"})
                send(type="tool_end", callId="c1", ok=True, result="     1\talpha")
                send(type="tool_start", callId="c2", tool="bash", args={"command": "ls"})
                send(type="tool_approval_request", callId="c2", tool="bash", args={"command": "ls"})
            elif f["type"] == "approval":
                send(type="tool_update", callId="c2", chunk="a.txt\n")
                send(type="tool_end", callId="c2", ok=True, result="a.txt\n")
                send(type="text_delta", delta="Done.")
                send(type="turn_end", lane="batched", sessionId="s1")
            elif f["type"] == "open_session":
                send(type="history", sessionId="s1", settings={"codingTools": True}, items=[
                    {"id": "u1", "role": "user", "content": "list my files", "siblingCount": 1},
                    {"id": "a1", "role": "assistant", "content": "Let me look. Done.", "reasoning": "",
                     "siblingCount": 1, "meta": {"ttft_ms": 5, "lane": "batched", "toolRounds": ROUNDS}}])
            elif f["type"] == "set_coding_tools":
                send(type="coding_tools", active=f["enabled"], pending=False)

        ws.on_message(on_message)
        send(type="ready", model="scripted-model", vision=False, audio=False, thinking=False, transcription=False,
             genDefaults=None)
        send(type="sessions", items=[], activePath=None)

    return handler


def test_tool_cards_and_the_approval_card(browser, base_url):
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    received: list[dict] = []
    page.route_web_socket("**/ws/chat", _scripted(received))
    try:
        page.goto(base_url + "/#/chat")
        page.wait_for_selector("text=scripted-model")
        page.check("#coding-tools")
        page.fill("textarea[aria-label=Message]", "list my files")
        page.keyboard.press("Enter")

        page.wait_for_selector("details.toolcard.ok:has-text('read')")
        asking = page.wait_for_selector("details.toolcard.asking:has-text('bash')")
        assert "waiting for approval" in asking.inner_text()
        for label in ("Allow", "Deny", "Always allow"):
            assert page.locator(f".tool-approval button:text-is('{label}')").is_visible()
        assert page.evaluate("document.activeElement.textContent") == "Allow"  # the keyboard lands on it
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "chat-tool-approval.png"))
        page.keyboard.press("Enter")

        # The stored turn: text, both cards from toolRounds, then the rest of the answer.
        page.wait_for_selector(".msg.assistant .perf")
        cards = page.locator(".msg.assistant details.toolcard")
        assert cards.count() == 2 and page.locator("details.toolcard.ok").count() == 2
        body = page.inner_text(".msg.assistant .body")
        assert body.index("Let me look.") < body.index("read") < body.index("bash") < body.index("Done.")
        page.click("details.toolcard:has-text('bash') summary")
        page.wait_for_selector("details.toolcard[open] pre.tool-result:has-text('a.txt')")
        page.screenshot(path=str(ARTIFACTS / "chat-tool-cards.png"))
        kinds = [f["type"] for f in received]
        assert {"type": "set_coding_tools", "enabled": True} in received
        assert {"type": "approval", "callId": "c2", "decision": "allow", "alwaysAllow": False} in received
        assert kinds.index("approval") > kinds.index("prompt")
    finally:
        context.close()
    assert not errors, errors
