"""The Curve Designer page in headless Chromium: reached from Settings, the
signal drawn under the curve, points added, dragged and kept monotone,
samples side by side; screenshots at desktop and phone widths. The Curve
Terrain beside it draws the HLG family and redraws for another span."""
from __future__ import annotations

from tests.helpers import ARTIFACTS


def _plot_point(page, x: float, y: float) -> tuple[float, float]:
    """Screen coordinates of (log-probability x, log-weight y) on the plot."""
    box = page.locator("#plot").bounding_box()
    scale = box["width"] / 640
    return (box["x"] + (46 + (x + 20) / 20 * 580) * scale, box["y"] + (14 + (-y) / 20 * 348) * scale)


def test_the_curve_designer_draws_and_samples(page, base_url):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.goto(base_url + "/#/settings")
    page.click("text=Open the Curve Designer")
    page.wait_for_url("**/curves")
    page.wait_for_selector("#plot circle.handle")
    assert page.locator("#plot circle.handle").count() == 2

    page.click("#read-signal")
    page.wait_for_selector("#plot .signal rect")
    assert "320 tokens" in page.inner_text("#signal-note")

    # Click the plot to add a point, then drag it: it stays between its neighbours.
    page.mouse.click(*_plot_point(page, -6, -6))
    assert page.locator("#plot circle.handle").count() == 3
    x, y = _plot_point(page, -6, -6)
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(*_plot_point(page, -4, -1), steps=5)
    page.mouse.up()
    assert page.inner_text("#readout") == "point 2: -4 → -1"
    page.mouse.move(*_plot_point(page, -4, -1))
    page.mouse.down()
    page.mouse.move(*_plot_point(page, -4, 5), steps=5)  # above the last point: held at its height
    page.mouse.up()
    assert page.inner_text("#readout") == "point 2: -4 → 0"
    page.locator("#plot circle.handle").nth(1).focus()
    page.keyboard.press("ArrowDown")
    assert page.inner_text("#readout") == "point 2: -4 → -0.5"
    page.keyboard.press("Delete")
    assert page.locator("#plot circle.handle").count() == 2

    page.click("text=Cut the tail")
    assert page.locator("#plot circle.handle").count() == 4
    page.fill("#max-tokens", "24")
    page.click("#generate")
    page.wait_for_selector("#default-samples .sample", timeout=60_000)
    assert page.locator("#curve-samples .sample").count() == 3
    assert page.locator("#default-samples .sample").count() == 3
    assert "temperature 0" in page.inner_text("#recipe") and "top-k 5" in page.inner_text("#recipe")
    page.screenshot(path=str(ARTIFACTS / "desktop-curves.png"), full_page=True)

    page.set_viewport_size({"width": 375, "height": 740})
    page.wait_for_timeout(200)
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, "the Curve Designer scrolls sideways at 375px"
    page.screenshot(path=str(ARTIFACTS / "phone-curves.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.click("button.theme")
    page.screenshot(path=str(ARTIFACTS / "desktop-curves-dark.png"), full_page=True)


def test_a_refusal_is_shown(browser, base_url):
    """The server's 400 reaches the page as its message (Chromium logs the failed
    request itself, so only script errors count here)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(base_url + "/curves")
    page.wait_for_selector("#plot circle.handle")
    page.fill("#prompt", "   ")
    page.click("#read-signal")
    page.wait_for_selector("#status:has-text('prompt must be a non-empty string')")
    context.close()
    assert not errors, errors


def test_the_curve_terrain_draws_the_hlg_family(page, base_url):
    page.goto(base_url + "/curves")
    page.click("text=Curve Terrain")
    page.wait_for_url("**/curve-terrain")
    page.wait_for_selector("#terrain .mesh polygon")
    assert page.locator("#terrain .mesh polygon").count() == 24 * 48  # 25 curves of 49 depths
    assert page.input_value("#span-width") == "4" and page.locator("#span-width").is_disabled()
    page.screenshot(path=str(ARTIFACTS / "desktop-curve-terrain.png"), full_page=True)
    page.select_option("#vary", "toe")
    page.wait_for_selector("text=Terrain over toe")
    assert not page.locator("#span-width").is_disabled() and page.locator("#span-toe").is_disabled()
    page.refusals_expected.add("/curve-terrain/surface")  # the 400 below, shown on the page
    page.fill("#high", "0")
    page.dispatch_event("#high", "change")
    page.wait_for_selector("#status:has-text('high must be above low')")
