"""The request bodies of the `/v1` routes as django-ninja Schemas, so the
OpenAPI document (`/v1/openapi.json`, `/v1/docs`) describes every route with
its body.

The protocol bodies (chat, completions, Messages, Responses, embeddings,
transcription) document; they do not validate. Each of those routes reads
its raw body with the protocol's own checks (`inference/protocols`), which
are shared with the paths that reach them without a route (the chat
socket, the router's count of a request, transcription's form fields) and
whose messages and `param` fields follow what OpenAI and Anthropic answer;
those schemas allow fields they do not list, and types stay loose where the
protocol takes several shapes. `AdapterMount`, a body of Hearth's own,
validates: ninja refuses it before the route runs, naming the field."""
from __future__ import annotations

from typing import Any, TypeVar

from ninja import Schema
from pydantic import ConfigDict, Field, create_model

from inference.protocols import params

Json = Any  # a value the protocol module checks itself


class _Body(Schema):
    model_config = ConfigDict(extra="allow")


_S = TypeVar("_S", bound=_Body)


def _numbers(fields: tuple[params.NumberField, ...]):
    """A class decorator: the schema with a field per `fields` entry (type,
    range and description); absent, each is null."""
    def with_fields(schema: type[_S]) -> type[_S]:
        defined: dict[str, Any] = {f.name: (f.kind | None, Field(None, description=_described(f))) for f in fields}
        return create_model(schema.__name__, __base__=schema, __module__=schema.__module__,
                            __doc__=schema.__doc__, **defined)
    return with_fields


def _described(field: params.NumberField) -> str:
    """The field's description with its range."""
    def shown(value: float) -> str:
        return str(int(value)) if field.kind is int else f"{value:g}"

    if field.minimum is None:
        return field.description
    if field.maximum is None:
        return f"{field.description}; at least {shown(field.minimum)}"
    return f"{field.description}; {shown(field.minimum)} to {shown(field.maximum)}"


@_numbers(params.FIELDS)
class Sampling(_Body):
    """The sampling fields every surface reads (`params.FIELDS`, in its
    order; see docs/serving/limits.md for their ranges)."""


class Hlg(_Body):
    """HLG tone-curve sampling; every field falls back to `--hlg-sampling`,
    then to the value shown."""

    enabled: bool | None = Field(None, description="sent at all, the curve is on unless this is false")
    width: float | None = Field(None, description="logits below the top drawn together as near-ties (4)")
    shoulder: float | None = Field(None, description="softness of the knee under the plateau (4; 0 = hard)")
    toe: float | None = Field(None, description="logits over which the tail below the pivot steepens (6; 0 = off)")
    pivot_offset: float | None = Field(None, description="where the toe starts, below the top (6)")


class ToneCurve(_Body):
    hlg: Hlg | None = Field(None, description="HLG tone-curve sampling, merged over the server's defaults")


class Routing(_Body):
    """Which cached prefix and which LoRA adapters a generation uses."""

    session_id: str | None = Field(None, description="prompt-cache session affinity")
    prompt_cache_key: str | None = None
    adapter: str | None = Field(None, description="mounted LoRA ids joined by '+', or 'none'")


class LogitBias(_Body):
    logit_bias: dict[str, float] | None = Field(None, description="token id -> bias, -100 to 100")


class Template(_Body):
    chat_template_kwargs: dict[str, Json] | None = Field(None, description="passed to the chat template "
                                                                           "(enable_thinking, ...)")


class Decoding(_Body):
    speculative: bool | None = Field(None, description="false: no speculative decoding or jump-forward for this "
                                                        "request")


class Guided(_Body):
    """Grammar-constrained output (xgrammar) by the request's own grammar."""

    guided_grammar: str | None = Field(None, description="an EBNF grammar")
    guided_regex: str | None = None
    guided_choice: list[str] | None = None


class Constraint(Guided):
    """Grammar-constrained output (xgrammar); precedence: guided_grammar, response_format, structured_outputs,
    guided_regex, guided_choice."""

    response_format: dict[str, Json] | None = Field(None, description="text, json_object or json_schema")
    structured_outputs: Json = None


