"""The radix index the prompt cache and its SSD tier find entries with,
against the plain scan it replaces, on random sequences of a small
vocabulary (so they share prefixes and branch often), through additions,
re-additions and removals."""
from __future__ import annotations

import random

import numpy as np

from inference.engine.prefix_index import PrefixIndex, common_prefix


def scan_longest(stored: dict[int, np.ndarray], tokens: np.ndarray, limit: int) -> tuple[int, int]:
    """(shared, length) of the best entry by a scan: most shared tokens up to `limit`, then shortest."""
    best = (0, 0)
    for seq in stored.values():
        shared = min(common_prefix(seq, tokens), limit)
        if shared > best[0] or (shared == best[0] and shared and len(seq) < best[1]):
            best = (shared, len(seq))
    return best


def walk_invariants(index: PrefixIndex) -> None:
    """Every node but the root is an end or a branch point; depths add up; `shortest` is right."""
    stack = [index.root]
    while stack:
        node = stack.pop()
        if node is not index.root:
            assert node.keys or len(node.children) >= 2
            assert node.depth == node.parent.depth + len(node.label)
        for first, child in node.children.items():
            assert child.parent is node and int(child.label[0]) == first
            stack.append(child)
        lengths = [node.depth for _ in node.keys] + [c.shortest[0] for c in node.children.values()]
        assert (node.shortest[0] if node.shortest else None) == (min(lengths) if lengths else None)


def test_the_index_answers_as_a_scan_of_every_entry():
    rng = random.Random(7)
    index: PrefixIndex[int] = PrefixIndex()
    stored: dict[int, np.ndarray] = {}
    for step in range(1500):
        action = rng.random()
        if action < 0.5 or not stored:
            key = rng.randrange(300)
            base = stored[rng.choice(list(stored))] if stored and rng.random() < 0.6 else np.zeros(0)
            seq = np.concatenate([base[: rng.randrange(len(base) + 1)],
                                  [rng.randrange(4) for _ in range(rng.randrange(6))]]).astype(np.int32)
            index.add(key, seq)
            stored[key] = seq
        elif action < 0.7:
            key = rng.choice(list(stored))
            index.remove(key)
            del stored[key]
        else:
            query = np.array([rng.randrange(4) for _ in range(rng.randrange(12))], dtype=np.int32)
            if stored and rng.random() < 0.5:
                seq = stored[rng.choice(list(stored))]
                query = np.concatenate([seq[: rng.randrange(len(seq) + 1)], query]).astype(np.int32)
            limit = max(0, len(query) - rng.randrange(3))
            key, shared = index.longest(query, limit)
            want = scan_longest(stored, query, limit)
            assert (shared, len(stored[key]) if key is not None else 0) == want, (step, query, limit)
            if key is not None:
                assert min(common_prefix(stored[key], query), limit) == shared
            whole_key, whole_n = index.whole(query, limit)
            assert whole_n == max((len(s) for s in stored.values()
                                   if len(s) <= limit and common_prefix(s, query) == len(s)), default=0)
            assert (whole_key is None) == (whole_n == 0) and (whole_key is None or len(stored[whole_key]) == whole_n)
            assert sorted(index.prefixes(query)) == sorted(
                k for k, s in stored.items() if len(s) <= len(query) and common_prefix(s, query) == len(s))
        assert len(index) == len(stored)
        if step % 100 == 0:
            walk_invariants(index)
    for key in list(stored):
        assert index.length(key) == len(stored[key])
        index.remove(key)
    walk_invariants(index)
    assert not index.root.children and index.root.shortest is None


def test_a_prompt_ending_inside_an_edge_or_at_a_branch():
    index: PrefixIndex[str] = PrefixIndex()
    index.add("long", np.array([1, 2, 3, 4, 5, 6]))
    index.add("side", np.array([1, 2, 3, 9]))
    index.add("short", np.array([1, 2]))
    assert index.longest(np.array([1, 2, 3, 4]), 3) == ("side", 3), "the shortest of those sharing 3"
    assert index.longest(np.array([1, 2, 3, 4, 5]), 4) == ("long", 4)
    assert index.longest(np.array([1, 2]), 1) == ("short", 1)
    assert index.longest(np.array([7]), 0) == (None, 0)
    assert index.prefixes(np.array([1, 2, 3, 9, 9])) == ["short", "side"]
    index.remove("short")
    assert index.longest(np.array([1, 2]), 2) == ("side", 2)
