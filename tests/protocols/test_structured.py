"""Grammar-constrained output through xgrammar, on the random tiny model."""
import json
import re

import httpx
import pytest

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["Ana", "Ben", "Chloe"]},
        # Bounded free text: xgrammar's own rule for it admits raw control characters
        # (not JSON); structured.bounded_strings rewrites it so the output always parses.
        "nick": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
    },
    "required": ["name", "nick", "age", "ok", "tags"],
    "additionalProperties": False,
}


def valid(obj) -> bool:
    return (isinstance(obj, dict) and list(obj) == ["name", "nick", "age", "ok", "tags"]
            and obj["name"] in ("Ana", "Ben", "Chloe") and isinstance(obj["nick"], str)
            # A random model strings byte tokens into invalid UTF-8, which decodes to one U+FFFD a byte:
            # the grammar bounds characters it can see, not those.
            and 1 <= len(obj["nick"]) and len(obj["nick"].replace("\ufffd", "")) <= 12
            and isinstance(obj["age"], int) and 0 <= obj["age"] <= 120
            and isinstance(obj["ok"], bool) and isinstance(obj["tags"], list) and len(obj["tags"]) <= 3
            and set(obj["tags"]) <= {"x", "y"})


def _body(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "Describe a person."}], "max_tokens": 200,
            "temperature": 1.0, "top_k": 0, **fields}


def chat(base_url, **fields):
    return httpx.post(base_url + "/v1/chat/completions", json=_body(**fields), timeout=120)


@pytest.mark.parametrize("seed", range(20))
def test_json_schema_output_validates_for_every_seed(base_url, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True,
                                                  "any_whitespace": False}}
    r = chat(base_url, seed=seed, response_format=fmt)
    assert r.status_code == 200 and "warning" not in r.headers
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    assert valid(json.loads(choice["message"]["content"])), choice["message"]["content"]


def test_json_is_compact_unless_whitespace_is_asked_for(base_url):
    """A random model would pad JSON with whitespace to its token limit; by default the grammar allows
    none beyond one space after `:` and `,`, and `any_whitespace` allows runs of at most 16."""
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    for seed in range(3):
        text = chat(base_url, seed=seed, response_format=fmt).json()["choices"][0]["message"]["content"]
        assert text == json.dumps(json.loads(text), ensure_ascii=False), text
        # Any object: a random model may still be inside one at its token limit, but never padding it.
        text = chat(base_url, seed=seed, response_format={"type": "json_object"}).json()["choices"][0]["message"][
            "content"]
        assert text.startswith("{") and not re.search(r"\s\s", text), text
    loose = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "any_whitespace": True}}
    for seed in range(3):
        reply = chat(base_url, seed=seed, response_format=loose).json()["choices"][0]
        assert not re.search(r"\s{17}", reply["message"]["content"]), reply


@pytest.fixture(scope="module")
def no_whitespace(tiny_model):
    """logit_bias that keeps a random model from padding JSON with whitespace
    forever (the grammar allows any amount when any_whitespace is on)."""
    from huggingface_hub import snapshot_download
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(snapshot_download(tiny_model, local_files_only=True) + "/tokenizer.json")
    return {str(i): -100 for i in range(tok.get_vocab_size()) if not tok.decode([i]).strip()}


def test_structured_outputs_alias_and_completions_route(base_url, no_whitespace):
    r = httpx.post(base_url + "/v1/completions", json={"prompt": "Person:", "max_tokens": 200, "seed": 1,
                                                       "temperature": 1.0, "structured_outputs": SCHEMA,
                                                       "logit_bias": no_whitespace})
    assert r.status_code == 200 and "warning" not in r.headers
    assert valid(json.loads(r.json()["choices"][0]["text"]))


def test_choice_regex_and_grammar(base_url):
    for seed in range(3):
        text = chat(base_url, seed=seed, guided_choice=["yes", "no", "maybe"]).json()["choices"][0]
        assert text["message"]["content"] in ("yes", "no", "maybe") and text["finish_reason"] == "stop"
        text = chat(base_url, seed=seed, guided_regex="[a-c]{3}-[0-9]{2}").json()["choices"][0]["message"]
        assert re.fullmatch("[a-c]{3}-[0-9]{2}", text["content"]), text
        grammar = 'root ::= "(" digit ("+" digit)* ")"\ndigit ::= [0-9]'
        text = chat(base_url, seed=seed, guided_grammar=grammar, max_tokens=40).json()["choices"][0]
        assert text["finish_reason"] == "length" or re.fullmatch(r"\(\d(\+\d)*\)", text["message"]["content"])


