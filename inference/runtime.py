"""The process-wide serving state: the engine and the server's defaults.

`hearth serve` fills it before daphne starts; views read it. Without a
running engine (a management command, the admin) generation routes answer
503 in their protocol's shape.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from inference.engine.engine import Engine
from inference.engine.errors import EngineError
from inference.protocols.response_store import ResponseStore


class EngineUnavailable(EngineError):
    status = 503
    type = "engine_unavailable"
    code = "no_model_loaded"


@dataclass(frozen=True)
class ServerDefaults:
    """Operator overrides from `hearth serve` flags; None means unset."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


class _Runtime:
    engine: Engine | None = None
    defaults: ServerDefaults = ServerDefaults()
    started_at: int = int(time.time())
    draining: bool = False
    inflight: int = 0  # HTTP requests still being answered
    grammar_enabled: bool = True  # HEARTH_GRAMMAR
    sse_keepalive: float = 5.0  # HEARTH_SSE_KEEPALIVE: seconds between comments while a tool call buffers
    embeddings_enabled: bool = False  # the served model answers /v1/embeddings
    responses: ResponseStore = ResponseStore()  # stored Responses turns (`hearth serve --response-ttl`)
    local_url: str | None = None  # how this process reaches its own HTTP API (jobs that call the model use it)
    allowed_hosts: frozenset | None = None  # Host names requests may use; None: any (no server configured it)
    # Access control, set by `hearth serve`: accepted API keys (empty: none
    # required), origins allowed cross-origin (CORS), and whether the operator
    # chose to serve off loopback with no key.
    api_keys: frozenset = frozenset()
    cors_origins: frozenset = frozenset()
    insecure_no_auth: bool = False
    templates: object | None = None  # the TemplateSandbox, with --allow-client-templates

    def require_engine(self) -> Engine:
        if self.engine is None or self.engine.loaded is None:
            raise EngineUnavailable("no model is loaded in this process; start it with `hearth serve`")
        return self.engine


runtime = _Runtime()
