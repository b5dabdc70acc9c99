"""A tool call's JSON arguments, sent piece by piece while the model writes them.

What a streaming client concatenates must be what the server records as
the call's arguments, and must be JSON. A model writing without a grammar
can still go wrong after the first pieces are out (a Python literal, a
missing quote), and the whole-call path repairs such text and applies the
schema's coercions (a number where the schema says string becomes a
string), neither of which can be taken back once sent. So the arguments
are not forwarded as written; they are re-rendered as they are read:

- the object is read member by member with a strict, resumable reader;
- a string value streams as it comes (each escape decoded, then encoded
  again the way `json.dumps` does, so a raw newline inside a string, which
  strict JSON refuses, goes out escaped);
- any other value is sent whole once it ends, after the schema coercion
  the whole-call path applies;
- members are joined with `json.dumps`'s separators, so the text sent for
  well-formed arguments is exactly `json.dumps` of the parsed object, the
  text a non-streamed reply carries.

At the first thing the reader cannot accept it stops sending. At the end,
the repaired and coerced arguments are used when they extend what was
sent; otherwise what was sent is closed with the fewest characters that
make it JSON, and that is the record. A call the generation was cut off
in (`cut`) is neither repaired nor closed: its record is what was sent and
then the rest of its text as written, so no value appears that the model
did not write. mlx-lm's tool parsers read whole calls only, hence this
reader.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable

from inference.protocols.toolcalls import Nesting, _schema_type, _strip_framing_newline, decode_value

_WS = " \t\r\n"
_HIGH_SURROGATE = re.compile(r"[dD][89abAB][0-9a-fA-F]{2}")
_SCALAR_END = re.compile(r"[\s,}\]]")


class ArgumentStreamer:
    """Reads an arguments object's text as it grows (`feed` takes all of it
    each time, from its `{`) and answers the next piece to send."""

    def __init__(self, props: dict):
        self.props = props  # the tool's parameters.properties, for the coercion of string-typed members
        self.sent = ""
        self.broken = False
        self.done = False  # the object closed
        self._at = 0  # how far the text has been read
        self._state = "start"
        self._members = 0
        self._key = ""
        self._value_at = 0  # where the current value starts (a string: its first character not yet sent)
        self._raw_at = 0  # where the text not yet rendered into `sent` starts
        self.whole_to = 0  # the length of `sent` up to the end of its last whole member (or its `{`)
        self._nesting: Nesting | None = None
        self._escaped = False  # the string being read ended its text on a backslash
        self._text = ""

    def feed(self, text: str) -> str:
        before = len(self.sent)
        self._text = text
        while not (self.broken or self.done) and self._step(text):
            pass
        return self.sent[before:]

    def close(self, repair: Callable[[], str | None]) -> tuple[str, str]:
        """The last piece and the recorded arguments, at the end of the call.
        `repair`: the whole-call path's reading of the same text, asked for
        only when the reader had stopped."""
        before = len(self.sent)
        if not (self.broken or self.done):
            self._finish_open()
        if self.done:
            return self.sent[before:], self.sent
        repaired = repair()
        if repaired is not None and repaired.startswith(self.sent):
            self.sent = repaired
            return self.sent[before:], repaired
        tail = ('"' if self._state == "string" else "") + "}"
        if not self.sent:
            tail = "{}"
        self.sent += tail
        return self.sent[before:], self.sent

    def cut(self) -> tuple[str, str]:
        """The last piece and the recorded arguments of a call the generation
        ended inside: what was sent, then the text not rendered yet as written
        (a value or key cut short, an escape cut in half), never closed."""
        before = len(self.sent)
        if not (self.done or self.broken):  # a reader that stopped at text it could not accept sends no more
            self.sent += self._text[self._raw_at:]
        return self.sent[before:], self.sent

    # -- the reader: each step consumes what it can and says whether it moved --

    def _step(self, text: str) -> bool:
        state = self._state
        if state == "string":
            return self._string(text)
        if state == "value":
            return self._value(text, final=False)
        at = self._skip(text)
        if at >= len(text):
            return False
        ch = text[at]
        if state == "start":
            return self._expect(ch == "{", at, "key_or_end", "{")
        if state in ("key_or_end", "key"):
            if ch == "}" and state == "key_or_end":
                return self._close_object(at)
            if ch != '"':
                return self._break()
            return self._read_key(text, at)
        if state == "colon":
            return self._expect(ch == ":", at, "value_start", "")
        if state == "value_start":
            return self._start_value(text, at)
        if state == "after_value":
            if ch == "}":
                return self._close_object(at)
            return self._expect(ch == ",", at, "key", "")
        return self._break()

    def _skip(self, text: str) -> int:
        at = self._at
        while at < len(text) and text[at] in _WS:
            at += 1
        self._at = at
        return at

    def _expect(self, ok: bool, at: int, state: str, send: str) -> bool:
        if not ok:
            return self._break()
        self._at, self._state = at + 1, state
        if send:  # the object's `{` (a colon or comma goes out with the member it leads to)
            self.sent += send
            self._raw_at, self.whole_to = at + 1, len(self.sent)
        return True

    def _break(self) -> bool:
        self.broken = True
        return False

    def _close_object(self, at: int) -> bool:
        self._at, self._raw_at, self.done = at + 1, at + 1, True
        self.sent += "}"
        return True

    def _read_key(self, text: str, at: int) -> bool:
        end = _string_end(text, at + 1)
        if end is None:
            return False
        try:
            self._key = json.loads(text[at:end + 1])
        except ValueError:
            return self._break()
        self._at, self._state = end + 1, "colon"
        return True

    def _member_head(self) -> str:
        return (", " if self._members else "") + json.dumps(self._key, ensure_ascii=False) + ": "

    def _start_value(self, text: str, at: int) -> bool:
        if text[at] == '"':
            self.sent += self._member_head() + '"'
            self._at, self._value_at, self._state, self._escaped = at + 1, at + 1, "string", False
            self._raw_at = at + 1
            return True
        self._at, self._value_at, self._state = at, at, "value"
        self._nesting = Nesting() if text[at] in "{[" else None
        return True

    def _string(self, text: str) -> bool:
        """Send what is new of a string value; close it at its quote. Reads
        each character once: a long string streams in linear time."""
        at, escaped = self._at, self._escaped
        while at < len(text) and (escaped or text[at] != '"'):
            escaped = not escaped and text[at] == "\\"
            at += 1
        self._at, self._escaped = at, escaped
        closed = at < len(text)
        raw = text[self._value_at:at]
        ready = raw if closed else _decodable(raw)
        encoded = _encode_string(ready)
        if encoded is None:
            return self._break()
        self.sent += encoded
        self._value_at += len(ready)
        self._raw_at = self._value_at
        if not closed:
            return False
        self.sent += '"'
        self._at, self._state, self._members = at + 1, "after_value", self._members + 1
        self._raw_at, self.whole_to = at + 1, len(self.sent)
        return True

    def _value(self, text: str, final: bool) -> bool:
        """A number, literal, object or array: sent whole when it ends."""
        if self._nesting is not None:
            close = self._nesting.scan(text[self._value_at:])
            end = None if close is None else self._value_at + close
        else:
            match = _SCALAR_END.search(text, self._value_at)
            end = match.start() if match else None
        if end is None and final:
            end = len(text)
        if end is None:
            return False
        try:
            value = json.loads(text[self._value_at:end])
        except ValueError:
            return self._break()
        if _schema_type(self.props.get(self._key)) == "string" and value is not None and not isinstance(value, str):
            value = json.dumps(value)  # as the whole-call path coerces it
        self.sent += self._member_head() + json.dumps(value, ensure_ascii=False)
        self._at, self._state, self._members = end, "after_value", self._members + 1
        self._raw_at, self.whole_to = end, len(self.sent)
        return True

    def _finish_open(self) -> None:
        """The text ended inside the object: finish the member it was in
        (a member whose key or value never came is left out)."""
        if self._state == "string":
            self._string(self._text)
            if not self.broken and self._state == "string":
                self.sent += '"'
                self._state = "after_value"
        elif self._state == "value":
            self._value(self._text, final=True)
        if not self.broken and self._state != "start":
            self.sent += "}"
            self.done = True


def _string_end(text: str, at: int) -> int | None:
    """Where the string whose content starts at `at` has its closing quote."""
    escaped = False
    for i in range(at, len(text)):
        ch = text[i]
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            return i
    return None


def _decodable(raw: str) -> str:
    """A string's raw content up to where it can be decoded: without an escape
    cut off at its end (a high surrogate waits for its low half)."""
    i = 0
    while i < len(raw):
        if raw[i] != "\\":
            i += 1
        elif i + 1 == len(raw):
            return raw[:i]
        elif raw[i + 1] != "u":
            i += 2
        elif i + 6 > len(raw):
            return raw[:i]
        elif _HIGH_SURROGATE.fullmatch(raw[i + 2:i + 6]) and len(raw) - (i + 6) < 6 \
                and "\\u".startswith(raw[i + 6:i + 8]):
            return raw[:i]
        else:
            i += 6
    return raw


def _encode_string(raw: str) -> str | None:
    """The content of a JSON string as `json.dumps` writes it, from the model's
    raw content (control characters accepted and escaped); None if invalid."""
    fixed = "".join(json.dumps(ch)[1:-1] if ord(ch) < 0x20 else ch for ch in raw)
    try:
        value = json.loads('"' + fixed + '"')
        value.encode("utf-8")  # a lone surrogate cannot go on the wire
    except (ValueError, UnicodeEncodeError):
        return None
    return json.dumps(value, ensure_ascii=False)[1:-1]


_PARAMETER_OPEN = re.compile(r"<parameter=([^>\s]+)\s*>")
_VALUE_ENDS = ("</parameter>", "<parameter=", "</function>")


class XmlArgumentStreamer:
    """The same for Qwen3-Coder's `<parameter=k>value</parameter>` calls
    (`feed` takes the text after `<function=name>`). A value whose schema says
    string streams as it comes, less the newline that frames it; any other is
    sent once it ends, decoded by its schema as the whole-call path does."""

    broken = False  # whatever comes, the whole-call path reads it the same way

    def __init__(self, props: dict):
        self.props = props
        self.sent = ""
        self.done = False
        self._at = 0
        self._members = 0
        self._key: str | None = None  # the parameter being read
        self._value_at = 0  # where its value starts
        self._sent_to = 0  # a string value: how far its text has been sent
        self._text = ""

    def feed(self, text: str) -> str:
        before, self._text = len(self.sent), text
        while not self.done and self._step(text, final=False):
            pass
        return self.sent[before:]

    def close(self, repair: Callable[[], str | None]) -> tuple[str, str]:
        before = len(self.sent)
        if not self.done:
            while self._step(self._text, final=True):
                pass
            self.sent = (self.sent or "{") + "}"
            self.done = True
        return self.sent[before:], self.sent

    def cut(self) -> tuple[str, str]:
        """A call the generation ended inside: what was sent, as it stands (a
        value not sent yet is not guessed at; the text is markup, not JSON)."""
        return "", self.sent

    def _step(self, text: str, final: bool) -> bool:
        if self._key is not None:
            return self._value(text, final)
        found = _PARAMETER_OPEN.search(text, self._at)
        closing = text.find("</function>", self._at)
        if closing >= 0 and (found is None or closing < found.start()):
            self.sent = (self.sent or "{") + "}"
            self.done = True
            return False
        if found is None:
            return False
        self._key, self._at = found.group(1), found.end()
        self._value_at = self._sent_to = found.end()
        self.sent = (self.sent or "{") + (", " if self._members else "") + json.dumps(self._key, ensure_ascii=False)
        self.sent += ": "
        if self._streams():
            self.sent += '"'
        return True

    def _streams(self) -> bool:
        return _schema_type(self.props.get(self._key)) == "string"

    def _value(self, text: str, final: bool) -> bool:
        hits = [at for at in (text.find(tag, self._value_at) for tag in _VALUE_ENDS) if at >= 0]
        end = min(hits) if hits else (len(text) if final else None)
        if self._streams():
            self._send_string(text, end)
        if end is None:
            return False
        if not self._streams():
            value = decode_value(_strip_framing_newline(text[self._value_at:end]), self.props.get(self._key))
            self.sent += json.dumps(value, ensure_ascii=False)
        else:
            self.sent += '"'
        self._at = end + len("</parameter>") if text.startswith("</parameter>", end) else end
        self._key, self._members = None, self._members + 1
        return True

    def _send_string(self, text: str, end: int | None) -> None:
        """Send what is settled of a string value: not the newline that may
        frame its start or end, nor what may be the start of a closing tag."""
        stop = end if end is not None else len(text) - _tag_prefix(text, self._value_at, _VALUE_ENDS)
        if self._sent_to == self._value_at:  # its first character decides the opening newline
            if stop == self._value_at:
                return
            if text[self._value_at] == "\n":
                self._sent_to += 1
        if stop > self._sent_to and text[stop - 1] == "\n":
            stop -= 1  # perhaps the closing frame; sent once something follows it
        if stop > self._sent_to:
            self.sent += json.dumps(text[self._sent_to:stop], ensure_ascii=False)[1:-1]
            self._sent_to = stop
        if end is not None and end > self._sent_to and text[self._sent_to:end] != "\n":
            self.sent += json.dumps(text[self._sent_to:end], ensure_ascii=False)[1:-1]
            self._sent_to = end


def _tag_prefix(text: str, start: int, tags: tuple[str, ...]) -> int:
    """Length of the longest end of `text[start:]` that begins one of `tags`."""
    for size in range(min(len(text) - start, max(len(t) for t in tags) - 1), 0, -1):
        if any(t.startswith(text[-size:]) for t in tags):
            return size
    return 0


def finished_members(arguments: str) -> dict:
    """The members an arguments object's JSON text holds whole: the input of a
    call cut off while it was written, without the member it was cut in (no
    value is made up for it); {} when there is none."""
    reader = ArgumentStreamer({})
    reader.feed(arguments)
    if reader.done:
        value = json.loads(reader.sent)
    else:
        value = json.loads(reader.sent[:reader.whole_to] + "}") if reader.whole_to else {}
    return value if isinstance(value, dict) else {}
