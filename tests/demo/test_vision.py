"""Images in every protocol on the demo vision model (a tiny llava trained
on this machine to name a drawn figure): the official openai and anthropic
SDKs over real sockets, the prompt cache keyed by the image, batching,
logprobs and grammar with an image in the prompt, remote image URLs under
the media policy, and the refusal on a text-only model."""
from __future__ import annotations

import base64
import io
import random
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import httpx
import openai
import pytest

from serving.demo.vision import VISION_REPO, draw
from tests.helpers import HEARTH, ROOT, ServerProcess, server_env

ASK = "What is in this picture?"


def png(colour: str, shape: str, seed: int = 1) -> bytes:
    buf = io.BytesIO()
    draw(colour, shape, random.Random(seed)).save(buf, "PNG")
    return buf.getvalue()


def data_url(colour: str, shape: str, seed: int = 1) -> str:
    return "data:image/png;base64," + base64.b64encode(png(colour, shape, seed)).decode()


def image_turn(url: str, text: str = ASK) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def vision_server(vision_build, vision_homes, tmp_path_factory):
    # The build (conftest: `vision_build`) runs in the background from collection, in homes of its own.
    proc = ServerProcess(server_env(*vision_homes), VISION_REPO,
                         capped=False, log_path=tmp_path_factory.mktemp("vision") / "s.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.output()


@pytest.fixture(scope="module")
def client(vision_server):
    return openai.OpenAI(base_url=vision_server.url + "/v1", api_key="x", max_retries=0)


def ask(client, url: str, **kw):
    return client.chat.completions.create(model=VISION_REPO, messages=image_turn(url), temperature=0,
                                          max_tokens=8, **kw)


def test_build_reports_what_it_measured_and_is_cached(vision_build, vision_homes):
    print(vision_build)  # training time and held-out accuracy, for the log of the run
    assert "held-out accuracy" in vision_build and f"{VISION_REPO} built" in vision_build
    again = subprocess.run([*HEARTH, "make-demo-model", "--kind", "vision"], cwd=ROOT, env=server_env(*vision_homes),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already built" in again.stdout


def test_models_reports_vision(vision_server):
    row = httpx.get(vision_server.url + "/v1/models").json()["data"][0]
    assert row["id"] == VISION_REPO and row["vision"] is True and row["capabilities"]["vision"] is True


# The demo names the colour every time; its shape is right less often (docs/using/vision.md), so
# these check the colour, which only the picture tells.
@pytest.mark.parametrize("colour,shape", [("red", "circle"), ("blue", "square"), ("green", "triangle")])
def test_openai_sdk_data_uri_names_the_colour(client, colour, shape):
    r = ask(client, data_url(colour, shape))
    assert r.choices[0].message.content.startswith(f"a {colour}"), r.choices[0].message.content
    assert r.usage.prompt_tokens > 16  # the image's run of tokens is part of the prompt


def drawn_clip(folder, colour: str, shape: str, seed: int, frames: int = 12) -> str:
    """A clip of the figure drawn again each frame (its place and size as the rng draws them), made by
    ffmpeg, as a data URL: a seed no training picture was drawn with."""
    rng = random.Random(seed)
    for i in range(frames):
        draw(colour, shape, rng).save(folder / f"f{i:03d}.png")
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-framerate", "6", "-i", str(folder / "f%03d.png"),
                    "-c:v", "mpeg4", str(folder / "clip.mp4")], check=True, timeout=60)
    return "data:video/mp4;base64," + base64.b64encode((folder / "clip.mp4").read_bytes()).decode()


@pytest.mark.parametrize("colour,shape,seed", [("red", "circle", 101), ("blue", "square", 202),
                                               ("purple", "triangle", 303)])
