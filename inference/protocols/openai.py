"""OpenAI chat and text completions: wire JSON in, engine request out;
engine events in, wire JSON out. Nothing here touches MLX."""
from __future__ import annotations

import asyncio
import codecs
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from core import sse as core_sse
from core.surfaces import OPENAI
from inference.engine.grammar import GrammarSpec
from inference.engine.loader import LoadedModel
from inference.engine.rows import Submission
from inference.engine.types import EventStream, GenerationEvent, GenerationRequest, Usage
from inference.engine.vision import Vision
from inference.protocols import (
    chat,
    harmony,
    images,
    markup,
    params,
    prompt_work,
    structured,
    tool_choice,
    unhonoured,
)
from inference.protocols.errors import RequestError
from inference.protocols.options import Options, ServerDefaults
from inference.protocols.output import Message, OutputParser, Piece, ToolDelta
from inference.protocols.toolcalls import ToolCall, called


@dataclass
class Prepared:
    """A checked request, ready for the engine, and headers for the reply."""

    request: GenerationRequest
    headers: dict = field(default_factory=dict)
    constraint: structured.Constraint | None = None
    output: OutputParser | None = None  # chat only: reasoning and tool calls
    submission: Submission | None = None  # once submitted (the first choice's, with several)
    n: int = 1  # choices asked for (protocols/choices.py)
    grammar_wait_s: float = 0.0  # spent waiting for its grammar to compile (or come from the cache)

    def cached_tokens(self) -> int | None:
        """Prompt tokens the prompt cache served; None before the request is admitted."""
        return self.submission.cached if self.submission is not None else None

    @property
    def chat_output(self) -> OutputParser:
        """The output parser of a chat turn (`prepare_chat` sets it)."""
        if self.output is None:
            raise ValueError("a completion has no output parser")
        return self.output


@dataclass
class _Turn:
    """A chat request read and checked, before its grammar and prompt exist."""

    prepared: Prepared
    spec: object  # the requested GrammarSpec, or None
    messages: list[dict]
    tools: list[dict] | None
    kwargs: dict
    template: str | None  # the client's own chat template
    single_call: bool
    images: list[chat.MediaRef] | None = None  # each image or video part, on a vision model
    think_budget: int | None = None  # the bound on the reasoning block the request asks for (chat.thinking_budget)
    continued: bool = False  # the reply continues the final assistant message (chat.continues)
    chars: int = 0  # characters of the turn's messages, tools and template (chat.check_size)


def _common(body: dict, model: LoadedModel, defaults: ServerDefaults, completion: bool = False) -> GenerationRequest:
    """Every field but the prompt, checked before the (costlier) prompt build."""
    params.choices(body)
    params.boolean(body, "stream")
    adapters = params.adapter(body, model.adapters)
    want_logprobs, top_logprobs = params.logprobs(body, completion)
    request = GenerationRequest(
        prompt_tokens=[],
        max_tokens=params.max_tokens(body, defaults),
        sampling=params.sampling(body, defaults, model.generation_config, model.vocab_size),
        logits=params.logits_params(body, model.vocab_size, defaults),
        stop=params.stop_sequences(body),
        logprobs=want_logprobs,
        top_logprobs=top_logprobs,
        adapters=adapters,
        speculative=params.boolean(body, "speculative", True),
    )
    return params.checked(request, model.vocab_size, model.context_window)


