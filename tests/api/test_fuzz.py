"""Fuzzing from the contract: schemathesis reads `/v1/openapi.json` and
`/api/openapi.json` from a real `hearth serve` and sends every documented
route a bounded number of generated requests: valid ones, ones that break
the schema (wrong types, missing fields, odd strings), and, on generation
routes, valid messages with every other field generated. Every answer must
come within a time limit (a stream read to its end), never be a 5xx, and,
when it is an error, be in its surface's one shape. Afterwards the server
still answers a normal chat completion.

The server is this module's own, in its own homes, on the tiny model: the
fuzz posts to job, download, memory and cache routes, so nothing it changes
reaches the other tests. It runs without a job worker (a submitted job
stays queued and trains nothing), offline (a download fails at once), with
a small context cap (a generated request costs at most a few dozen tokens).
Every route of both documents is fuzzed; none is left out.
"""
from __future__ import annotations

import json
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.helpers import TINY_REPO, ServerProcess, build_tiny_model, server_env

MAX_EXAMPLES = 8  # generated requests per route and run (positive, negative, anchored): every route, each run
REQUEST_TIMEOUT = 30.0  # seconds for a whole answer, a streamed one included: longer is a hang
MAX_CONTEXT = 96  # tokens of prompt plus generation the fuzz server allows

# Routes whose answer is meant to outlive a request: read for a short while,
# then let go. A job's event stream follows the job until it ends, and with
# no worker a queued job never does.
LONG_LIVED = {("GET", "/api/jobs/{job_id}/stream"): 3.0}

# Derandomized: the same requests every run. No shrinking: a failing request
# is reported as it was sent, without re-sending slower variants of it.
FUZZ_SETTINGS = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                         phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
                         report_multiple_bugs=False)

