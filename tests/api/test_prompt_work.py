"""A burst of huge prompts cannot take every core and gigabytes from the
others: prompts over `prompt_work.LARGE_CHARS` characters are rendered and
tokenized one at a time, and a small prompt never waits behind them."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from inference.protocols import chat, prompt_work

CHAT = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4}


def test_large_prompts_are_built_one_at_a_time_and_small_ones_pass_them(inproc, monkeypatch):
    real, lock, release = chat.build_prompt, threading.Lock(), threading.Event()
    inside, most = [0], [0]

    def build(model, messages, *args):
        if sum(len(m["content"]) for m in messages) <= prompt_work.LARGE_CHARS:
            return real(model, messages, *args)
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            release.wait(60)  # held until the small request below has been answered
            return real(model, messages, *args)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(chat, "build_prompt", build)
    arrived, run = [0], prompt_work.run

    async def counted(chars, fn, *args):
        if chars > prompt_work.LARGE_CHARS:
            with lock:
                arrived[0] += 1
        return await run(chars, fn, *args)

    monkeypatch.setattr(prompt_work, "run", counted)
    big = {**CHAT, "messages": [{"role": "user", "content": "hello " * 20_000}]}  # 120,000 characters
    with ThreadPoolExecutor(3) as pool:
        larges = [pool.submit(inproc.post, "/v1/chat/completions", json=big) for _ in range(3)]
        deadline = time.monotonic() + 60
        while arrived[0] < 3 and time.monotonic() < deadline:  # all three have arrived
            time.sleep(0.02)
        small = inproc.post("/v1/chat/completions", json=CHAT)
        assert small.status_code == 200 and small.json()["usage"]["completion_tokens"] == 4
        release.set()
        answers = [f.result(timeout=120) for f in larges]
    assert most[0] == 1
    for answer in answers:  # far over the tiny model's 2048-token window, in OpenAI's shape
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded"


def test_large_prompts_past_the_bound_are_refused_as_a_full_queue(inproc, monkeypatch):
    """Each large build waiting holds its body: past `MAX_LARGE` taken, the
    next large prompt is a 429 queue_full in its caller's protocol, at once;
    a place comes back when a build ends."""
    real, release, started = chat.build_prompt, threading.Event(), threading.Event()

    def build(model, messages, *args):
        if sum(len(m["content"]) for m in messages) > prompt_work.LARGE_CHARS:
            started.set()
            release.wait(60)  # the thread stays busy until the refusals below are in
        return real(model, messages, *args)

    monkeypatch.setattr(chat, "build_prompt", build)
    monkeypatch.setattr(prompt_work, "MAX_LARGE", 2)
    big = {**CHAT, "messages": [{"role": "user", "content": "hello " * 20_000}]}
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(inproc.post, "/v1/chat/completions", json=big) for _ in range(2)]
        deadline = time.monotonic() + 60
        while prompt_work._taken < 2 and time.monotonic() < deadline:  # one building, one waiting
            time.sleep(0.02)
        assert started.wait(60)
        try:
            refused = inproc.post("/v1/chat/completions", json=big)
            anthropic = inproc.post("/v1/messages", json=big)
            small = inproc.post("/v1/chat/completions", json=CHAT)  # small prompts are not counted
        finally:
            release.set()
        answers = [f.result(timeout=120) for f in held]
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "queue_full" and error["type"] == "resource_admission" and "2 prompts" in error["message"]
    assert anthropic.status_code == 429 and anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "rate_limit_error"
    assert small.status_code == 200
    for answer in answers:
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded"
    again = inproc.post("/v1/chat/completions", json=big)  # both places given back
    assert again.status_code == 400 and again.json()["error"]["code"] == "context_length_exceeded"
    assert prompt_work._taken == 0
