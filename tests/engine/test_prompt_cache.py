"""The prompt cache and its SSD tier on small real KV caches: longest-prefix
reuse, the byte cap, session preference, superseded entries, atomic files
that survive a restart, and files that went bad."""
from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache

from inference.engine import ssd_cache
from inference.engine.prefix_index import common_prefix
from inference.engine.prompt_cache import PromptCache
from inference.engine.ssd_cache import SSDCache

LAYERS, HEADS, DIM = 2, 2, 4
BYTES_PER_TOKEN = LAYERS * 2 * HEADS * DIM * 4


def kv(tokens: list[int]) -> list:
    """A cache whose every key/value row is its token id, so reuse is checkable."""
    cache = []
    for layer in range(LAYERS):
        c = KVCache()
        rows = mx.broadcast_to(mx.array(tokens, dtype=mx.float32)[None, None, :, None] + layer,
                               (1, HEADS, len(tokens), DIM))
        c.update_and_fetch(rows, rows * 2)
        cache.append(c)
    return cache


def ids_in(cache: list) -> list[int]:
    c = cache[0]
    return c.keys[0, 0, : c.offset, 0].astype(mx.int32).tolist()


def test_common_prefix():
    a = np.array([1, 2, 3, 4], dtype=np.int32)
    assert common_prefix(a, np.array([1, 2, 9], dtype=np.int32)) == 2
    assert common_prefix(a, a[:2]) == 2
    assert common_prefix(a, np.array([], dtype=np.int32)) == 0


def test_longest_prefix_reuse_is_trimmed_and_private():
    cache = PromptCache(1 << 20)
    cache.publish([1, 2, 3, 4, 5], kv([1, 2, 3, 4, 5]))
    cache.publish([7, 8, 9], kv([7, 8, 9]))
    got, n = cache.lookup([1, 2, 3, 9, 9])
    assert n == 3 and ids_in(got) == [1, 2, 3]
    got[0].trim(3)  # the copy is the caller's: the stored entry is untouched
    again, n = cache.lookup([1, 2, 3, 4, 5, 6])
    assert n == 5 and ids_in(again) == [1, 2, 3, 4, 5]
    same, n = cache.lookup([1, 2, 3, 4, 5])
    assert n == 4, "one prompt token is always left to prefill"
    assert cache.lookup([5, 5])[1] == 0
    s = cache.stats()
    assert (s["hits"], s["misses"], s["prefix_scans"]) == (3, 1, 4)


def test_an_entry_the_next_one_extends_is_replaced():
    cache = PromptCache(1 << 20)
    cache.publish([1, 2, 3], kv([1, 2, 3]))
    cache.publish([1, 2, 3, 4, 5], kv([1, 2, 3, 4, 5]))
    assert cache.stats()["entries"] == 1
    assert cache.bytes == 5 * BYTES_PER_TOKEN


def test_byte_cap_evicts_least_recent_but_session_entries_last():
    cache = PromptCache(3 * 4 * BYTES_PER_TOKEN)  # room for three 4-token entries
    cache.publish([1, 1, 1, 1], kv([1, 1, 1, 1]), session="kept")
    cache.publish([2, 2, 2, 2], kv([2, 2, 2, 2]))
    cache.publish([3, 3, 3, 3], kv([3, 3, 3, 3]))
    cache.lookup([2, 2, 2, 2, 0])  # 2 is now the most recent
    cache.publish([4, 4, 4, 4], kv([4, 4, 4, 4]))
    kept = {int(e.tokens[0]) for e in cache.entries.values()}
    assert kept == {1, 2, 4}, "3 was the least recent entry no session held"
    assert cache.bytes <= cache.max_bytes and cache.stats()["evictions"] == 1


def test_sessions_follow_covering_entries_and_eviction_spares_them_at_random():
    """Random publishes (with and without sessions, extending earlier ones), closes and lookups under a tight
    byte cap, against the plain definitions: the sessions reversed are the holders map, a session whose entry
    was covered points at the entry that covers it, and eviction takes the least recent entry no session
    holds."""
    import random

    rng = random.Random(7)
    cache = PromptCache(6 * 4 * BYTES_PER_TOKEN)
    names = [f"s{i}" for i in range(5)]
    for step in range(400):
        op = rng.random()
        if op < 0.6:
            oldest = next(iter(cache.entries.values()), None)
            base = [int(t) for t in oldest.tokens] if oldest is not None and rng.random() < 0.4 else []
            tokens = (base + [rng.randrange(4) for _ in range(rng.randrange(1, 4))])[:8]
            session = rng.choice([*names, None])
            before = dict(cache.sessions)
            covered = {e.key for e in cache.entries.values()
                       if len(e.tokens) <= len(tokens) and list(e.tokens) == tokens[:len(e.tokens)]}
            if any(len(e.tokens) == len(tokens) for e in cache.entries.values() if e.key in covered):
                covered = set()  # published before: only its session is bound
            held = set(cache.sessions.values())
            lru_free = next((e.key for e in cache.entries.values() if e.key not in held), None)
            cache.publish(tokens, kv(tokens), session=session)
            new = next((k for k, e in cache.entries.items() if list(e.tokens) == tokens), None)
            if new is not None:
                for name, key in before.items():
                    if key in covered and key != new:
                        assert cache.sessions[name] == new, (step, name)
            if lru_free is not None and lru_free not in covered and lru_free not in cache.entries:
                assert cache.stats()["evictions"] > 0
        elif op < 0.75:
            cache.close_session(rng.choice(names))
        else:
            cache.lookup([rng.randrange(4) for _ in range(6)], session=rng.choice([*names, None]))
        reversed_ = {}
        for name, key in cache.sessions.items():
            reversed_.setdefault(key, set()).add(name)
        assert cache._holders == reversed_, step
        held = set(cache.sessions.values())
        want = next((e for e in cache.entries.values() if e.key not in held), None)
        if cache.entries:
            assert cache._victim() is (want or next(iter(cache.entries.values()))), step


