"""Who holds what a request made: with API keys, a resumable stream or a
stored Response belongs to the key that made it (its *holder*, a one-way
name of the key), and a request with another key is answered as if it did
not exist. `hearth/access.py` names each request's holder as it checks the
key (`request.hearth_holder`); the stores and routes below it ask here.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import hashlib
import hmac

HEADER = "X-Hearth-Holder"  # the holder a router or web node states for a request it forwards
_CHARS = frozenset("0123456789abcdef")


def holder_of(key_digest: str) -> str:
    """The holder name of the key with this SHA-256 digest: what streams and
    stored Responses record (on disk, in Redis), from which the key cannot be had."""
    return hashlib.sha256(("hearth-holder:" + key_digest).encode()).hexdigest()[:32]


def well_formed(stated: str) -> bool:
    return len(stated) <= 64 and set(stated) <= _CHARS


def of(request) -> str:
    """The holder of a request ("" when no key is required: everything is everyone's)."""
    return getattr(request, "hearth_holder", "")


def may_see(owner: str, holder: str) -> bool:
    """Whether a request held by `holder` may see what `owner` made ("" made
    it: made before keys were required, or a chat turn, which every
    signed-in key shares)."""
    return not owner or hmac.compare_digest(owner, holder)