# The fields without which a generation route stops at its first check.
# The "anchored" run keeps every generated field but these, so the fuzz
# reaches sampling, grammar, template and streaming code with odd values.
HI = [{"role": "user", "content": "Hi"}]
ANCHORS = {
    "/v1/chat/completions": {"messages": HI},
    "/v1/completions": {"prompt": "Hi"},
    "/v1/messages": {"messages": HI},
    "/v1/messages/count_tokens": {"messages": HI},
    "/v1/responses": {"input": "Hi"},
    "/v1/embeddings": {"input": "Hi"},
}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    hf_home, hearth_home = root / "hf", root / "hearth"
    build_tiny_model(hf_home / "hub")
    from serving.demo.whisper_build import write_random

    whisper = write_random(root / "whisper")  # the audio routes answer 503 without one
    env = dict(server_env(hf_home, hearth_home), HEARTH_ALLOW_PATHS=str(root),
               HF_ENDPOINT="http://127.0.0.1:9",  # no hub, even if offline mode were off
               HEARTH_MCP_COMMANDS="0")  # a generated MCP configuration never runs a generated command
    proc = ServerProcess(env, TINY_REPO, "--no-worker", "--embeddings", "--max-context", str(MAX_CONTEXT),
                         "--max-tokens", "16", "--whisper-model", str(whisper), log_path=root / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        code = proc.stop()
        assert code == 0, f"server exited {code} on SIGTERM:\n{proc.output()}"


def _schema(server: ServerProcess, document: str):
    config = schemathesis.Config.from_dict({"base-url": server.url, "max-stream-events": 100_000})
    return schemathesis.openapi.from_url(f"{server.url}/{document}/openapi.json", config=config, timeout=10)


@pytest.fixture(scope="module")
def v1_schema(fuzz_server):
    return _schema(fuzz_server, "v1")


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return _schema(fuzz_server, "api")


def _json(content: bytes) -> object:
    try:
        return json.loads(content)
    except ValueError:
        return None


def error_shape(path: str, body: object) -> str | None:
    """What is wrong with an error answer on `path`, or None when it is in its surface's shape."""
    if not isinstance(body, dict):
        return "the error body is not a JSON object"
    if path.startswith("/api/"):
        if body.get("ok") is not False or not isinstance(body.get("error"), str) or not body["error"]:
            return 'an /api error must be {"ok": false, "error": message}'
        return None
    error = body.get("error")
    if path.startswith("/v1/messages"):
        if body.get("type") != "error" or not isinstance(error, dict) \
                or not isinstance(error.get("type"), str) or not isinstance(error.get("message"), str):
            return 'an Anthropic error must be {"type": "error", "error": {"type", "message"}}'
        return None
    if not isinstance(error, dict) or not {"message", "type", "param", "code"} <= set(error) \
            or not isinstance(error["message"], str) or not isinstance(error["type"], str):
        return 'an OpenAI error must be {"error": {"message", "type", "param", "code"}}'
    return None


def check_answer(case, response, elapsed: float, limit: float, long_lived: bool) -> None:
    detail = f"{case.as_curl_command()}\nanswer {response.status_code}: {response.content[:500]!r}"
    assert response.status_code < 500, f"server error\n{detail}"
    assert long_lived or not response.stream_cut_short, f"the stream did not end within {limit} s\n{detail}"
    assert elapsed < limit + 5, f"answered after {elapsed:.1f} s\n{detail}"
    if response.status_code >= 400:
        wrong = error_shape(case.operation.path, _json(response.content))
        assert wrong is None, f"{wrong}\n{detail}"


def _runs(operation) -> list[tuple[str, GenerationMode, dict | None]]:
    """(name, generation mode, anchor) of each run an operation gets."""
    runs = [("positive", GenerationMode.POSITIVE, None), ("negative", GenerationMode.NEGATIVE, None)]
    if operation.path in ANCHORS:
        runs.append(("anchored", GenerationMode.POSITIVE, ANCHORS[operation.path]))
    return runs


def _send(operation, mode: GenerationMode, anchor: dict | None) -> None:
    """Up to MAX_EXAMPLES generated requests to `operation`, each answer checked."""
    limit = LONG_LIVED.get((operation.method.upper(), operation.path))

    @FUZZ_SETTINGS
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        if anchor is not None and isinstance(case.body, dict):
            case.body = {**case.body, **anchor}
        started = time.monotonic()
        response = case.call(timeout=limit or REQUEST_TIMEOUT)
        check_answer(case, response, time.monotonic() - started, limit or REQUEST_TIMEOUT, limit is not None)

    run()


def fuzz(schema) -> list[str]:
    """Every operation of `schema`, in every run; the failures, the first of
    each operation and run (empty: none)."""
    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()  # a document schemathesis cannot read fails the test here
        for name, mode, anchor in _runs(operation):
            try:
                _send(operation, mode, anchor)
            except Unsatisfiable:
                # Nothing in the operation can be made invalid (no body, no typed parameter):
                # it has no negative requests, and its positive run covered it.
                assert mode is GenerationMode.NEGATIVE, f"{operation.label}: no {name} request can be generated"
            except Exception as exc:  # reported together, so one run shows every failing route
                failures.append(f"{operation.label} ({name}): {type(exc).__name__}: {exc}")
    return failures


def test_v1_routes_answer_in_their_shape(v1_schema):
    failures = fuzz(v1_schema)
    assert not failures, "\n\n".join(failures)


def test_api_routes_answer_in_their_shape(api_schema):
    failures = fuzz(api_schema)
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize(("path", "body", "right"), [
    ("/v1/chat/completions", {"error": {"message": "m", "type": "t", "param": None, "code": None}}, True),
    ("/v1/chat/completions", {"detail": "Not Found"}, False),
    ("/v1/messages", {"type": "error", "error": {"type": "t", "message": "m"}}, True),
    ("/v1/messages/count_tokens", {"error": {"message": "m", "type": "t", "param": None, "code": None}}, False),
    ("/api/jobs", {"ok": False, "error": "m"}, True),
    ("/api/jobs", {"ok": True, "error": "m"}, False),
    ("/api/jobs", {"detail": "m"}, False),
    ("/api/jobs", None, False),  # not JSON (an HTML error page)
])
def test_the_shape_check_tells_the_surfaces_apart(path, body, right):
    assert (error_shape(path, body) is None) is right


def _post(server: ServerProcess, path: str, text: str) -> httpx.Response:
    """`text` as the body, byte for byte (httpx's json= cannot encode a lone surrogate)."""
    return httpx.post(server.url + path, content=text.encode(), timeout=60,
                      headers={"Content-Type": "application/json"})


LONE = r'"\ud800 x"'  # JSON that parses to a string no encoder takes
HUGE = "1" + "0" * 400  # an integer beyond a float's range


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", '{"prompt": %s}' % LONE),
    ("/v1/embeddings", '{"input": [%s]}' % LONE),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}], "guided_regex": %s}' % LONE),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": %s}]}' % LONE),
    ("/v1/messages", '{"messages": [{"role": "user", "content": %s}], "max_tokens": 4}' % LONE),
    ("/v1/responses", '{"input": "Hi", "instructions": %s}' % LONE),
    ("/api/settings/hf-token", '{"token": %s}' % LONE),
])
def test_a_lone_surrogate_is_refused_in_the_routes_shape(fuzz_server, path, body):
    answer = _post(fuzz_server, path, body)
    assert answer.status_code == 400, answer.text
    assert error_shape(path, answer.json()) is None, answer.text
    assert "unpaired surrogate" in answer.text


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty"])
def test_a_number_beyond_float_range_is_refused_naming_its_field(fuzz_server, field):
    answer = _post(fuzz_server, "/v1/chat/completions",
                   '{"messages": [{"role": "user", "content": "Hi"}], "%s": %s}' % (field, HUGE))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == field


def test_server_still_serves_after_the_fuzz(fuzz_server):
    answer = httpx.post(fuzz_server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    assert body["usage"]["completion_tokens"] >= 1
    streamed = httpx.post(fuzz_server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "stream": True})
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]"), streamed.text
    assert httpx.get(fuzz_server.url + "/health", timeout=10).status_code == 200
