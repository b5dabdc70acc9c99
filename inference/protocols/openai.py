"""OpenAI chat and text completions, the request: wire JSON in, engine
request out. The reply is rendered by `openai_reply.py`. Nothing here
touches MLX."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inference.engine.grammar import GrammarSpec
from inference.engine.loader import LoadedModel
from inference.engine.rows import Submission
from inference.engine.types import GenerationRequest
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
from inference.protocols.output import OutputParser


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


async def prepare_completion(body: dict, model: LoadedModel, options: Options,
                             room: Callable[[int], None] | None = None) -> Prepared:
    """A raw-prompt completion ready for the engine; `room(n)` as for
    `prepare_chat`: the prompt is tokenized and its length checked before
    its grammar compiles."""
    prepared, spec, prompt = await asyncio.to_thread(_read_completion, body, model, options)
    prepared.request.prompt_tokens = await prompt_work.run(len(prompt), model.tokenizer.encode, prompt)
    if room is not None:
        room(len(prepared.request.prompt_tokens))
    await _constrain(prepared, spec, model, options)  # no template: the header is the only notice
    prepared.request.continues = True  # the text goes on from the prompt's: a first token's leading space is kept
    return prepared
