"""OpenAI's harmony format (gpt-oss): prompts written, replies read.

A harmony model (its tokenizer has `<|start|>`, `<|channel|>`,
`<|message|>`, `<|end|>`, `<|call|>`, `<|return|>` among its tokens) gets
its prompt from `render`, not from a chat template: a system message with
the reasoning effort, a developer message with the client's system text as
`# Instructions` and its tools as a TypeScript `namespace functions`, then
the turns. Its reply is a run of messages, each `<|start|>assistant`,
a header (`<|channel|>analysis`, `<|channel|>final`, `<|channel|>commentary
to=functions.NAME <|constrain|>json`) and `<|message|>` content; `Reader`
turns that stream into the markup every surface reads already
(output.OutputParser): the analysis channel into a `<think>` block, `final`
into content, a call to `functions.NAME` into a `<tool_call>` whose
arguments stream as they come. `tool_choice` is enforced with xgrammar's
own harmony structural tag (tool_choice.py).

The official `openai-harmony` package renders and parses this format, but
it loads its `o200k_base` vocabulary from a file it downloads on first use,
and Hearth never downloads at run time: so the format is written and read
here, from the package's published spec (docs/format.md of openai/harmony)
and its renderer's rules for tools (the TypeScript of a JSON schema).
No Django here.
"""
from __future__ import annotations

import datetime
import functools
import json
import re

from inference.protocols.errors import RequestError
from inference.protocols.output import partial_suffix

START, END, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"
CALL, RETURN = "<|call|>", "<|return|>"
TOKENS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
KNOWLEDGE_CUTOFF = "2024-06"
EFFORTS = ("low", "medium", "high")
# reasoning_effort as clients send it -> harmony's three levels (it cannot switch reasoning off: `none` is low).
EFFORT_OF = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


def is_harmony(tokenizer) -> bool:
    """Whether the model writes harmony (its vocabulary has the format's tokens)."""
    return _is_harmony(getattr(tokenizer, "_tokenizer", tokenizer))


@functools.cache
def _is_harmony(tokenizer) -> bool:  # once per loaded tokenizer: get_vocab() builds a dict
    vocab = tokenizer.get_vocab()
    return all(token in vocab for token in TOKENS)


def effort(kwargs: dict, budget: int | None = None) -> str:
    """The reasoning level of the system message: `reasoning_effort` as the
    request set it, else one from a thinking budget (Anthropic's
    `budget_tokens`; `enable_thinking: false` counts as 0: `low`), else
    harmony's default, `medium`."""
    asked = kwargs.get("reasoning_effort")
    if asked is not None:
        if not isinstance(asked, str) or asked not in EFFORT_OF:
            raise RequestError("reasoning_effort must be one of " + ", ".join(EFFORT_OF), "reasoning_effort")
        return EFFORT_OF[asked]
    if kwargs.get("enable_thinking") is False:
        return "low"
    if budget is not None:
        return "low" if budget < 1024 else "medium" if budget < 8192 else "high"
    return "medium"


# -- the prompt ----------------------------------------------------------------
def render(messages: list[dict], tools: list[dict] | None, level: str, today: datetime.date | None = None,
           continued: bool = False) -> str:
    """The prompt for `messages` (chat.normalize_messages' shape: system
    turns there carry the developer's too), ending where the assistant's
    next message begins; `continued` (chat.continues): ending inside the
    final assistant message's `final` channel, its text left open."""
    prefill = messages[-1]["content"] if continued else None
    if continued:
        messages = [*messages[:-1], {**messages[-1], "content": ""}]
    functions = [t["function"] for t in tools or []]
    instructions = "\n\n".join(m["content"] for m in messages if m["role"] == "system" and m["content"])
    out = [_system(level, bool(functions), today or datetime.date.today())]
    if instructions or functions:
        out.append(_message("developer", _developer(instructions, functions)))
    turns = [m for m in messages if m["role"] != "system"]
    last_user = max((i for i, m in enumerate(turns) if m["role"] == "user"), default=-1)
    names: dict[str, str] = {}  # tool call id -> the function it called (a result names its caller)
    for i, m in enumerate(turns):
        if m["role"] == "user":
            out.append(_message("user", m["content"]))
        elif m["role"] == "assistant":
            out.append(_assistant(m, names, keep_analysis=i > last_user))
        elif m["role"] == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id") or "") or "tool"
            out.append(f"{START}functions.{name} to=assistant{CHANNEL}commentary{MESSAGE}{m['content']}{END}")
    if prefill is not None:
        return "".join(out) + f"{START}assistant{CHANNEL}final{MESSAGE}{prefill}"
    return "".join(out) + START + "assistant"


