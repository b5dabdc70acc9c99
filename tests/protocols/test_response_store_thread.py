"""A Responses turn is stored off the event loop (a turn may be megabytes of JSON, written to a file or to
Redis, and every other stream on the loop would wait for it), and still before its client is told the
response is complete: a `previous_response_id` sent at once finds it. An input past --max-messages is refused
before the store is read for its previous turn."""
from __future__ import annotations

import asyncio
import time

import pytest


@pytest.fixture
def puts(app, monkeypatch):
    """Where each `put` of the runtime's response store ran (True on the app's event loop), recorded once it
    has returned; each takes 0.3 s, as a large turn written to a slow disk would, so a reply sent without
    waiting for its store would be read before the record is there."""
    from hearth.root import RUNTIME

    store, seen = RUNTIME.responses, []
    original = store.put

    def put(*args, **kwargs):
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        time.sleep(0.3)
        result = original(*args, **kwargs)
        seen.append(on_loop)
        return result

    monkeypatch.setattr(store, "put", put)
    return seen


def test_a_turn_is_stored_off_the_loop_and_before_it_is_answered(app, oai, puts):
    first = oai.responses.create(model="m", input="Hello.", max_output_tokens=4)
    assert puts == [False]
    second = oai.responses.create(model="m", input="Again.", max_output_tokens=4, previous_response_id=first.id)
    assert second.status in ("completed", "incomplete") and puts == [False, False]


def test_a_streamed_turn_is_stored_off_the_loop_before_its_completed_event(app, oai, puts):
    for event in oai.responses.create(model="m", input="Hello.", max_output_tokens=4, stream=True):
        if event.type in ("response.completed", "response.incomplete"):  # incomplete here: cut at 4 tokens
            assert puts == [False]  # stored by the time the client reads that it ended
            final = event.response
    follow = oai.responses.create(model="m", input="More.", max_output_tokens=4, previous_response_id=final.id)
    assert follow.previous_response_id == final.id and puts == [False, False]


def test_an_input_past_max_messages_is_refused_before_the_previous_turn_is_read(app, oai, monkeypatch):
    import openai

    from hearth.root import RUNTIME

    first = oai.responses.create(model="m", input="Hello.", max_output_tokens=2)
    store, reads = RUNTIME.responses, []
    original = store.get
    monkeypatch.setattr(store, "get", lambda *a, **k: reads.append(a) or original(*a, **k))
    most = RUNTIME.options.limits.max_messages
    many = [{"role": "user", "content": "hi"}] * (most + 1)
    with pytest.raises(openai.BadRequestError) as refused:
        oai.responses.create(model="m", input=many, max_output_tokens=2, previous_response_id=first.id)
    assert refused.value.body["code"] == "too_many_messages" and refused.value.body["param"] == f"input[{most}]"
    assert reads == []  # the previous turn (a file, Redis) was not read for a request refused anyway