def _read_chat(body: dict, model: LoadedModel, options: Options) -> _Turn:
    unhonoured.refuse(body, unhonoured.CHAT)
    limits = options.limits
    vision = model.vision
    images: list[chat.MediaRef] | None = [] if vision is not None else None
    messages = chat.normalize_messages(body.get("messages"), limits, images, vision.image_token if vision else "")
    continued = chat.continues(body, messages)
    messages = chat.with_verbosity(messages, body.get("verbosity"))
    kwargs, template = chat.template_kwargs(body, limits)
    if options.defaults.thinking is not None and "enable_thinking" not in kwargs:  # --thinking on|off
        kwargs = {**kwargs, "enable_thinking": options.defaults.thinking}
    source = template or getattr(chat.hf_tokenizer(model), "chat_template", None)
    kwargs = chat.with_depth(kwargs, body.get("reasoning_effort"), source if isinstance(source, str) else None)
    tools = chat.tools_for(body)
    chars = chat.check_size(messages, tools, kwargs, template, limits)
    single = not params.boolean(body, "parallel_tool_calls", True)  # at most one tool call per reply
    prepared = Prepared(_common(body, model, options.defaults), n=params.choices(body))
    budget = chat.thinking_budget(body, kwargs)
    if harmony.is_harmony(model.tokenizer):  # its reasoning has a level, not a <think> block to bound
        asked = body.get("reasoning_effort")
        kwargs = {**kwargs, "reasoning_effort": harmony.effort(
            {**kwargs, "reasoning_effort": asked} if asked is not None else kwargs, budget)}
        budget = None
    spec = structured.requested(body, limits)
    if continued:
        _refuse_in_continuation(body, spec, tools)
    return _Turn(prepared, spec, messages, tools, kwargs, template, single, images, budget, continued, chars)


def _refuse_in_continuation(body: dict, spec, tools: list[dict] | None) -> None:
    """What cannot hold for a reply that continues an assistant message
    already begun (continue_final_message): an output format, which
    describes a whole message, and an enforced tool choice, whose grammar
    starts where a reply starts. A guided_* grammar constrains the
    continuation itself, and stays."""
    if isinstance(spec, GrammarSpec) and spec.kind in ("json", "json_schema"):
        field = "response_format" if body.get("response_format") is not None else "structured_outputs"
        raise RequestError(f"{field} describes a whole message, and this reply continues one already begun "
                           "(continue_final_message, or a prefill on /v1/messages): send one or the other", field)
    if tool_choice.forces(body, tools):
        field = "tool_choice" if tool_choice.demands_a_call(body, tools) else "tools"
        raise RequestError(f"{field}: an enforced tool choice (required, a named tool, or a strict tool) constrains "
                           "a reply from its start, and this reply continues one already begun "
                           "(continue_final_message, or a prefill on /v1/messages): send one or the other", field)


async def _resolve(prepared: Prepared, spec, model: LoadedModel, options: Options):
    """structured.resolve, timed into the request's grammar wait."""
    started = time.perf_counter()
    try:
        return await structured.resolve(spec, model.grammar_compiler, options.grammar_enabled, options.limits)
    finally:
        prepared.grammar_wait_s += time.perf_counter() - started


async def _constrain(prepared: Prepared, spec, model: LoadedModel, options: Options) -> None:
    constraint = await _resolve(prepared, spec, model, options)
    prepared.constraint = constraint
    if constraint is None:
        return
    if constraint.compiled is not None:
        prepared.request.grammar = model.grammar_compiler.state(constraint.compiled)
    else:
        prepared.headers["Warning"] = constraint.warning


