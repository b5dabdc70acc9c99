"""Rendering and tokenizing a prompt, off the event loop, with the large
ones taken one at a time on a thread of their own.

A prompt's build costs in proportion to its text: the 2,000,000 characters
`--max-prompt-chars` lets through take seconds of CPU and a few hundred MB
while the tokenizer holds the text's tokens, offsets and strings, before the
engine can say the prompt does not fit the model. Run side by side on the
loop's 32 threads, a client's burst of such prompts would take every core
from the engine and gigabytes of memory, and each thread's malloc arena
would keep its peak afterwards. So a build of more than `LARGE_CHARS`
characters runs on one thread kept for them, in arrival order (one arena
reused), and a smaller one never waits behind them.

No Django here."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

LARGE_CHARS = 64 * 1024  # a build of more characters than this is a large one

_large = ThreadPoolExecutor(1, thread_name_prefix="hearth-large-prompt")


async def run(chars: int, fn: Callable[..., T], *args) -> T:
    """`fn(*args)` off the event loop: on the loop's executor, or on the
    large builds' thread when the prompt is over `LARGE_CHARS` characters.
    A build whose request is cancelled (its client left) still runs: a
    thread cannot be stopped."""
    if chars <= LARGE_CHARS:
        return await asyncio.to_thread(fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_large, fn, *args)