def _message(role: str, content: str) -> str:
    return f"{START}{role}{MESSAGE}{content}{END}"


def _system(level: str, functions: bool, today: datetime.date) -> str:
    channels = "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    if functions:
        channels += "\nCalls to these tools must go to the commentary channel: 'functions'."
    top = f"{IDENTITY}\nKnowledge cutoff: {KNOWLEDGE_CUTOFF}\nCurrent date: {today.isoformat()}"
    return _message("system", f"{top}\n\nReasoning: {level}\n\n{channels}")


def _developer(instructions: str, functions: list[dict]) -> str:
    sections = ["# Instructions", instructions] if instructions else []
    if functions:
        body = ["## functions\n", "namespace functions {\n"]
        for fn in functions:
            body += [f"// {line}" for line in (fn.get("description") or "").splitlines()]
            params = fn.get("parameters")
            if isinstance(params, dict) and params.get("properties"):
                body.append(f"type {fn['name']} = (_: {typescript(params, '')}) => any;\n")
            else:
                body.append(f"type {fn['name']} = () => any;\n")
        body.append("} // namespace functions")
        sections += ["# Tools", "\n".join(body)]
    return "\n\n".join(sections)


def _assistant(m: dict, names: dict[str, str], keep_analysis: bool) -> str:
    """A past assistant turn: its reasoning (kept only after the last user
    turn, where the model is still working through tool calls, as the spec
    asks), its text on `final`, each call on `commentary`."""
    out = []
    reasoning = m.get("reasoning_content")
    if keep_analysis and isinstance(reasoning, str) and reasoning:
        out.append(f"{START}assistant{CHANNEL}analysis{MESSAGE}{reasoning}{END}")
    if m.get("content"):
        out.append(f"{START}assistant{CHANNEL}final{MESSAGE}{m['content']}{END}")
    for call in m.get("tool_calls") or []:
        fn = call["function"]
        names[call.get("id") or ""] = fn["name"]
        args = fn.get("arguments", {})
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        out.append(f"{START}assistant to=functions.{fn['name']}{CHANNEL}commentary {CONSTRAIN}json{MESSAGE}"
                   f"{text}{CALL}")
    return "".join(out)


def typescript(schema: dict, indent: str) -> str:
    """A JSON schema as the TypeScript type harmony describes tools with
    (the rules of the openai-harmony renderer: comments for descriptions
    and defaults, `?` for optional keys, enums as unions of literals)."""
    if not isinstance(schema, dict):
        return "any"
    variants = schema.get("oneOf", schema.get("anyOf"))
    if isinstance(variants, list):
        return "".join(f"\n{indent} | {_nullable(v, typescript(v, indent + '   '))}" for v in variants
                       if isinstance(v, dict))
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join("number" if t == "integer" else str(t) for t in kind) or "any"
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    if kind == "object":
        return _object(schema, indent)
    if kind == "array":
        items = schema.get("items")
        return f"{typescript(items, indent)}[]" if isinstance(items, dict) else "Array<any>"
    return {"string": "string", "number": "number", "integer": "number", "boolean": "boolean",
            "null": "null"}.get(kind if isinstance(kind, str) else "", "any")


def _object(schema: dict, indent: str) -> str:
    out = f"{indent}// {schema['description']}\n" if isinstance(schema.get("description"), str) else ""
    out += "{\n"
    required = set(schema.get("required") or [])
    for key, value in (schema.get("properties") or {}).items():
        value = value if isinstance(value, dict) else {}
        optional = "" if key in required else "?"
        if isinstance(value.get("title"), str):
            out += f"{indent}// {value['title']}\n{indent}//\n"
        variants = value.get("oneOf")
        if isinstance(variants, list):
            out += _one_of(key + optional, value, [v for v in variants if isinstance(v, dict)], indent)
            continue
        if isinstance(value.get("description"), str):
            out += f"{indent}// {value['description']}\n"
        examples = value.get("examples")
        if isinstance(examples, list) and examples:
            out += f"{indent}// Examples:\n" + "".join(f'{indent}// - "{e}"\n' for e in examples if isinstance(e, str))
        out += f"{indent}{key}{optional}: {_nullable(value, typescript(value, indent + '    '))},"
        if "default" in value:
            out += f" // default: {_default(value)}"
        out += "\n"
    return out + f"{indent}}}"


