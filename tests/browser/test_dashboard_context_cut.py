"""The dashboard chat marks where the model's view of a conversation that
outgrew its context begins, in a real headless Chromium against a real
server capped at the demo model's 512 tokens: a line above the first
message the model still saw, naming how many it no longer sees, and the
reply's header says so; every message stays on the page."""
from __future__ import annotations

import re

import pytest

from tests.helpers import ARTIFACTS, ServerProcess, server_env

QUESTION = "Tell me about the {0} river and the towns along its banks, " * 3  # about 135 tokens


@pytest.fixture(scope="module")
def small_context(homes, tiny_model, tmp_path_factory):
    proc = ServerProcess(server_env(*homes), tiny_model, "--max-context", "512", "--no-worker",
                         log_path=tmp_path_factory.mktemp("logs") / "small-context.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.output()


def test_the_chat_marks_the_messages_the_model_no_longer_sees(page, small_context):
    page.goto(small_context.url + "/#/chat")
    page.wait_for_selector("text=hearth-test/tiny-random")
    # The 2nd question's prompt (two questions and a reply at the cap) is already past the room the cap leaves
    # (512 - 128); a 3rd turn leaves out whole turns with room to spare.
    for n in range(3):
        page.fill("textarea[aria-label=Message]", QUESTION.format(n))
        page.keyboard.press("Enter")
        page.wait_for_selector(f".msg.user:has-text('the {n} river')", timeout=60_000)
        page.wait_for_selector("text=Model · writing…", state="detached", timeout=120_000)
        page.wait_for_selector(".msg.assistant .tools button:has-text('Regenerate')", timeout=60_000)
    marker = page.locator(".context-cut")
    marker.wait_for(timeout=30_000)
    assert page.locator(".msg.user").count() == 3 and page.locator(".msg .error").count() == 0  # none refused
    assert re.match(r"The model no longer sees the \d+ messages above", marker.inner_text())
    # The line sits right above a question (whole turns are left out), and the last reply says it.
    assert marker.evaluate("el => el.nextElementSibling.classList.contains('user')")
    assert "without the oldest" in page.locator(".msg.assistant").last.locator(".who").inner_text()
    # The random model's replies run to the chat's cap, a quarter of the operator's --max-context 512 (the tiny
    # model's own window is larger): the note under them names the context the server allows.
    notes = [n for n in page.locator(".length-note").all_inner_texts() if "reply limit" in n]
    assert notes and all("512-token context this server allows" in n for n in notes), notes
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    marker.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "desktop-chat-context-cut.png"))
