"""The dashboard in a real headless Chromium (Debian's, driven by
Playwright): chat with a streamed reply, the session found again after a
reload, switching sessions, a fine-tune started from the wizard and
followed to done, the Settings page's hub token and MCP servers, and a
screenshot of every page at phone and desktop widths in
tests/artifacts/screenshots (look at them)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from tests.browser import pages
from tests.helpers import ARTIFACTS

# tests/mcp_server.py over stdio, as the Settings page's MCP card configures it.
MCP_CALC = {"command": sys.executable, "args": [str(Path(__file__).parents[1] / "mcp_server.py")],
            "env": {"SECRET": "s3cret"}}
PAGES = ("chat", "status", "models", "jobs", "finetune", "quantize", "dataset", "adapters", "lineage", "settings")


def test_chat_streams_a_reply_and_sessions_survive_a_reload(page, base_url):
    pages.open_chat(page, base_url)
    page.fill("textarea[aria-label=Message]", "Tell me about lighthouses")
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Model · writing…", timeout=30_000)  # streaming shows before the turn ends
    page.wait_for_selector(".msg.assistant .perf", timeout=120_000)  # the stored turn with its perf strip
    assert "TTFT" in page.inner_text(".msg.assistant .perf")
    page.reload()
    page.click(".sessions button:has-text('Tell me about lighthouses')")
    page.wait_for_selector(".msg.user:has-text('Tell me about lighthouses')")
    assert page.locator(".msg.assistant").count() == 1

    page.click("text=New chat")
    page.wait_for_selector("text=Start a conversation")
    pages.send(page, "A second conversation about otters")
    page.wait_for_selector(".sessions button:has-text('A second conversation')")
    page.click(".sessions button:has-text('Tell me about lighthouses')")
    page.wait_for_selector(".msg.user:has-text('Tell me about lighthouses')")
    assert page.locator(".msg.user:has-text('otters')").count() == 0
    page.fill("input[aria-label='Search chats']", "otters")
    page.wait_for_selector(".hits mark:has-text('otters')")


def test_finetune_wizard_starts_a_job_that_reaches_done(page, base_url, tiny_model, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    row = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
    (data / "train.jsonl").write_text("\n".join(json.dumps(row) for _ in range(4)) + "\n")
    page.goto(base_url + "/#/finetune")
    page.wait_for_function("document.querySelector('#main input').value.length > 0")
    page.click("text=Next")
    page.fill("#main input", str(tmp_path / "no-such-folder"))
    page.refusals_expected.add("/api/finetune/inspect-dataset")  # a 404: no train.jsonl there
    page.click("text=Next")
    page.wait_for_selector("[role=alert]:has-text('not found')")  # validated before going on
    page.fill("#main input", str(data))
    page.click("text=Next")
    page.wait_for_selector("text=4 training rows")
    page.fill("label:has-text('Iterations') + input", "4")
    page.fill("label:has-text('Report loss every') + input", "2")
    page.click("text=Next")
    page.click("text=Start job")
    page.wait_for_url("**/#/jobs/*")
    page.wait_for_selector("h1 .badge:has-text('done')", timeout=180_000)
    page.wait_for_selector("text=train step 4")
    job_id = page.url.rsplit("/", 1)[-1]
    job = httpx.get(f"{base_url}/api/jobs/{job_id}").json()["job"]
    assert job["status"] == "done"
    # Its summary and its done event read as the jobs list shows them, not as JSON.
    message = page.wait_for_selector("#main p:has-text('100% ')").inner_text()
    assert message.startswith("100% method sft · ") and "{" not in message, message
    page.wait_for_selector(".events:has-text('done')")
    done = next(line for line in page.inner_text(".events").splitlines() if "  done  " in line)
    assert f"output {job['output_path']} · method sft · " in done and "{" not in done, done
    page.screenshot(path=str(ARTIFACTS / "desktop-job-detail.png"), full_page=True)


def test_quantize_wizard_runs_a_calibrated_gptq_job(page, base_url, tiny_model, tmp_path):
    text = tmp_path / "calibration.txt"
    text.write_text(" ".join(f"The {i} red birds fly over the old market." for i in range(400)))
    page.goto(base_url + "/#/quantize")
    page.wait_for_function("document.querySelector('#main input').value.length > 0")
    page.fill("#main input", tiny_model)
    page.click("text=Next")
    page.select_option("[data-spot=quantize-mode]", "gptq")
    page.select_option("[data-spot=quantize-bits]", "3")
    page.fill("[data-spot=quantize-calibration]", str(text))
    page.fill("label:has-text('Calibration sequences') + input", "4")
    page.click("text=Next")
    page.wait_for_selector("[role=alert]:has-text('GPTQ packs 2, 4 or 8 bits')")  # checked before going on
    page.select_option("[data-spot=quantize-bits]", "4")
    page.select_option("[data-spot=quantize-group]", "32")
    page.screenshot(path=str(ARTIFACTS / "desktop-quantize-calibrated.png"), full_page=True)
    page.click("text=Next")
    page.wait_for_selector(f"text=GPTQ on {text}")
    page.click("text=Start job")
    page.wait_for_url("**/#/jobs/*")
    page.wait_for_selector("h1 .badge:has-text('done')", timeout=180_000)
    job = httpx.get(f"{base_url}/api/jobs/{page.url.rsplit('/', 1)[-1]}").json()["job"]
    config = json.loads(job["config_json"])
    assert job["status"] == "done" and config["method"] == "gptq" and config["n_calibration"] == 4
    assert job["output_path"].split("/snapshots/")[0].endswith("models--hearth-test--tiny-random-hearth-4bit-gptq")


def test_the_lineage_page_draws_the_served_model_and_links_each_node(page, base_url, tiny_model):
    page.goto(base_url + "/dag")  # the contract's address of the page
    page.wait_for_url("**/#/lineage")
    served = page.wait_for_selector(f"[data-node='served:{tiny_model}']")
    page.wait_for_selector(f"[data-node='model:{tiny_model}']")
    assert page.locator("path.edge").count() >= 1
    page.screenshot(path=str(ARTIFACTS / "desktop-lineage.png"), full_page=True)
    served.click()
    page.wait_for_url(f"**/#/status/{tiny_model}")  # that model's cards
    page.wait_for_selector(f"[data-model='{tiny_model}'] dd:text-is('{tiny_model}')")


def test_status_page_says_what_caps_other_machines_context(page, base_url, tiny_model):
    page.goto(base_url + "/#/status")
    page.wait_for_selector(f"[data-model='{tiny_model}'] .card h2:text-is('Rows')")  # one model's server: its cards
    page.wait_for_selector(".sku-note")
    fit = httpx.get(base_url + "/fit").json()
    window = fit["context_window"]
    assert window < fit["sku_matrix_ctx"]  # the tiny model's window is the smaller: it caps every row
    assert page.inner_text("h2:has-text('Other machines')") == f"Other machines at {window} tokens"
    assert f"at most {window} tokens (its own context window)" in page.inner_text(".sku-note")
    assert {int(t) for t in page.locator("table.sku tbody td:nth-child(3)").all_inner_texts()} == {window}
    # The Hardware card gives its values room: each stays on one line at 1280 px.
    heights = page.eval_on_selector_all(".card:has(h2:text-is('Hardware')) dd",
                                        "els => els.map((e) => e.getBoundingClientRect().height)")
    assert len(heights) == 6 and max(heights) < 1.5 * min(heights), heights


def test_adapters_page_names_each_base_model(page, base_url, tiny_model, homes):
    from huggingface_hub import snapshot_download

    from tests.helpers import random_adapter, write_adapter

    snapshot = snapshot_download(tiny_model, local_files_only=True)  # as a fine-tune records its base
    write_adapter(homes[1] / "adapters" / "named-base", random_adapter(snapshot, 1, 5), 1.0, snapshot, layers=1)
    page.goto(base_url + "/#/adapters")
    cell = page.wait_for_selector("tr[data-adapter='named-base'] td[data-label='base model']")
    assert cell.inner_text() == tiny_model and cell.get_attribute("title") == snapshot
    assert "`" not in page.inner_text("#main"), page.inner_text("#main")
    assert page.inner_text("#main .page > p code") == "adapter"
    page.screenshot(path=str(ARTIFACTS / "desktop-adapters-base-model.png"), full_page=True)


def test_a_partial_adapter_is_named_so_on_its_page_and_in_the_chat(page, base_url, tiny_model, homes):
    """A fine-tune that ended before its last step left its last checkpoint (jobs/leftovers.py): the
    Adapters page badges it, and the chat's adapter menu names it partial too."""
    from huggingface_hub import snapshot_download

    from tests.helpers import random_adapter, write_adapter

    snapshot = snapshot_download(tiny_model, local_files_only=True)
    folder = write_adapter(homes[1] / "adapters" / "cut-short", random_adapter(snapshot, 1, 6), 1.0, snapshot,
                           layers=1)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["partial"] = {"step": 6, "iters": 10, "ended": "cancelled", "job_id": 1}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    page.goto(base_url + "/#/adapters")
    badge = page.wait_for_selector("tr[data-adapter='cut-short'] .badge.warn")
    assert badge.inner_text() == "partial · step 6 of 10" and "cancelled" in badge.get_attribute("title")
    page.goto(base_url + "/#/chat")
    page.wait_for_function("[...document.querySelectorAll('select[aria-label=Adapter] option')]"
                           ".some((o) => o.value === 'cut-short')")
    label = page.eval_on_selector("select[aria-label=Adapter] option[value='cut-short']", "o => o.textContent")
    assert label == "cut-short · partial, step 6 (mount)", label


