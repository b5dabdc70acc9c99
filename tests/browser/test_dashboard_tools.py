"""Tool cards and the approval card in the dashboard chat, in a real
headless Chromium. The page is served by the real server; its /ws/chat is
replaced by a scripted socket (Playwright's route_web_socket), so the tool
frames arrive exactly as the protocol says, with no model to steer. The
server side of the same frames is tested in test_chat_tools.py.
Screenshots go to tests/artifacts/screenshots."""
from __future__ import annotations

import json

from tests.helpers import ARTIFACTS

ROUNDS = [{"text": "Let me look. ", "calls": [
    {"id": "c1", "tool": "read", "args": {"path": "notes.txt"}, "ok": True, "result": "     1\talpha"},
    {"id": "c2", "tool": "bash", "args": {"command": "ls"}, "ok": True, "result": "a.txt\n"}]}]


def _scripted(received: list[dict], may_code: bool = True):
    allowed: list[str] = []  # the session's always-allowed tools

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
                if f.get("alwaysAllow"):
                    allowed[:] = ["bash"]
                    send(type="tool_approvals", sessionId="s1", alwaysAllow=allowed)
                send(type="tool_update", callId="c2", chunk="a.txt\n")
                send(type="tool_end", callId="c2", ok=True, result="a.txt\n")
                send(type="text_delta", delta="Done.")
                send(type="turn_end", lane="batched", sessionId="s1")
            elif f["type"] == "open_session":
                send(type="history", sessionId="s1", settings={"codingTools": True, "alwaysAllow": allowed}, items=[
                    {"id": "u1", "role": "user", "content": "list my files", "siblingCount": 1},
                    {"id": "a1", "role": "assistant", "content": "Let me look. Done.", "reasoning": "",
                     "siblingCount": 1, "meta": {"ttft_ms": 5, "lane": "batched", "toolRounds": ROUNDS}}])
            elif f["type"] == "set_coding_tools":
                send(type="coding_tools", active=f["enabled"], pending=False)
            elif f["type"] == "revoke_approval":
                allowed.remove(f["tool"])
                send(type="tool_approvals", sessionId="s1", alwaysAllow=allowed)

        ws.on_message(on_message)
        send(type="ready", model="scripted-model", vision=False, audio=False, thinking=False, transcription=False,
             genDefaults=None, codingTools=may_code)
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


def test_always_allow_shows_in_the_chat_bar_and_revokes(browser, base_url):
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    received: list[dict] = []
    page.route_web_socket("**/ws/chat", _scripted(received))
    try:
        page.goto(base_url + "/#/chat")
        page.wait_for_selector("text=scripted-model")
        assert page.locator(".chatbar .allowed").is_hidden()
        page.check("#coding-tools")
        page.fill("textarea[aria-label=Message]", "list my files")
        page.keyboard.press("Enter")
        page.click(".tool-approval button:text-is('Always allow')")
        page.wait_for_selector(".chatbar .allowed .badge:has-text('bash')")
        page.wait_for_selector(".msg.assistant .perf")  # the turn stored and reopened: the chip stays
        assert "Always allowed" in page.inner_text(".chatbar .allowed")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.locator(".composer").screenshot(path=str(ARTIFACTS / "chat-always-allowed.png"))
        page.click(".chatbar button[aria-label='Revoke always-allow for bash']")
        page.wait_for_selector(".chatbar .allowed", state="hidden")
        assert {"type": "approval", "callId": "c2", "decision": "allow", "alwaysAllow": True} in received
        assert {"type": "revoke_approval", "tool": "bash"} in received
    finally:
        context.close()
    assert not errors, errors


def test_coding_tools_toggle_is_off_for_an_unvouched_socket(browser, base_url):
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    page.route_web_socket("**/ws/chat", _scripted([], may_code=False))
    try:
        page.goto(base_url + "/#/chat")
        page.wait_for_selector("text=scripted-model")
        assert page.is_disabled("#coding-tools")
        assert "sign in" in page.get_attribute("label[for=coding-tools]", "title")
    finally:
        context.close()


def test_settings_lists_and_revokes_each_sessions_approvals(page, base_url):
    """Approvals seeded in the server's database (this process shares its
    HEARTH_HOME), listed and revoked through the page."""
    from concurrent.futures import ThreadPoolExecutor

    def seed():
        import django

        django.setup()  # the database the running server migrated
        from chat import store
        from chat.models import ToolApproval

        sessions = []
        for title, tools in (("Fix the build", ["bash", "edit"]), ("Draft the notes", ["write"])):
            s = store.create()
            s.title = title
            s.save()
            sessions.append(s.id)
            for tool in tools:
                ToolApproval.objects.create(session=s, tool=tool)
        return sessions

    def left(session_id):
        from chat.approvals import allowed

        return allowed(session_id)

    with ThreadPoolExecutor(1) as pool:  # Django away from Playwright's event loop
        build, notes = pool.submit(seed).result()
        page.goto(base_url + "/#/settings")
        row = page.wait_for_selector(f".approvals-list li:has-text('{build}')")
        assert "Fix the build" in row.inner_text() and page.locator(".approvals-list li").count() >= 2
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        card = page.locator(".card:has-text('Always-allowed tools')")
        card.screenshot(path=str(ARTIFACTS / "settings-approvals.png"))
        page.click("button[aria-label='Revoke bash in Fix the build']")
        page.wait_for_selector("button[aria-label='Revoke bash in Fix the build']", state="detached")
        assert pool.submit(left, build).result() == ["edit"] and pool.submit(left, notes).result() == ["write"]
