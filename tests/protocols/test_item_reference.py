"""Responses `item_reference` input items through the official `openai` SDK,
in process: a stored response's output items (message, function_call,
reasoning) and its input items (listed, with their ids, by GET
/v1/responses/{id}/input_items) are taken by id, in the store of one
process, in the folder a router's model processes share (`hearth serve
--response-store DIR`) and in Redis; an id that is not stored is a 404 naming
`input[i].id`. An item stays found while any stored turn of its key holds
it; references read the store off the event loop, each response once, and
are bounded by --max-messages. A grammar steers the random model where a test needs an
exact reply; a referenced item reads as the same item sent whole (the
prompts have the same number of tokens)."""
from __future__ import annotations

import asyncio
import json
import uuid

import openai
import pytest

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def forced(text: str) -> dict:
    return {"guided_grammar": "root ::= " + json.dumps(text)}


# "memory" and "redis" run one after the other on one stack (the same flags); "folder" starts its own.
@pytest.fixture(scope="module", params=["memory", "redis", "folder"])
def oai(request, served, tmp_path_factory):
    """A client of the stack with its own store (one process's), the store in Redis (HEARTH_REDIS_URL)
    put in its place, or the folder store a router sets."""
    if request.param == "folder":
        yield served("--response-store", str(tmp_path_factory.mktemp("responses"))).openai()
        return
    client = served().openai()
    if request.param == "memory":
        yield client
        return
    from hearth.root import RUNTIME
    from inference.protocols.response_store import RedisResponseStore

    before, RUNTIME.responses = RUNTIME.responses, RedisResponseStore(request.getfixturevalue("redis_url"))
    try:
        yield client
    finally:
        RUNTIME.responses = before


def prompt_tokens(oai, input_items: list, **extra) -> int:
    return oai.responses.create(model="m", input=input_items, max_output_tokens=1, **extra).usage.input_tokens


def test_an_output_message_by_reference_reads_as_the_message_sent_whole(oai):
    first = oai.responses.create(model="m", input="Name a colour.", max_output_tokens=8, extra_body=forced("Blue."))
    (message,) = first.output
    follow = {"type": "message", "role": "user", "content": "Why that one?"}
    by_reference = prompt_tokens(oai, [{"type": "item_reference", "id": message.id}, follow])
    whole = prompt_tokens(oai, [message.model_dump(exclude_none=True), follow])
    assert by_reference == whole > prompt_tokens(oai, [follow])


def test_a_call_and_its_output_by_reference(oai):
    """The function_call of one response and the function_call_output sent in the next, each taken by id."""
    first = oai.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER], max_output_tokens=40,
                                 extra_body=forced(CALL))
    (call,) = first.output
    assert call.type == "function_call" and call.id.startswith("fc_")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18C"}
    second = oai.responses.create(model="m", tools=[WEATHER], max_output_tokens=40, extra_body=forced("It is 18C."),
                                  input=[{"type": "message", "role": "user", "content": "Weather in Paris?"},
                                         {"type": "item_reference", "id": call.id}, result])
    assert second.output_text == "It is 18C."
    listed = list(oai.responses.input_items.list(second.id, order="asc"))
    assert [i.type for i in listed] == ["message", "function_call", "function_call_output"]
    assert listed[1].id == call.id and listed[1].arguments == call.arguments  # the item it named, as stored
    output_id = listed[2].id
    assert output_id.startswith("fco_") and listed[2].call_id == call.call_id

    question = {"type": "message", "role": "user", "content": "Weather in Paris?"}
    by_reference = prompt_tokens(oai, [question, {"type": "item_reference", "id": call.id},
                                       {"type": "item_reference", "id": output_id}], tools=[WEATHER])
    whole = prompt_tokens(oai, [question, call.model_dump(exclude_none=True), result], tools=[WEATHER])
    assert by_reference == whole


def test_a_reasoning_item_by_reference_is_taken_and_left_out_as_sent_whole(oai):
    first = oai.responses.create(model="m", input="Hi", reasoning={"effort": "high"}, max_output_tokens=60,
                                 extra_body=forced("Greet back.</think>\n\nHello!"))
    reasoning, message = first.output
    assert reasoning.type == "reasoning"
    refs = [{"type": "item_reference", "id": reasoning.id}, {"type": "item_reference", "id": message.id}]
    assert prompt_tokens(oai, refs) == prompt_tokens(oai, [message.model_dump(exclude_none=True)])


