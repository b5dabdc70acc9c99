"""The app-aware assistant and queued messages over /ws/chat, against the
real engine on the tiny model: `context` frames and their refusals, the
three app tools run on a real turn (`ui_navigate` / `ui_spotlight` frames),
the ambient line, and messages sent while a turn runs (follow-ups after it,
steering first, a second socket joining mid-queue, Stop handing texts back)."""
from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from channels.testing import WebsocketCommunicator

from tests.chat import chatws
from tests.helpers import ROOT

QUANTIZE = {"route": "quantize", "step": {"index": 1, "count": 3, "label": "Precision"},
            "snapshot": {"route": "quantize", "capturedAt": "2026-12-02T20:00:00Z",
                         "elements": [{"ref": "e1", "label": "Bits", "kind": "select", "selector": "#f-bits",
                                       "spotlightId": "quantize-bits"}]}}


@pytest.fixture(scope="module")
def engine(local_engine):
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    return local_engine


async def _frames_until(ws: WebsocketCommunicator, done, timeout: float = 60) -> list[dict]:
    frames: list[dict] = []
    while not frames or not done(frames[-1]):
        frames.append(await ws.receive_json_from(timeout=timeout))
    return frames


def _final(frame: dict) -> bool:
    return frame["type"] == "turn_end" and not frame.get("continues")


async def _long_turns(ws, eos_id: int) -> None:
    """This chat's turns run 40 tokens at least (no end-of-sequence before), so a message sent meanwhile waits."""
    await ws.send_json_to({"type": "set_sampling", "scope": "session", "temperature": 1.0, "max_tokens": 40,
                           "logit_bias": {str(eos_id): -100}})


def test_context_frames_are_checked(engine):
    async def run():
        ws = await chatws.connect()
        for bad, says in [({"route": "nowhere"}, "context.route"), ("quantize", "context must be an object"),
                          ({"route": "quantize", "step": {"index": 3, "count": 3}}, "context.step"),
                          ({"route": "chat", "snapshot": {"elements": "x"}}, "elements")]:
            await ws.send_json_to({"type": "context", "context": bad})
            error = await ws.receive_json_from(timeout=10)
            assert error["type"] == "error" and says in error["message"]
        await ws.send_json_to({"type": "context", "context": QUANTIZE})
        assert await ws.receive_nothing(timeout=0.3)  # taken quietly
        await ws.disconnect()

    asyncio.run(run())


