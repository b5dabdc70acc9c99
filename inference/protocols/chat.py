"""The chat turn every protocol builds on: messages normalized for chat
templates, tools, the thinking switch, and the rendered prompt.

A turn is bounded before it is rendered: at most `max_messages` messages
and `max_prompt_chars` characters of text, tool schemas and template
variables together (core/limits.py). A client's own chat template
(`chat_template_kwargs.chat_template`) is refused unless the operator
allowed them; `template_sandbox` renders those."""
from __future__ import annotations

import functools
import json
from typing import NamedTuple

from core.limits import Limits
from inference.engine.loader import LoadedModel
from inference.engine.think import ThinkBound
from inference.protocols import harmony, params
from inference.protocols.errors import RequestError
from inference.protocols.output import THINK_CLOSE, THINK_OPEN

ROLES = {"system", "developer", "user", "assistant", "tool"}
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
TOOL_CHOICES = ("none", "auto", "required")


IMAGE_PARTS = ("image_url", "image", "input_image")
VIDEO_PARTS = ("video_url", "video")
AUDIO_PARTS = ("input_audio", "audio", "audio_url")  # chat completions transcribes them (serving/routes/audio.py)
VIDEO_FRAMES = 8  # the stills a video part is sampled into, spread evenly over the clip


def media_in_user_messages(messages) -> None:
    """OpenAI's rule for a chat body as its client sent it: image, video and
    audio parts belong in user messages (a system, developer, assistant or
    tool message's content is text); one elsewhere is a 400 naming the part.
    The other protocols keep their own rules, checked where they are read
    (their tool results may hold images, and arrive here as tool messages)."""
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(role, str) or role not in ROLES or role == "user" or \
                not isinstance(message.get("content"), list):
            continue  # a role that is not one is normalize_messages' to refuse
        for j, part in enumerate(message["content"]):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in IMAGE_PARTS + VIDEO_PARTS + AUDIO_PARTS:
                what = "image" if kind in IMAGE_PARTS else "video" if kind in VIDEO_PARTS else "audio"
                at = f"messages[{i}].content[{j}]"
                raise RequestError(f"{at}: {what} parts are only allowed in user messages, and messages[{i}] is "
                                   f"{'an' if role == 'assistant' else 'a'} {role} message", at)


class MediaRef(NamedTuple):
    """An image or video part of a turn: its url (http(s) or data:) and field path."""
    url: str
    at: str
    video: bool = False


