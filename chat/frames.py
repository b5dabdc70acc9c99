"""What each `/ws/chat` frame does to the chat sessions (the socket itself
is `chat/consumer.py`).

`ChatFrames` holds one socket's side of the chat: the session it has open,
the running turn it follows, the sampling values kept for its next turn and
the page its dashboard shows. A frame of type `t` is answered by its
`on_t(frame)`; a frame it refuses raises `FrameError`, whose message the
socket sends back as an error frame. Frames for the socket go out through
the `send` it is given.

A turn runs as a task of its own, apart from any socket (`chat/live.py`):
its frames go to the session's resumable stream and a socket follows it,
so a socket that closes leaves the turn running to its end and a socket
that opens the session again (a reload, a second tab) gets the turn's
frames from its first. `abort` stops it within a decode step. Every
request is built by the same code as `/v1/chat/completions` (validation,
template, adapters, sampling), so the dashboard can do nothing a client
could not.

The coding tools (read, bash, edit, write) are offered, and gated tool
calls answered, only where the socket may use them (`may_code`, see
`chat.consumer.coding_permitted`). Approvals given with "Always allow"
hold for one tool in one session (`chat/approvals.py`)."""
from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable

from asgiref.sync import sync_to_async

from chat import appctx, gensettings, live, store, turns
from chat.models import ChatEntry, ChatSession
from inference.protocols import params
from serving.router.slots import RouterError

log = logging.getLogger("hearth.chat")
HISTORY_PAGE_BYTES = 256 << 10  # far below the socket's message limit (4 MiB, set where daphne starts)
MAX_ID = 256  # session, entry, call and adapter ids, tool names
MAX_IMAGES = 4  # pictures attached to one question
MAX_IMAGE_CHARS = 400_000  # each, as a data: URL (the dashboard scales pictures down before sending)
CODING_REFUSED = ("coding tools are only for the server's own machine or a signed-in dashboard: "
                  "open the dashboard on the server (loopback) or sign in")


class FrameError(Exception):
    """A frame refused: its message goes back to the socket as an error frame."""


