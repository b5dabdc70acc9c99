"""Split generated text, as it streams, into reasoning, content and tool calls.

Protocol modules feed text deltas in and render what comes out, so every
protocol shares one reading of the model's output. Text that might be the
start of a tag is held back until the next delta decides; tool-call markup
is withheld and turned into `ToolCall`s when it closes (or, failing to
parse, released as content: nothing visible is ever lost). A `<tool_call>`
JSON body closes at its end tag outside the JSON's strings: an argument may
hold the markup as text.

Streams render `take_deltas()`: a call's start (id, name), then its
arguments piece by piece, then its end. A `<tool_call>` JSON call whose
name comes first, and a Qwen3-Coder `<function=name>` call, stream their
arguments as they are read, re-rendered as JSON that stays valid whatever
the model writes next (argstream.py); the other families' calls arrive
whole when their markup closes, after the repair pass and the schema's
coercions.

A call the generation was cut off in (`finish(cut=True)`: the token limit
or a stop sequence ended the text before the call's arguments were whole)
is never a finished call: a streamed one is recorded with `ToolCall.cut`
set and its arguments as far as they were written, unrepaired and
unclosed; one whose name had not come yet is dropped, and so is one of a
family read whole, except that a markup with no end tag (Llama 3's,
Mistral's) keeps the calls written whole before the cut. Protocols read `ToolCall.cut` (`toolcalls.called`) for their
finish reason and item status, so no reply says a cut call is ready to run.
"""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inference.protocols.argstream import ArgumentStreamer, XmlArgumentStreamer
from inference.protocols.markup import HEARTH, Markup
from inference.protocols.toolcalls import ToolCall, tool_schemas

if TYPE_CHECKING:  # harmony.py reads with this module's helpers: it imports this one
    from inference.protocols.harmony import Reader

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass
class Piece:
    kind: str  # "content" or "reasoning"
    text: str


@dataclass
class ToolDelta:
    """Part of a call as a stream sends it: `name` on its first delta only,
    `arguments` the next piece of its arguments' JSON text, `done` on its last."""

    index: int
    id: str
    name: str | None
    arguments: str
    done: bool = False


@dataclass
class Message:
    """A finished chat turn, split into its channels; `blocks` keeps them in
    the order they were generated (a text run, or a call), as a stream sends
    them, for the protocols that answer with blocks or items."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list = field(default_factory=list)
    blocks: list[Piece | ToolCall] = field(default_factory=list)

    def add(self, pieces: list[Piece]) -> None:
        for piece in pieces:
            if piece.kind == "reasoning":
                self.reasoning += piece.text
            else:
                self.content += piece.text
            last = self.blocks[-1] if self.blocks else None
            if isinstance(last, Piece) and last.kind == piece.kind:
                last.text += piece.text
            elif piece.text:
                self.blocks.append(Piece(piece.kind, piece.text))

    def take(self, items: list[Piece | ToolDelta], calls: list[ToolCall]) -> None:
        """What `OutputParser.ordered` made, with the parser's calls as it settled them."""
        for item in items:
            if isinstance(item, Piece):
                self.add([item])
            elif item.name is not None:  # a call's first delta: where its block starts
                self.blocks.append(calls[item.index])
        self.tool_calls = calls


# The start of a `<tool_call>` JSON body up to its arguments' value: the name must come first to stream.
_ARGS_START = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
# Qwen3-Coder's XML, inside `<tool_call>` or on its own (the markup's body then starts after `<function=`).
_XML_START = {"json_tools": re.compile(r"\s*<function=([^>\s]+)\s*>"), "qwen3_coder": re.compile(r"([^>\s]+)\s*>")}
STREAMED_FAMILIES = frozenset(_XML_START)


@dataclass
class _Streaming:
    """A `<tool_call>` JSON call whose arguments are being streamed."""

    index: int
    id: str
    name: str
    at: int  # where its arguments' value starts in the markup's body
    args: ArgumentStreamer | XmlArgumentStreamer


