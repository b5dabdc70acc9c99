"""What the browser tests do on a page again and again."""
from __future__ import annotations

from tests.helpers import TINY_REPO


def open_chat(page, base_url: str, model: str = TINY_REPO) -> None:
    """The chat page, once its socket said which model it talks to."""
    page.goto(base_url + "/#/chat")
    page.wait_for_selector(f"text={model}")


def send(page, text: str) -> None:
    """Type a message, send it, and wait for the stored turn (its perf strip)."""
    page.fill("textarea[aria-label=Message]", text)
    page.keyboard.press("Enter")
    page.wait_for_selector("article.msg.assistant .perf", timeout=120_000)
