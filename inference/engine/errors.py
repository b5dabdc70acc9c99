"""Typed engine errors; each API renders them in its own protocol shape."""


class EngineError(Exception):
    """Base class. `status` is the HTTP status the adapters answer with."""

    status = 500
    type = "server_error"
    code: str | None = None
    param: str | None = None  # the request field at fault, when there is one


class EngineTimeout(EngineError):
    """The engine thread did not get to a call in time (it may still run it)."""

    status = 503
    type = "engine_unavailable"
    code = "engine_busy"


class ModelNotFound(EngineError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class ModelLoadError(EngineError):
    status = 500


class QueueFull(EngineError):
    status = 429
    type = "resource_admission"
    code = "queue_full"


class EngineClosed(EngineError):
    status = 503
    type = "engine_unavailable"
    code = "shutting_down"


class ContextOverBudget(EngineError):
    """The prompt alone fills the operator's context or memory cap."""

    status = 400
    type = "memory_admission"
    code = "context_over_budget"