@dataclass
class OutputParser:
    in_reasoning: bool = False  # the prompt left a <think> block open
    reasoning: bool = False  # parse <think> blocks at all
    tools: list[dict] | None = None  # parse tool calls when set
    max_calls: int | None = None  # 1 when the client turned parallel tool calls off: later calls are dropped
    markups: tuple[Markup, ...] = HEARTH  # the model's tool-call markup (markup.markups_for)
    # Calls to tools nobody offered stay text, unless the caller answers them itself (the dashboard's
    # tool loop tells the model the tool does not exist, so it can correct itself).
    undeclared: bool = False
    harmony: Reader | None = None  # a harmony model's reply, read into the markup below first (harmony.py)
    calls: list[ToolCall] = field(default_factory=list)
    _held: str = ""
    _tool_open: Markup | None = None  # the markup being withheld
    _after_think: bool = False
    _deltas: list[ToolDelta] = field(default_factory=list)
    _streaming: _Streaming | None = None
    # How far the open `<tool_call>` JSON body has been read for its end tag: (where, inside a string, after a
    # backslash there); `_end_at`. None: not that markup, or its end tag is looked for as plain text.
    _scan: tuple[int, bool, bool] | None = None
    # Where the open call's end tag first came inside what reads as a JSON string (None: not yet). A streamed
    # call's arguments go out only up to there: if its quoting went wrong, that tag ends it (`finish`).
    _tag_in_string: int | None = None

    def take_deltas(self) -> list[ToolDelta]:
        """The call deltas since the last take, in order."""
        out, self._deltas = self._deltas, []
        return out

    @property
    def buffering(self) -> bool:
        """Withholding a tool call (protocol modules send keep-alives meanwhile)."""
        return self._tool_open is not None

    def _tags(self) -> list[str]:
        if self._tool_open is not None:  # a markup with no end tag runs to the end of the generation
            return [self._tool_open.end] if self._tool_open.end else []
        if self.in_reasoning:
            return [THINK_CLOSE]
        tags = [THINK_OPEN] if self.reasoning else []
        return tags + ([m.start for m in self.markups] if self.tools else [])

    def feed(self, text: str) -> list[Piece]:
        return [piece for pieces in self._steps(text) for piece in pieces]

    def ordered(self, text: str, finish: bool = False, cut: bool = False) -> list[Piece | ToolDelta]:
        """`feed` (then `finish`, when asked) with the pieces and the call
        deltas in the order the text made them: a delta that spans the end of
        a call and the text after it (several tokens at once) keeps the text
        after the call. Streams that render calls as items of their own
        (Responses, Messages) read this."""
        items: list[Piece | ToolDelta] = []
        for pieces in self._steps(text):
            items += pieces
            items += self.take_deltas()
        if finish:
            items += self.finish(cut)
            items += self.take_deltas()
        return items

    def _steps(self, text: str) -> Iterator[list[Piece]]:
        """The pieces `text` makes, a list per tag it reaches and one for what
        follows the last; the call deltas each made are pending when it comes."""
        if self.harmony is not None:
            text = self.harmony.feed(text)
        self._held += text
        yield from self._split()

    def _split(self) -> Iterator[list[Piece]]:
        """`_steps` on the text held now."""
        while True:
            hits = [(at, t) for t in self._tags() if (at := self._find(t)) >= 0]
            if not hits:
                break
            out: list[Piece] = []
            at, tag = min(hits)
            before, self._held = self._held[:at], self._held[at + len(tag):]
            if self._tool_open is not None:  # the end tag: what came before is the call
                self._close_tool(out, self._tool_open, before, closed=True)
            else:
                self._emit(out, before)
                self._switch(tag)
            yield out
        out = []
        keep = partial_suffix(self._held, self._tags())
        if self._tool_open is None:
            self._emit(out, self._held[: len(self._held) - keep])
            self._held = self._held[len(self._held) - keep:]
        elif self._tool_open.family in STREAMED_FAMILIES:
            upto = len(self._held) - keep
            if self._tag_in_string is not None:
                upto = min(upto, self._tag_in_string)
            self._stream_arguments(self._held[:upto])
        yield out

    def _find(self, tag: str) -> int:
        if self._tool_open is None or self._tool_open.family != "json_tools" or self._scan is None:
            return self._held.find(tag)
        return self._end_at(tag)

    def _end_at(self, tag: str) -> int:
        """Where the end tag closes an open `<tool_call>` JSON body: its first
        occurrence outside the JSON's strings (an argument may hold the tag as
        text, as a file being edited does), -1 while none has come. Reads each
        character once over the call, however many deltas it comes in."""
        held = self._held
        assert self._scan is not None
        at, in_string, escaped = self._scan
        if at == 0:
            body = held.lstrip()
            if not body:
                return held.find(tag)
            if not body.startswith("{"):  # not JSON: the tag is looked for as written
                self._scan = None
                return held.find(tag)
        while at < len(held):
            ch = held[at]
            if in_string:
                if self._tag_in_string is None:
                    if held.startswith(tag, at):
                        self._tag_in_string = at
                    elif tag.startswith(held[at:]):  # may be the tag's beginning: the next delta decides
                        self._scan = (at, in_string, escaped)
                        return -1
                escaped, in_string = not escaped and ch == "\\", escaped or ch != '"'
            elif ch == '"':
                in_string = True
            elif held.startswith(tag, at):
                break
            elif tag.startswith(held[at:]):  # may be the tag's beginning: the next delta decides
                self._scan = (at, False, False)
                return -1
            at += 1
        self._scan = (at, in_string, escaped)
        return at if at < len(held) else -1

    def _stream_arguments(self, body: str) -> None:
        """Send what is new of an open call's arguments (argstream.py)."""
        if self._streaming is None:
            self._streaming = self._start_streaming(body)
            if self._streaming is None:
                return
            self._deltas.append(ToolDelta(self._streaming.index, self._streaming.id, self._streaming.name, ""))
        streaming = self._streaming
        piece = streaming.args.feed(body[streaming.at:])
        if piece:
            self._deltas.append(ToolDelta(streaming.index, streaming.id, None, piece))

    def _start_streaming(self, body: str) -> _Streaming | None:
        """A call whose name has been written, to an offered tool, with room for it."""
        assert self._tool_open is not None
        if self.max_calls is not None and len(self.calls) >= self.max_calls:
            return None
        streamer: type[ArgumentStreamer] | type[XmlArgumentStreamer] = ArgumentStreamer
        match = _ARGS_START.match(body) if self._tool_open.family == "json_tools" else None
        if match is None:
            match, streamer = _XML_START[self._tool_open.family].match(body), XmlArgumentStreamer
        if match is None:
            return None
        name = _unescape(match.group(1)) if streamer is ArgumentStreamer else match.group(1)
        if name not in self._offered():
            return None
        return _Streaming(len(self.calls), "call_" + uuid.uuid4().hex[:24], name, match.end(),
                          streamer(tool_schemas(self.tools).get(name, {})))

    def _offered(self) -> set:
        return {(t.get("function") or {}).get("name") for t in self.tools or []}

    def finish(self, cut: bool = False) -> list[Piece]:
        """Flush at the end of generation. `cut` (`GenerationEvent.cut`): the
        token limit or a stop sequence ended the text, and a call it ended
        inside is a cut call (see the module's docstring); half a call is not
        content either. A generation that stopped by itself has an unclosed
        call parsed as it stands (the repair closes truncated JSON), and text
        that never became a call shown as written."""
        out: list[Piece] = []
        if self.harmony is not None:  # its open message ends here: what closes it may close a call
            reader, self.harmony = self.harmony, None
            out = self.feed(reader.finish(cut))
            self.harmony = reader
        if self._tool_open is not None and self._scan is not None and not cut and \
                self._tool_open.family == "json_tools" and self._tool_open.end in self._held:
            # The end tag came only inside what read as a JSON string: the call's quoting went wrong, and its
            # first end tag is taken as its end, as in a body that is not JSON (a streamed call's arguments
            # went out only up to that tag: `_tag_in_string`).
            self._scan = None
            out += [piece for pieces in self._split() for piece in pieces]
        if self._tool_open is not None:
            self._close_tool(out, self._tool_open, self._held, closed=False, cut=cut)
        elif not (cut and self._call_began(self._held)):
            self._emit(out, self._held)
        self._held = ""
        return out

    def _call_began(self, held: str) -> bool:
        """Whether the text held back at the end is the start of a call's markup
        (two characters of it at least: a lone `<` may be text)."""
        return bool(self.tools) and len(held) >= 2 and any(m.start.startswith(held) for m in self.markups)

    def _emit(self, out: list[Piece], text: str) -> None:
        if self._after_think:  # the blank line after </think> is framing, not content
            text = text.lstrip("\n")
            self._after_think = not text
        if not text:
            return
        kind = "reasoning" if self.in_reasoning else "content"
        if out and out[-1].kind == kind:
            out[-1].text += text
        else:
            out.append(Piece(kind, text))

    def _switch(self, tag: str) -> None:
        if tag == THINK_OPEN:
            self.in_reasoning = True
        elif tag == THINK_CLOSE:
            self.in_reasoning = False
            self._after_think = True
        else:
            self._tool_open = next(m for m in self.markups if m.start == tag)
            self._scan, self._tag_in_string = (0, False, False), None

    def _close_tool(self, out: list[Piece], markup: Markup, body: str, closed: bool, cut: bool = False) -> None:
        """End `markup`: its calls, or, unreadable, the text."""
        self._tool_open, self._tag_in_string = None, None
        if self._streaming is not None:
            self._stream_arguments(body)
            if cut and not closed and not self._streaming.args.done:
                self._cut_streamed()
            else:
                self._finish_streamed(markup, body, closed, cut and not closed)
            return
        if cut and not closed:
            # A markup with no end tag (Llama 3's, Mistral's) is never closed, and a stop sequence may come
            # after whole calls: read without the repair pass, only calls written whole count. One with an end
            # tag that did not come was cut inside. The rest is neither a call nor content.
            if not markup.end:
                self._take_whole(markup.parse(body, self.tools, closed, False) or [])
            return
        if not self._take_whole(markup.parse(body, self.tools, closed, True) or []):
            self._emit(out, markup.start + body + (markup.end if closed else ""))  # unreadable: shown as written

    def _take_whole(self, calls: list[ToolCall]) -> bool:
        """Calls read whole, as many as there is room for; False when there are
        none, or one names a tool nobody offered (never a call the client gets)."""
        offered = self._offered()
        if not calls or (not self.undeclared and any(c.name not in offered for c in calls)):
            return False
        room = len(calls) if self.max_calls is None else max(self.max_calls - len(self.calls), 0)
        for call in calls[:room]:
            self._deltas.append(ToolDelta(len(self.calls), call.id, call.name, call.arguments, done=True))
            self.calls.append(call)
        return True

    def _finish_streamed(self, markup: Markup, body: str, closed: bool, cut: bool = False) -> None:
        """A streamed call is a call whatever follows: its arguments are what
        was sent, completed from the repair pass's reading where the reader
        had stopped (argstream.py). `cut`: the generation ended after its
        arguments but inside its markup, and a later call of the block that
        had not closed is dropped."""
        streaming, self._streaming = self._streaming, None
        assert streaming is not None

        def repair() -> str | None:
            parsed = markup.parse(body, self.tools, closed, True)
            return parsed[0].arguments if parsed and parsed[0].name == streaming.name else None

        rest, arguments = streaming.args.close(repair)
        if rest:
            self._deltas.append(ToolDelta(streaming.index, streaming.id, None, rest))
        self._deltas.append(ToolDelta(streaming.index, streaming.id, None, "", done=True))
        self.calls.append(ToolCall(streaming.name, arguments, streaming.id))
        if isinstance(streaming.args, XmlArgumentStreamer) and body.count("<function=") > 1:
            more = (markup.parse(body, self.tools, closed, True) or [])[1:]  # more calls in one block
            self._take_whole(more[:body.count("</function>") - 1] if cut else more)

    def _cut_streamed(self) -> None:
        """A streamed call the generation ended inside, before its arguments
        were whole: recorded as cut, its arguments what was sent and the rest
        of its text as written (argstream.py)."""
        streaming, self._streaming = self._streaming, None
        assert streaming is not None
        rest, arguments = streaming.args.cut()
        if rest:
            self._deltas.append(ToolDelta(streaming.index, streaming.id, None, rest))
        self._deltas.append(ToolDelta(streaming.index, streaming.id, None, "", done=True))
        self.calls.append(ToolCall(streaming.name, arguments, streaming.id, cut=True))


def _unescape(name: str) -> str:
    try:
        return json.loads(f'"{name}"')
    except ValueError:
        return name


def partial_suffix(text: str, tags: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that begins one of `tags`."""
    for size in range(min(len(text), max((len(t) for t in tags), default=1) - 1), 0, -1):
        if any(t.startswith(text[-size:]) for t in tags):
            return size
    return 0