def text_of(content, where: str, images: list | None = None, marker: str = "", refusals: bool = False) -> str:
    """Message content as one string: a string, null, or a list of parts.
    With `images` (a vision model), each image part becomes `marker` in the
    text and a `MediaRef` (its url, its field path) is appended to `images`;
    a video part becomes one marker per frame it is sampled into
    (`VIDEO_FRAMES`) and one `MediaRef` marked `video`. Without, an image
    or video part is refused naming its path. With `refusals` (an
    assistant's content, as OpenAI allows), a refusal part is the text the
    assistant said; elsewhere it is refused."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of content parts", where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        marked = part.get("_at") if isinstance(part, dict) else None
        at = marked if isinstance(marked, str) else f"{where}.content[{i}]"
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal":
            if not refusals:
                raise RequestError(f"{at}: refusal parts are only allowed in assistant messages", at)
            if not isinstance(part.get("refusal"), str):
                raise RequestError(f"{at}.refusal must be a string", f"{at}.refusal")
            texts.append(part["refusal"])
        elif kind in IMAGE_PARTS:
            if images is None:
                raise RequestError("model has no vision sidecar", at)
            images.append(MediaRef(image_url(part, at), at))
            texts.append(marker)
        elif kind in VIDEO_PARTS:
            if images is None:
                raise RequestError("video input needs a vision model: this model has no vision sidecar", at)
            images.append(MediaRef(video_url(part, at), at, video=True))
            texts.append(marker * VIDEO_FRAMES)
        elif kind in AUDIO_PARTS:  # chat completions transcribes them before this
            raise RequestError("audio parts are taken by /v1/chat/completions, where the Whisper model transcribes "
                               "them (no chat model here has an audio tower); send text here", at)
        else:
            raise RequestError(f"{at} is not a text part", at)
    return "".join(texts)


def image_url(part: dict, where: str) -> str:
    """The url (http(s) or data:) an image part points at: `image_url` as an
    object with `url` or as a string, or (the `image` alias) `url`, or
    base64 bytes in `data` / `image`."""
    ref = part.get("image_url")
    _detail(ref.get("detail") if isinstance(ref, dict) else None, f"{where}.image_url.detail")
    _detail(part.get("detail"), f"{where}.detail")  # Responses' input_image
    if isinstance(ref, dict):
        ref = ref.get("url")
    if ref is None:
        ref = part.get("url")
    if ref is None:
        raw = part.get("data", part.get("image"))
        if isinstance(raw, str) and raw:
            ref = raw if raw.startswith(("data:", "http://", "https://")) else "data:image/*;base64," + raw
    if not isinstance(ref, str) or not ref:
        if part.get("file_id") is not None:
            raise RequestError("image file ids are not supported; send the image as a data: URL or an http(s) "
                               "URL", where)
        raise RequestError(f"{where} needs an image: image_url.url (an http(s) or data: URL)", where)
    return ref


DETAILS = ("auto", "low", "high", "original")


def _detail(value, where: str) -> None:
    """OpenAI's `detail`: any of its values is taken, and sizes nothing (the
    model's image processor gives every picture the tower's one size)."""
    if value is not None and value not in DETAILS:
        raise RequestError(f"{where} must be one of {', '.join(DETAILS)}", where)


def video_url(part: dict, where: str) -> str:
    """The url (http(s) or data:) a video part points at: `video_url` as an
    object with `url` or as a string, or (the `video` alias) `url` or base64
    bytes in `data`."""
    ref = part.get("video_url")
    if isinstance(ref, dict):
        ref = ref.get("url")
    if ref is None:
        ref = part.get("url")
    if ref is None:
        raw = part.get("data")
        if isinstance(raw, str) and raw:
            ref = raw if raw.startswith(("data:", "http://", "https://")) else "data:video/*;base64," + raw
    if not isinstance(ref, str) or not ref:
        raise RequestError(f"{where} needs a clip: video_url.url (an http(s) or data: URL)", where)
    return ref


def keep_media(content, where: str, field: str = "content", refusals: bool = False):
    """Content for a converted protocol: a string when it has no image part,
    else the parts, each image part marked with its field path (`_at`, the
    part's index in `where`.`field`) so a refusal later names the client's
    own field. `refusals` as for `text_of`."""
    if not isinstance(content, list) or not any(
            isinstance(p, dict) and p.get("type") in IMAGE_PARTS + VIDEO_PARTS for p in content):
        return text_of(content, where, refusals=refusals)
    return [{**p, "_at": f"{where}.{field}[{i}]"} if isinstance(p, dict) and p.get("type") in IMAGE_PARTS +
            VIDEO_PARTS else p for i, p in enumerate(content)]


def _template_tool_calls(calls, where: str) -> list[dict]:
    """Assistant tool calls with `arguments` decoded: templates expect a mapping."""
    if not isinstance(calls, list):
        raise RequestError(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"{where}.tool_calls[{i}].function.name required", f"{where}.tool_calls[{i}]")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass  # left as the string the client sent
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


VERBOSITY = {"low": "Keep your answer short: say only what is needed.",
             "high": "Give a thorough, detailed answer."}


def with_verbosity(messages: list[dict], level, param: str = "verbosity") -> list[dict]:
    """OpenAI's `verbosity` (Responses: `text.verbosity`) as the model can
    take it: low and high add a line to the system turn (a new first turn
    when there is none), medium (the default) adds nothing."""
    if level is None or level == "medium":
        return messages
    if level not in VERBOSITY:
        raise RequestError(f"{param} must be low, medium or high", param)
    note = VERBOSITY[level]
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{note}"}, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


def normalize_messages(messages, limits: Limits, images: list | None = None, marker: str = "") -> list[dict]:
    """Messages checked and flattened for the template; `images` and `marker`
    as for `text_of`."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages required", "messages")
    most = limits.max_messages
    if len(messages) > most:
        raise RequestError(f"the conversation has {len(messages)} messages; this server takes at most {most} "
                           "(--max-messages)", "messages", code="too_many_messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(sorted(ROLES))}", f"{where}.role")
        msg = dict(m)
        msg["role"] = "system" if m["role"] == "developer" else m["role"]
        if m["role"] == "user" and m.get("content") is None:  # only an assistant's may be absent (tool calls)
            raise RequestError(f"{where}.content is required for a user message", f"{where}.content")
        if m["role"] == "tool" and not (isinstance(m.get("tool_call_id"), str) and m["tool_call_id"]):
            raise RequestError(f"{where}.tool_call_id required: the id of the assistant's tool call this message "
                               "answers", f"{where}.tool_call_id")
        msg["content"] = text_of(m.get("content"), where, images, marker, refusals=m["role"] == "assistant")
        if m["role"] == "assistant":
            refusal = m.get("refusal")  # a reply's refusal, sent back as it came: what the assistant said
            if refusal is not None and not isinstance(refusal, str):
                raise RequestError(f"{where}.refusal must be a string", f"{where}.refusal")
            if refusal and not msg["content"]:
                msg["content"] = refusal
            # `reasoning` is an alias; an explicit reasoning_content wins, even empty.
            if "reasoning_content" not in m and isinstance(m.get("reasoning"), str):
                msg["reasoning_content"] = m["reasoning"]
            if m.get("tool_calls"):
                msg["tool_calls"] = _template_tool_calls(m["tool_calls"], where)
        out.append(msg)
    return out