class ChatCompletionRequest(Sampling, ToneCurve, LogitBias, Routing, Constraint, Decoding):
    messages: list[dict[str, Json]] = Field(..., description="system, developer, user, assistant and tool turns")
    model: str | None = Field(None, description="the served model answers whatever this names")
    stream: bool | None = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = Field(None, description="wins over max_tokens")
    stop: str | list[str] | None = Field(None, description="up to 4 strings")
    tools: list[dict[str, Json]] | None = None
    tool_choice: str | dict[str, Json] | None = Field(None, description="none, auto, required or a function")
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, description="at most 11")
    n: int | None = Field(None, description="choices, 1 to 8: each a row of the batch")
    chat_template_kwargs: dict[str, Json] | None = None
    reasoning_effort: str | None = Field(None, description="none turns thinking off, any other level on")
    verbosity: str | None = Field(None, description="low or high adds a line to the system turn; medium nothing")
    thinking_budget: int | None = Field(None, description="tokens of thinking before the block is closed")
    stream_options: dict[str, Json] | None = None
    continue_final_message: bool | None = Field(None, description="the reply continues the final assistant "
                                                "message's text instead of starting a turn (vLLM's field)")


class CompletionRequest(Sampling, ToneCurve, LogitBias, Routing, Constraint, Decoding):
    prompt: str = Field(..., description="the raw prompt (no chat template)")
    model: str | None = None
    stream: bool | None = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    logprobs: bool | int | None = Field(None, description="true, or the legacy count of top tokens (0 to 11)")
    top_logprobs: int | None = Field(None, description="at most 11")
    n: int | None = Field(None, description="choices, 1 to 8: each a row of the batch")
    stream_options: dict[str, Json] | None = None


class MessagesRequest(Sampling, ToneCurve, Routing, Constraint, Decoding, Template):
    """Anthropic Messages (`logit_bias` is not part of it)."""

    messages: list[dict[str, Json]] = Field(..., description="user, assistant and system turns, string or blocks")
    max_tokens: int = Field(..., ge=1, description="required, as on Anthropic")
    model: str | None = None
    system: str | list[dict[str, Json]] | None = None
    stream: bool | None = False
    stop_sequences: list[str] | None = None
    tools: list[dict[str, Json]] | None = None
    tool_choice: dict[str, Json] | None = None
    thinking: dict[str, Json] | None = Field(None, description="enabled, disabled or adaptive")
    output_config: dict[str, Json] | None = Field(None, description="format (json_schema) and effort")
    output_format: dict[str, Json] | None = Field(None, description="the structured-outputs beta's name for "
                                                  "output_config.format")
    cache_control: dict[str, Json] | None = Field(None, description="accepted: every prompt prefix is cached anyway")
    metadata: dict[str, Json] | None = None


class CountTokensRequest(_Body):
    """A Messages request less max_tokens; what changes no prompt token (tool_choice, an output format) is
    taken and counts nothing."""

    messages: list[dict[str, Json]]
    model: str | None = None
    system: str | list[dict[str, Json]] | None = None
    tools: list[dict[str, Json]] | None = None
    tool_choice: dict[str, Json] | None = None
    thinking: dict[str, Json] | None = Field(None, description="enabled, disabled or adaptive")
    output_config: dict[str, Json] | None = None
    cache_control: dict[str, Json] | None = None


class ResponsesRequest(Sampling, ToneCurve, LogitBias, Routing, Guided, Decoding, Template):
    """OpenAI Responses (the output format is `text.format`)."""

    input: str | list[dict[str, Json]] = Field(..., description="a string, or message / function_call items")
    model: str | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = True
    stream: bool | None = False
    max_output_tokens: int | None = None
    max_tokens: int | None = Field(None, description="read when max_output_tokens is absent")
    stop: str | list[str] | None = Field(None, description="up to 4 strings")
    tools: list[dict[str, Json]] | None = None
    tool_choice: str | dict[str, Json] | None = None
    text: dict[str, Json] | None = Field(None, description="text.format: json_schema or json_object")
    reasoning: dict[str, Json] | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, Json] | None = None
    include: list[str] | None = Field(None, description="reasoning.encrypted_content (the reasoning, base64)")
    max_tool_calls: int | None = Field(None, description="accepted: it bounds built-in tools, none of which run here")


class EmbeddingsRequest(_Body):
    input: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="a string or up to 2048 strings, or the text tokenized: token ids, or arrays of them")
    model: str | None = None
    encoding_format: str | None = Field("float", description="float or base64")
    instruction: str | None = None


class AdapterMount(Schema):
    """Validated before the route runs (a field at fault is the error's `param`); the id's letters are the engine's
    to check."""
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(..., min_length=1, description="1-128 letters, digits, '.', '_' or '-'")
    path: str = Field(..., min_length=1, description="a folder with adapters.safetensors and adapter_config.json")

