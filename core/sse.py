"""Server-sent events framing, for every stream Hearth sends.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import json

KEEP_ALIVE = b": keep-alive\n\n"


def frame(data, event: str | None = None) -> bytes:
    """One event: `data` as JSON (a string is sent as it is), with an `event:` line when named.
    A string's line breaks become one `data:` line each, which a receiver joins with "\\n"
    (SSE has no way to send a carriage return: "\\r\\n" and "\\r" arrive as "\\n")."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    if "\n" in text or "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\ndata: ")
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()