def continues(body: dict, messages: list[dict]) -> bool:
    """`continue_final_message` (vLLM's field; a Messages request that ends
    with an assistant message arrives with it): the reply goes on from the
    final assistant message's text, left open, instead of starting a turn of
    its own, and holds only what comes after that text. `messages` are the
    request's own, normalized (before anything is added to them)."""
    if not params.boolean(body, "continue_final_message"):
        return False
    where = f"messages[{len(messages) - 1}]"
    last = messages[-1]
    if last["role"] != "assistant":
        raise RequestError("continue_final_message needs the final message to be an assistant message; "
                           f"{where} is a {last['role']} message", "continue_final_message")
    if last.get("tool_calls"):
        raise RequestError(f"{where} has tool_calls: a reply cannot continue a tool call (send its result "
                           "in a tool message)", f"{where}.tool_calls")
    if not last["content"]:
        raise RequestError(f"{where}.content is empty: continue_final_message has no text to continue",
                           f"{where}.content")
    return True


def tools_for(body: dict) -> list[dict] | None:
    """The request's function tools, or None when absent or tool_choice is "none".
    A choice that asks for a call ("required", a named function) needs tools;
    how it is enforced is tool_choice.py's."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice is not None and not (choice in TOOL_CHOICES or (
            isinstance(choice, dict) and choice.get("type") == "function")):
        raise RequestError("tool_choice must be 'none', 'auto', 'required' or "
                           "{\"type\": \"function\", \"function\": {\"name\": …}}", "tool_choice")
    if tools is None or tools == []:
        if choice == "required" or isinstance(choice, dict):
            raise RequestError("tool_choice asks for a tool call, but the request offers no function tools to "
                               "call (a built-in or server tool is not one this server runs)", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of function tools", "tools")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": …}}}}",
                               f"tools[{i}]")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object",
                               f"tools[{i}].function.parameters")
        if fn["name"] in seen:  # a call names its tool: two of one name could not be told apart
            raise RequestError(f"tools offer {fn['name']!r} twice: tool names must be unique", "tools")
        seen.add(fn["name"])
    return None if choice == "none" else tools


# apply_chat_template's own parameters: as template variables they would change how it runs, not what it renders.
RESERVED_KWARGS = ("conversation", "tools", "tokenize", "add_generation_prompt", "return_dict", "return_tensors",
                   "padding", "truncation", "max_length", "return_assistant_tokens_mask", "tokenizer_kwargs",
                   "processor_kwargs", "messages", "continue_final_message")


def template_kwargs(body: dict, limits: Limits) -> tuple[dict, str | None]:
    """chat_template_kwargs, with reasoning_effort mapped onto enable_thinking
    unless the client set enable_thinking itself; and the client's own chat
    template, when it sent one and the operator allows them."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
    for name in RESERVED_KWARGS:
        if name in kwargs:
            where = f"chat_template_kwargs.{name}"
            hint = " (send continue_final_message in the request body)" if name == "continue_final_message" else ""
            raise RequestError(f"{where} is not a template variable{hint}", where)
    template = kwargs.get("chat_template")
    if template is not None:
        where = "chat_template_kwargs.chat_template"
        if not limits.allow_client_templates:
            raise RequestError("this server renders prompts with the model's own chat template; client templates are "
                               "off (start it with --allow-client-templates to allow them)", where)
        if not isinstance(template, str) or not template.strip():
            raise RequestError(f"{where} must be a non-empty string", where)
        kwargs = {k: v for k, v in kwargs.items() if k != "chat_template"}
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise RequestError("reasoning_effort must be one of "
                               + ", ".join(f"'{e}'" for e in REASONING_EFFORTS), "reasoning_effort")
        if "enable_thinking" not in kwargs:
            kwargs = {**kwargs, "enable_thinking": effort != "none"}
    return kwargs, template