def test_settings_saves_and_removes_the_hub_token(page, base_url):
    page.goto(base_url + "/#/settings")
    page.wait_for_selector("text=No token saved.")
    try:
        page.fill("input[aria-label='Hugging Face token']", "hf_dashboard_test")
        page.click("button:has-text('Save')")
        page.wait_for_selector("text=A token is saved.")
        assert httpx.get(base_url + "/api/settings/hf-token").json() == {"ok": True, "has_token": True}
        page.click("button:has-text('Remove token')")
        page.wait_for_selector("text=No token saved.")
    finally:
        httpx.delete(base_url + "/api/settings/hf-token")


def test_the_settings_page_configures_an_mcp_server(page, base_url):
    page.goto(base_url + "/#/settings")
    page.wait_for_selector(".mcp .mcp-status li")
    page.fill("textarea.mcp-config", "{not json")
    page.click("text=Save and connect")
    assert "Not JSON" in page.inner_text(".mcp [role=alert]")
    servers = {"calc": MCP_CALC, "gone": {"command": "/nonexistent/x"}}
    page.fill("textarea.mcp-config", json.dumps({"mcpServers": servers}))
    try:
        page.click("text=Save and connect")
        page.wait_for_selector('.mcp li[data-server="calc"] .badge.ok', timeout=30_000)
        assert "calc__add" in page.inner_text('.mcp li[data-server="calc"]')
        assert "not available" in page.inner_text('.mcp li[data-server="gone"]')
        assert '"SECRET": "********"' in page.input_value("textarea.mcp-config")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "desktop-settings-mcp.png"), full_page=True)
    finally:
        httpx.put(base_url + "/api/settings/mcp", json={"servers": {}}, timeout=30).raise_for_status()


