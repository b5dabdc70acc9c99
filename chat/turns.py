"""A chat turn as the OpenAI route would build it: one request body from
the session's settings, read by the same code as /v1/chat/completions."""
from __future__ import annotations

from chat import store
from chat.models import ChatSession


def body(session: ChatSession, messages: list[dict], next_turn: dict, tools: list[dict] | None = None) -> dict:
    out: dict = {"messages": messages}
    if tools:
        out["tools"] = tools
    sampling = {**store.stored_sampling(session), **next_turn}
    out.update({k: v for k, v in sampling.items() if v is not None})
    out["chat_template_kwargs"] = {"enable_thinking": bool(session.thinking)}
    if session.adapter:
        out["adapter"] = session.adapter
    return out


def sampling_problem(values: dict, model, defaults) -> str | None:
    """Why the engine could not run these sampling values on `model`, or None:
    the same checks a /v1 request gets, so nothing unrunnable is ever saved."""
    from inference.engine.types import GenerationRequest
    from inference.protocols import params
    from inference.protocols.errors import RequestError
    body = {k: v for k, v in values.items() if v is not None}
    try:
        request = GenerationRequest(prompt_tokens=[], logits=params.logits_params(body, model.vocab_size, defaults),
                                    sampling=params.sampling(body, defaults, model.generation_config,
                                                             model.vocab_size))
        params.checked(request, model.vocab_size, model.context_window)
    except RequestError as exc:
        return exc.message
    return None


async def prepare(session: ChatSession, messages: list[dict], next_turn: dict, model, options,
                  tools: list[dict] | None = None):
    from inference.protocols.openai import prepare_chat

    prepared = await prepare_chat(body(session, messages, next_turn, tools), model, options)
    prepared.chat_output.undeclared = True  # the tool loop answers a call to a tool it lacks (toolloop._run_call)
    return prepared
