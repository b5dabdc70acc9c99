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


class InvalidRequest(EngineError):
    """A request field the engine cannot run; `param` names it."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


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


class PromptTooLong(EngineError):
    """The prompt leaves no room to generate within `limit` tokens; refused
    before any prefill. `max_prompt_tokens` is the longest prompt that fits."""

    status = 400

    def __init__(self, message: str, prompt_tokens: int = 0, limit: int = 0):
        super().__init__(message)
        self.prompt_tokens, self.limit = prompt_tokens, limit

    @property
    def max_prompt_tokens(self) -> int:
        return max(self.limit - 1, 0)  # one token of room to generate


class ContextLengthExceeded(PromptTooLong):
    """The prompt alone fills the model's own context window."""

    type = "invalid_request_error"
    code = "context_length_exceeded"
    param = "messages"


class ContextOverBudget(PromptTooLong):
    """The prompt alone fills the operator's context or memory cap."""

    type = "memory_admission"
    code = "context_over_budget"