# Template variables that set how deeply a model reasons, and the level each
# reasoning_effort maps to (a template that knows no `xhigh` gets `high`).
DEPTH_VARIABLES = ("reasoning_effort", "reasoning_depth")
DEPTHS = {"minimal": "low", "low": "low", "medium": "medium", "high": "xhigh", "xhigh": "xhigh"}


def with_depth(kwargs: dict, effort, source: str | None) -> dict:
    """`kwargs` with reasoning_effort's level in the template's reasoning-depth
    variable, when the template (`source`) reads one and the client did not set it."""
    if effort not in DEPTHS or not source:
        return kwargs
    read = template_variables(source)
    for name in DEPTH_VARIABLES:
        if name in read and name not in kwargs:
            level = DEPTHS[effort]
            return {**kwargs, name: level if level != "xhigh" or "xhigh" in source else "high"}
    return kwargs


@functools.lru_cache(maxsize=32)
def template_variables(source: str) -> frozenset:
    """The variables a chat template reads (empty for one that does not parse)."""
    import jinja2
    from jinja2 import meta

    try:
        return frozenset(meta.find_undeclared_variables(jinja2.Environment().parse(source)))
    except jinja2.TemplateError:
        return frozenset()


def check_size(messages: list[dict], tools: list[dict] | None, kwargs: dict, template: str | None,
               limits: Limits) -> int:
    """Refuse a turn over `max_prompt_chars` before anything renders or
    tokenizes it; its characters, when it is not."""
    chars = len(template or "")
    for m in messages:
        chars += len(m["content"])
        if isinstance(m.get("reasoning_content"), str):
            chars += len(m["reasoning_content"])
        if m.get("tool_calls"):
            chars += len(json.dumps(m["tool_calls"], ensure_ascii=False))
    if tools:
        chars += len(json.dumps(tools, ensure_ascii=False))
    if kwargs:
        chars += len(json.dumps(kwargs, ensure_ascii=False))
    check_chars(chars, "messages", limits)
    return chars


def check_chars(chars: int, param: str, limits: Limits, what: str = "the prompt") -> None:
    """Refuse `chars` characters of input over `max_prompt_chars`, naming `param`."""
    most = limits.max_prompt_chars
    if chars > most:
        raise RequestError(f"{what} is {chars} characters; this server takes at most {most} "
                           "(--max-prompt-chars)", param, code="prompt_too_large")


def thinks(model: LoadedModel) -> bool:
    """Whether the model has a <think> channel worth parsing."""
    return _thinks(model.tokenizer)


