"""What the protocol modules are told by the server that runs them: the
operator's sampling defaults, the bounds on a request, whether grammars
compile, the client-template sandbox, the SSE keep-alive interval. Passed
in with every call; the modules read no process-wide state."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core import limits as core_limits

if TYPE_CHECKING:
    from inference.engine.types import HlgParams
    from inference.protocols.template_sandbox import TemplateSandbox


@dataclass(frozen=True)
class ServerDefaults:
    """Operator overrides from `hearth serve` flags; None means unset."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    hlg: HlgParams | None = None  # --hlg-sampling: what a request's `hlg` object is merged over
    thinking: bool | None = None  # --thinking on/off: enable_thinking for a request that does not say; None: auto


@dataclass(frozen=True)
class Options:
    defaults: ServerDefaults = ServerDefaults()
    # The bounds `hearth serve` settled on (by default, those of this process's environment).
    limits: core_limits.Limits = field(default_factory=core_limits.current)
    grammar_enabled: bool = True  # HEARTH_GRAMMAR
    templates: TemplateSandbox | None = None  # with --allow-client-templates
    sse_keepalive: float = 5.0  # HEARTH_SSE_KEEPALIVE: seconds between keep-alive comments
