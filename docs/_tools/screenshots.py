"""The dashboard screenshots in docs/images/, taken again.

    .venv/bin/python docs/_tools/screenshots.py [OUT_DIR]

Builds tiny random models into throwaway HF_HOME and HEARTH_HOME folders
(nothing is downloaded), starts `hearth serve` on them in router mode,
imports a short chat session (a random model only babbles, so the
conversation shown is imported, as `/api/sessions/import` takes an export),
and photographs the Chat and Models pages at 1280 px with Playwright on
the system Chromium. The server is stopped at the end."""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers import TINY_REPO, ServerProcess, build_tiny_model, server_env  # noqa: E402

SMALL = "hearth-test/tiny-random-4bit"
CODE = '''```python
from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8080/v1", api_key="unused")
for m in client.models.list():
    print(m.id, m.model_extra["status"]["value"])
```'''
TURNS = [
    ("user", "Which models can I name in a request?"),
    ("assistant", "Every model in the library. `GET /v1/models` lists them, loaded or not, each with its "
                  "status:\n\n" + CODE + "\n\nA request that names no model gets the default one."),
    ("user", "And how do I keep one loaded?"),
    ("assistant", "Pin it. On the **Models** page press **Pin**, or:\n\n"
                  "1. `curl -s localhost:8080/models/pin -d '{\"model\": \"qwen\", \"pinned\": true}'`\n"
                  "2. or set `pin = true` in its section of the `--models-preset` file.\n\n"
                  "A pinned model loads at start and is never unloaded to make room."),
]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hearth-shots-"))
    hf, home = work / "hf", work / "hearth"
    build_tiny_model(hf / "hub")
    build_tiny_model(hf / "hub", repo_id=SMALL, quantize=True)
    env = dict(server_env(hf, home), HEARTH_BLAS="openblas")
    server = ServerProcess(env, "--default-model", TINY_REPO, "--no-worker", log_path=work / "server.log")
    try:
        server.wait_ready()
        entries = [{"type": "session", "title": "Models and pins"}]
        for i, (role, text) in enumerate(TURNS):
            entries.append({"type": "message", "id": f"m{i}", "parentId": f"m{i - 1}" if i else None,
                            "message": {"role": role, "content": text}})
        r = httpx.post(server.url + "/api/sessions/import", json={"entries": entries}, timeout=60)
        r.raise_for_status()
        shoot(server.url, out)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def shoot(url: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_context(viewport={"width": 1280, "height": 940}, color_scheme="light").new_page()
        page.goto(url + "/#/chat")
        page.wait_for_selector(".sessions button:has-text('Models and pins')")
        page.click(".sessions button:has-text('Models and pins')")
        page.wait_for_selector(".msg.assistant:has-text('Pin it')")
        page.wait_for_timeout(500)
        page.screenshot(path=str(out / "chat.png"))
        page.goto(url + "/#/models")
        page.wait_for_selector(f"text={SMALL}")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(out / "models.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 570})
        browser.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images")
