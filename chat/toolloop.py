"""One dashboard chat turn as a loop: generate; when the generation ends in
tool calls, run them (asking the user first for gated ones), feed the
results back and generate again, up to MAX_ROUNDS generations.

The turn's tool calls are kept in the assistant entry's meta as
`toolRounds`: one `{text, calls}` per generation that ended in calls, where
`text` is what that generation showed and each call is `{id, tool, args,
ok, result}`. The entry's content is all the turn's text in order, so the
rounds' texts are its prefix and what follows them is the final answer.
`replay` turns that back into the assistant / tool messages the model saw,
so a later turn (and the session tree: siblings, regenerate, edit, fork)
needs nothing else."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from asgiref.sync import sync_to_async

from chat import appctx, mcp, window
from chat import tools as chat_tools
from core.modelconfig import folder_window
from inference.protocols.errors import RequestError

MAX_ROUNDS = 8
# A reply the session sets no max_tokens for may take this share of the model's context: a model that never
# stops (the demo model before it has trained) would otherwise fill the whole window with one reply, and the
# next message would be refused as too long. A quarter leaves room for the conversation to go on a few turns.
REPLY_SHARE = 4
STOPPED = "not run: the turn was stopped"
DENIED = "error: the user denied this tool call"
UNANSWERED = "error: nobody answered the approval request (no dashboard followed this chat), so it was not run"
ASK_POLL_S = 5.0


class TurnFailed(Exception):
    """Why a turn could not go on; `code` is the refusal's (a router model's
    process refused it) or None."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


@dataclass
class TurnState:
    text: str = ""
    reasoning: str = ""
    rounds: list[dict] = field(default_factory=list)
    first: float | None = None  # when the turn's first token was generated (text, thinking or a call's markup)
    final: object = None  # the last generation's final event
    model: str | None = None  # router mode: the model that answered
    # What the turn's generations decoded: each one's tokens after its first, and the time from its first
    # token to its last (the engine's `decode_ms`), summed; the speed readout is the one over the other.
    decode_tokens: int = 0
    decode_s: float = 0.0
    budget: dict | None = None  # the chat's own reply cap, when the turn ran under it (`reply_budget`)
    cut: dict | None = None  # the oldest turns its last generation left out (`window.Conversation.cut`)
    skip: int = 0  # how many of them: the next tool round's fit starts there, as a turn only grows

    def generated(self, final) -> float:
        """Count one finished generation's decoding (its final event); answers its decode time in seconds."""
        usage = getattr(final, "usage", None)
        if usage is None or not (usage.timings or {}).get("decode_ms"):
            return 0.0
        decode_ms = usage.timings["decode_ms"]
        self.decode_tokens += max(usage.completion_tokens - 1, 0)
        self.decode_s += decode_ms / 1000
        return decode_ms / 1000


def replay(entry) -> list[dict]:
    """The messages an assistant entry stands for, tool rounds included (an
    answer that is only an error reads as an empty one: its error is the
    page's, and a question queued behind it still follows an answer)."""
    meta = json.loads(entry.meta_json or "{}")
    rounds = meta.get("toolRounds") or []
    out, used = [], 0
    for r in rounds:
        calls = r.get("calls") or []
        out.append({"role": "assistant", "content": r.get("text", ""),
                    "tool_calls": [_wire(c) for c in calls]})
        out += [{"role": "tool", "tool_call_id": c["id"], "name": c["tool"], "content": c.get("result", "")}
                for c in calls]
        used += len(r.get("text", ""))
    tail = entry.content[used:]
    if tail or not rounds:
        out.append({"role": "assistant", "content": tail})
    return out


def _wire(call: dict) -> dict:
    args = call.get("args")
    return {"id": call["id"], "type": "function",
            "function": {"name": call["tool"], "arguments": args if isinstance(args, str) else json.dumps(args)}}