def test_a_held_out_drawn_clip_is_named_by_its_colour(client, tmp_path, colour, shape, seed):
    """A video part: its frames are the stills the model reads (8 of them), and it names their colour."""
    r = client.chat.completions.create(model=VISION_REPO, temperature=0, max_tokens=8, messages=[
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": drawn_clip(tmp_path, colour, shape,
                                                                                              seed)}},
                                     {"type": "text", "text": ASK}]}])
    assert r.choices[0].message.content.startswith(f"a {colour}"), r.choices[0].message.content
    assert r.usage.prompt_tokens > 8 * 16  # eight stills, each its run of image tokens


def test_streamed_reply_with_an_image(client):
    stream = client.chat.completions.create(model=VISION_REPO, messages=image_turn(data_url("orange", "square")),
                                            temperature=0, max_tokens=10, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.startswith("a orange"), text


def test_image_alias_part_with_base64_data(client):
    b64 = base64.b64encode(png("yellow", "circle")).decode()
    r = client.chat.completions.create(model=VISION_REPO, temperature=0, max_tokens=8, messages=[
        {"role": "user", "content": [{"type": "image", "data": b64}, {"type": "text", "text": ASK}]}])
    assert r.choices[0].message.content.startswith("a yellow")


def test_anthropic_base64_image_block(vision_server):
    c = anthropic.Anthropic(base_url=vision_server.url, api_key="x", max_retries=0)
    b64 = base64.b64encode(png("red", "circle")).decode()
    msg = c.messages.create(model=VISION_REPO, max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
        {"type": "text", "text": ASK}]}])
    assert msg.content[0].text.startswith("a red")


def test_anthropic_url_source_and_image_in_a_tool_result(vision_server, picture_host):
    c = anthropic.Anthropic(base_url=vision_server.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as err:
        c.messages.create(model=VISION_REPO, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": picture_host}}, {"type": "text", "text": ASK}]}])
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert err.value.body["error"]["message"].startswith("prompt build failed: image url rejected: ")
    b64 = base64.b64encode(png("green", "square")).decode()
    msg = c.messages.create(model=VISION_REPO, max_tokens=8, messages=[
        {"role": "user", "content": "Take a screenshot"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]}]}])
    assert msg.usage.input_tokens > 16  # the picture's tokens are in the prompt


def test_responses_input_image(client):
    r = client.responses.create(model=VISION_REPO, max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url("blue", "square")},
                                     {"type": "input_text", "text": ASK}]}])
    assert r.output_text.startswith("a blue")


def test_prompt_cache_keys_the_image(client):
    first = ask(client, data_url("purple", "triangle", seed=3))
    again = ask(client, data_url("purple", "triangle", seed=3))
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    other = ask(client, data_url("orange", "triangle", seed=3))  # the same text, another image
    # Only the text before the image is shared.
    assert other.usage.prompt_tokens_details.cached_tokens < 8
    assert other.choices[0].message.content.startswith("a orange")


def test_batched_image_rows_with_logprobs_and_grammar(client):
    figures = [("red", "circle"), ("blue", "square"), ("green", "triangle"), ("yellow", "square")]

    def one(fig):
        return ask(client, data_url(*fig, seed=7), logprobs=True, top_logprobs=2)

    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(one, figures))
    for (colour, _), r in zip(figures, replies, strict=True):
        assert r.choices[0].message.content.startswith(f"a {colour}")
        assert r.usage.lane in ("batched", "serial")  # "serial": it ran alone from start to end
        lp = r.choices[0].logprobs.content
        assert lp and all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in lp)
    forced = ask(client, data_url("red", "circle", seed=7), extra_body={"guided_choice": ["circle", "square"]})
    assert forced.choices[0].message.content in ("circle", "square")


def test_text_only_model_refuses_an_image_part_in_every_protocol(base_url):
    part = {"type": "image_url", "image_url": {"url": data_url("red", "circle")}}
    r = httpx.post(base_url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": [part]}]})
    assert r.status_code == 400 and r.json()["error"]["message"] == "model has no vision sidecar"
    assert r.json()["error"]["param"] == "messages[0].content[0]"
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    r = httpx.post(base_url + "/v1/messages", timeout=60, json={"max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}, block]}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "model has no vision sidecar" in r.json()["error"]["message"]


def test_bad_images_are_400s_naming_the_part(client):
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, "data:image/png;base64," + base64.b64encode(b"not a picture").decode())
    assert "prompt build failed: image url rejected" in err.value.message
    assert err.value.body["param"] == "messages[0].content[0]"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=VISION_REPO, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}]}])
    assert "video" in err.value.message


