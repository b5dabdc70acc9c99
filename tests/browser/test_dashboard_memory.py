"""The dashboard's Memory page in a real headless Chromium against a real
`hearth serve` with its own HEARTH_HOME (so the vault lives in a temp
folder): the consent card creates the vault, fixture articles committed
with git are searched, opened, followed by wikilink, their history diffed,
a dry-run synthesis is followed to done, and screenshots of the page at
phone and desktop widths land in tests/artifacts/screenshots (look at them)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from tests.helpers import ARTIFACTS, ServerProcess, server_env

GIT_ID = ["-c", "user.name=Hearth Tests", "-c", "user.email=tests@hearth.invalid", "-c", "commit.gpgsign=false"]

LIGHTHOUSE = """---
type: Building
kind: place
series: Coastal history
height: 48 m
lens: [[Fresnel lens]]
---
# Lighthouse

A tower with a lamp that guides ships past the reef. Its light comes from a
[[Fresnel lens]] tended by [[Keeper|the keeper]].

## Construction

Built of granite blocks in 1850. Beware <img src=x onerror="window.pwned=1"> tags in notes.

## Lens

The first-order [[Fresnel lens#History|lens]] turns once a minute.
"""

FRESNEL = """# Fresnel lens

A compound lens of concentric prisms, used in every [[Lighthouse]].

## History

Augustin-Jean Fresnel designed it in 1822.
"""


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *GIT_ID, *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _write_fixture(root: Path) -> None:
    """Two articles, the first changed in a second commit so its history has a diff."""
    articles = root / "articles"
    if (articles / "Lighthouse.md").exists():
        return
    (articles / "Lighthouse.md").write_text(LIGHTHOUSE.replace("in 1850", "in 1849"), encoding="utf-8")
    (articles / "Fresnel lens.md").write_text(FRESNEL, encoding="utf-8")
    _git(root, "add", "--", "articles/Lighthouse.md", "articles/Fresnel lens.md")
    _git(root, "commit", "-q", "-m", "Add Lighthouse and Fresnel lens")
    (articles / "Lighthouse.md").write_text(LIGHTHOUSE, encoding="utf-8")
    _git(root, "commit", "-q", "-m", "Lighthouse: correct the year", "--", "articles/Lighthouse.md")


@pytest.fixture(scope="module")
def memory_server(homes, tiny_model, tmp_path_factory):
    """A server of its own, with a fresh HEARTH_HOME: no vault until the page makes one."""
    hearth_home = tmp_path_factory.mktemp("memory-home")
    proc = ServerProcess(server_env(homes[0], hearth_home), tiny_model,
                         log_path=tmp_path_factory.mktemp("logs") / "memory-server.log")
    try:
        yield proc.wait_ready()
    finally:
        code = proc.stop()
        assert code == 0, f"server exited {code} on SIGTERM:\n{proc.output()}"


def _vault_root(url: str) -> Path:
    vaults = httpx.get(url + "/api/memory/vaults").json()["vaults"]
    assert vaults, "no vault was made"
    return Path(next(v for v in vaults if v["default"])["root"])


def test_consent_search_article_links_history_and_dry_run(page, memory_server):
    url = memory_server.url
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.goto(url + "/#/memory")
    page.wait_for_selector("text=Set up a memory vault")
    assert page.locator(".top nav a.active").inner_text() == "Memory"
    assert "memory" in page.inner_text(".mem-consent code")  # the root it will use is shown
    page.screenshot(path=str(ARTIFACTS / "desktop-memory-consent.png"), full_page=True)
    page.click("button:has-text('Create vault')")
    page.wait_for_selector(".mem-status:has-text('0 articles')")
    page.wait_for_selector("text=No articles yet")

    root = _vault_root(url)
    _write_fixture(root)
    page.reload()
    page.wait_for_selector(".mem-status:has-text('2 articles')")
    page.wait_for_selector(".mem-list a:has-text('Lighthouse')")

    # Search: summaries and highlighted line hits; the excerpt's markup is text, never HTML.
    page.fill("input[aria-label='Search memory']", "granite")
    page.wait_for_selector(".mem-hits mark:has-text('granite')")
    page.fill("input[aria-label='Search memory']", "beware")
    page.keyboard.press("Enter")
    hit = page.locator(".mem-hits a", has_text="Beware").first
    hit.wait_for()
    assert "<img" in hit.inner_text()
    assert page.evaluate("window.pwned") is None and page.locator("#main img").count() == 0
    page.fill("input[aria-label='Search memory']", "granite")
    page.wait_for_selector(".mem-hits mark:has-text('granite')")
    page.locator(".mem-hits a", has_text="granite").first.click()

    # The article: rendered markdown, infobox, series banner, contents, links; opened at the hit's section.
    page.wait_for_selector(".mem-body h1:has-text('Lighthouse')")
    assert "#/memory/Lighthouse?a=construction" in page.url
    page.wait_for_selector(".mem-infobox th:has-text('height')")
    assert page.locator(".mem-infobox td a.wikilink", has_text="Fresnel lens").count() == 1
    assert "Coastal history" in page.inner_text(".mem-series")
    assert page.locator(".mem-body hr").count() == 0  # front matter is the infobox, not the body
    assert [t.strip() for t in page.locator(".mem-toc a").all_inner_texts()] == ["Construction", "Lens"]
    assert page.locator(".mem-body a.wikilink.missing", has_text="the keeper").count() == 1
    assert "<img" in page.inner_text(".mem-body") and page.locator(".mem-body img").count() == 0
    page.wait_for_selector(".mem-links li:has-text('Fresnel lens')")

    # History: two commits, the newer one's diff shown as coloured text lines.
    page.wait_for_selector(".mem-commits li >> nth=1")
    page.locator(".mem-commits summary", has_text="correct the year").click()
    page.wait_for_selector(".mem-diff .add:has-text('1850')")
    assert "1849" in page.inner_text(".mem-diff .del")

    # Follow a wikilink; the other article lists this one as linking in.
    page.locator(".mem-body a.wikilink", has_text="Fresnel lens").first.click()
    page.wait_for_selector(".mem-body h1:has-text('Fresnel lens')")
    page.wait_for_selector(".mem-links li:has-text('Lighthouse')")
    page.go_back()
    page.wait_for_selector(".mem-body h1:has-text('Lighthouse')")

    # A dry run: every stage reaches done, the buttons are off while it runs and on again after.
    page.goto(url + "/#/memory")
    assert page.input_value("input[aria-label='Search memory']") == "granite"  # the search is kept
    page.wait_for_selector(".mem-hits mark:has-text('granite')")
    page.click("button:has-text('Dry run')")
    assert page.is_disabled("button:has-text('Synthesize')")  # off from the click until the run ends
    page.wait_for_selector(".mem-run .badge:has-text('Done')", timeout=120_000)
    assert page.locator(".mem-stages li.done").count() == 9
    assert page.locator(".mem-run .error").count() == 0
    assert page.is_enabled("button:has-text('Dry run')") and page.is_enabled("button:has-text('Synthesize')")


def test_memory_page_renders_at_phone_and_desktop_widths(browser, memory_server):
    """Search and article, light and dark, at phone then desktop width, with the stage list of a finished dry
    run: one page (loaded at phone width) and one dry run for every shot; the run stays on the page as long
    as the page is not loaded again."""
    url = memory_server.url
    if not httpx.get(url + "/api/memory/vaults").json()["vaults"]:
        assert httpx.post(url + "/api/memory/init", json={}).json()["ok"]
    _write_fixture(_vault_root(url))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 375, "height": 740})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + "/#/memory")
    page.wait_for_selector(".mem-list a:has-text('Lighthouse')")
    page.click("button:has-text('Dry run')")
    page.wait_for_selector(".mem-run .badge:has-text('Done')", timeout=120_000)
    for width, height, name in ((375, 740, "phone"), (1280, 800, "desktop")):
        page.set_viewport_size({"width": width, "height": height})
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            suffix = "" if scheme == "light" else "-dark"
            page.goto(url + "/#/memory")  # the same document: a new hash, no load (the search is kept)
            page.fill("input[aria-label='Search memory']", "lens")
            page.wait_for_selector(".mem-hits mark")
            page.wait_for_selector(".mem-run .badge:has-text('Done')")
            _no_sideways_scroll(page, f"memory search at {width}px")
            page.screenshot(path=str(ARTIFACTS / f"{name}-memory{suffix}.png"), full_page=True)
            page.goto(url + "/#/memory/Lighthouse")
            page.wait_for_selector(".mem-commits summary")
            page.locator(".mem-commits summary").first.click()
            page.wait_for_selector(".mem-diff .add")
            _no_sideways_scroll(page, f"memory article at {width}px")
            page.screenshot(path=str(ARTIFACTS / f"{name}-memory-article{suffix}.png"), full_page=True)
    context.close()
    assert not errors, errors


def _no_sideways_scroll(page, what: str) -> None:
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"{what} scrolls sideways"
