"""The part of a dashboard chat the model sees: the newest turns that fit
its context.

A conversation is its system prompt and its turns: each turn one question
and what answered it (text, tool calls and their results). When the whole
conversation leaves less room than the turn's reply may take (its
max_tokens, the chat's `reply_budget`), the oldest turns are left out, whole
(a tool call never without its result), until it fits; the system prompt
and the turn being answered are always sent. What is stored stays as it is:
the turn keeps, in its meta, how many of the chat's messages the model no
longer saw and the first one it did (`context_cut`), which the page marks.
A conversation over the server's `--max-prompt-chars` or `--max-messages`
does not fit either, and loses its oldest turns the same way. Only when the
turn being answered does not fit even alone is it refused, as any prompt too
long is.

The count is the prompt's tokens as the model's own chat template and
tokenizer make them: the engine's prepared request in single-model mode; in
router mode, the template and tokenizer of the folder the model's process
serves, read here once (the process renders the same messages with the
same files).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

# The most of the context a reply's room may take when the turn's max_tokens asks for more: past that the
# conversation would keep almost nothing of itself; the reply still runs up to the window's end.
MAX_REPLY_SHARE = 2
# The protocols' refusals of a prompt by its size alone (inference/protocols/chat.py): over --max-prompt-chars,
# over --max-messages. A conversation refused so leaves out its oldest turns as one over the context does.
SIZE_REFUSALS = ("prompt_too_large", "too_many_messages")


@dataclass
class Turn:
    entry_id: str  # the question's stored entry
    messages: list[dict]  # the question, then what answered it, as the model reads them
    shown: int  # the chat's messages it stands for (its question, and its answer when there is one)


@dataclass
class Conversation:
    head: list[dict]  # the system prompt
    turns: list[Turn] = field(default_factory=list)  # oldest first; the last is the turn being answered

    def messages(self, skip: int = 0) -> list[dict]:
        """The system prompt and the turns from the `skip`th on."""
        return [*self.head, *(m for t in self.turns[skip:] for m in t.messages)]

    def extend(self, messages: list[dict]) -> None:
        """What the turn being answered adds (a tool round's call and its results)."""
        self.turns[-1].messages.extend(messages)

    def cut(self, skip: int) -> dict | None:
        """What the page shows of a turn sent without its `skip` oldest turns."""
        if skip <= 0:
            return None
        return {"hidden": sum(t.shown for t in self.turns[:skip]), "first_seen": self.turns[skip].entry_id}


def conversation(session, user_entry) -> Conversation:
    """The stored path to `user_entry`, grouped in turns (synchronous ORM code)."""
    from chat import store
    from chat.toolloop import replay

    conv = Conversation([{"role": "system", "content": session.system_prompt}] if session.system_prompt else [])
    for e in store.path(session, user_entry):
        if e.role == "assistant" and conv.turns:
            conv.turns[-1].messages += replay(e)
            conv.turns[-1].shown += 1
        elif e.role == "assistant":  # an answer with no question before it: its own turn
            conv.turns.append(Turn(e.id, replay(e), 1))
        else:
            conv.turns.append(Turn(e.id, [{"role": e.role, "content": store.user_content(e)}], 1))
    return conv


def prompt_limit(window: int | None, max_tokens: int | None) -> int | None:
    """The most prompt tokens that leave a reply of `max_tokens` its room
    (at most 1/MAX_REPLY_SHARE of the window); None: the window is unknown."""
    if window is None:
        return None
    room = min(max_tokens or 1, window // MAX_REPLY_SHARE)
    return max(window - room, 1)


async def fit(turns: int, count: Callable[[int], Awaitable[tuple[int | None, Any]]], limit: int | None,
              start: int = 0) -> tuple[int, Any]:
    """The fewest oldest turns to leave out so the prompt holds at most
    `limit` tokens, and what `count(skip)` made of that prompt (its tokens,
    and whatever the caller sends: the prepared request). `count` answers
    (None, the refusal) for a prompt refused whatever its tokens (over the
    server's characters or messages): it does not fit either. The prompt
    without the `start` oldest turns is counted first (once, when it fits;
    a tool round starts from the skip of the round before it, as a turn only
    grows); past that, a bisection over how many more to skip. Nothing fits:
    the newest turn alone, and when even that is refused, its refusal is
    raised."""
    def fits(counted: tuple[int | None, Any]) -> bool:
        return counted[0] is not None and (limit is None or counted[0] <= limit)

    start = min(max(start, 0), max(turns - 1, 0))
    counted = {start: await count(start)}
    low, high = start + 1, turns - 1  # the newest turn alone (skip turns - 1) is sent whether or not it fits
    if fits(counted[start]) or low > high:
        low = start
    while low < high:
        mid = (low + high) // 2
        counted[mid] = await count(mid)
        if fits(counted[mid]):
            high = mid
        else:
            low = mid + 1
    if low not in counted:
        counted[low] = await count(low)
    tokens, made = counted[low]
    if tokens is None:
        raise made
    return low, made


def router_count(folder: Path, messages: list[dict], tools: list[dict] | None, thinking: bool) -> int:
    """Router mode: the prompt's tokens as the model's process makes them,
    from the chat template and tokenizer in its folder."""
    tokenizer = _tokenizer(str(folder))
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=thinking)
    return len(tokenizer.encode(text, add_special_tokens=False))


@functools.lru_cache(maxsize=4)
def _tokenizer(folder: str):
    # The parent of a router holds no model; the tokenizer alone is a few MB, read once per folder.
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
