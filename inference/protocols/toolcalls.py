"""Parse tool-call markup from model text: OpenAI-JSON inside
`<tool_call>…</tool_call>` and Qwen's `<function=name><parameter=k>v</parameter></function>`.

JSON that fails strict parsing goes through a repair pass (fences and
prose, single quotes, trailing commas, truncated braces, Python literals
outside strings, a name that landed inside `arguments`). Argument values
are decoded against the tool's JSON schema. Nothing here raises on any
input: unparseable markup returns None and stays visible as content.
"""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as a string (the wire form); a cut call's, as far as it was written
    id: str = ""
    cut: bool = False  # the generation ended inside the call (output.OutputParser.finish): never one to run

    def wire(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def called(calls: list[ToolCall]) -> bool:
    """Whether a reply ends in calls for the client to run: some, none of them cut."""
    return bool(calls) and not any(c.cut for c in calls)


def new_call(name: str, arguments: dict) -> ToolCall:
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False), "call_" + uuid.uuid4().hex[:24])


# -- JSON repair ---------------------------------------------------------------

_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*|\s*```\s*$")
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}


def _outside_strings(text: str, fix: Callable[[str], str]) -> str:
    """Apply `fix` to each run of text that is not inside a double-quoted string."""
    out: list[str] = []
    run: list[str] = []
    i, in_str = 0, False
    while i < len(text):
        ch = text[i]
        if in_str:
            out.append(ch)
            if ch == "\\" and i + 1 < len(text):
                out.append(text[i + 1])
                i += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            out.append(fix("".join(run)))
            run = []
            out.append(ch)
            in_str = True
        else:
            run.append(ch)
        i += 1
    out.append(fix("".join(run)))
    return "".join(out)


def _single_to_double_quotes(text: str) -> str:
    out, i, quote = [], 0, None
    while i < len(text):
        ch = text[i]
        if quote is None and ch in "'\"":
            quote = ch
            out.append('"')
        elif quote is not None and ch == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2] if text[i + 1] != "'" else "'")
            i += 1
        elif quote is not None and ch == quote:
            quote = None
            out.append('"')
        elif quote == "'" and ch == '"':
            out.append('\\"')
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _close_truncated(text: str) -> str:
    stack, in_str, escaped = [], False, False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack and stack[-1] == ch:
            stack.pop()
    return text + ('"' if in_str else "") + "".join(reversed(stack))


def _loads_object(text: str):
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def repair_json(text: str) -> dict | None:
    """Parse a JSON object, repairing what models commonly get wrong."""
    text = _FENCE.sub("", text.strip())
    start = text.find("{")
    if start < 0:
        return None
    text = text[start:]  # a prose prefix
    if (value := _loads_object(text)) is not None:
        return value
    attempts = [text]
    if "'" in text:
        attempts.append(_single_to_double_quotes(text))
    for candidate in list(attempts):
        fixed = _outside_strings(candidate, lambda run: re.sub(r"\b(True|False|None)\b",
                                                              lambda m: _PY_LITERALS[m.group(1)], run))
        fixed = _outside_strings(fixed, lambda run: re.sub(r",(\s*[}\]])", r"\1", run))
        for option in (fixed, _close_truncated(fixed), _close_truncated(fixed.rstrip().rstrip(","))):
            if (value := _loads_object(option)) is not None:
                return value
        # Text after the object (a closing remark) is dropped.
        end = balanced_end(fixed)
        if end and (value := _loads_object(fixed[:end])) is not None:
            return value
    return None


def balanced_end(text: str) -> int | None:
    """Where the JSON object or array at the start of `text` closes (None: not yet)."""
    return Nesting().scan(text, 0)


class Nesting:
    """A reader of JSON nesting that can stop and go on: `scan` takes more of
    the text and answers where the value begun at its start closes, once it does."""

    def __init__(self):
        self.depth, self.in_str, self.escaped, self.at = 0, False, False, 0

    def scan(self, text: str, start: int | None = None) -> int | None:
        at = self.at if start is None else start
        for i in range(at, len(text)):
            ch = text[i]
            if self.in_str:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_str = False
            elif ch == '"':
                self.in_str = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.at = i + 1
                    return i + 1
        self.at = len(text)
        return None


# -- schema-aware arguments ----------------------------------------------------------

def tool_schemas(tools: list[dict] | None) -> dict[str, dict]:
    """name -> parameters.properties for each function tool."""
    out = {}
    for tool in tools or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            out[fn["name"]] = props if isinstance(props, dict) else {}
    return out


def _schema_type(prop) -> str:
    kind = prop.get("type") if isinstance(prop, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return kind if isinstance(kind, str) else ""


def decode_value(raw: str, prop) -> object:
    """A raw text parameter value, typed by its schema. Strings stay strings."""
    kind = _schema_type(prop)
    if kind == "string":
        return raw
    stripped = raw.strip()
    if kind in ("integer", "number"):
        try:
            number = float(stripped)
            return int(number) if kind == "integer" and number.is_integer() else number
        except ValueError:
            return raw
    if kind == "boolean":
        return {"true": True, "false": False}.get(stripped.lower(), raw)
    if kind in ("object", "array") or not kind:
        try:
            value = json.loads(stripped)
        except ValueError:
            value = repair_json(stripped) if kind == "object" else None
        if value is not None and (kind or isinstance(value, (dict, list))):
            return value
    if stripped == "null":
        return None
    return raw


def _coerce_json_arguments(arguments: dict, props: dict) -> dict:
    """JSON arguments whose schema says string but arrived as another type
    become strings; everything else is kept as the model wrote it."""
    out = {}
    for key, value in arguments.items():
        if _schema_type(props.get(key)) == "string" and value is not None and not isinstance(value, str):
            value = json.dumps(value)  # 3 -> "3", true -> "true", {...} -> its JSON text
        out[key] = value
    return out


# -- envelopes --------------------------------------------------------------

_FUNCTION = re.compile(r"<function=([^>\s]+)\s*>(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)\s*>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _strip_framing_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def parse_qwen(body: str, schemas: dict[str, dict]) -> list[ToolCall]:
    calls = []
    for name, inner in _FUNCTION.findall(body):
        props = schemas.get(name, {})
        args = {key: decode_value(_strip_framing_newline(value), props.get(key))
                for key, value in _PARAMETER.findall(inner)}
        calls.append(new_call(name, args))
    return calls


def _envelope(obj: dict, schemas: dict[str, dict]) -> ToolCall | None:
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = repair_json(args) if args.strip() else {}
    if not isinstance(args, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) and isinstance(args.get("name"), str):
        if not schemas or args["name"] in schemas:  # the name landed inside arguments
            args = dict(args)
            name = args.pop("name")
    if not isinstance(name, str) or not name:
        return None
    return new_call(name, _coerce_json_arguments(args, schemas.get(name, {})))


def parse_block(body: str, tools: list[dict] | None) -> list[ToolCall] | None:
    """Tool calls in the text between the markup's start and end tags, or
    None when it cannot be read as any (the caller shows it as content)."""
    try:
        schemas = tool_schemas(tools)
        if "<function=" in body:
            return parse_qwen(body, schemas) or None
        obj = repair_json(body)
        if obj is None:
            return None
        call = _envelope(obj, schemas)
        return [call] if call else None
    except Exception:  # never let a model's text break the response
        return None