@pytest.fixture(scope="module")
def picture_host():
    """A local http server with one picture, at 127.0.0.1."""
    body = png("green", "circle", seed=4)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    host = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{host.server_address[1]}/figure.png"
    host.shutdown()


def test_private_image_url_is_refused_without_the_flag(client, picture_host):
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, picture_host)
    assert err.value.body["message"].startswith("prompt build failed: image url rejected: ")
    assert "loopback" in err.value.body["message"] and err.value.body["param"] == "messages[0].content[0]"


def test_private_image_url_with_allow_private_media(vision_build, vision_homes, picture_host, tmp_path):
    proc = ServerProcess(server_env(*vision_homes), VISION_REPO, "--allow-private-media",
                         capped=False, log_path=tmp_path / "s.log")
    try:
        proc.wait_ready()
        c = openai.OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0)
        assert ask(c, picture_host).choices[0].message.content.startswith("a green")
    finally:
        assert proc.stop() == 0, proc.output()


# -- the other lanes, in process ---------------------------------------------------------------
@pytest.mark.parametrize("config", [{"batch": 1}, {"draft_kind": "ngram"}], ids=["serial", "speculative"])
def test_image_rows_on_the_serial_and_speculative_lanes(vision_build, vision_homes, config):
    import asyncio

    from inference.engine.engine import Engine, EngineConfig
    from inference.engine.types import GenerationRequest
    from serving.demo.vision import prompt_text
    from tests.helpers import collect

    snapshot = next((vision_homes[0] / "hub" / "models--hearth--demo-vision" / "snapshots").iterdir())
    engine = Engine(str(snapshot), EngineConfig(**config))
    model = engine.start()
    try:
        vision = model.vision
        picture = vision.prepare(png("purple", "square", seed=5))
        tokens = model.tokenizer.encode(prompt_text(ASK), add_special_tokens=False)
        tokens, key = vision.expand(tokens, [picture])
        request = GenerationRequest(prompt_tokens=tokens, max_tokens=10, images=(picture,), cache_key=key)
        out = asyncio.run(collect(engine, request))
        assert out["text"].startswith("a purple"), out["text"]
        assert out["usage"].lane.startswith("serial")
    finally:
        engine.close(drain_seconds=0)


# -- the dashboard (last: the browser fixture holds an event loop in this thread until the module ends) --
SCREENSHOTS = ROOT / "tests" / "artifacts" / "screenshots"


def test_dashboard_attaches_an_image_and_shows_it_again(page, vision_server, tmp_path):
    picture = tmp_path / "figure.png"
    picture.write_bytes(png("blue", "circle", seed=9))
    page.goto(vision_server.url + "/#/chat")
    page.wait_for_selector(f"text={VISION_REPO}")
    page.set_input_files("input[type=file][aria-label='Attach images']", str(picture))
    page.wait_for_selector(".attachments img")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.fill("textarea[aria-label=Message]", ASK)
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant .perf", timeout=120_000)
    assert page.locator(".msg.user .turn-images img").count() == 1
    assert page.locator(".attachments img").count() == 0  # sent: the composer is empty again
    assert page.inner_text(".msg.assistant .body").strip().startswith("a blue")
    page.screenshot(path=str(SCREENSHOTS / "vision-chat-desktop.png"))
    page.reload()
    page.click(f".sessions button:has-text('{ASK}')")
    page.wait_for_selector(".msg.user .turn-images img")  # stored with the session
    page.set_viewport_size({"width": 375, "height": 740})
    page.screenshot(path=str(SCREENSHOTS / "vision-chat-375.png"))
