"""Server-sent events framing, for every stream Hearth sends.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import json

KEEP_ALIVE = b": keep-alive\n\n"


def frame(data, event: str | None = None) -> bytes:
    """One event: `data` as JSON (a string is sent as it is), with an `event:` line when named."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()