def test_session_hit_miss_and_close():
    cache = PromptCache(1 << 20)
    cache.lookup([1, 2, 3], session="s")  # nothing yet: a session miss, then a scan
    cache.publish([1, 2, 3, 4], kv([1, 2, 3, 4]), session="s")
    got, n = cache.lookup([1, 2, 3, 4, 5, 6], session="s")
    assert n == 4
    s = cache.stats()
    assert (s["session_hits"], s["session_misses"], s["prefix_scans"]) == (1, 1, 1)
    cache.lookup([9, 9, 9], session="s")  # an edited history: miss, ordinary search
    cache.close_session("s")
    cache.lookup([1, 2, 3, 4, 5], session="s")
    s = cache.stats()
    assert (s["session_hits"], s["session_misses"], s["prefix_scans"]) == (1, 3, 3)


def test_the_ssd_entries_of_a_snapshot_that_is_gone_are_removed_at_start(tmp_path):
    """Each namespace records its snapshot; a start removes the namespaces whose snapshot is gone (a
    checkpoint replaced), keeps those whose snapshot is there, and leaves alone any folder that is not a
    namespace with its record (someone else's, in a shared --ssd-cache folder)."""
    root, kept_model, new_model = tmp_path / "cache", tmp_path / "kept", tmp_path / "new"
    kept_model.mkdir()
    new_model.mkdir()
    old = SSDCache(root, "0" * 16, max_bytes=1 << 30, queue_bytes=1 << 30, source=str(tmp_path / "replaced"))
    cache = PromptCache(1 << 20, old)
    cache.publish([5, 6, 7, 8], kv([5, 6, 7, 8]))
    assert old.wait_idle(10)
    old.close()
    assert list((root / ("0" * 16)).glob("*.safetensors"))  # a start never removes its own namespace
    (root / "unknown").mkdir()
    (root / "unknown" / "a.safetensors").write_bytes(b"someone's")
    (root / "mine").mkdir()  # not a namespace's name, though it holds the record of a snapshot that is gone
    (root / "mine" / ssd_cache.SOURCE).write_text(json.dumps({"path": str(tmp_path / "replaced")}))
    SSDCache(root, "1" * 16, max_bytes=1 << 30, queue_bytes=1 << 30, source=str(kept_model)).close()
    assert sorted(p.name for p in root.iterdir()) == ["1" * 16, "mine", "unknown"]
    SSDCache(root, "2" * 16, max_bytes=1 << 30, queue_bytes=1 << 30, source=str(new_model)).close()
    assert sorted(p.name for p in root.iterdir()) == ["1" * 16, "2" * 16, "mine", "unknown"]


def test_ssd_tier_round_trip_and_restart(tmp_path):
    ssd = SSDCache(tmp_path, "ns", max_bytes=1 << 30, queue_bytes=1 << 30)
    cache = PromptCache(1 << 20, ssd)
    cache.publish([5, 6, 7, 8], kv([5, 6, 7, 8]))
    assert ssd.wait_idle(10)
    entry = next(iter(cache.entries.values()))
    assert entry.durable and ssd.stats()["spills"] == 1
    assert not list((tmp_path / "ns").glob("*.tmp"))
    ssd.close()

    import os

    (tmp_path / "ns" / "leftover.safetensors.tmp").write_bytes(b"half a write")
    os.utime(tmp_path / "ns" / "leftover.safetensors.tmp", (1, 1))  # a crash long ago
    (tmp_path / "ns" / "inflight.safetensors.tmp").write_bytes(b"another writer, now")
    (tmp_path / "ns" / "broken.safetensors").write_bytes(b"not safetensors")
    restarted = SSDCache(tmp_path, "ns", max_bytes=1 << 30, queue_bytes=1 << 30)
    assert restarted.stats()["entries"] == 1, "the broken file is skipped, not used"
    assert not (tmp_path / "ns" / "leftover.safetensors.tmp").exists()
    assert (tmp_path / "ns" / "inflight.safetensors.tmp").exists()
    assert (tmp_path / "ns" / "broken.safetensors").exists(), "nothing stored is deleted for being unreadable"
    fresh = PromptCache(1 << 20, restarted)
    got, n = fresh.lookup([5, 6, 7, 8, 9])
    assert n == 4 and ids_in(got) == [5, 6, 7, 8]
    assert mx.array_equal(got[1].values[..., :4, :], kv([5, 6, 7, 8])[1].values[..., :4, :])
    assert restarted.stats()["restores"] == 1 and fresh.stats()["entries"] == 1
    restarted.close()


