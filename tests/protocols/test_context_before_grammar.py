"""A prompt too long for the model is refused before any grammar compiles:
a compile (500 tools under a required tool_choice, a huge json_schema) takes
seconds of a grammar process, and the refusal costs nothing."""
from __future__ import annotations

import pytest

TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}}}} for i in range(50)]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "r", "schema": {
    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}


@pytest.mark.parametrize("path, extra, param", [
    ("/v1/chat/completions", {"tools": TOOLS, "tool_choice": "required"}, "messages"),
    ("/v1/chat/completions", {"response_format": SCHEMA}, "messages"),
    ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "r",
                                           "schema": SCHEMA["json_schema"]["schema"]}}}, "input"),
    ("/v1/completions", {"response_format": SCHEMA}, "prompt"),
])
def test_a_prompt_over_the_window_is_refused_before_its_grammar_compiles(inproc, monkeypatch, path, extra, param):
    from inference.protocols import openai

    compiles = []
    real = openai._resolve

    async def resolve(*args):
        compiles.append(args[1])
        return await real(*args)

    monkeypatch.setattr(openai, "_resolve", resolve)
    long = "hello " * 4000  # over the tiny model's 2,048-token window
    body = {"input": long} if path == "/v1/responses" else {"prompt": long} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": long}]}
    r = inproc.post(path, json={**body, "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded" and r.json()["error"]["param"] == param
    assert [c for c in compiles if c is not None] == []
    short = {"input": "hi"} if path == "/v1/responses" else {"prompt": "hi"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "hi"}]}
    assert inproc.post(path, json={**short, "max_tokens": 4, **extra}).status_code == 200
    assert [c for c in compiles if c is not None]
