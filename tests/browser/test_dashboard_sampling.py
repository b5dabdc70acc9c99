"""The chat's sampling panel in headless Chromium against the session server:
its number fields drawn from the server's list (`/api/sampling-fields`), the
model's defaults shown, a JSON schema checked as it is typed, every setting
saved on the session and shown again after a reload."""
from __future__ import annotations

import json

import httpx

from tests.browser import pages
from tests.helpers import ARTIFACTS


def test_the_sampling_panel_saves_every_setting(page, base_url):
    pages.open_chat(page, base_url)
    page.click("text=New chat")
    pages.send(page, "Settings test chat")
    page.click("button[aria-label='Sampling settings']")
    panel = page.locator("form.sampling-panel")
    assert "(model)" in panel.locator("input[aria-label=temperature]").get_attribute("placeholder")
    panel.locator("input[aria-label='max tokens']").fill("12")
    panel.locator("input[aria-label='top k']").fill("7")
    panel.locator("input[aria-label='Stop sequences (comma separated)']").fill("###, END")
    panel.locator("textarea[aria-label='Logit bias by token text']").fill("the = -5")
    panel.locator("select[aria-label='Response format']").select_option("json_schema")
    schema = panel.locator("textarea[aria-label='JSON schema']")
    schema.fill('{"type": "object",')
    assert "JSON" in panel.locator("[role=status]").inner_text()  # the parse error, as typed
    panel.locator("button", has_text="Save for this chat").click()
    assert "does not parse" in panel.locator("[role=alert]").inner_text()
    schema.fill(json.dumps({"type": "object", "properties": {"a": {"type": "string"}}}))
    assert "Valid JSON schema" in panel.locator("[role=status]").inner_text()
    panel.locator("button", has_text="Save for this chat").click()
    page.wait_for_selector("#toast:has-text('Sampling saved')")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "desktop-chat-sampling.png"))

    page.reload()
    page.wait_for_selector("text=Settings test chat")
    page.click("button[aria-label='Sampling settings']")
    assert panel.locator("input[aria-label='max tokens']").input_value() == "12"
    assert panel.locator("input[aria-label='top k']").input_value() == "7"
    assert panel.locator("input[aria-label='Stop sequences (comma separated)']").input_value() == "###, END"
    bias = panel.locator("textarea[aria-label='Logit bias by token text']").input_value()
    assert bias and all(line.split(" = ")[0].isdigit() and line.endswith("= -5") for line in bias.splitlines())
    assert json.loads(schema.input_value())["properties"]["a"] == {"type": "string"}


def test_the_panel_draws_the_fields_the_server_lists(page, base_url):
    """No list of fields in the page: one more field listed is one more input, with the listed range."""
    listed = httpx.get(base_url + "/api/sampling-fields").json()["fields"]
    probe = {"name": "probe_level", "type": "integer", "minimum": 3, "maximum": 9, "description": "a made-up field"}
    page.route("**/api/sampling-fields", lambda route: route.fulfill(json={"ok": True, "fields": [*listed, probe]}))
    pages.open_chat(page, base_url)
    page.click("button[aria-label='Sampling settings']")
    panel = page.locator("form.sampling-panel")
    panel.locator("input[aria-label='probe level']").wait_for()
    keys = panel.locator("input[data-key]").evaluate_all("inputs => inputs.map((i) => i.dataset.key)")
    assert keys == [f["name"] for f in listed] + ["probe_level"]
    temperature = next(f for f in listed if f["name"] == "temperature")
    for field in (temperature, probe):
        shown = panel.locator(f"input[data-key={field['name']}]")
        assert (shown.get_attribute("min"), shown.get_attribute("max")) == (f"{field['minimum']:g}",
                                                                            f"{field['maximum']:g}")
        assert shown.get_attribute("title") == field["description"]
    assert page.locator(".chatbar input[aria-label=Temperature]").get_attribute("max") == f"{temperature['maximum']:g}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "desktop-chat-sampling-fields.png"))
