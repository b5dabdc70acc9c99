"""Images on a vision model as SDK clients send them, in-process: the
shapes each protocol carries an image in (a tool's output included),
pictures that must be refused before they cost the server its memory, and
refusals that say why. The model is the pipeline's llava (tests/protocols/conftest.py)."""
from __future__ import annotations

import base64
import io
import struct
import zlib

import anthropic
import openai
import pytest
from PIL import Image

TEXT = {"type": "text", "text": "What colour?"}


def png(colour: str = "red", size: tuple[int, int] = (40, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def grey_png(width: int, height: int) -> bytes:
    """A grey PNG of any shape, written row by row (Pillow would hold it all)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = zlib.compress((b"\0" + b"\x80" * width) * height, 9)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", rows) + chunk(b"IEND", b""))


def data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def app(served, vision_model):
    return served("--no-worker", model=vision_model)


def _chat(app, image: bytes):
    return app.openai().chat.completions.create(model="m", max_tokens=2, temperature=0, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}}, TEXT]}])


def test_a_thin_picture_is_refused_before_the_processor_enlarges_it(app):
    """The image processor scales the shortest edge up to its size (32 here):
    1 x 40,000 pixels would become 32 x 1,280,000 floats in each channel,
    and a 4 x 4,000,000 PNG of 30 kB some 12 GB of them."""
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(app, grey_png(1, 40_000))
    error = refused.value.body
    assert error["param"] == "messages[0].content[0]", error
    assert error["message"].startswith("prompt build failed: image url rejected: messages[0].content[0]: the image "
                                       "is 1x40000 pixels")
    assert "crop it closer to a square" in error["message"]
    assert _chat(app, grey_png(1, 400)).usage.prompt_tokens > 16  # a thin picture within the bound is taken


@pytest.mark.parametrize("image, reason", [
    (b"", "not a readable image: the image is empty"),
    (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "not a readable image: not a format Pillow reads"),
])
def test_an_unreadable_image_says_why_in_words(app, image, reason):
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(app, image)
    formats = " (PNG, JPEG, WebP, GIF, BMP, TIFF)" if image else ""
    assert refused.value.body["message"] == \
        f"prompt build failed: image url rejected: messages[0].content[0]: {reason}{formats}"


def test_a_function_call_output_may_hold_an_image(app):
    """Responses: `function_call_output.output` as a list of input_text and
    input_image parts (a screenshot a tool took) puts the picture in the prompt."""
    client = app.openai()

    def after_call(output):
        return client.responses.create(model="m", max_output_tokens=2, temperature=0, input=[
            {"role": "user", "content": "Take a screenshot."},
            {"type": "function_call", "call_id": "call_1", "name": "screenshot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": output}])

    text = after_call([{"type": "input_text", "text": "done"}])
    shot = after_call([{"type": "input_text", "text": "done"}, {"type": "input_image", "image_url": data_url(png())}])
    assert shot.usage.input_tokens > text.usage.input_tokens + 8  # the image's run of tokens
    with pytest.raises(openai.BadRequestError) as refused:
        after_call([{"type": "input_image", "image_url": data_url(b"not an image")}])
    assert refused.value.body["param"] == "input[2].output[0]"
    assert refused.value.body["message"].startswith("prompt build failed: image url rejected:")


def test_an_anthropic_image_needs_an_image_media_type(app):
    client = app.anthropic()

    def ask(source: dict):
        return client.messages.create(model="m", max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "image", "source": source}, TEXT]}])

    data = base64.b64encode(png()).decode()
    assert ask({"type": "base64", "media_type": "image/png", "data": data}).usage.output_tokens >= 1
    for media_type in ("text/plain", None):
        source = {"type": "base64", "data": data} | ({"media_type": media_type} if media_type else {})
        with pytest.raises(anthropic.BadRequestError) as refused:
            ask(source)
        error = refused.value.body["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("messages[0].content[0].source.media_type must name an image type")


def test_an_anthropic_refusal_names_the_block(app):
    """Anthropic's error shape has no `param`: the message names the block,
    here the second picture of a tool_result two turns back."""
    good = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": base64.b64encode(png()).decode()}}
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                       "data": base64.b64encode(b"not a picture").decode()}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        app.anthropic().messages.create(model="m", max_tokens=2, messages=[
            {"role": "user", "content": [good, TEXT]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [good, bad]}]}])
    assert refused.value.body["error"]["message"].startswith(
        "prompt build failed: image url rejected: messages[2].content[0].content[1]: not a readable image")


def test_detail_takes_openai_values_only(app):
    """`detail` sizes nothing here (the tower has one size), so any of
    OpenAI's values is taken and another is a 400 naming it."""
    client, url = app.openai(), data_url(png())
    for detail in ("auto", "low", "high", "original"):
        assert client.chat.completions.create(model="m", max_tokens=1, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url, "detail": detail}}, TEXT]}]).usage.prompt_tokens > 16
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", max_tokens=1, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url, "detail": "ultra"}}, TEXT]}])
    assert refused.value.body["param"] == "messages[0].content[0].image_url.detail"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="m", max_output_tokens=1, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": url, "detail": "ultra"}]}])
    assert refused.value.body["param"] == "input[0].content[0].detail"