@pytest.mark.parametrize("width,height,name", [(375, 740, "phone"), (1280, 800, "desktop")])
def test_every_page_renders_at_phone_and_desktop_widths(browser, base_url, width, height, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    for route in PAGES:
        page.goto(f"{base_url}/#/{route}")
        page.wait_for_selector("#main h1, #main .chat", timeout=15_000)
        page.wait_for_timeout(400)
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, f"{route} scrolls sideways at {width}px"
        if route != "chat":  # the chat is the page there: no button
            assert pages.under_dock_button(page) == [], f"the Assistant button covers part of {route} at {width}px"
        assert pages.shown_though_hidden(page) == [], f"{route} shows what it hides at {width}px"
        page.screenshot(path=str(ARTIFACTS / f"{name}-{route}.png"), full_page=True)
    page.emulate_media(color_scheme="dark")
    page.goto(f"{base_url}/#/chat")
    page.wait_for_selector(".chat")
    page.screenshot(path=str(ARTIFACTS / f"{name}-chat-dark.png"))
    context.close()
    assert not errors, errors


def test_markdown_never_runs_html_from_a_reply(page, base_url):
    page.goto(base_url + "/#/status")
    page.wait_for_selector("#main h1")
    found = page.evaluate("""async () => {
        const { markdown } = await import("/assets/js/md.js");
        window.pwned = 0;
        const evil = ['<code>x <img src=x onerror="window.pwned=1">', '<script>window.pwned=2</script>',
                      '[link](javascript:window.pwned=3)', '<b onclick="window.pwned=4">bold</b> **real bold**',
                      '```html\\n<img src=x onerror="window.pwned=5">\\n```'];
        const box = document.createElement("div");
        for (const text of evil) box.append(markdown(text));
        document.body.append(box);
        await new Promise((r) => setTimeout(r, 300));
        return { pwned: window.pwned, imgs: box.querySelectorAll("img, script, [onclick], [onerror]").length,
                 hrefs: [...box.querySelectorAll("a")].map((a) => a.getAttribute("href")),
                 strong: box.querySelectorAll("strong").length };
    }""")
    assert found == {"pwned": 0, "imgs": 0, "hrefs": ["#"], "strong": 1}, found


def test_a_chat_larger_than_one_socket_frame_opens_whole(page, base_url):
    big = "A long answer about tides. " * 50_000  # 1.35 MB in one entry; the socket's frames stop at 1 MiB
    entries = [{"type": "session", "title": "A very long chat"}]
    for i in range(6):
        content = big if i == 3 else f"turn {i}: " + "waves " * 20_000
        entries.append({"type": "message", "id": f"m{i}", "parentId": f"m{i - 1}" if i else None,
                        "message": {"role": "user" if i % 2 == 0 else "assistant", "content": content}})
    r = httpx.post(base_url + "/api/sessions/import", json={"entries": entries}, timeout=60)
    assert r.status_code == 200, r.text
    pages.open_chat(page, base_url)
    page.click(".sessions button:has-text('A very long chat')")
    page.wait_for_selector(".msg.user:has-text('turn 4:')", timeout=60_000)  # the last page arrived
    assert page.locator(".msg").count() == 6
    shown = page.evaluate("[...document.querySelectorAll('.msg.assistant')][1].innerText.length")
    assert shown >= len(big) - 10  # the split entry, joined again
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "desktop-chat-long-session.png"))