def test_json_object_streams_valid_json(base_url, no_whitespace):
    body = {"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 300, "stream": True,
            "temperature": 0.8, "seed": 5, "response_format": {"type": "json_object"},
            "logit_bias": no_whitespace}
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    if chunks[-1]["choices"][0]["finish_reason"] == "stop":
        json.loads(text)
    else:  # ran out of tokens mid-value: still a prefix of JSON, never free text
        assert text.lstrip()[:1] in ("{", "[")


def test_precedence_guided_grammar_wins(base_url):
    r = chat(base_url, seed=2, guided_grammar='root ::= "A" | "B"', guided_choice=["zzz"],
             response_format={"type": "json_object"})
    assert r.json()["choices"][0]["message"]["content"] in ("A", "B")


def test_text_format_is_no_constraint(base_url):
    r = chat(base_url, seed=2, max_tokens=5, response_format={"type": "text"})
    assert r.status_code == 200 and "warning" not in r.headers


def test_uncompilable_grammar_degrades_with_a_warning(base_url):
    plain = chat(base_url, seed=1, max_tokens=2)
    r = chat(base_url, seed=1, max_tokens=2, guided_grammar="root ::= (")
    assert r.status_code == 200
    assert r.headers["warning"].startswith("grammar not enforced: ")
    # Chat adds a system instruction in place of the grammar.
    assert r.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"]
    t = httpx.post(base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "guided_regex": "(["})
    assert t.status_code == 200 and t.headers["warning"].startswith("grammar not enforced: ")


@pytest.mark.parametrize("fields,param", [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": "yes"}, "guided_choice"),
    ({"guided_regex": 5}, "guided_regex"),
    ({"structured_outputs": "not a schema"}, "structured_outputs"),
])
def test_malformed_constraint_fields_are_400(inproc, fields, param):
    r = inproc.post("/v1/chat/completions", json=_body(**fields))
    assert r.status_code == 400 and r.json()["error"]["param"] == param


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from huggingface_hub import snapshot_download
    from mlx_lm import load

    return load(snapshot_download(tiny_model, local_files_only=True))[1]


def _compiler(tok, **kw):
    from inference.engine.grammar import GrammarCompiler

    return GrammarCompiler(tok._tokenizer, len(tok.get_vocab()), sorted(tok.eos_token_ids), **kw)


def _compile_workers() -> set:
    import os

    from tests.helpers import children_running

    return children_running(os.getpid(), "inference.engine.grammar_worker")


# Seconds to compile on any machine (a JSON grammar takes hundredths), and a tenth of a megabyte of source.
SLOW_CHOICES = json.dumps([f"option {i} of many" for i in range(20_000)])


def test_compiled_grammars_are_cached(tokenizer):
    from inference.engine.grammar import GrammarSpec

    compiler = _compiler(tokenizer)
    try:
        spec = GrammarSpec("regex", "[ab]+")
        first = compiler.compile(spec)
        assert compiler.compile(GrammarSpec("regex", "[ab]+")) is first and compiler.hits == 1
    finally:
        compiler.close()


def test_a_compile_past_its_budget_is_stopped_and_refused_again_at_once(tokenizer):
    """xgrammar cannot interrupt a compile, so it runs in a process that is
    killed once the budget is spent: no core stays busy on a grammar nobody
    waits for, and asking again is refused without another compile."""
    from inference.engine.grammar import GrammarSpec, GrammarTimeout

    before = _compile_workers()
    compiler = _compiler(tokenizer, timeout_s=0.5)
    try:
        slow = GrammarSpec("choice", SLOW_CHOICES)
        with pytest.raises(GrammarTimeout, match="did not compile within 0.5 s"):
            compiler.compile(slow)
        assert compiler.stats()["timeouts"] == 1 and compiler.stats()["compiling"] == 0
        killed = [p for p in _compile_workers() - before if p.status() != "zombie"]
        assert compiler.stats()["workers"] == 0 and not killed, "the compile outlived its budget"
        misses = compiler.misses
        with pytest.raises(GrammarTimeout):
            compiler.compile(slow)
        assert compiler.misses == misses  # no second compile
        assert compiler.compile(GrammarSpec("json")) is not None  # a fresh process serves the next one
    finally:
        compiler.close()


def test_closing_the_compiler_stops_a_running_compile_at_once(tokenizer):
    """Shutdown never waits on a compile: closing fails the compiles under way and kills their processes."""
    import time

    from inference.engine.grammar import GrammarSpec, GrammarStopped

    before = _compile_workers()
    compiler = _compiler(tokenizer, timeout_s=60)
    future = compiler.submit(GrammarSpec("choice", SLOW_CHOICES))
    deadline = time.monotonic() + 60
    while not compiler.stats()["workers"]:  # the compile process is up and working
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    compiler.close()
    with pytest.raises(GrammarStopped, match="stopping"):
        future.result(timeout=5)
    assert time.monotonic() - started < 5
    assert not [p for p in _compile_workers() - before if p.is_running() and p.status() != "zombie"]