def test_responses_refusals_of_media_say_what_is_true(app):
    """On a vision model an image in a developer item is refused for what
    it is (instructions are text), not as "model has no vision sidecar";
    an audio part says where audio is taken."""
    client, url = app.openai(), data_url(png())
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="m", max_output_tokens=1, input=[
            {"role": "developer", "content": [{"type": "input_image", "image_url": url, "detail": "auto"}]},
            {"role": "user", "content": "What colour?"}])
    assert refused.value.body["param"] == "input[0].content[0]"
    assert "instructions, which are text: send images in a user item" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="m", max_output_tokens=1, input=[{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}])
    assert refused.value.body["message"].startswith("audio parts are taken by /v1/chat/completions")


def test_an_image_outside_a_user_message_is_refused_where_it_is(app):
    """As OpenAI and Anthropic have it, on a model that could see it: image
    parts go in user messages (Anthropic's and Responses' tool results too),
    a system, developer, assistant or tool message's is a 400 naming it."""
    client, url = app.openai(), data_url(png())
    image = {"type": "image_url", "image_url": {"url": url}}
    for role in ("system", "developer", "assistant"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="m", max_tokens=1, messages=[
                {"role": role, "content": [TEXT, image]}, {"role": "user", "content": "What colour?"}])
        error = refused.value.body
        assert error["param"] == "messages[0].content[1]", error
        article = "an" if role == "assistant" else "a"
        assert error["message"] == ("messages[0].content[1]: image parts are only allowed in user messages, and "
                                    f"messages[0] is {article} {role} message")
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", max_tokens=1, messages=[
            {"role": "user", "content": "Take a screenshot."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": [image]}])
    assert refused.value.body["param"] == "messages[2].content[0]"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="m", max_output_tokens=1, input=[
            {"role": "user", "content": "Draw."},
            {"role": "assistant", "content": [{"type": "input_image", "image_url": url, "detail": "auto"}]},
            {"role": "user", "content": "What colour?"}])
    assert refused.value.body["param"] == "input[1].content[0]"
    assert "images are only allowed in user items" in refused.value.body["message"]
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png()).decode()}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        app.anthropic().messages.create(model="m", max_tokens=1, messages=[
            {"role": "user", "content": "Draw."}, {"role": "assistant", "content": [block]},
            {"role": "user", "content": "What colour?"}])
    assert refused.value.body["error"]["message"] == (
        "messages[1].content[0]: image blocks are only allowed in user messages (and inside a tool_result block), "
        "and messages[1] is an assistant message")
    # In a user message each is taken.
    assert client.chat.completions.create(model="m", max_tokens=1, messages=[
        {"role": "system", "content": [TEXT]}, {"role": "user", "content": [TEXT, image]}]).usage.prompt_tokens > 16
