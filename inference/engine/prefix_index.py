"""Token sequences by key, found by the prefix they share with a prompt.

The prompt cache and its SSD tier ask two questions of the sequences they
hold: which one shares the longest prefix with a new prompt, and which ones
a new sequence extends. Scanning every sequence costs a numpy comparison an
entry, on the engine thread, for every request: with a small model a 1 GiB
cache holds thousands of entries, and an SSD tier as many. This is a radix
tree (a trie whose edges carry runs of tokens), so both answers cost one
comparison per branch point along the prompt's own path, whatever the
number of entries.

mlx-lm's `PromptTrie` (mlx_lm.models.cache) is a trie of one dict per token:
a node per token of every entry (millions of dicts for a cache of long
contexts), and its search for an entry below the point where a prompt
diverges walks that subtree. Here a node is a branch point or the end of a
sequence, an edge is a numpy slice, and each node knows the shortest
sequence below it, so a lookup walks the prompt's path and nothing else.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class _Node(Generic[K]):
    __slots__ = ("label", "depth", "parent", "children", "keys", "shortest")

    def __init__(self, label: np.ndarray, depth: int, parent: _Node[K] | None):
        self.label = label  # the tokens on the edge from the parent
        self.depth = depth  # tokens from the root to here, this edge's included
        self.parent = parent
        self.children: dict[int, _Node[K]] = {}  # by the first token of the child's label
        self.keys: dict[K, None] = {}  # the sequences that end here, in insertion order
        self.shortest: tuple[int, K] | None = None  # (length, key) of the shortest sequence at or below

    def refresh(self) -> None:
        """Recompute `shortest` from this node's own keys and its children's."""
        if self.keys:
            self.shortest = (self.depth, next(iter(self.keys)))
            return
        below = [c.shortest for c in self.children.values() if c.shortest is not None]
        self.shortest = min(below, key=lambda s: s[0]) if below else None


class PrefixIndex(Generic[K]):
    """Sequences of token ids, each under a key. Not thread-safe: its owner
    serializes the calls."""

    def __init__(self) -> None:
        self.root: _Node[K] = _Node(np.zeros(0, dtype=np.int32), 0, None)
        self.nodes: dict[K, _Node[K]] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, key: object) -> bool:
        return key in self.nodes

    def add(self, key: K, tokens: np.ndarray) -> None:
        """Index `tokens` under `key` (a key added again moves to its new tokens)."""
        if key in self.nodes:
            self.remove(key)
        tokens = np.asarray(tokens, dtype=np.int32)
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(int(tokens[i]))
            if child is None:
                leaf = _Node[K](tokens[i:].copy(), len(tokens), node)
                node.children[int(tokens[i])] = leaf
                node = leaf
                break
            m = common_prefix(child.label, tokens[i:])
            if m < len(child.label):
                child = self._split(child, m)
            node, i = child, i + m
        node.keys[key] = None
        self.nodes[key] = node
        at: _Node[K] | None = node
        while at is not None:
            if at.shortest is None or len(tokens) < at.shortest[0]:
                at.shortest = (len(tokens), key)
            at = at.parent

    def _split(self, child: _Node[K], m: int) -> _Node[K]:
        """Put a node `m` tokens into `child`'s edge and return it."""
        parent = child.parent
        assert parent is not None
        # Copies, so that no edge keeps a removed sequence's whole array alive.
        mid = _Node[K](child.label[:m].copy(), parent.depth + m, parent)
        parent.children[int(child.label[0])] = mid
        child.label = child.label[m:].copy()
        child.parent = mid
        mid.children[int(child.label[0])] = child
        mid.shortest = child.shortest
        return mid

    def remove(self, key: K) -> None:
        node = self.nodes.pop(key, None)
        if node is None:
            return
        del node.keys[key]
        # Keep every node a branch point or an end: drop an empty leaf, fold a pass-through node into its child.
        while node is not self.root and not node.keys and len(node.children) <= 1:
            parent = node.parent
            assert parent is not None
            if node.children:
                (child,) = node.children.values()
                child.label = np.concatenate([node.label, child.label])
                child.parent = parent
                parent.children[int(node.label[0])] = child
            else:
                del parent.children[int(node.label[0])]
            node = parent
        # Only the nodes whose shortest sequence was this one need another: removing keeps every other minimum
        # (a branch point after a shared system prompt can have thousands of children to look through).
        at: _Node[K] | None = node
        while at is not None:
            if at.shortest is not None and at.shortest[1] == key:
                at.refresh()
            at = at.parent

    def longest(self, tokens: np.ndarray, limit: int) -> tuple[K | None, int]:
        """The key whose sequence shares the most tokens with `tokens`, counting
        at most `limit`, and that count; among equals, the shortest sequence
        (the least to trim). (None, 0) when none shares a token."""
        if limit <= 0:
            return None, 0
        best: tuple[int, int, K] | None = None  # (-shared, length, key)
        node, i = self.root, 0  # i: the tokens matched down to `node`, always under `limit`
        while True:
            if node.keys:  # a sequence `tokens` starts with
                cand = (-node.depth, node.depth, next(iter(node.keys)))
                best = cand if best is None or cand[:2] < best[:2] else best
            child = node.children.get(int(tokens[i])) if i < len(tokens) else None
            if child is None:  # everything at or below `node` shares its i tokens
                below, shared = node, i
                break
            m = common_prefix(child.label, tokens[i:])
            if i + m >= limit:  # everything below shares `limit` tokens or more: the shortest of it wins
                below, shared = child, limit
                break
            if m < len(child.label):  # `tokens` ends or turns inside this edge
                below, shared = child, i + m
                break
            node, i = child, i + m
        if shared and below.shortest is not None:
            length, key = below.shortest
            cand = (-shared, length, key)
            best = cand if best is None or cand[:2] < best[:2] else best
        if best is None or best[0] == 0:
            return None, 0
        return best[2], -best[0]

    def whole(self, tokens: np.ndarray, limit: int) -> tuple[K | None, int]:
        """The key of the longest sequence `tokens` starts with, of at most `limit` tokens, and its length:
        one a cache can use without cutting it back. (None, 0) when there is none."""
        found = self.prefixes(tokens[:max(limit, 0)])
        length = self.length(found[-1]) if found else 0
        return (found[-1], length) if length else (None, 0)

    def prefixes(self, tokens: np.ndarray) -> list[K]:
        """The keys whose sequences `tokens` starts with (its own included)."""
        found: list[K] = []
        node, i = self.root, 0
        while True:
            found.extend(node.keys)
            if i >= len(tokens):
                return found
            child = node.children.get(int(tokens[i]))
            if child is None or common_prefix(child.label, tokens[i:]) < len(child.label):
                return found
            node, i = child, i + len(child.label)

    def length(self, key: K) -> int:
        """The length of the sequence under `key` (KeyError where none is)."""
        return self.nodes[key].depth