def test_ssd_queue_bound_drops_then_flush_writes(tmp_path):
    ssd = SSDCache(tmp_path, "ns", max_bytes=1 << 30, queue_bytes=0)  # every background write is refused
    cache = PromptCache(1 << 20, ssd)
    cache.publish([1, 2, 3], kv([1, 2, 3]))
    assert ssd.stats()["dropped_spills"] == 1 and ssd.stats()["entries"] == 0
    pending = cache.pending_durability()
    assert len(pending) == 1
    for entry in pending:
        assert ssd.submit(entry, force=True)  # what a flush does
    assert ssd.wait_idle(10) and ssd.stats()["entries"] == 1 and pending[0].durable
    ssd.close()


def test_ssd_size_cap_removes_the_least_recently_used(tmp_path):
    import os

    ssd = SSDCache(tmp_path, "ns", max_bytes=1 << 30, queue_bytes=1 << 30)
    cache = PromptCache(1 << 20, ssd)
    cache.publish([1, 1, 1, 1], kv([1, 1, 1, 1]))
    assert ssd.wait_idle(10)
    first = next(iter(cache.entries))
    size = ssd.stats()["bytes"]
    os.utime(tmp_path / "ns" / f"{first}.safetensors", (1, 1))  # long unused
    ssd.max_bytes = 2 * size
    cache.publish([2, 2, 2, 2], kv([2, 2, 2, 2]))
    cache.publish([3, 3, 3, 3], kv([3, 3, 3, 3]))
    assert ssd.wait_idle(10)
    assert ssd.stats()["entries"] == 2 and ssd.stats()["bytes"] <= ssd.max_bytes
    assert not (tmp_path / "ns" / f"{first}.safetensors").exists()
    assert [e.durable for e in cache.entries.values()] == [False, True, True]
    ssd.close()


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_ssd_keeps_half_precision(tmp_path, dtype):
    ssd = SSDCache(tmp_path, "ns", max_bytes=1 << 30, queue_bytes=1 << 30)
    cache = PromptCache(1 << 20, ssd)
    half = kv([3, 4, 5])
    for c in half:
        c.keys, c.values = c.keys.astype(dtype), c.values.astype(dtype)
    cache.publish([3, 4, 5], half)
    assert ssd.wait_idle(10)
    key = next(iter(cache.entries))
    tokens, restored = ssd.load(key)
    assert tokens.tolist() == [3, 4, 5] and restored[0].keys.dtype == dtype
    assert mx.array_equal(restored[0].keys, half[0].keys[..., :3, :])
    ssd.close()


def test_an_untrimmable_cache_reuses_the_longest_entry_the_prompt_starts_with():
    cache = PromptCache(1 << 20, trimmable=False)
    cache.publish([1, 2], kv([1, 2]))
    cache.publish([1, 2, 3, 4, 5, 6], kv([1, 2, 3, 4, 5, 6]))  # shares more, but would need a trim
    cache.publish([1, 2, 3, 7], kv([1, 2, 3, 7]), ns="adapter")
    got, n = cache.lookup([1, 2, 3, 4, 9])
    assert n == 2 and ids_in(got) == [1, 2]
    got, n = cache.lookup([1, 2, 3, 4, 5, 6, 7])
    assert n == 6 and ids_in(got) == [1, 2, 3, 4, 5, 6]
    assert cache.lookup([1, 2, 3, 4, 5, 6], session=None)[1] == 2, "the whole entry would leave nothing to prefill"
    got, n = cache.lookup([1, 2, 3, 7, 8], ns="adapter")
    assert n == 4 and cache.lookup([1, 2, 3, 8], ns="adapter")[1] == 0, "entries stay in their adapter set"


def test_a_wrapped_sliding_window_entry_keeps_the_ones_it_extends_and_falls_back_to_them():
    from mlx_lm.models.cache import RotatingKVCache

    def window(tokens: list[int]) -> list:
        c = RotatingKVCache(max_size=4)
        rows = mx.broadcast_to(mx.array(tokens, dtype=mx.float32)[None, None, :, None], (1, HEADS, len(tokens), DIM))
        c.update_and_fetch(rows, rows)
        return [c]

    cache = PromptCache(1 << 20)  # the model's caches are trimmable while they have not wrapped
    cache.publish([1, 2], window([1, 2]))
    cache.publish([1, 2, 3, 4, 5, 6, 7, 8], window([1, 2, 3, 4, 5, 6, 7, 8]))  # wrapped: it cannot be cut back
    assert cache.stats()["entries"] == 2
    got, n = cache.lookup([1, 2, 3, 9, 9])
    assert n == 2 and got[0].offset == 2, "the longer entry shares more, but only the shorter one is usable"
    got, n = cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert n == 8 and got[0].offset == 8