async def prepare_chat(body: dict, model: LoadedModel, options: Options,
                       room: Callable[[int], None] | None = None) -> Prepared:
    """A chat request ready for the engine. Reading and rendering run off the
    event loop; the grammar compile and a client template's render are
    awaited on it (neither holds a thread while it waits); `options.templates`
    is the TemplateSandbox when client templates are allowed. `room(n)`
    refuses a prompt of `n` tokens the engine would refuse (its window and
    caps): asked once the prompt is built and before any grammar compiles,
    since a compile (500 tools under a required tool_choice, a huge schema)
    can take seconds of a process, and the cheap refusal is due first."""
    turn = await asyncio.to_thread(_read_chat, body, model, options)
    prepared = turn.prepared
    spec, deferred = turn.spec, None
    output_format = isinstance(spec, GrammarSpec) and spec.kind in ("json", "json_schema")
    if output_format and tool_choice.demands_a_call(body, turn.tools):
        # The client asked for a call and sent an output format too (instructor's tool modes do): the call
        # is enforced, and the format is for the message that follows the call's result. Should the call
        # not be enforceable here, the format applies after all. A grammar of the request's own (guided_*)
        # is more precise than the call's and stays.
        spec, deferred = None, spec
    prepared.request.prompt_tokens, think = await _build(turn, turn.messages, model, options)
    if room is not None:
        room(len(prepared.request.prompt_tokens))
    await _constrain(prepared, spec, model, options)
    if prepared.constraint is not None and prepared.constraint.compiled is None:
        # The constraint degrades to an instruction in the system turn: the prompt is built again with it.
        messages = _with_instruction(turn.messages, prepared.constraint.instruction())
        prepared.request.prompt_tokens, think = await _build(turn, messages, model, options)
    prepared.request.continues = turn.continued
    if turn.images and model.vision is not None:
        await asyncio.to_thread(_with_images, prepared.request, turn.images, model.vision)
    markups = markup.markups_for(model.tokenizer)
    enforced = tool_choice.forces(body, turn.tools) and await _enforce_tool_choice(prepared, body, turn.tools,
                                                                                     model, options, think)
    if enforced:
        markups = markups[:1]  # while enforced, only the markup the grammar constrains is read as calls
        if deferred is not None:
            prepared.headers["Warning"] = ("the output format applies to the message after the forced tool call; "
                                           "this reply is the call")
    elif deferred is not None:  # the call could not be enforced (the Warning says why): the format holds
        await _constrain(prepared, deferred, model, options)
    budget = turn.think_budget
    if budget is None and enforced and tool_choice.demands_a_call(body, turn.tools):
        budget = chat.forced_call_budget(prepared.request.max_tokens)  # thinking ends in time for the call
    prepared.request.think = chat.think_bound(model, think, budget)
    # A continuation is the message's text going on: a <think> tag there is text, unless the prefill left a block open.
    reasoning = chat.thinks(model) and (not turn.continued or think == "open")
    prepared.output = OutputParser(in_reasoning=think == "open", reasoning=reasoning, tools=turn.tools,
                                   max_calls=1 if turn.single_call else None, markups=markups,
                                   harmony=harmony.Reader(in_message=turn.continued)
                                   if harmony.is_harmony(model.tokenizer) else None)
    return prepared


async def _build(turn, messages: list[dict], model: LoadedModel, options: Options):
    """The turn's prompt tokens over `messages` (and the think state), through a client template if it brought one."""
    rendered = None
    if turn.template is not None:
        if options.templates is None:
            raise RequestError("client chat templates are not available on this server",
                               "chat_template_kwargs.chat_template")
        variables = {**_special_tokens(model), **turn.kwargs}
        rendered = await options.templates.render(turn.template, messages, turn.tools, variables,
                                                  options.limits.max_prompt_chars, turn.continued)
    chars = turn.chars + len(rendered or "")
    return await prompt_work.run(chars, chat.build_prompt, model, messages, turn.tools, turn.kwargs, rendered,
                                 turn.continued)