async def run(consumer, session, conv: window.Conversation, state: TurnState) -> None:
    """Generate, run tools, generate again, each time with the newest turns
    of `conv` that fit the model's context (chat/window.py); raises
    TurnFailed with a message for the user, CancelledError when stopped."""
    coding = bool(session.coding_tools) and consumer.may_code  # never offered to an unvouched socket
    runtime = consumer.runtime
    await mcp.ensure_listed()  # MCP servers' tools, listed again when mcp.json changed
    offered = await sync_to_async(chat_tools.available)(coding)
    if not consumer.may_code:  # a gated tool (an MCP server's too) waits for an approval only such a socket gives
        offered = {name: tool for name, tool in offered.items() if not tool.gated}
    aware = appctx.latest(session.id) is not None and appctx.offered_to(_model_id(runtime, session))
    if aware:  # a dashboard that acts on ui_* frames shows this chat
        offered = {**appctx.tools(), **offered}
    trained = _trained_tools(runtime, session)
    if trained is not None:  # a model that learned a few tools gets those alone: the others put it off them
        offered = {name: tool for name, tool in offered.items() if name in trained}
    sampling, consumer.next_sampling = consumer.next_sampling, {}  # "next turn" covers all of its rounds
    state.budget = await sync_to_async(reply_budget)(runtime, session, sampling)
    if state.budget is not None:
        sampling = {**sampling, "max_tokens": state.budget["max_tokens"]}
    limit = await sync_to_async(_prompt_limit)(runtime, session, sampling)
    for round_no in range(MAX_ROUNDS):
        def seen(skip: int) -> list[dict]:
            messages = conv.messages(skip)
            return appctx.with_ambient(messages, appctx.latest(session.id)) if aware else messages  # where the user is
        calls, round_text = await _generate(consumer, session, (conv, seen, limit), offered, state, runtime, sampling)
        if not calls:
            return
        if round_no == MAX_ROUNDS - 1:
            raise TurnFailed(f"stopped after {MAX_ROUNDS} tool-call rounds; the last calls were not run")
        record = {"text": round_text, "calls": [
            {"id": c.id, "tool": c.name, "args": _args(c.arguments), "ok": False, "result": STOPPED} for c in calls]}
        state.rounds.append(record)
        for call in record["calls"]:
            await _run_call(consumer, session.id, call, offered)
        conv.extend([{"role": "assistant", "content": round_text, "tool_calls": [_wire(c) for c in record["calls"]]},
                     *({"role": "tool", "tool_call_id": c["id"], "name": c["tool"], "content": c["result"]}
                       for c in record["calls"])])
        if consumer.steering:  # the user wrote meanwhile: the turn goes on from their message (chat/live.py)
            return


def _model_id(runtime, session) -> str | None:
    """The model a turn in `session` talks to (None: unknown, e.g. a router model that is gone)."""
    from serving.router.slots import RouterError

    if runtime.router is not None:
        try:
            return runtime.router.resolve(session.model).id
        except RouterError:
            return None
    engine = runtime.engine
    return engine.loaded.model_id if engine is not None and engine.loaded is not None else None


def context_window(runtime, session) -> int | None:
    """The tokens a turn in `session` may hold, prompt and reply: the model's
    window, or the operator's cap (`--max-context`, the memory budget) where
    that is smaller; a router model not loaded yet: its folder's config."""
    if runtime.router is not None:
        from chat.live import model_info

        listed = model_info(runtime, session.model)  # its process's row: the limit it enforces
        window = listed.get("context_limit", listed.get("context_window"))
        if window is None:
            folder = _library_folder(runtime, session.model)
            window = folder_window(folder) if folder is not None else None
        return window if isinstance(window, int) and window > 0 else None
    engine = runtime.engine
    return engine.context_limit if engine is not None else None


def _prompt_limit(runtime, session, sampling: dict) -> int | None:
    """The most prompt tokens a turn may send: the context less its reply's room (the turn's max_tokens, the
    operator's --max-tokens where the turn sets none)."""
    from chat import store

    max_tokens = {**store.stored_sampling(session), **sampling}.get("max_tokens") or runtime.options.defaults.max_tokens
    return window.prompt_limit(context_window(runtime, session), max_tokens)