def test_input_items_list_with_ids_an_item_reference_finds(oai):
    first = oai.responses.create(model="m", instructions="Be brief.", max_output_tokens=3, input=[
        {"role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}], "id": "msg_mine"},
        {"role": "user", "content": "Goodbye"}])
    newest_first = list(oai.responses.input_items.list(first.id))
    assert [i.role for i in newest_first] == ["user", "user", "developer"]
    assert newest_first[1].id == "msg_mine" and all(i.id and i.status == "completed" for i in newest_first)
    assert newest_first[0].content[0].type == "input_text" and newest_first[0].content[0].text == "Goodbye"
    page = oai.responses.input_items.list(first.id, limit=2, order="asc")
    assert [i.role for i in page.data] == ["developer", "user"] and page.has_more
    rest = oai.responses.input_items.list(first.id, limit=2, order="asc", after=page.data[-1].id)
    assert [i.id for i in rest.data] == [newest_first[0].id] and not rest.has_more

    goodbye = {"role": "user", "content": "Goodbye"}
    by_reference = prompt_tokens(oai, [{"type": "item_reference", "id": newest_first[0].id}])
    assert by_reference == prompt_tokens(oai, [goodbye])
    # a string input is one user message, listed with its id
    (only,) = oai.responses.input_items.list(oai.responses.create(model="m", input="Goodbye", max_output_tokens=1).id)
    assert only.role == "user" and only.content[0].text == "Goodbye"
    assert prompt_tokens(oai, [{"type": "item_reference", "id": only.id}]) == by_reference


def test_an_item_not_stored_is_a_404_naming_it(oai):
    unstored = oai.responses.create(model="m", input="Forget me.", max_output_tokens=3, store=False)
    deleted = oai.responses.create(model="m", input="Delete me.", max_output_tokens=3)
    oai.responses.delete(deleted.id)
    for gone in ("msg_nope", unstored.output[0].id, deleted.output[0].id):
        with pytest.raises(openai.NotFoundError) as caught:
            oai.responses.create(model="m", max_output_tokens=3, input=[
                {"role": "user", "content": "Hi"}, {"type": "item_reference", "id": gone}])
        error = caught.value.body
        assert error["param"] == "input[1].id" and error["code"] == "item_not_found" and gone in error["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model="m", input=[{"type": "item_reference", "id": ""}])
    assert caught.value.body["param"] == "input[0].id"
    with pytest.raises(openai.NotFoundError):
        oai.responses.input_items.list(deleted.id)


@pytest.mark.parametrize("query, param", [
    ({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"order": "up"}, "order"), ({"after": "msg_nope"}, "after"),
    ({"include": ["file_search_call.results"]}, "include")])
def test_input_items_refuses_what_it_cannot_answer(oai, query, param):
    made = oai.responses.create(model="m", input="Hi", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.input_items.list(made.id, **query)
    assert caught.value.body["param"] == param


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture
def reads(monkeypatch) -> list:
    """(response id, whether on the event loop) of each read of the store's turns, as they happen."""
    from hearth.root import RUNTIME

    store, seen = RUNTIME.responses, []
    real = store.get

    def get(response_id: str, holder: str = ""):
        seen.append((response_id, _on_loop()))
        return real(response_id, holder)

    monkeypatch.setattr(store, "get", get)
    return seen


def test_references_read_each_response_once_off_the_event_loop(oai, reads):
    first = oai.responses.create(model="m", max_output_tokens=1, input=[
        {"type": "message", "role": "user", "content": "One", "id": "msg_" + uuid.uuid4().hex},
        {"type": "message", "role": "user", "content": "Two", "id": "msg_" + uuid.uuid4().hex}])
    ids = [i.id for i in oai.responses.input_items.list(first.id)] + [first.output[0].id]
    reads.clear()
    oai.responses.create(model="m", max_output_tokens=1, store=False,
                         input=[{"type": "item_reference", "id": i} for i in ids] * 5)
    assert reads == [(first.id, False)]


def test_more_input_items_than_max_messages_is_a_400_before_the_store_is_read(oai, reads):
    from hearth.root import RUNTIME

    most = RUNTIME.options.limits.max_messages
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model="m", max_output_tokens=1,
                             input=[{"type": "item_reference", "id": "msg_nope"}] * (most + 1))
    assert caught.value.body["param"] == f"input[{most}]" and caught.value.body["code"] == "too_many_messages"
    assert reads == []


def test_an_item_sent_again_is_found_while_any_turn_holding_it_is_stored(oai):
    """Agents send every item back each turn: deleting the first turn that held one leaves it found in
    the newer, until no stored turn holds it."""
    mine = {"type": "message", "role": "user", "content": "Remember this.", "id": "msg_" + uuid.uuid4().hex}
    first = oai.responses.create(model="m", input=[mine], max_output_tokens=3)
    reply = first.output[0].model_dump(exclude_none=True)
    second = oai.responses.create(model="m", input=[mine, reply], max_output_tokens=1)
    oai.responses.delete(first.id)
    refs = [{"type": "item_reference", "id": mine["id"]}, {"type": "item_reference", "id": reply["id"]}]
    assert prompt_tokens(oai, refs, store=False) == prompt_tokens(oai, [mine, reply], store=False)
    oai.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError) as caught:
        oai.responses.create(model="m", input=refs, max_output_tokens=1, store=False)
    assert caught.value.body["param"] == "input[0].id"


def test_the_folder_indexes_items_in_one_file_counted_in_the_cap(oai):
    from hearth.root import RUNTIME
    from inference.protocols.response_store import FolderResponseStore

    store = RUNTIME.responses
    if not isinstance(store, FolderResponseStore):
        pytest.skip("the folder store's index")
    many = [{"type": "reasoning", "summary": []} for _ in range(1000)]  # left out of the prompt: cheap
    made = oai.responses.create(model="m", input=[*many, {"role": "user", "content": "Hi"}], max_output_tokens=1)
    (hi,) = oai.responses.input_items.list(made.id, limit=1).data  # the 1001st item
    assert prompt_tokens(oai, [{"type": "item_reference", "id": hi.id}], store=False) == \
        prompt_tokens(oai, [{"role": "user", "content": "Hi"}], store=False)
    names = [p.name for p in store.folder.iterdir()]
    assert len(names) < 50 and not [n for n in names if n.endswith(".item")]
    turns = sum(p.stat().st_size for p in store.folder.glob("*.json"))
    assert store.stats()["bytes"] > turns  # the index's pages count toward the cap