async def _enforce_tool_choice(prepared: Prepared, body: dict, tools, model: LoadedModel, options: Options,
                               think: str | None) -> bool:
    """Constrain generation to the tool calls the choice asks for; whether it
    did. A grammar the request brought itself (guided_grammar,
    response_format, …) is the more precise constraint and stays: the choice
    is then only advisory."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in tool_choice.offered_names(tools):
            raise RequestError(f"tool_choice names {name!r}, which is not among the offered tools", "tool_choice")
    if prepared.constraint is not None:
        prepared.headers.setdefault("Warning", "tool_choice not enforced: the request's own grammar constrains "
                                               "the output")
        return False
    spec = tool_choice.spec(body, tools, model, think, options.limits)
    if spec is None:
        prepared.headers["Warning"] = tool_choice.unenforced(model)
        return False
    constraint = await _resolve(prepared, spec, model, options)
    if constraint is None or constraint.compiled is None:
        prepared.headers["Warning"] = (constraint.warning if constraint else None) or tool_choice.unenforced(model)
        return False
    prepared.constraint = constraint
    prepared.request.grammar = model.grammar_compiler.state(constraint.compiled)
    return True


def _with_images(request: GenerationRequest, refs: list[chat.MediaRef], vision: Vision) -> None:
    """Read the turn's images and grow each image mark to the tower's run of tokens."""
    loaded = images.load(refs, vision)
    request.prompt_tokens, request.cache_key = images.expand(request.prompt_tokens, loaded, vision)
    request.images = tuple(loaded)


def _special_tokens(model: LoadedModel) -> dict:
    """What apply_chat_template shows a template besides the turn: bos_token, eos_token, …"""
    tokens = getattr(chat.hf_tokenizer(model), "special_tokens_map", {}) or {}
    return {k: v for k, v in tokens.items() if isinstance(v, str)}


def _with_instruction(messages: list[dict], instruction: str) -> list[dict]:
    """Add an instruction to the system turn (templates often want one, first)."""
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=messages[0]["content"] + "\n\n" + instruction)
        return [first, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]


def _read_completion(body: dict, model: LoadedModel, options: Options):
    unhonoured.refuse(body, unhonoured.COMPLETIONS)
    prompt = body.get("prompt")
    if prompt is None:
        raise RequestError("prompt required", "prompt")
    if not isinstance(prompt, str):
        raise RequestError("prompt must be a string (token arrays are not accepted)", "prompt")
    if not prompt:
        raise RequestError("prompt must not be empty", "prompt")
    chat.check_chars(len(prompt), "prompt", options.limits)
    prepared = Prepared(_common(body, model, options.defaults, completion=True), n=params.choices(body))
    return prepared, structured.requested(body, options.limits), prompt


async def prepare_completion(body: dict, model: LoadedModel, options: Options) -> Prepared:
    prepared, spec, prompt = await asyncio.to_thread(_read_completion, body, model, options)
    await _constrain(prepared, spec, model, options)  # no template: the header is the only notice
    prepared.request.prompt_tokens = await prompt_work.run(len(prompt), model.tokenizer.encode, prompt)
    prepared.request.continues = True  # the text goes on from the prompt's: a first token's leading space is kept
    return prepared


def usage_json(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "lane": usage.lane,
        **({"timings": usage.timings} if usage.timings is not None else {}),
        **({"speculation": usage.speculation} if usage.speculation is not None else {}),
        **({"fill": usage.fill} if usage.fill is not None else {}),
    }


def finish_reason(finish: str | None, calls: list[ToolCall]) -> str | None:
    """`tool_calls` when the model stopped after calls it finished; a cut call leaves the finish as it was."""
    return "tool_calls" if called(calls) and finish == "stop" else finish


STREAM_OPTIONS = ("include_usage", "include_obfuscation")


def usage_apart(body: dict) -> bool:
    """`stream_options.include_usage`: the usage in a chunk of its own, with no
    choices, as OpenAI sends it (without it, the usage rides on the chunk with
    the finish reason). As on OpenAI, stream_options needs `stream: true`;
    `include_obfuscation` may only ask for none (no padding is sent)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise RequestError("stream_options must be an object", "stream_options")
    if not params.boolean(body, "stream"):
        raise RequestError("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                           "stream_options")
    for name in options:
        if name not in STREAM_OPTIONS:
            raise RequestError(f"stream_options.{name} is not a stream option (it takes "
                               f"{' and '.join(STREAM_OPTIONS)})", f"stream_options.{name}")
    if options.get("include_obfuscation") not in (None, False):
        raise RequestError("stream_options.include_obfuscation is not supported: no obfuscation padding is sent "
                           "here", "stream_options.include_obfuscation", code="unsupported_parameter")
    apart = options.get("include_usage", False)
    if not isinstance(apart, bool):
        raise RequestError("stream_options.include_usage must be a boolean", "stream_options.include_usage")
    return apart


class Reply:
    """Ids and timestamps shared by every chunk of one response."""

    def __init__(self, kind: str, model_id: str, body: dict | None = None):
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        self.kind, self.model_id = kind, model_id
        self.id, self.created = prefix + uuid.uuid4().hex[:24], int(time.time())
        self.usage_apart = usage_apart(body or {})
        self._text_at: dict[int, tuple[int, codecs.IncrementalDecoder]] = {}  # a completion choice's offset

    def _envelope(self, obj: str, *choices: dict) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_id,
                "choices": list(choices)}

    def logprobs_block(self, entries: list[dict], index: int = 0) -> dict | None:
        """The `logprobs` of a choice or chunk: chat's `{"content": [...]}`, or a
        completion's legacy columns (with the same `content` list beside them).
        `text_offset` counts the characters of the choice's text before each
        token, over the whole stream: a token's bytes decoded after those
        before it (a token holding part of a character adds nothing until the
        character is whole; a byte that cannot start one is the U+FFFD the text
        shows), not the length of its label (`bytes:\\x83`)."""
        if not entries:
            return None
        if self.kind == "chat":
            return {"content": entries, "refusal": None}
        at, decoder = self._text_at.get(index) or (0, codecs.getincrementaldecoder("utf-8")("replace"))
        offsets = []
        for entry in entries:
            offsets.append(at)
            at += len(decoder.decode(bytes(entry["bytes"])))
        self._text_at[index] = (at, decoder)
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets, "content": entries}

    def choice(self, message: Message, finish: str | None, logprobs: list[dict] | None = None,
               index: int = 0) -> dict:
        block = self.logprobs_block(logprobs or [], index)
        if self.kind != "chat":
            return {"index": index, "text": message.content, "logprobs": block, "finish_reason": finish}
        body: dict = {"role": "assistant",
                      "content": None if message.tool_calls and not message.content.strip() else message.content}
        if message.reasoning:
            body["reasoning"] = message.reasoning
        if message.tool_calls:
            body["tool_calls"] = [c.wire() for c in message.tool_calls]
        return {"index": index, "message": body, "logprobs": block,
                "finish_reason": finish_reason(finish, message.tool_calls)}

    def complete(self, message: Message, finish: str | None, usage: Usage,
                 logprobs: list[dict] | None = None) -> dict:
        return self.answer([self.choice(message, finish, logprobs)], usage)

    def answer(self, choices: list[dict], usage: Usage) -> dict:
        out = self._envelope("chat.completion" if self.kind == "chat" else "text_completion", *choices)
        out["usage"] = usage_json(usage)
        return out

    def chunk(self, delta: dict | None = None, finish: str | None = None, logprobs: list[dict] | None = None,
              index: int = 0) -> dict:
        block = self.logprobs_block(logprobs or [], index)
        if self.kind == "chat":
            choice = {"index": index, "delta": delta or {}, "logprobs": block, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", choice)
        text = (delta or {}).get("content", "")
        return self._envelope("text_completion", {"index": index, "text": text, "logprobs": block,
                                                  "finish_reason": finish})


sse = core_sse.frame
KEEP_ALIVE = core_sse.KEEP_ALIVE


async def collect(events: EventStream,
                  output: OutputParser | None) -> tuple[Message, list[dict], GenerationEvent]:
    """Drain a generation: the message split into channels, the logprobs
    entries (when asked) and the final event."""
    parts, entries = [], []
    async for event in events:
        parts.append(event.text)
        if event.logprobs is not None:
            entries.append(event.logprobs)
        if event.error is not None or event.finish_reason is not None:
            message = Message()
            if output is None:
                message.content = "".join(parts)
            else:
                message.take(output.ordered("".join(parts), finish=True, cut=event.cut), output.calls)
            return message, entries, event
    raise RuntimeError("generation ended without a final event")


def _call_deltas(deltas: list[ToolDelta]) -> list[dict]:
    """`tool_calls` entries, one per call in a chunk: id, type and name on a
    call's first, then pieces of its arguments."""
    out: list[dict] = []
    for delta in deltas:
        if out and out[-1]["index"] == delta.index:  # the same call again in this chunk: one entry
            out[-1]["function"]["arguments"] += delta.arguments
        elif delta.name is not None:
            out.append({"index": delta.index, "id": delta.id, "type": "function",
                        "function": {"name": delta.name, "arguments": delta.arguments}})
        elif delta.arguments:
            out.append({"index": delta.index, "function": {"arguments": delta.arguments}})
    return out


def _deltas(pieces: list[Piece]) -> list[dict]:
    return [{"reasoning" if p.kind == "reasoning" else "content": p.text} for p in pieces if p.text]


async def with_keepalive(events: EventStream, output: OutputParser | None,
                         interval: float, always: bool = False) -> AsyncIterator[GenerationEvent | None]:
    """Events, with None whenever `interval` passes while a tool call buffers
    (or, with `always`, whenever it passes without an event). Only a wait
    that can time out runs the next event's fetch as a task: the rest await
    it in place (a task and a wait per token cost the event loop more than
    the chunk they carry, with many streams on a fast device)."""
    pending: asyncio.Future | None = None
    try:
        while True:
            if always or (output is not None and output.buffering):
                if pending is None:
                    pending = asyncio.ensure_future(events.__anext__())
                done, _ = await asyncio.wait({pending}, timeout=interval)
                if not done:
                    yield None
                    continue
            try:
                event = await pending if pending is not None else await events.__anext__()
            except StopAsyncIteration:
                return
            pending = None
            yield event
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):  # its own cancellation, or the stream's end
                await pending
        await events.aclose()