class ChatFrames:
    """One socket's chat: `on_<type>(frame)` for each frame type it takes."""

    def __init__(self, runtime, send: Callable[[dict], Awaitable[None]], may_code: bool):
        self.runtime = runtime  # the serving process's runtime
        self.send = send  # writes a frame to the socket
        self.may_code = may_code
        self.session: ChatSession | None = None
        self.follower: asyncio.Task | None = None  # passes the open session's running turn on to the socket
        self.next_sampling: dict = {}
        self.app_context: dict | None = None  # the page the socket's dashboard shows

    # -- frames ------------------------------------------------------------
    async def on_prompt(self, frame):
        """A question; while a turn runs in the chat, a message queued on it:
        `streamingBehavior` "steer" (the default: taken after the current
        generation and its tool calls) or "followUp" (once the turn is done)."""
        text = _text(frame, "text", self.runtime.options.limits.max_socket_text)
        images = _images(frame)
        behavior = frame.get("streamingBehavior", "steer")
        if behavior not in ("steer", "followUp"):
            raise FrameError("streamingBehavior must be steer or followUp")
        session = await self._session()
        self._share_context()
        turn = await live.find(self.runtime, session.id)
        if turn is not None:
            try:
                if await turn.offer(text, images, behavior):
                    return
            except live.TurnBusy as exc:
                raise FrameError(str(exc)) from None
            await turn.ended()  # writing its last frames: the message starts the next turn
        entry = await sync_to_async(store.ask)(session, text, images)
        await self._start_turn(entry)

    async def on_context(self, frame):
        """What the dashboard shows (the app-aware assistant, chat/appctx.py)."""
        try:
            self.app_context = appctx.check(frame.get("context"))
        except appctx.ContextRefused as exc:
            raise FrameError(str(exc)) from None
        self._share_context()

    async def on_ui_result(self, frame):
        """What the dashboard did with a `ui_*` frame of the open chat's running turn
        (chat/appctx.py reads it); one that no call waits for is dropped quietly."""
        call_id = frame.get("callId")
        if not isinstance(call_id, str) or not call_id or len(call_id) > MAX_ID:
            raise FrameError("ui_result needs callId")
        if not isinstance(frame.get("result"), dict):
            raise FrameError("ui_result needs result: an object")
        turn = await live.find(self.runtime, self.session.id) if self.session is not None else None
        if turn is not None:
            try:
                await turn.answer_ui(call_id, frame["result"])
            except live.TurnBusy as exc:
                raise FrameError(str(exc)) from None

    async def on_abort(self, frame):
        await self._abort()

    async def on_set_thinking(self, frame):
        enabled = frame.get("enabled")
        if not isinstance(enabled, bool):
            raise FrameError("set_thinking needs enabled: true or false")
        session = await self._session()
        session.thinking = enabled
        await sync_to_async(session.save)(update_fields=["thinking", "updated_at"])

    async def on_set_coding_tools(self, frame):
        """Offer the workspace tools (read, bash, edit, write) from the next turn on."""
        enabled = frame.get("enabled")
        if not isinstance(enabled, bool):
            raise FrameError("set_coding_tools needs enabled: true or false")
        if enabled and not self.may_code:
            raise FrameError(CODING_REFUSED)
        session = await self._session()
        session.coding_tools = enabled
        await sync_to_async(session.save)(update_fields=["coding_tools", "updated_at"])
        running = await live.find(self.runtime, session.id) is not None
        await self.send({"type": "coding_tools", "active": enabled, "pending": running})

    async def on_approval(self, frame):
        """The user's answer to a tool_approval_request (from any socket on the session)."""
        if not self.may_code:  # gated calls are the coding tools: only a socket that may run them answers
            raise FrameError(CODING_REFUSED)
        if frame.get("decision") not in ("allow", "deny"):
            raise FrameError("decision must be allow or deny")
        edited = frame.get("editedArgs")
        if edited is not None and not isinstance(edited, dict):
            raise FrameError("editedArgs must be an object")
        turn = await live.find(self.runtime, self.session.id) if self.session is not None else None
        answer = {"decision": frame["decision"], "editedArgs": edited, "alwaysAllow": frame.get("alwaysAllow") is True}
        try:
            taken = turn is not None and await turn.answer(str(frame.get("callId")), answer)
        except live.TurnBusy as exc:
            raise FrameError(str(exc)) from None
        if not taken:
            raise FrameError(f"no tool call {frame.get('callId')!r} is waiting for approval")

    async def on_revoke_approval(self, frame):
        """Ask again before running `tool` in the open session."""
        from chat import approvals

        tool = frame.get("tool")
        if not isinstance(tool, str) or not tool:
            raise FrameError("revoke_approval needs tool")
        if self.session is None:
            raise FrameError("no chat is open")
        session = await self._session()
        if not await sync_to_async(approvals.revoke)(session.id, tool):
            raise FrameError(f"{tool} is not always-allowed in this chat")
        await self.send({"type": "tool_approvals", "sessionId": session.id,
                         "alwaysAllow": await sync_to_async(approvals.allowed)(session.id)})

    async def on_set_sampling(self, frame):
        scope = frame.get("scope", "session")
        if scope not in ("session", "next_turn"):
            raise FrameError("scope must be session or next_turn")
        values = {k: frame[k] for k in params.SAMPLING if k in frame}
        for key, value in values.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise FrameError(f"{key} must be a finite number or null")
        engine = self.runtime.engine if self.runtime.router is None else None
        tokenizer = engine.loaded.tokenizer if engine is not None and engine.loaded is not None else None
        for key in gensettings.KEYS:
            if key in frame:
                try:
                    values[key] = gensettings.check(key, frame[key], tokenizer)
                except ValueError as exc:
                    raise FrameError(str(exc)) from None
        if scope == "next_turn":
            self._check_sampling({**self.next_sampling, **values})
            self.next_sampling.update(values)
            return
        session = await self._session()
        current = store.stored_sampling(session)
        current.update(values)
        current = {k: v for k, v in current.items() if v is not None}
        self._check_sampling(current)
        session.sampling_json = json.dumps(current, allow_nan=False)
        await sync_to_async(session.save)(update_fields=["sampling_json", "updated_at"])

    async def on_set_system_prompt(self, frame):
        text = frame.get("text")
        if text is not None and not isinstance(text, str):
            raise FrameError("text must be a string or null")
        most = self.runtime.options.limits.max_socket_text
        if text and len(text) > most:
            raise FrameError(f"the system prompt is over {most} characters")
        session = await self._session()
        session.system_prompt = text or None
        await sync_to_async(session.save)(update_fields=["system_prompt", "updated_at"])

    async def on_set_adapter(self, frame):
        adapter = frame.get("id")
        if adapter is not None and (not isinstance(adapter, str) or len(adapter) > MAX_ID):
            raise FrameError("id must be an adapter id or null")
        session = await self._session()
        session.adapter = adapter or None
        await sync_to_async(session.save)(update_fields=["adapter", "updated_at"])

    async def on_set_model(self, frame):
        """Router mode: the model this session talks to from its next turn (null: the default)."""
        model = frame.get("model")
        if model is not None and (not isinstance(model, str) or len(model) > MAX_ID):
            raise FrameError("model must be a model id or null")
        router = self.runtime.router
        if router is None:
            raise FrameError("this server serves one model; start `hearth serve` without a model to pick one "
                              "per chat")
        if model:
            try:
                model = router.resolve(model).id
            except RouterError as exc:
                raise FrameError(exc.message) from None
        session = await self._session()
        session.model = model or None
        await sync_to_async(session.save)(update_fields=["model", "updated_at"])

    async def on_new_session(self, frame):
        await self.unfollow()  # a turn running in the chat left behind goes on
        self.session = await sync_to_async(store.create)()
        self._share_context()
        await self.send({"type": "history", "items": [], "sessionId": self.session.id, "total": 0, "more": False})
        await self.send_sessions()

    async def on_list_sessions(self, frame):
        await self.send_sessions()

    async def on_open_session(self, frame):
        """The session's history, then (while a turn runs there) that turn's
        frames from its first, and the rest as they come."""
        session = await self._find(frame)
        await self.unfollow()
        self.session = session
        self._share_context()
        turn = await live.find(self.runtime, session.id)
        offset = turn.segment_offset if turn is not None else 0  # read before the history: see live.upto
        await self._send_history(turn.anchor_id if turn is not None else None)
        await self.send_sessions()
        if turn is not None:
            self._follow(turn, offset)

    async def on_fork_session(self, frame):
        source = await self._find(frame)
        await self.unfollow()
        self.session = await sync_to_async(store.fork)(source)
        self._share_context()
        await self._send_history()
        await self.send_sessions()

    async def on_delete_session(self, frame):
        target = await self._find(frame)
        await self.runtime.streams.stop(target.id)  # its turn, if one runs
        if self.session is not None and self.session.id == target.id:
            await self.unfollow()
            self.session = None
            await self.send({"type": "history", "items": [], "sessionId": None, "total": 0, "more": False})
        await sync_to_async(target.delete)()
        await self.send_sessions()

    async def on_regenerate(self, frame):
        session = await self._session()
        await self._require_idle(session)
        last_user = await sync_to_async(self._last_user)(session)
        await self._start_turn(last_user)

    async def on_edit_resend(self, frame):
        """Ask again with new text: the last question, or the one `entryId` names."""
        text = _text(frame, "text", self.runtime.options.limits.max_socket_text)
        session = await self._session()
        await self._require_idle(session)
        entry_id = frame.get("entryId")
        if entry_id is not None:
            edited = await sync_to_async(session.entries.filter(id=entry_id, role="user").first)()
            if edited is None:
                raise FrameError(f"no question {entry_id} in this session")
        else:
            edited = await sync_to_async(self._last_user)(session)
        parent = await sync_to_async(lambda: edited.parent)()
        images = store.images_of(edited)  # the edited question keeps its pictures
        meta = {"images": images} if images else None
        entry = await sync_to_async(store.add)(session, parent, "user", text, meta=meta)
        await self._start_turn(entry)

    async def on_switch_sibling(self, frame):
        entry_id = frame.get("entryId")
        if not isinstance(entry_id, str):
            raise FrameError("switch_sibling needs entryId")
        session = await self._session()
        await self._require_idle(session)
        try:
            entry = await sync_to_async(store.switch)(session, entry_id)
        except ChatEntry.DoesNotExist:
            raise FrameError(f"no entry {entry_id} in this session") from None
        await self._send_history()
        await self.send({"type": "siblings", **await sync_to_async(store.siblings)(entry)})

    # -- turns -------------------------------------------------------------
    async def _start_turn(self, user_entry: ChatEntry) -> None:
        assert self.session is not None  # the callers opened the session the entry is in
        sampling, self.next_sampling = self.next_sampling, {}  # "next turn" covers all of its rounds
        try:
            turn = await live.start(self.runtime, self.session, self.may_code, sampling, user_entry)
        except live.TurnBusy as exc:
            raise FrameError(str(exc)) from None
        self._follow(turn)

    def _follow(self, turn: live.LiveTurn | live.RemoteTurn, offset: int = 0) -> None:
        if self.follower is not None:
            self.follower.cancel()
        self.follower = asyncio.ensure_future(self._pass_on(turn, offset))

    async def _pass_on(self, turn: live.LiveTurn | live.RemoteTurn, offset: int) -> None:
        try:
            async for frame in live.follow(turn.stream, turn.session_id, offset):
                if frame.get("type") == "turn_end":
                    await self.send_sessions()  # the stored turn may have named the chat
                await self.send(frame)
        except asyncio.CancelledError:
            raise
        except Exception:  # the socket closed under it: the turn goes on without this socket
            log.debug("following a turn ended", exc_info=True)

    async def unfollow(self) -> None:
        follower, self.follower = self.follower, None
        await live.cancel(follower)

    @staticmethod
    def _last_user(session: ChatSession) -> ChatEntry:
        for entry in reversed(store.path(session)):
            if entry.role == "user":
                return entry
        raise FrameError("nothing to regenerate yet")

    async def _abort(self) -> None:
        """Stop the open session's running turn (what was shown is still kept)."""
        if self.session is not None:
            await self.runtime.streams.stop(self.session.id)

    async def _require_idle(self, session: ChatSession) -> None:
        if await live.find(self.runtime, session.id) is not None:
            raise FrameError("a turn is running; abort it first")

    # -- helpers -----------------------------------------------------------
    async def _session(self) -> ChatSession:
        """The open session as stored now (another tab may have changed it)."""
        if self.session is not None:
            self.session = await sync_to_async(ChatSession.objects.filter(id=self.session.id).first)()
            if self.session is None:
                raise FrameError("this chat was deleted (in another tab?); start a new one")
        if self.session is None:
            self.session = await sync_to_async(store.create)()
        return self.session

    async def _find(self, frame) -> ChatSession:
        key = frame.get("path") or frame.get("id")
        if not isinstance(key, str) or not key or len(key) > MAX_ID:
            raise FrameError("path required")
        found = await sync_to_async(ChatSession.objects.filter(id=key).first)()
        if found is None:
            raise FrameError(f"no session {key}")
        return found

    async def _send_history(self, anchor_id: str | None = None) -> None:
        """The showing path in pages: `history` with the first, `history_more`
        with the rest (`more` says whether another follows). With a running
        turn's `anchor_id`: only up to it, as the replay that follows brings the rest."""
        from chat import approvals

        assert self.session is not None  # the callers opened (or made) the session first
        total, pages = await sync_to_async(store.history_pages)(self.session, HISTORY_PAGE_BYTES)
        if anchor_id is not None:
            pages = live.upto(pages, anchor_id) or [[]]
            total = len({it.get("id") for page in pages for it in page})
        settings = {**store.settings(self.session), "alwaysAllow": await sync_to_async(approvals.allowed)(
            self.session.id)}
        settings["codingTools"] = settings["codingTools"] and self.may_code  # what a turn here will offer
        sid = self.session.id
        await self.send({"type": "history", "items": pages[0], "sessionId": sid, "settings": settings,
                         "total": total, "more": len(pages) > 1})
        for i, page in enumerate(pages[1:], start=2):
            await self.send({"type": "history_more", "items": page, "sessionId": sid, "more": i < len(pages)})

    def _share_context(self) -> None:
        """The open session's turns see what this socket's dashboard shows."""
        if self.app_context is not None and self.session is not None:
            appctx.remember(self.session.id, self.app_context)

    def _check_sampling(self, values: dict) -> None:
        runtime = self.runtime  # router mode: the model's process checks them when a turn runs
        if runtime.router is None and runtime.engine is not None and runtime.engine.loaded is not None:
            problem = turns.sampling_problem(values, runtime.engine.loaded, runtime.options.defaults)
            if problem is not None:
                raise FrameError(problem)

    async def send_sessions(self) -> None:
        items = await sync_to_async(store.sessions)()
        await self.send({"type": "sessions", "items": items,
                         "activePath": self.session.id if self.session else None})



def _images(frame: dict) -> list[str]:
    """A prompt's attached pictures: data:image/… URLs, stored with the
    question and sent to the model as image parts."""
    value = frame.get("images") or []
    if not isinstance(value, list) or len(value) > MAX_IMAGES:
        raise FrameError(f"images must be a list of at most {MAX_IMAGES} data:image URLs")
    for url in value:
        if not isinstance(url, str) or not url.startswith("data:image/") or len(url) > MAX_IMAGE_CHARS:
            raise FrameError(f"each image must be a data:image URL of at most {MAX_IMAGE_CHARS} characters")
    return value


def _text(frame: dict, key: str, most: int) -> str:
    value = frame.get(key)
    if not isinstance(value, str) or not value.strip():
        raise FrameError(f"{key} required")
    if len(value) > most:
        raise FrameError(f"{key} is over {most} characters")
    return value
