"""The dashboard chat reattaches to a running turn, in a real headless
Chromium against a real server: a reload mid-turn shows the turn again and
it finishes on the page, once; the sidebar marks chats whose turn runs (by
asking for the listed chats' streams, never for a listing)."""
from __future__ import annotations

import time
import uuid

import httpx
import pytest

from tests.helpers import ARTIFACTS, ServerProcess, server_env

BLOCKERS = 40  # 80,000 tokens queued: far longer than the test takes, on any machine


@pytest.fixture(scope="module")
def one_row(homes, tiny_model, tmp_path_factory):
    """One generation at a time: a chat turn queued behind others stays
    running, with nothing written yet, for as long as the test holds them."""
    proc = ServerProcess(server_env(*homes), tiny_model, "--batch", "1", "--no-worker",
                         log_path=tmp_path_factory.mktemp("logs") / "one-row.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.output()


def _hold(url: str, tiny_model: str, eos_id: int) -> list[str]:
    """Long generations that run detached (resumable: the POST is left at once)."""
    ids = []
    for _ in range(BLOCKERS):
        conv = f"blocker-{uuid.uuid4()}"
        body = {"model": tiny_model, "messages": [{"role": "user", "content": "hold"}], "max_tokens": 2000,
                "stream": True, "logit_bias": {str(eos_id): -100}}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers={"X-Conversation-Id": conv},
                          timeout=60) as reply:
            assert reply.status_code == 200
            next(reply.iter_raw())
        ids.append(conv)
    return ids


def _release(url: str, ids: list[str]) -> None:
    for conv in ids:
        assert httpx.delete(f"{url}/v1/stream/{conv}", timeout=60).status_code == 200


def test_a_reload_mid_turn_reattaches_and_the_turn_finishes_once(page, one_row, tiny_model, eos_id):
    url = one_row.url
    held = _hold(url, tiny_model, eos_id)
    try:
        page.goto(url + "/#/chat")
        page.wait_for_selector("text=hearth-test/tiny-random")
        page.fill("textarea[aria-label=Message]", "Tell me about harbours")
        page.keyboard.press("Enter")
        page.wait_for_selector("text=Model · writing…", timeout=30_000)
        page.reload()  # mid-turn: the turn waits behind the held generations
        page.wait_for_selector(".msg.user:has-text('Tell me about harbours')", timeout=30_000)
        page.wait_for_selector("text=Model · writing…", timeout=30_000)  # reattached to the running turn
        page.wait_for_selector(".sessions button:has-text('Tell me about harbours') .spinner")
        assert page.locator("button:text-is('Stop')").is_visible()

        page.click("text=New chat")  # the turn goes on in the other chat; its spinner stays
        page.wait_for_selector("text=Start a conversation")
        page.wait_for_selector(".sessions button:has-text('Tell me about harbours') .spinner")
        page.set_viewport_size({"width": 375, "height": 740})
        page.wait_for_selector(".sessions-toggle .spinner")  # the list is folded away on a phone
        page.click(".sessions-toggle")
        page.screenshot(path=str(ARTIFACTS / "chat-live-spinner-375.png"))
        page.click(".sessions-toggle")
        page.set_viewport_size({"width": 1280, "height": 800})

        page.click(".sessions button:has-text('Tell me about harbours')")
        page.wait_for_selector("text=Model · writing…", timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "chat-reattached-desktop.png"))
    finally:
        _release(url, held)
    page.wait_for_selector(".msg.assistant .perf", timeout=120_000)  # the turn ended and was stored
    assert page.locator(".msg.assistant").count() == 1 and page.locator(".msg.user").count() == 1
    deadline = time.monotonic() + 30
    while page.locator(".sessions .spinner").count() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert page.locator(".sessions .spinner").count() == 0
    found = httpx.get(url + "/api/sessions/search", params={"q": "harbours"}, timeout=30).json()["results"]
    stored = httpx.get(url + "/api/sessions/export", params={"path": found[0]["session_path"]}, timeout=30).json()
    answers = [e for e in stored["entries"] if e.get("message", {}).get("role") == "assistant"]
    assert len(answers) == 1 and answers[0]["meta"]["aborted"] is False  # stored once, run to its end
    assert page.locator(".msg.assistant .body").count() == 1