def test_the_ambient_line_and_the_app_tools_reach_the_model(engine):
    from chat import appctx

    assert appctx.ambient(appctx.check(QUANTIZE)) == "[user is on: Quantize · step 2/3]"
    seen = appctx.with_ambient([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                               appctx.check(QUANTIZE))
    assert seen[0]["content"] == "[user is on: Quantize · step 2/3]\nBe brief." and len(seen) == 2
    # The demo chat model learned the app tools; the vision demo did not: its turns get neither the line nor the tools.
    assert appctx.offered_to("hearth-test/tiny-random") and appctx.offered_to("hearth/demo-chat")
    assert not appctx.offered_to("hearth/demo-vision")
    assert not appctx.offered_to(None)

    async def run():
        ws = await chatws.connect()
        await ws.send_json_to({"type": "set_sampling", "scope": "session", "temperature": 0, "max_tokens": 4})
        plain = [f for f in await chatws.turn(ws, {"type": "prompt", "text": "where am I"})
                 if f["type"] == "turn_end"][0]
        await ws.send_json_to({"type": "context", "context": QUANTIZE})
        await ws.send_json_to({"type": "regenerate"})
        aware = await _frames_until(ws, _final)
        aware_end = aware[-1]
        # Same question, same chat: the prompt grew by the ambient line and the three tools' specs.
        assert aware_end["prompt_tokens"] > plain["prompt_tokens"] + 20
        await ws.disconnect()

    asyncio.run(run())


def test_app_tools_write_ui_frames_and_refuse_unknown_routes(engine):
    """The tools as a turn runs them (chat/toolloop.py calls appctx.act with the live turn)."""
    from asgiref.sync import sync_to_async

    from chat import appctx, live, store

    async def run():
        session = await sync_to_async(store.create)()
        turn = live.LiveTurn(None, session, False, {}, "anchor")
        tools = appctx.tools()

        async def call(name, args):
            ok, text = await appctx.act(tools[name], args, turn)
            frames = []
            while not turn._frames.empty():
                raw = turn._frames.get_nowait().decode()
                frames += [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: ")]
            return ok, text, frames

        assert (await call("get_current_app_context", {}))[:2] == (
            False, "error: no dashboard page has said what it shows")
        appctx.remember(session.id, appctx.check(QUANTIZE))
        ok, text, frames = await call("get_current_app_context", {})
        assert ok and json.loads(text)["step"]["label"] == "Precision" and frames == []
        assert json.loads(text)["snapshot"]["elements"][0]["spotlightId"] == "quantize-bits"

        ok, text, frames = await call("navigate_app", {"route": "Fine-tune"})
        assert ok and text == "ok: the user now sees the Fine-tune page"
        assert frames == [{"type": "ui_navigate", "route": "finetune"}]
        assert appctx.latest(session.id) == {"route": "finetune"}  # the next round's ambient line
        ok, text, frames = await call("navigate_app", {"route": "admin"})
        assert not ok and "unknown route 'admin'" in text and frames == []  # never sent to the browser

        # No socket follows this turn: nothing can confirm the spotlight, and the model is told so.
        ok, text, frames = await call("spotlight_ui", {"target": "quantize-bits", "value": 4, "route": "quantize",
                                                       "message": "Bits go here"})
        assert ok and text == ("sent: asked the dashboard to set quantize-bits to 4 and highlight it on the Quantize "
                               "page; no dashboard confirmed it")
        assert frames[0].pop("callId").startswith("ui_")
        assert frames == [{"type": "ui_spotlight", "target": "quantize-bits", "message": "Bits go here",
                           "route": "quantize", "value": "4"}]
        # A catalog target goes to its own page whatever route the call wrote (the demo, deep in a chat, wrote
        # "route"); any other target needs a route that exists.
        ok, text, frames = await call("spotlight_ui", {"target": "settings-keys", "route": "route"})
        assert ok and frames[0]["route"] == "settings"
        ok, text, frames = await call("spotlight_ui", {"label": "Bits", "route": "route"})
        assert not ok and "unknown route 'route'" in text and frames == []
        ok, text, frames = await call("spotlight_ui", {"selector": "#coding-tools", "value": "true"})
        assert not ok and "value fills only a named target" in text and frames == []  # not the chat's switches
        ok, text, frames = await call("spotlight_ui", {"message": "here"})
        assert not ok and "say what to highlight" in text and frames == []
        ok, text, _ = await call("spotlight_ui", {"target": 3})
        assert not ok and "must be of type string" in text

    asyncio.run(run())


SET_RANK = {"target": "finetune-rank", "value": "8"}  # no route: the catalog knows the page


@pytest.mark.parametrize("answer, told", [
    ({"ok": True, "found": "step", "route": "finetune", "step": 2, "stepLabel": "Training", "value": "8"},
     (True, "ok: set finetune-rank to 8 and highlighted it")),
    ({"ok": False, "found": None, "route": "finetune"},
     (False, "error: finetune-rank was not found on the Fine-tune page")),
    ({"ok": True, "found": "page", "route": "finetune", "value": None},
     (False, "error: finetune-rank is highlighted on the Fine-tune page but did not take the value 8")),
    ({"ok": False, "route": "models"}, (False, "error: the dashboard could not open the Fine-tune page")),
    (None, (True, "sent: asked the dashboard to set finetune-rank to 8 and highlight it on the Fine-tune page; "
                  "no dashboard confirmed it")),
])
def test_a_spotlight_goes_to_its_page_and_tells_the_model_what_the_dashboard_did(engine, steer, monkeypatch,
                                                                                 answer, told):
    """From the Models page, a call that names only a catalog target: the frame takes the target's page,
    the socket answers as the dashboard would (`ui_result`), and the tool result says what it answered."""
    from chat import appctx

    if answer is None:  # the unanswered case waits this long; an answered one is not raced against it
        monkeypatch.setattr(appctx, "UI_CONFIRM_S", 0.5)
    seen = steer("spotlight_ui", SET_RANK)

    async def run():
        ws = await chatws.connect()
        await ws.send_json_to({"type": "new_session"})
        await _frames_until(ws, lambda f: f["type"] == "sessions")
        await ws.send_json_to({"type": "context", "context": {"route": "models"}})
        await ws.send_json_to({"type": "prompt", "text": "Go to finetune and set rank 8."})
        frames = await _frames_until(ws, lambda f: f["type"] == "ui_spotlight")
        spot = frames[-1]
        assert spot["route"] == "finetune" and spot["target"] == "finetune-rank" and spot["value"] == "8"
        if answer is not None:
            await ws.send_json_to({"type": "ui_result", "callId": spot["callId"], "result": answer})
        frames = await _frames_until(ws, _final)
        await ws.send_json_to({"type": "ui_result", "callId": spot["callId"], "result": {"ok": True}})
        assert await ws.receive_nothing(timeout=0.3)  # a late answer (another tab's) is dropped quietly
        await ws.disconnect()
        return frames

    frames = asyncio.run(run())
    end = next(f for f in frames if f["type"] == "tool_end")
    assert (end["ok"], end["result"]) == told
    page = "Fine-tune" if answer and answer["route"] == "finetune" else "Models"
    assert seen[-1][0] == {"role": "system", "content": f"[user is on: {page}]"}  # the next round knows the page


def test_a_model_that_says_which_tools_it_learned_is_offered_only_those(engine, tiny_model, tmp_path, monkeypatch):
    """A demo chat build (its marker says so) learned the three app tools and four practice tools; offered a
    memory vault's tools beside them, it calls none. Its /v1/models row lists what it learned,
    and its dashboard turns offer it those alone, with a vault and the coding tools on."""
    import shutil

    from huggingface_hub import try_to_load_from_cache

    import chat.turns
    from hearth.root import RUNTIME
    from inference.engine.engine import Engine
    from memory import service
    from serving.demo import build
    from serving.routes.listing import served_row

    folder = tmp_path / "demo-build"
    shutil.copytree(Path(try_to_load_from_cache(tiny_model, "config.json")).parent, folder)
    (folder / build.MARKER).write_text(json.dumps(build._marker(build.Recipe())))
    offered: list[list[str]] = []
    original = chat.turns.body

    def body(session, messages, next_turn, tools=None):
        offered.append([t["function"]["name"] for t in tools or []])
        return {**original(session, messages, next_turn, tools), "guided_grammar": chatws.forced("Done.")}

    monkeypatch.setattr(chat.turns, "body", body)
    service.init()  # the default vault: its tools are on offer to any other model
    assert served_row(RUNTIME, engine)["trained_tools"] is None
    demo = Engine(str(folder))
    demo.start()
    monkeypatch.setattr(RUNTIME, "engine", demo)
    try:
        assert served_row(RUNTIME, demo)["trained_tools"] == [
            "get_current_app_context", "navigate_app", "spotlight_ui", "get_weather", "add", "get_time", "search"]

        async def run():
            ws = await chatws.connect()
            await ws.send_json_to({"type": "new_session"})
            await _frames_until(ws, lambda f: f["type"] == "sessions")
            await chatws.coding(ws)
            await ws.send_json_to({"type": "context", "context": {"route": "models"}})
            await chatws.turn(ws, {"type": "prompt", "text": "Take me to quantize."})
            await ws.disconnect()

        asyncio.run(run())
    finally:
        demo.close(drain_seconds=0)
    assert offered == [["get_current_app_context", "navigate_app", "spotlight_ui"]]


def test_every_spotlight_target_is_marked_in_the_dashboard():
    from chat import appctx

    source = "\n".join(p.read_text() for p in (ROOT / "frontend" / "js").glob("*.js"))
    marked = set(re.findall(r"""["'`]([a-z]+-[a-z]+)["'`]""", source))
    assert set(appctx.SPOTS) <= marked, set(appctx.SPOTS) - marked


def test_the_prompts_the_docs_give_the_demo_are_ones_it_was_trained_on():
    """The tiny demo model follows the phrasings of its corpus, not others ("take me to quantize" gets a
    plain sentence): each prompt the docs quote for it is a question of the very corpus its recipe trains on."""
    from serving.demo import corpus
    from serving.demo.build import Recipe

    recipe = Recipe()
    trained = {m["content"] for messages, _, _ in corpus.samples(recipe.seed, recipe.examples) for m in messages
               if m["role"] == "user"}
    first_run = (ROOT / "docs" / "using" / "first-run.md").read_text()
    chat = (ROOT / "docs" / "using" / "chat.md").read_text()
    dashboard = (ROOT / "docs" / "using" / "dashboard.md").read_text()
    text = (first_run.split("## What the demo model can do")[1].split("\n## ")[0]
            + chat.split("The demo chat model (`hearth/demo-chat`)")[1].split("\n\n")[0]
            + dashboard.split("the demo chat model learned these tools' calls")[1].split("a real model")[0])
    quoted = [" ".join(q.split()) for q in re.findall(r'"([^"]+)"', re.sub(r"`[^`]*`", "", text)) if "…" not in q]
    assert len(quoted) >= 5, quoted
    assert [q for q in quoted if q not in trained] == []


def test_a_follow_up_sent_mid_turn_is_answered_after_it(engine, eos_id):
    async def run():
        ws = await chatws.connect()
        await ws.send_json_to({"type": "new_session"})
        await _frames_until(ws, lambda f: f["type"] == "sessions")
        await _long_turns(ws, eos_id)
        await ws.send_json_to({"type": "prompt", "text": "first question"})
        assert (await ws.receive_json_from(timeout=10))["type"] == "turn_start"
        await ws.send_json_to({"type": "prompt", "text": "and then this", "streamingBehavior": "followUp"})
        frames = await _frames_until(ws, _final, timeout=120)
        queued = [f for f in frames if f["type"] == "queue_update"]
        assert queued[0] == {"type": "queue_update", "steering": [], "followUp": ["and then this"]}
        assert queued[-1]["followUp"] == []
        seam = next(i for i, f in enumerate(frames) if f["type"] == "turn_end")
        assert frames[seam]["continues"] is True and frames[seam]["entry"]["role"] == "assistant"
        first_answer = frames[seam]["entry"]
        assert first_answer["content"] == "".join(f["delta"] for f in frames[:seam] if f["type"] == "text_delta")
        start = frames[seam + 1]
        assert start["type"] == "turn_start" and start["user"]["content"] == "and then this"
        assert start["user"]["parentId"] == first_answer["id"]
        second = "".join(f["delta"] for f in frames[seam:] if f["type"] == "text_delta")
        assert second and frames[-1]["aborted"] is False
        await ws.send_json_to({"type": "open_session", "path": start["sessionId"]})
        history = await _frames_until(ws, lambda f: f["type"] == "history")
        items = history[-1]["items"]
        assert [(i["role"], i["content"]) for i in items] == [
            ("user", "first question"), ("assistant", first_answer["content"]), ("user", "and then this"),
            ("assistant", second)]
        await ws.disconnect()

    asyncio.run(run())


def test_steering_goes_first_and_a_second_socket_sees_each_entry_once(engine, eos_id):
    async def run():
        ws = await chatws.connect()
        await ws.send_json_to({"type": "new_session"})
        sid = (await _frames_until(ws, lambda f: f["type"] == "history"))[-1]["sessionId"]
        await _long_turns(ws, eos_id)
        await ws.send_json_to({"type": "prompt", "text": "one"})
        assert (await _frames_until(ws, lambda f: f["type"] == "turn_start"))[-1]["type"] == "turn_start"
        await ws.send_json_to({"type": "prompt", "text": "later", "streamingBehavior": "followUp"})
        await ws.send_json_to({"type": "prompt", "text": "now"})  # steering, the default
        await ws.send_json_to({"type": "prompt", "text": "also now", "streamingBehavior": "steer"})
        await _frames_until(ws, lambda f: f["type"] == "turn_end")  # the first answer's seam
        # A second socket opens the chat in the middle of the queue: history, then the replay of the running segment.
        other = WebsocketCommunicator(chatws.asgi_app(), "/ws/chat", headers=[(b"host", b"testserver")])
        other.scope["client"] = ["127.0.0.1", 50001]
        assert (await other.connect())[0]
        await _frames_until(other, lambda f: f["type"] == "sessions")
        await other.send_json_to({"type": "open_session", "path": sid})
        seen = await _frames_until(other, _final, timeout=120)
        mine = await _frames_until(ws, _final, timeout=120)

        starts = [f["user"]["content"] for f in mine if f["type"] == "turn_start"]
        assert starts == ["now\n\nalso now", "later"]  # all the steering as one message, then the follow-up
        history = next(f for f in seen if f["type"] == "history")
        shown = [(i["role"], i["id"]) for i in history["items"]]
        shown += [("assistant", f["entry"]["id"]) for f in seen if f["type"] == "turn_end" and f.get("continues")]
        shown += [("user", f["user"]["id"]) for f in seen if f["type"] == "turn_start" and "user" in f]
        ids = [i for _, i in shown]
        assert len(ids) == len(set(ids))  # nothing twice
        await ws.send_json_to({"type": "open_session", "path": sid})
        stored = (await _frames_until(ws, lambda f: f["type"] == "history"))[-1]["items"]
        assert {i["id"] for i in stored[:-1]} <= set(ids)  # and nothing missed (the last answer streamed)
        assert [i["content"] for i in stored if i["role"] == "user"] == ["one", "now\n\nalso now", "later"]
        await ws.disconnect()
        await other.disconnect()

    asyncio.run(run())


def test_stop_hands_queued_messages_back(engine, eos_id):
    async def run():
        ws = await chatws.connect()
        await ws.send_json_to({"type": "new_session"})
        await _frames_until(ws, lambda f: f["type"] == "sessions")
        await _long_turns(ws, eos_id)
        await ws.send_json_to({"type": "prompt", "text": "go"})
        await _frames_until(ws, lambda f: f["type"] == "turn_start")
        await ws.send_json_to({"type": "prompt", "text": "keep me", "streamingBehavior": "followUp"})
        await ws.send_json_to({"type": "prompt", "text": "x", "streamingBehavior": "sideways"})
        await ws.send_json_to({"type": "abort"})
        frames = await _frames_until(ws, _final, timeout=60)
        assert any(f["type"] == "error" and "streamingBehavior" in f["message"] for f in frames)
        dropped = [f for f in frames if f["type"] == "queue_update" and f.get("dropped")]
        assert dropped == [{"type": "queue_update", "steering": [], "followUp": [], "dropped": ["keep me"]}]
        assert frames[-1]["aborted"] is True and not any(f["type"] == "turn_start" for f in frames)
        await ws.disconnect()

    asyncio.run(run())


def test_a_router_finds_what_a_library_model_learned_before_it_loads(tiny_model):
    """Router mode asks the model's folder in the library when its process has said nothing yet (the turn that
    loads it): `hub.registry.snapshot` is the folder `scan` lists, and a folder without a demo marker limits nothing."""
    from huggingface_hub import snapshot_download

    from hub.registry import scan, snapshot
    from serving.demo.build import trained_tools

    folder = snapshot(tiny_model)
    assert folder is not None and folder == next(m.path for m in scan() if m.repo_id == tiny_model)
    assert folder.resolve() == Path(snapshot_download(tiny_model, local_files_only=True)).resolve()
    assert snapshot("nobody/nothing") is None and trained_tools(folder) is None
