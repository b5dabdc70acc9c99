"""The chat sidebar's session actions in headless Chromium against the
session server: fork a chat, export it as JSONL, delete the fork, import the
export back as a new chat."""
from __future__ import annotations

import json

from tests.browser import pages
from tests.helpers import ARTIFACTS

TOPIC = "Lighthouse keepers of the north"


def _rows(page, text: str):
    return page.locator(".sessions li.session-row", has_text=text)


def test_fork_export_delete_and_import_a_chat(page, base_url, tmp_path):
    pages.open_chat(page, base_url)
    page.click("text=New chat")
    pages.send(page, TOPIC)
    original = _rows(page, TOPIC).first
    original.wait_for()
    count = _rows(page, TOPIC).count()

    original.locator(".session-more").click()
    original.locator(".session-menu button", has_text="Fork").click()
    _rows(page, f"{TOPIC} (fork)").first.wait_for()
    assert _rows(page, TOPIC).count() == count + 1

    row = _rows(page, TOPIC).filter(has_not_text="(fork)").first
    row.locator(".session-more").click()
    with page.expect_download() as download:
        row.locator(".session-menu a", has_text="Export").click()
    exported = tmp_path / "chat.jsonl"
    download.value.save_as(exported)
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert lines[0]["type"] == "session" and any(TOPIC in json.dumps(e) for e in lines[1:])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "desktop-chat-session-actions.png"))

    fork = _rows(page, f"{TOPIC} (fork)").first
    fork.locator(".session-more").click()
    fork.locator(".session-menu button", has_text="Delete…").click()
    fork.locator(".session-menu button", has_text="Keep").click()  # asked first: nothing deleted
    assert _rows(page, f"{TOPIC} (fork)").count() == 1
    fork.locator(".session-menu button", has_text="Delete…").click()
    fork.locator(".session-menu button", has_text="Delete").last.click()
    page.wait_for_function(f"!document.querySelector('.sessions').innerText.includes({json.dumps(TOPIC + ' (fork)')})")
    assert _rows(page, TOPIC).count() == count

    page.set_input_files("input[aria-label='Session file to import']", str(exported))
    page.wait_for_selector("#toast:has-text('Imported')")
    page.wait_for_function(f"document.querySelectorAll('.sessions li.session-row').length && "
                           f"[...document.querySelectorAll('.sessions li.session-row')]"
                           f".filter((li) => li.innerText.includes({json.dumps(TOPIC)})).length === {count + 1}")
    page.wait_for_selector(f".msg.user:has-text({json.dumps(TOPIC)})")  # the imported chat is open