@functools.cache
def _thinks(tokenizer) -> bool:  # once per loaded tokenizer: get_vocab() builds a dict
    template = getattr(tokenizer, "chat_template", None) or ""
    return THINK_OPEN in template or THINK_OPEN in tokenizer.get_vocab() or harmony.is_harmony(tokenizer)


def hf_tokenizer(model: LoadedModel):
    # The Hugging Face tokenizer itself: mlx-lm's wrapper sets enable_thinking
    # for every tokenizer with think tokens, overriding the template's default.
    return getattr(model.tokenizer, "_tokenizer", model.tokenizer)


def build_prompt(model: LoadedModel, messages: list[dict], tools: list[dict] | None,
                 kwargs: dict, rendered: str | None = None, continued: bool = False) -> tuple[list[int], str | None]:
    """Prompt tokens, and how the prompt leaves the model's <think> channel:
    `open` (generation starts inside it), `closed` (the template wrote an
    empty block: thinking is off) or None (the model may open one itself).
    `rendered` is the text a client's template produced (template_sandbox).
    `continued` (`continues`): the prompt ends inside the final assistant
    message, with no generation prompt after it; the reply is that message's
    text going on, so the channel is `open` only when that text left a
    <think> block open, and `closed` otherwise."""
    tokenizer = hf_tokenizer(model)
    if rendered is None and harmony.is_harmony(tokenizer):  # gpt-oss: its format, written here (harmony.py)
        level = kwargs.get("reasoning_effort")
        text = harmony.render(messages, tools, level if level in harmony.EFFORTS else harmony.effort(kwargs),
                              continued=continued)
        return tokenizer.encode(text, add_special_tokens=False), None
    if rendered is None and not getattr(tokenizer, "chat_template", None):
        raise RequestError("prompt build failed: this model has no chat template; use /v1/completions")
    try:
        text = rendered if rendered is not None else tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=not continued,
            continue_final_message=continued, **kwargs)
        tokens = tokenizer.encode(text, add_special_tokens=False)
    except Exception as exc:  # jinja errors, raise_exception() in templates
        raise RequestError(f"prompt build failed: {exc}") from None
    if text.rfind(THINK_OPEN) > text.rfind(THINK_CLOSE):
        return tokens, "open"
    return tokens, "closed" if continued or text.rstrip().endswith(THINK_CLOSE) else None


# The most tokens a reasoning block may hold before a forced tool call (`tool_choice` required or
# named) when the request sets no budget: half of max_tokens, at most this many.
FORCED_CALL_THINK_TOKENS = 512


def thinking_budget(body: dict, kwargs: dict) -> int | None:
    """The reasoning block's bound the request asks for: `thinking_budget`
    (Hearth's field; the Messages API's `thinking.budget_tokens` arrives as
    it), or 0 when the client switched thinking off (`enable_thinking`
    false, `reasoning_effort: none`), which a template that opens the block
    regardless does not hear; None: no bound."""
    if kwargs.get("enable_thinking") is False:
        return 0
    value = body.get("thinking_budget")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise RequestError("thinking_budget must be a whole number of tokens, 0 or more", "thinking_budget")
    return value


def forced_call_budget(max_tokens: int | None) -> int:
    """The bound on thinking before a forced tool call, so the call always has room."""
    return FORCED_CALL_THINK_TOKENS if max_tokens is None else min(FORCED_CALL_THINK_TOKENS, max_tokens // 2)


def think_bound(model: LoadedModel, think: str | None, budget: int | None) -> ThinkBound | None:
    """The bound for a prompt that leaves the think channel `think`
    (build_prompt): none where there is no budget, no channel, or a block
    the template already closed."""
    if budget is None or think == "closed" or not thinks(model) or harmony.is_harmony(model.tokenizer):
        return None  # harmony has no <think> block: its budget set the reasoning effort instead
    tokenizer = hf_tokenizer(model)
    close = tuple(tokenizer.encode(THINK_CLOSE, add_special_tokens=False))
    return ThinkBound(budget, close, lambda token: tokenizer.decode([token]), THINK_CLOSE, THINK_OPEN,
                      inside=think == "open")