async def stream(reply: Reply, events: EventStream, output: OutputParser | None = None,
                 keepalive: float = 5.0) -> AsyncIterator[bytes]:
    """SSE frames: the role first (chat), reasoning and content deltas, tool
    calls (their arguments piece by piece as they are generated), a final
    chunk with the finish reason and usage, then [DONE]. A failure mid-stream is sent as an error frame and
    the stream closes. While a tool call buffers, `: keep-alive` comments
    keep client idle timers from firing."""
    async for item in choice_chunks(reply, events, output, keepalive):
        if isinstance(item, bytes):
            yield item
            continue
        if isinstance(item, Ended):  # the last frames in one write
            if reply.usage_apart:
                yield (sse(item.chunk) + sse({**reply.chunk(), "choices": [], "usage": usage_json(item.usage)})
                       + sse("[DONE]"))
            else:
                yield sse({**item.chunk, "usage": usage_json(item.usage)}) + sse("[DONE]")
            return
        yield sse(item)


@dataclass
class Ended:
    """A choice's last chunk (its finish reason) and the generation's usage."""

    chunk: dict
    usage: Usage


async def choice_chunks(reply: Reply, events: EventStream, output: OutputParser | None, keepalive: float,
                        index: int = 0) -> AsyncIterator[dict | bytes | Ended]:
    """One choice's stream: its chunks, `: keep-alive` comments (bytes) while
    a tool call buffers, then `Ended`, or an error event (bytes) and no more."""
    if reply.kind == "chat":
        yield reply.chunk({"role": "assistant", "content": ""}, index=index)
    entries: list[dict] = []  # logprobs not sent yet: each goes with the next chunk out (text held back waits)
    async for event in with_keepalive(events, output, keepalive):
        if event is None:
            yield KEEP_ALIVE
            continue
        if event.error is not None:
            yield OPENAI.stream_error(event.error)
            return
        if event.logprobs is not None:
            entries.append(event.logprobs)
        pieces = ([Piece("content", event.text)] if output is None else output.feed(event.text))
        if event.finish_reason is not None and output is not None:
            pieces += output.finish(cut=event.cut)
        for delta in _deltas(pieces):
            yield reply.chunk(delta, logprobs=entries, index=index)
            entries = []
        calls = _call_deltas(output.take_deltas()) if output is not None else []
        if calls:
            yield reply.chunk({"tool_calls": calls}, logprobs=entries, index=index)
            entries = []
        if event.finish_reason is not None:
            finish = finish_reason(event.finish_reason, output.calls if output else [])
            yield Ended(reply.chunk(finish=finish, logprobs=entries, index=index), event.final_usage)
            return
