"""A bound on a reasoning block: once a row has written `budget` tokens
inside `<think>`, its next tokens are the block's closing tokens, forced
(every other token masked), and the row goes on past the block.

Two requests need one. A forced tool call on a model whose template opens a
think block: the grammar lets the block run free, and a model that never
closes it thinks until `max_tokens` and no call comes. And Anthropic's
`thinking.budget_tokens`, which caps the reasoning. A budget of 0 closes the
block at once (thinking switched off by the client, on a template that opens
the block regardless).

A logits processor, last in the row's chain: after the grammar's mask, so a
closing token the grammar does not allow there (the row is not in a think
block after all) is never forced; the bound then stands down. The model's
own opening and closing are found in the text of the tokens it writes
(`piece`), whatever tokens spell them; the forced close is `close`, the
tokenizer's own spelling. Like the grammar it keeps state across steps and
starts again from the tokens a row had generated when the row moves to a
fresh lane (`restart`). mlx-lm and xgrammar bound no reasoning length, so
this is Hearth's own.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

TAIL_CHARS = 64  # the text kept to find a marker the model writes across several tokens


@dataclass
class ThinkBound:
    budget: int  # tokens the block may hold before it is closed
    close: tuple[int, ...]  # the tokens that close it, forced
    piece: Callable[[int], str]  # one token's text
    close_text: str = "</think>"
    open_text: str = "<think>"
    inside: bool = False  # the prompt left the block open: generation starts in it
    _state: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self._reset()

    def _reset(self) -> None:
        self._state = {"inside": self.inside, "count": 0, "forcing": 0 if self.inside and self.budget <= 0 else -1,
                       "done": False, "tail": "", "started": False}

    def fresh(self) -> ThinkBound:
        """The same bound for another row (a sibling choice), from the start."""
        return ThinkBound(self.budget, self.close, self.piece, self.close_text, self.open_text, self.inside)

    def restart(self, generated: list[int]) -> None:
        """Start over having seen `generated` (a row continuing on a fresh
        lane, whose first call sees its prompt and those tokens again)."""
        self._reset()
        for token in generated:
            self._see(token)

    def _see(self, token: int) -> None:
        s = self._state
        if s["done"]:
            return
        s["tail"] = (s["tail"] + self.piece(token))[-TAIL_CHARS:]
        if not s["inside"]:
            if self.open_text in s["tail"]:
                s["inside"], s["count"], s["tail"] = True, 0, ""
                s["forcing"] = 0 if self.budget <= 0 else -1
            return
        if s["forcing"] >= 0:  # a forced closing token
            s["forcing"] += 1
            s["done"] = s["forcing"] >= len(self.close)
        elif self.close_text in s["tail"]:
            s["done"] = True  # the model closed the block itself
        else:
            s["count"] += 1
            if s["count"] >= self.budget:
                s["forcing"] = 0  # the next tokens are the closing ones

    def __call__(self, tokens, logits):
        import mlx.core as mx

        s = self._state
        if s["started"]:  # the token sampled last step; the first call sees the prompt
            self._see(int(tokens[-1].item()))
        s["started"] = True
        if s["done"] or not s["inside"] or s["forcing"] < 0:
            return logits
        token = self.close[s["forcing"]]
        if not bool(mx.isfinite(logits[..., token]).all().item()):  # the grammar does not allow it here
            s["done"], s["forcing"] = True, -1
            return logits
        keep = mx.arange(logits.shape[-1]) == token
        return mx.where(keep, logits, mx.array(-mx.inf, dtype=logits.dtype))
