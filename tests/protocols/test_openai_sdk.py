"""The official openai SDK against a real `hearth serve` on the tiny model."""
import asyncio

import openai
import pytest

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there!"}]


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def test_chat_non_streaming(client, tiny_model):
    r = client.chat.completions.create(model="anything", messages=MESSAGES, max_tokens=12)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == tiny_model  # the request's model field is ignored; the served id echoes back
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_chat_streaming_matches_non_streaming(client):
    whole = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=16)
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=16, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 16
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    timings = chunks[-1].usage.model_extra["timings"]  # where its time went; the chat's speed readout reads it
    assert {"queue_ms", "prefill_ms", "decode_ms"} <= set(timings) and timings["decode_ms"] > 0


def test_async_client_runs_concurrent_requests(base_url):
    async def main():
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
        calls = [client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=6) for _ in range(3)]
        return await asyncio.gather(*calls)

    results = asyncio.run(main())
    assert [r.usage.completion_tokens for r in results] == [6, 6, 6]
    assert len({r.choices[0].message.content for r in results}) == 1  # greedy by the model's defaults


def test_text_completion_streaming_and_not(client):
    r = client.completions.create(model="m", prompt="The quick brown", max_tokens=10)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    chunks = list(client.completions.create(model="m", prompt="The quick brown", max_tokens=10, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 10


def test_max_completion_tokens_wins(client):
    r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10, max_completion_tokens=3)
    assert r.usage.completion_tokens == 3


def test_stop_string_is_cut_and_reported(client):
    free = client.completions.create(model="m", prompt="Hello", max_tokens=30).choices[0].text
    stop = free[8:11]
    assert len(stop) == 3, f"need a longer greedy continuation than {free!r}"
    expected = free[: free.find(stop)]
    r = client.completions.create(model="m", prompt="Hello", max_tokens=30, stop=[stop, "never-seen"])
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model="m", prompt="Hello", max_tokens=30, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_eos_counts_as_a_token_but_never_shows(client, eos_id):
    r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=5,
                                       logit_bias={str(eos_id): 100})
    assert r.choices[0].message.content == ""
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 1


def test_seed_reproduces_sampled_output(client):
    def sample(seed):
        return client.completions.create(model="m", prompt="Once", max_tokens=20, temperature=1.5,
                                         seed=seed, extra_body={"top_k": 0}).choices[0].text

    assert sample(11) == sample(11)
    assert len({sample(s) for s in (1, 2, 3, 4)}) > 1


def test_explicit_temperature_overrides_greedy_default(client):
    greedy = {client.completions.create(model="m", prompt="Once", max_tokens=12).choices[0].text
              for _ in range(2)}
    assert len(greedy) == 1
    hot = {client.completions.create(model="m", prompt="Once", max_tokens=12, temperature=2.0,
                                     extra_body={"top_k": 0}).choices[0].text for _ in range(4)}
    assert len(hot) > 1


def test_chat_template_kwargs_reach_the_template(client):
    plain = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1)
    probed = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1,
                                            extra_body={"chat_template_kwargs": {"probe": "abc abc abc"}})
    assert probed.usage.prompt_tokens > plain.usage.prompt_tokens


def test_text_parts_are_joined(client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there!"}]}]
    a = client.chat.completions.create(model="m", messages=parts, max_tokens=4)
    b = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hello there!"}],
                                       max_tokens=4)
    assert a.usage.prompt_tokens == b.usage.prompt_tokens
    assert a.choices[0].message.content == b.choices[0].message.content


def test_n_choices_are_rows_of_one_request(client):
    """`n` choices: each its own sample (a seed gives choice i the seed plus i), streamed with their index,
    the usage counting the prompt once; a grammar holds every choice."""
    ask = dict(model="m", messages=MESSAGES, max_tokens=8, temperature=1.0, top_p=1.0, seed=3)
    r = client.chat.completions.create(**ask, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2] and all(c.message.content for c in r.choices)
    one = client.chat.completions.create(**ask)
    assert r.choices[0].message.content == one.choices[0].message.content  # choice 0 is the seed's own sample
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    assert 3 <= r.usage.completion_tokens <= 3 * 8
    texts = {0: "", 1: "", 2: ""}
    finishes = {}
    for chunk in client.chat.completions.create(**ask, n=3, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
        if chunk.usage is not None:
            assert chunk.usage.completion_tokens == r.usage.completion_tokens
    assert texts == {c.index: c.message.content for c in r.choices} and set(finishes) == {0, 1, 2}
    person = {"type": "object", "properties": {"name": {"type": "string", "enum": ["Ana", "Ben"]}},
              "required": ["name"], "additionalProperties": False}
    shaped = client.chat.completions.create(**{**ask, "max_tokens": 40}, n=4, response_format={
        "type": "json_schema", "json_schema": {"name": "p", "schema": person}})
    assert all(c.message.content in ('{"name": "Ana"}', '{"name": "Ben"}') for c in shaped.choices), [
        (c.message.content, c.finish_reason) for c in shaped.choices]
    completions = client.completions.create(model="m", prompt="Once", max_tokens=5, n=2, seed=1, temperature=1.0)
    assert [c.index for c in completions.choices] == [0, 1]
    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(**{**ask, "n": 9})
    assert too_many.value.body["param"] == "n"