def test_bounded_strings_never_admit_control_characters():
    """xgrammar's rule for a string with maxLength accepts a raw control
    character (JSON that json.loads refuses); the rewritten schema does not,
    and keeps the bounds."""
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    from inference.protocols.structured import bounded_strings

    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}, "required": ["a"]}
    before = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    assert _is_grammar_accept_string(before, '{"a": "x\x01y"}')  # the flaw, still in xgrammar
    after = xgr.Grammar.from_json_schema(json.dumps(bounded_strings(schema)), any_whitespace=False)
    assert not _is_grammar_accept_string(after, '{"a": "x\x01y"}')
    assert _is_grammar_accept_string(after, '{"a": "abcde"}') and _is_grammar_accept_string(after, '{"a": ""}')
    assert not _is_grammar_accept_string(after, '{"a": "abcdef"}')
    nested = {"type": "array", "items": {"anyOf": [{"type": "string", "minLength": 2}, {"const": {
        "type": "string", "maxLength": 1}}]}}
    rewritten = bounded_strings(nested)["items"]["anyOf"]
    assert "minLength" not in rewritten[0] and rewritten[0]["pattern"].endswith("{2,}$")
    assert rewritten[1] == nested["items"]["anyOf"][1]  # data, not a schema: left as it is
    assert bounded_strings({"type": "string", "maxLength": 3, "pattern": "^a+$"})["maxLength"] == 3


def test_bounded_strings_cover_nullable_strings_and_odd_property_names_but_not_huge_bounds():
    from inference.protocols.structured import REWRITE_MOST, bounded_strings

    schema = {"type": "object", "properties": {
        "default": {"type": ["string", "null"], "maxLength": 5},  # a property named like a data keyword
        "essay": {"type": "string", "maxLength": 4 * REWRITE_MOST}}}
    out = bounded_strings(schema)["properties"]
    assert out["default"]["pattern"].endswith("{0,5}$") and out["default"]["type"] == ["string", "null"]
    assert out["essay"] == {"type": "string", "maxLength": 4 * REWRITE_MOST}  # unrolled, it would compile slowly


PREFILLED = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{\"a\": "}]


def test_continue_final_message_leaves_the_assistant_message_open(inproc, local_engine):
    """Chat completions answer a final assistant message with a turn of its own
    (as OpenAI does), unless the request sets `continue_final_message` (vLLM's
    field): then the reply continues that text, and a guided_* grammar
    constrains the continuation."""
    client = inproc.openai()
    encode = local_engine.loaded_model.tokenizer.encode
    head = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n{\"a\": "
    plain = client.chat.completions.create(model="m", messages=PREFILLED, max_tokens=1)
    assert plain.usage.prompt_tokens == len(encode(head + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
                                                   add_special_tokens=False))
    cont = client.chat.completions.create(model="m", messages=PREFILLED, max_tokens=20, extra_body={
        "continue_final_message": True, "guided_regex": "[0-9]{2}}"})
    assert cont.usage.prompt_tokens == len(encode(head, add_special_tokens=False))
    assert json.loads(PREFILLED[1]["content"] + cont.choices[0].message.content)["a"] >= 0


@pytest.mark.parametrize("fields, param", [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"structured_outputs": {"json": {"type": "object"}}}, "structured_outputs"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "continue_final_message"),
    ({"messages": [PREFILLED[0], {"role": "assistant", "content": ""}]}, "messages[1].content"),
    ({"messages": [PREFILLED[0], {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages[1].tool_calls"),
    ({"continue_final_message": "yes"}, "continue_final_message"),
    ({"chat_template_kwargs": {"continue_final_message": True}}, "chat_template_kwargs.continue_final_message"),
])
def test_a_continuation_that_cannot_hold_is_refused(inproc, fields, param):
    r = inproc.post("/v1/chat/completions", json={"messages": PREFILLED, "max_tokens": 3,
                                                  "continue_final_message": True, **fields})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_client_template_continues_the_final_message(served, tiny_model, local_engine):
    """A client's own chat template renders the continuation too (its worker
    leaves the final message open, with no generation prompt)."""
    app = served("--no-worker", "--allow-client-templates")
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    r = app.post("/v1/chat/completions", json={
        "model": tiny_model, "messages": PREFILLED, "max_tokens": 20, "continue_final_message": True,
        "guided_regex": "[0-9]{2}}", "chat_template_kwargs": {"chat_template": template}}).json()
    head = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n{\"a\": "
    encode = local_engine.loaded_model.tokenizer.encode
    assert r["usage"]["prompt_tokens"] == len(encode(head, add_special_tokens=False))
    assert json.loads(PREFILLED[1]["content"] + r["choices"][0]["message"]["content"])["a"] >= 0
