"""The composition root's one `Runtime`: built here, filled by `hearth
serve`, handed to requests by `RuntimeMiddleware` and to chat sockets by the
ASGI router, and wired to the apps' services once they are loaded
(`hearth/apps.py`). Only `hearth` imports it."""
from __future__ import annotations

from serving.runtime import Runtime

RUNTIME = Runtime()
