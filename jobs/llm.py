"""The served model as a job sees it: this server's own OpenAI route, so a
job's requests are batched with everyone else's. A JSON schema goes down the
grammar path, so even a small model answers in a shape that parses."""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request


class ServedModel:
    """The served model over this server's own OpenAI route."""

    def __init__(self, api_url: str | None, model_name: str | None):
        if not api_url:
            raise ValueError("this job needs the served model; start it from a running `hearth serve`")
        self.url, self.model = api_url.rstrip("/") + "/v1/chat/completions", model_name

    def ask(self, messages: list[dict], schema: dict | None = None, max_tokens: int = 512,
            temperature: float = 0.7) -> str:
        return self.complete(messages, schema, max_tokens, temperature)[0]

    def complete(self, messages: list[dict], schema: dict | None = None, max_tokens: int = 512,
                 temperature: float = 0.7) -> tuple[str, str | None]:
        """(the reply's text, its finish reason)."""
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature, "seed": 0}
        if self.model:
            body["model"] = self.model
        if schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "reply", "schema": schema, "strict": True, "any_whitespace": False}}
        request = urllib.request.Request(self.url, json.dumps(body).encode(), _headers())
        for attempt in range(3):
            try:
                with urllib.request.urlopen(request, timeout=600) as r:
                    choice = json.loads(r.read())["choices"][0]
                    return choice["message"]["content"] or "", choice.get("finish_reason")
            except urllib.error.HTTPError as exc:
                if exc.code != 429 or attempt == 2:
                    detail = exc.read().decode(errors="replace")
                    if exc.code == 400 and _prompt_too_long(detail):
                        return "", "length"  # as if cut off at once: callers skip such an item
                    raise RuntimeError(f"the served model answered {exc.code}: {detail[:300]}") from None
                time.sleep(2 ** attempt)
            except urllib.error.URLError as exc:
                raise RuntimeError(f"could not reach the served model at {self.url}: {exc.reason}") from None
        raise RuntimeError("unreachable")


    def served_name(self) -> str | None:
        """The model a request that names none gets (its `/props`), or None when the server cannot say."""
        if self.model:
            return self.model
        props = self.url.removesuffix("/v1/chat/completions") + "/props"
        try:
            with urllib.request.urlopen(urllib.request.Request(props, headers=_headers()), timeout=10) as r:
                name = json.loads(r.read()).get("model_alias")
        except (OSError, ValueError, AttributeError):
            return None
        return name if isinstance(name, str) else None


def _headers() -> dict[str, str]:
    headers = {"content-type": "application/json"}
    key = os.environ.get("HEARTH_INTERNAL_KEY") or os.environ.get("HEARTH_API_KEY")
    if key:  # the server's own key for its jobs, or the operator's for a separately run worker
        headers["authorization"] = f"Bearer {key.strip()}"
    return headers


def _prompt_too_long(body: str) -> bool:
    """Whether an error body is the refusal of a prompt that leaves no room
    to generate (the model's window, or the operator's context cap)."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return False
    return code in ("context_length_exceeded", "context_over_budget")


def text_schema(limit: int) -> dict:
    """A string schema: starts with a visible character, at most `limit` long."""
    return {"type": "string", "pattern": f"^\\S[\\s\\S]{{0,{limit - 1}}}$"}
