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

Each large build waiting there holds its request's body and messages (up to
`--max-body-bytes` each), so at most `MAX_LARGE` are taken at once, the one
building included; past that a large prompt is refused at once with
`QueueFull` (429 `queue_full` in the caller's protocol, as a full
generation queue is). A build counts until its thread is done with it, also
when its client left while it ran: a client that sends and drops cannot
queue more (one that leaves while its build still waits takes it out of
the queue).

No Django here."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from inference.engine.errors import QueueFull

T = TypeVar("T")

LARGE_CHARS = 64 * 1024  # a build of more characters than this is a large one
# Large builds taken at once. Each takes up to seconds of the thread, so the eighth waits several of them;
# eight is the bound the engine keeps on calls waiting for its one exclusive thread (solo.MAX_SOLO) too.
MAX_LARGE = 8

_large = ThreadPoolExecutor(1, thread_name_prefix="hearth-large-prompt")
_lock = threading.Lock()
_taken = 0  # large builds submitted whose thread has not finished them


async def run(chars: int, fn: Callable[..., T], *args) -> T:
    """`fn(*args)` off the event loop: on the loop's executor, or on the
    large builds' thread when the prompt is over `LARGE_CHARS` characters
    (`QueueFull` while `MAX_LARGE` are taken). A build whose request is
    cancelled (its client left) is dropped while it waits, and runs to its
    end once started: a thread cannot be stopped."""
    if chars <= LARGE_CHARS:
        return await asyncio.to_thread(fn, *args)
    global _taken
    with _lock:
        if _taken >= MAX_LARGE:
            raise QueueFull(f"{MAX_LARGE} prompts over {LARGE_CHARS} characters are already waiting to be "
                            "built; retry later")
        _taken += 1
    try:
        future = _large.submit(fn, *args)
    except BaseException:
        _release()
        raise
    future.add_done_callback(_release)  # built, failed, or dropped from the queue by its cancelled request
    return await asyncio.wrap_future(future)


def _release(_future: object = None) -> None:
    global _taken
    with _lock:
        _taken -= 1
