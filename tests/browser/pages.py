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


# What the Assistant button can lie over: each control, and each element with text of its own, in #main that
# comes under the button's box at some scroll position of the page (what passes under the sticky header is
# hidden by the header, not by the button, and does not count). Worked out from the boxes at the top of the
# page and the page's scroll range; empty when the button is out of view or absent.
_UNDER_DOCK_BUTTON = """() => {
  const button = document.querySelector(".dock-toggle");
  if (!button || button.hidden) return ["no Assistant button"];
  scrollTo(0, 0);
  const b = button.getBoundingClientRect(), header = document.querySelector(".top").getBoundingClientRect().bottom;
  if (!b.width || b.bottom <= 0 || b.top >= innerHeight) return ["the Assistant button is out of view"];
  const fixed = getComputedStyle(button).position === "fixed" || Boolean(button.closest(".top"));
  const range = fixed ? document.documentElement.scrollHeight - innerHeight : 0;
  const found = [];
  for (const el of document.querySelectorAll("#main *")) {
    const control = el.matches("button, a, input, select, textarea");
    if (!control && ![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    const r = el.getBoundingClientRect();
    if (!r.width || !r.height || r.right <= b.left || r.left >= b.right) continue;
    // A scroll s in [0, range] that puts the element under the button, below the header.
    const low = Math.max(0, r.top - b.bottom), high = Math.min(range, r.bottom - b.top, r.top - header);
    if (low < high) {
      const what = (el.textContent || el.getAttribute("aria-label") || "").trim().slice(0, 40);
      found.push(`${el.tagName.toLowerCase()}: ${what}`);
    }
  }
  return found;
}"""


def under_dock_button(page) -> list[str]:
    """The page's controls and text the Assistant button covers at some scroll position (none, or it hides them)."""
    return page.evaluate(_UNDER_DOCK_BUTTON)


def shown_though_hidden(page) -> list[str]:
    """Elements that carry the `hidden` attribute yet take room on the page: a class's own `display`
    outranks the browser's rule for `[hidden]` unless the stylesheet says otherwise."""
    return page.evaluate("""() => [...document.querySelectorAll("[hidden]")]
      .filter((el) => getComputedStyle(el).display !== "none")
      .map((el) => `${el.tagName.toLowerCase()}.${el.className} ${el.getAttribute("aria-label") || ""}`.trim())""")
