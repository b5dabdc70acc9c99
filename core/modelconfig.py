"""What a model's config.json says about it, read one way for the engine, the library and the chat."""
from __future__ import annotations

from pathlib import Path

from core.paths import PathRefused, read_json

# The keys model families use for the longest sequence they were built for, in the order tried;
# multimodal configs keep it in their `text_config`.
WINDOW_KEYS = ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length")


def context_window(config: dict) -> int | None:
    """The context window a model's config declares, or None."""
    for key in WINDOW_KEYS:
        value = config.get(key) or (config.get("text_config") or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def folder_window(folder: Path) -> int | None:
    """The context window of the model in `folder`, or None where its config.json is missing or unreadable."""
    try:
        config = read_json(folder / "config.json", "config.json")
    except (OSError, ValueError, PathRefused):
        return None
    return context_window(config) if isinstance(config, dict) else None