def reply_budget(runtime, session, next_turn: dict) -> dict | None:
    """The chat's cap on a reply the session sets no max_tokens for (nor the
    next-turn settings): a REPLY_SHARE of the context. None when the session
    sets one, the operator's `--max-tokens` is smaller (it applies), or the
    window is unknown. `{max_tokens, context_window}`, kept in the turn's
    meta so the page can say why a reply stopped there."""
    from chat import store

    if {**store.stored_sampling(session), **next_turn}.get("max_tokens") is not None:
        return None
    window = context_window(runtime, session)
    if window is None:
        return None
    cap = max(window // REPLY_SHARE, 1)
    operator = runtime.options.defaults.max_tokens
    if operator is not None and operator <= cap:
        return None  # the operator's `--max-tokens` is the tighter cap, and the request applies it
    return {"max_tokens": cap, "context_window": window}


def _trained_tools(runtime, session) -> list[str] | None:
    """The tools the turn's model says it was trained to call (`trained_tools`
    of its /v1/models row; serving.demo.build); None: it says nothing."""
    from serving.demo.build import trained_tools

    if runtime.router is not None:
        from chat.live import model_info

        listed = model_info(runtime, session.model).get("trained_tools")
        if isinstance(listed, list):
            return listed
        folder = _library_folder(runtime, session.model)  # not loaded yet (the turn loads it): its folder says
        return trained_tools(folder) if folder is not None else None
    engine = runtime.engine
    return trained_tools(engine.loaded.path) if engine is not None and engine.loaded is not None else None


def _library_folder(runtime, model: str | None) -> Path | None:
    """Router mode: the folder `model`'s process serves (a folder of its own, or its snapshot in the HF cache)."""
    from hub.registry import snapshot
    from serving.router.slots import RouterError

    try:
        ref = runtime.router.resolve(model).ref
    except RouterError:
        return None
    return Path(ref) if Path(ref).is_absolute() else snapshot(ref)


def _args(raw: str):
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # left as written; the call fails its argument check


async def _generate(consumer, session, view, offered, state: TurnState, runtime, sampling: dict):
    """One generation, of the newest turns that fit (`view`: the conversation, its messages without the oldest
    `skip` turns, the prompt's limit)."""
    from chat.turns import prepare

    conv, seen, limit = view
    tools = chat_tools.specs(offered) or None
    if runtime.router is not None:
        folder = await sync_to_async(_library_folder)(runtime, session.model) if limit is not None else None

        async def count_remote(skip: int):
            messages = seen(skip)
            if folder is None:  # no folder to count with: the whole conversation, as the process takes it
                return 0, messages
            try:
                tokens = await asyncio.to_thread(window.router_count, folder, messages, tools, bool(session.thinking))
            except Exception:  # noqa: BLE001 - no template or tokenizer here: the process says what it makes of it
                return 0, messages
            return tokens, messages

        state.skip, messages = await window.fit(len(conv.turns), count_remote, limit, state.skip)
        state.cut = conv.cut(state.skip)
        return await _generate_remote(consumer, session, messages, offered, state, runtime, sampling)
    engine = runtime.require_engine()

    async def count(skip: int):
        try:
            prepared = await prepare(session, seen(skip), sampling, engine.loaded, runtime.options, tools)
        except RequestError as exc:
            if exc.code in window.SIZE_REFUSALS:  # too many characters or messages: fewer turns may fit
                return None, exc
            raise
        return len(prepared.request.prompt_tokens), prepared

    state.skip, prepared = await window.fit(len(conv.turns), count, limit, state.skip)
    state.cut = conv.cut(state.skip)
    round_text = ""
    async for event in engine.submit(prepared.request).events():
        if event.error is not None:
            raise TurnFailed(event.error)
        if event.token_ids and state.first is None:
            state.first = time.perf_counter()
        for piece in prepared.output.feed(event.text) if event.text else []:
            round_text += await _piece(consumer, piece, state)
        if event.finish_reason is not None:
            state.final = event
            state.generated(event)
    cut = getattr(state.final, "cut", False)  # the token limit or a stop sequence ended this round
    for piece in prepared.output.finish(cut=cut):
        round_text += await _piece(consumer, piece, state)
    return [c for c in prepared.output.calls if not c.cut], round_text  # a call cut off is never run


async def _generate_remote(consumer, session, messages, offered, state: TurnState, runtime, sampling: dict):
    """Router mode: the same turn, run by the session's model's process over
    its /v1 stream (which parses reasoning and tool calls there)."""
    from chat.turns import body
    from serving.router import remote
    from serving.router.slots import RouterError

    request = body(session, messages, sampling, chat_tools.specs(offered) or None)
    calls: list = []
    round_text = ""
    try:
        state.model = runtime.router.resolve(session.model).id
        # Closed at once however the turn ends (a stopped turn too), so the model is not left busy.
        async with contextlib.aclosing(remote.chat(runtime.router, session.model, request)) as deltas:
            async for delta in deltas:
                if delta.text and state.first is None:
                    state.first = time.perf_counter()
                if delta.text:
                    round_text += await _piece(consumer, delta, state)
                calls += delta.calls
                if delta.final is not None:
                    state.final = delta.final
                    decoded = state.generated(delta.final)
                    if state.first is None:  # nothing shown yet (a call, or text held back): its first token's time
                        state.first = time.perf_counter() - decoded
    except RouterError as exc:
        raise TurnFailed(exc.message, exc.code) from None
    return calls, round_text


async def _piece(consumer, piece, state: TurnState) -> str:
    if piece.kind == "reasoning":
        await consumer.send_json({"type": "thinking_delta", "delta": piece.text})
        state.reasoning += piece.text
        return ""
    await consumer.send_json({"type": "text_delta", "delta": piece.text})
    state.text += piece.text
    return piece.text


async def _run_call(consumer, session_id: str, call: dict, offered: dict) -> None:
    """Ask (when gated and not always-allowed in this session), run, report:
    tool_start … tool_end. The outcome is written into `call`."""
    from chat import approvals

    cid, name = call["id"], call["tool"]
    await consumer.send_json({"type": "tool_start", "callId": cid, "tool": name, "args": call["args"]})
    tool = offered.get(name)
    try:
        if tool is None:
            call["result"] = f"error: unknown tool {name!r}; available: {', '.join(offered) or 'none'}"
        else:
            allowed, answer = True, {}
            if tool.gated and not await sync_to_async(approvals.is_allowed)(session_id, name):
                answer = await _ask(consumer, cid, name, call["args"])
                allowed = answer["decision"] == "allow"
                if allowed and isinstance(answer.get("editedArgs"), dict):
                    call["args"] = answer["editedArgs"]
                if allowed and answer.get("alwaysAllow") is True:
                    names = await sync_to_async(approvals.allow)(session_id, name)
                    await consumer.send_json({"type": "tool_approvals", "sessionId": session_id,
                                              "alwaysAllow": names})
            if not allowed:
                call["result"] = UNANSWERED if answer.get("unattended") else DENIED
            elif tool.act is not None:
                call["ok"], call["result"] = await appctx.act(tool, call["args"], consumer)
            elif tool.stream is not None:
                async def emit(chunk: str) -> None:
                    await consumer.send_json({"type": "tool_update", "callId": cid, "chunk": chunk})

                call["ok"], call["result"] = await chat_tools.call_streaming(tool, call["args"], emit)
            else:
                call["ok"], call["result"] = await sync_to_async(chat_tools.call_sync)(tool, call["args"])
    except asyncio.CancelledError:
        call["ok"], call["result"] = False, STOPPED
        await consumer.send_json({"type": "tool_end", "callId": cid, "ok": False, "result": STOPPED})
        raise
    await consumer.send_json({"type": "tool_end", "callId": cid, "ok": call["ok"], "result": call["result"]})


async def _ask(consumer, cid: str, name: str, args) -> dict:
    """Wait for an `approval` frame for this call, from any socket that
    follows the turn; a stopped turn cancels the wait, and a turn that no
    socket has followed for a long while (`consumer.unattended()`) is denied."""
    future = asyncio.get_running_loop().create_future()
    consumer.approvals[cid] = future
    try:
        await consumer.send_json({"type": "tool_approval_request", "callId": cid, "tool": name, "args": args})
        while True:
            done, _ = await asyncio.wait({future}, timeout=ASK_POLL_S)
            if done:  # every socket on the chat takes its approval card down
                answer = future.result()
                await consumer.send_json({"type": "tool_approval_answered", "callId": cid,
                                          "decision": answer["decision"]})
                return answer
            if consumer.unattended():
                return {"decision": "deny", "editedArgs": None, "alwaysAllow": False, "unattended": True}
    finally:
        consumer.approvals.pop(cid, None)