def _one_of(key: str, value: dict, variants: list[dict], indent: str) -> str:
    """A property that is one of several types: its comments above it, then a
    line per variant, each with its own description and default."""
    described = value.get("description") if isinstance(value.get("description"), str) else None
    first = variants[0].get("description") if variants else None
    above = described is not None and described != first
    out = f"{indent}// {described}\n" if above else ""
    if "default" in value:
        out += f"{indent}// default: {_default(value)}\n"
    out += f"{indent}{key}:\n"
    for i, variant in enumerate(variants):
        out += f"{indent} | {_nullable(variant, typescript(variant, indent + '   '))}"
        notes = []
        desc = variant.get("description")
        if isinstance(desc, str) and not (i == 0 and above) and desc != described:
            notes.append(desc)
        if "default" in variant:
            notes.append(f"default: {_default(variant)}")
        out += (f" // {' '.join(notes)}" if notes else "") + "\n"
    return out + f"{indent},\n"


def _default(schema: dict) -> str:
    """A default as the comment shows it: a string quoted, but an enum's value bare."""
    default = schema["default"]
    if isinstance(default, str):
        return default if "enum" in schema else f'"{default}"'
    return json.dumps(default)


def _nullable(schema: dict, text: str) -> str:
    return f"{text} | null" if schema.get("nullable") is True and "null" not in text else text


# -- the reply -----------------------------------------------------------------
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_ENDS = (END, CALL, RETURN, START)


class Reader:
    """Harmony as it streams (the special tokens as their text) -> the
    markup output.OutputParser reads: `analysis` in `<think>` … `</think>`,
    `final` and `commentary` preambles as text, a message to `functions.NAME`
    as `<tool_call>{"name": "NAME", "arguments": …}</tool_call>`. A header
    is held until its `<|message|>`; a partial end token is held back."""

    def __init__(self, in_message: bool = False) -> None:
        self._held = ""
        # The reply starts inside the first message's header, or (`in_message`: the prompt left a
        # final-channel message open, harmony.render's `continued`) inside that message's text.
        self._in_header = not in_message
        self._close = ""  # what ends the open message's markup

    def feed(self, text: str) -> str:
        self._held += text
        out = []
        while True:
            if self._in_header:
                at = self._held.find(MESSAGE)
                if at < 0:
                    break
                header, self._held = self._held[:at], self._held[at + len(MESSAGE):]
                opening, self._close = _markup(header)
                out.append(opening)
                self._in_header = False
            else:
                hits = [(self._held.find(tag), tag) for tag in _ENDS if tag in self._held]
                if not hits:
                    keep = partial_suffix(self._held, _ENDS)
                    out.append(self._held[:len(self._held) - keep])
                    self._held = self._held[len(self._held) - keep:]
                    break
                at, tag = min(hits)
                out.append(self._held[:at] + self._close)
                self._held, self._close = self._held[at + (0 if tag == START else len(tag)):], ""
                self._in_header = True
        return "".join(out)

    def finish(self, cut: bool = False) -> str:
        """The end of the generation (its stop token, `<|return|>` or
        `<|call|>`, is never shown): the open message ends here. `cut`: the
        token limit or a stop sequence ended it, and a call it cut is left
        open, so the output parser reads it as cut (never a whole call with a
        stray `}`)."""
        if self._in_header:  # cut inside a header: nothing of it was content
            self._held = ""
            return ""
        rest, self._held, close, self._close = self._held, "", self._close, ""
        self._in_header = True
        return rest if cut and close.endswith("</tool_call>") else rest + close


def _markup(header: str) -> tuple[str, str]:
    """The markup that opens and closes a message with this header."""
    recipient = _RECIPIENT.search(header)
    channel = _CHANNEL.search(header)
    if recipient is not None and recipient.group(1) != "assistant":
        name = recipient.group(1).removeprefix("functions.")
        return '<tool_call>{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ', "}</tool_call>"
    if channel is not None and channel.group(1) == "analysis":
        return "<think>", "</think>"
    return "", ""
