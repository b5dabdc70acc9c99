"""The inference engine: one thread owns every MLX call.

Nothing in this package imports Django, ninja or Channels (a test walks the
imports); protocol modules translate wire JSON into `GenerationRequest`s and
`GenerationEvent`s back into wire JSON.
"""
from inference.engine.errors import EngineClosed, EngineError, ModelLoadError, ModelNotFound, QueueFull
from inference.engine.types import GenerationEvent, GenerationRequest, SamplingParams, Usage

__all__ = [
    "EngineClosed", "EngineError", "GenerationEvent", "GenerationRequest", "ModelLoadError",
    "ModelNotFound", "QueueFull", "SamplingParams", "Usage",
]
