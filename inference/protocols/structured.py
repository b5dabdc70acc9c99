"""Structured output fields (OpenAI, vLLM and oMLX spellings) resolved into
one grammar spec, compiled, or degraded to an instruction plus a Warning
header when it cannot be enforced. A constraint is never silently dropped.

Every spec is bounded before it reaches the compiler (`limits`): its text
(`max_grammar_bytes`), the number of choices, and a JSON schema's nesting;
a compile runs for at most `grammar_timeout_s` (in a process that is killed
past it, see `inference.engine.grammar`), and a request fails with a 400
naming the limit when its grammar ran out of time."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from core import jsonbody
from core.limits import Limits
from core.workers import STARTUP_S
from inference.engine.grammar import GrammarCompileError, GrammarSpec, GrammarStopped, GrammarTimeout
from inference.protocols.errors import RequestError

RESPONSE_FORMATS = ("text", "json_object", "json_schema")


@dataclass
class Constraint:
    spec: GrammarSpec
    compiled: object | None = None  # None: not enforced, see `warning`
    warning: str | None = None

    def instruction(self) -> str:
        """The system instruction that stands in for an unenforced grammar."""
        s = self.spec
        if s.kind == "json":
            return "Respond only with a valid JSON object, and nothing else."
        if s.kind == "json_schema":
            return f"Respond only with JSON that matches this JSON schema, and nothing else:\n{s.source}"
        if s.kind == "ebnf":
            return f"Respond only with text that matches this grammar, and nothing else:\n{s.source}"
        if s.kind == "structural_tag":
            return "Answer by calling one of the offered tools."
        if s.kind == "regex":
            return f"Respond only with text that matches this regular expression, and nothing else: {s.source}"
        return "Respond with exactly one of these, and nothing else: " + ", ".join(json.loads(s.source))


def _schema_text(schema, param: str, limits: Limits) -> str:
    if isinstance(schema, str):
        try:
            schema = jsonbody.loads(schema, limits.max_json_depth, "JSON schema")
        except jsonbody.JsonRefused:
            raise RequestError(f"{param} must be a JSON schema object", param) from None
    if not isinstance(schema, dict):
        raise RequestError(f"{param} must be a JSON schema object", param)
    levels = limits.max_schema_depth
    if jsonbody.depth(schema) > levels:
        raise RequestError(f"{param} nests more than {levels} levels deep (HEARTH_MAX_SCHEMA_DEPTH)", param,
                           code="grammar_too_large")
    return json.dumps(bounded_strings(schema))  # key order kept: it is the order the output follows


# A JSON string of `minLength`..`maxLength` characters, none a control character,
# quote or backslash: xgrammar turns a bounded string into a rule that admits raw
# control characters (which `json.loads` refuses), but builds a pattern's rule on
# its JSON-string mode, which never does. A pattern's bound is unrolled, so its
# compile grows with the bound: past REWRITE_MOST, xgrammar's own rule stays.
BOUNDED = '^[^\\x00-\\x1f"\\\\]{%d,%s}$'
REWRITE_MOST = 512
_DATA = frozenset({"enum", "const", "default", "examples"})  # values there are data, not schemas
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def bounded_strings(node):
    """The schema with every string bounded by minLength/maxLength (at most
    REWRITE_MOST, and no pattern, format, enum or const of its own) bounded by
    a pattern instead, so every output it constrains parses as JSON."""
    if isinstance(node, list):
        return [bounded_strings(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict = {}
    for key, value in node.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):  # names there are anything, values schemas
            out[key] = {name: bounded_strings(schema) for name, schema in value.items()}
        else:
            out[key] = value if key in _DATA else bounded_strings(value)
    kind = out.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    low, high = out.get("minLength", 0), out.get("maxLength")
    if "string" in kinds and ("minLength" in out or "maxLength" in out) \
            and not {"pattern", "format", "enum", "const"} & out.keys() \
            and isinstance(low, int) and isinstance(high, (int, type(None))) and (high or low) <= REWRITE_MOST:
        out.pop("minLength", None)
        out.pop("maxLength", None)
        out["pattern"] = BOUNDED % (low, "" if high is None else high)  # applies to strings only: null stays
    return out


def _response_format(value, limits: Limits) -> GrammarSpec | None:
    if not isinstance(value, dict) or value.get("type") not in RESPONSE_FORMATS:
        raise RequestError(f"response_format.type must be one of {', '.join(RESPONSE_FORMATS)}",
                           "response_format")
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return GrammarSpec("json")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise RequestError("response_format.json_schema.schema required", "response_format")
    any_ws = spec.get("any_whitespace", False)  # compact unless asked
    strict = spec.get("strict", True)
    return GrammarSpec("json_schema", _schema_text(spec["schema"], "response_format.json_schema.schema", limits),
                       any_whitespace=any_ws is True, strict=strict is not False)


def _structured_outputs(value, limits: Limits) -> GrammarSpec:
    # vLLM's object form ({"json": …, "regex": …, "choice": …, "grammar": …}) or a bare schema.
    if isinstance(value, dict):
        if "grammar" in value:
            return GrammarSpec("ebnf", str(value["grammar"]))
        if "json" in value:
            return GrammarSpec("json_schema", _schema_text(value["json"], "structured_outputs.json", limits))
        if "regex" in value:
            return GrammarSpec("regex", str(value["regex"]))
        if "choice" in value:
            return _choice(value["choice"], "structured_outputs.choice", limits)
    return GrammarSpec("json_schema", _schema_text(value, "structured_outputs", limits))


def _choice(value, param: str, limits: Limits) -> GrammarSpec:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise RequestError(f"{param} must be a non-empty list of strings", param)
    most = limits.max_grammar_choices
    if len(value) > most:
        raise RequestError(f"{param} has {len(value)} choices; this server takes at most {most} "
                           "(--max-grammar-choices)", param, code="grammar_too_large")
    return GrammarSpec("choice", json.dumps(value))


def _text(value, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise RequestError(f"{param} must be a non-empty string", param)
    return value


def requested(body: dict, limits: Limits) -> GrammarSpec | None:
    """The constraint a body asks for, within the size limits."""
    spec, field = _requested(body, limits)
    most = limits.max_grammar_bytes
    if spec is not None and len(spec.source.encode()) > most:
        raise RequestError(f"{field} is {len(spec.source.encode())} bytes as a grammar; this server takes at most "
                           f"{most} (--max-grammar-bytes)", field, code="grammar_too_large")
    return spec


def _requested(body: dict, limits: Limits) -> tuple[GrammarSpec | None, str]:
    """The constraint a body asks for, and the field it came from, by
    precedence: guided_grammar, then response_format (json_schema,
    json_object), structured_outputs, guided_regex, guided_choice."""
    if body.get("guided_grammar") is not None:
        return GrammarSpec("ebnf", _text(body["guided_grammar"], "guided_grammar")), "guided_grammar"
    if body.get("response_format") is not None:
        spec = _response_format(body["response_format"], limits)
        if spec is not None:
            return spec, "response_format"
    if body.get("structured_outputs") is not None:
        return _structured_outputs(body["structured_outputs"], limits), "structured_outputs"
    if body.get("guided_regex") is not None:
        return GrammarSpec("regex", _text(body["guided_regex"], "guided_regex")), "guided_regex"
    if body.get("guided_choice") is not None:
        return _choice(body["guided_choice"], "guided_choice", limits), "guided_choice"
    return None, ""


async def resolve(spec: GrammarSpec | None, compiler, enabled: bool, limits: Limits) -> Constraint | None:
    """Compile the requested constraint, or mark it unenforced with a reason.
    Waits on the event loop (no thread is held); the compiler bounds the
    compile by the grammar timeout (the wait here only adds the compile
    process's own start, which the budget does not count)."""
    if spec is None:
        return None
    if not enabled:
        return Constraint(spec, warning="grammar not enforced: grammar compilation disabled by HEARTH_GRAMMAR=0")
    timeout = limits.grammar_timeout_s
    future = asyncio.wrap_future(compiler.submit(spec, timeout))  # GrammarBusy (429) when too many big ones wait
    future.add_done_callback(_consume)
    done, _ = await asyncio.wait({future}, timeout=timeout + STARTUP_S)
    try:
        if not done:
            raise GrammarTimeout(f"the grammar did not compile within {timeout:g} s (--grammar-timeout)")
        if future.cancelled():  # still queued when the server began to stop (GrammarCompiler.close)
            raise GrammarStopped("the server is stopping; retry on another server or once it is back")
        return Constraint(spec, compiled=future.result())
    except GrammarTimeout as exc:  # 400 past the budget; 503 when the server stopped it (GrammarStopped)
        raise RequestError(str(exc), FIELD_OF[spec.kind], status=exc.status, kind=exc.type, code=exc.code) from None
    except GrammarCompileError as exc:
        return Constraint(spec, warning=f"grammar not enforced: {exc}")


FIELD_OF = {"json": "response_format", "json_schema": "response_format", "ebnf": "guided_grammar",
            "regex": "guided_regex", "choice": "guided_choice", "structural_tag": "tool_choice"}


def _consume(future) -> None:
    """Nobody may await a compile that outlived its request: read its outcome."""
    if not future.cancelled():
        future.exception()
