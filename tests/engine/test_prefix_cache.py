"""The prefix cache's bookkeeping: block matching, LRU order, limits, and metrics (no model needed)."""

from __future__ import annotations

import ctypes

from prometheus_client import generate_latest

from semif_adapter.engine.chunking import block_cuts, shared_cut
from semif_adapter.engine.prefix_cache import PrefixCache, SavedPrefix
from semif_adapter.metrics import Metrics


def saved(tokens: list[int], nbytes: int = 100) -> SavedPrefix:
    return SavedPrefix(tuple(tokens), (ctypes.c_uint8 * nbytes)())


def test_block_cuts_share_only_whole_equal_blocks() -> None:
    def common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
        return shared_cut(a, block_cuts(len(a), 4), b, block_cuts(len(b), 4))

    a = tuple(range(10))
    assert common(a, a) == 8  # the partial third block never counts
    assert common(a, (*a[:5], 99, *a[6:])) == 4
    assert common(a, (99, *a[1:])) == 0
    assert common(a, a[:7]) == 4


def test_lookup_takes_the_longest_block_match_and_counts_hits() -> None:
    cache = PrefixCache(1000, 10_000, block=4, partial_reuse=True)
    cache.put(saved(list(range(8))))
    cache.put(saved([*range(4), 50, 51, 52, 53, 54, 55, 56, 57]))
    entry, reused = cache.lookup((*range(4), 50, 51, 52, 53, 54, 55, 99, 98, 97))
    assert entry is not None and entry.tokens[4] == 50 and reused == 8
    assert cache.lookup((7, 7, 7, 7, 7))[0] is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries, stats.tokens) == (1, 1, 2, 20)


def test_peek_answers_like_lookup_without_counting_or_reordering() -> None:
    cache = PrefixCache(8, 10_000, block=4, partial_reuse=True)
    a, b = saved([1] * 4), saved([2] * 4)
    cache.put(a)
    cache.put(b)
    assert cache.peek((1, 1, 1, 1, 9)) == (a, 4)
    assert cache.peek((9, 9, 9, 9)) == (None, 0)
    assert (cache.stats().hits, cache.stats().misses) == (0, 0)
    cache.put(saved([3] * 4))  # a was only peeked at, so it is still the least recently used
    assert cache.peek((1, 1, 1, 1)) == (None, 0) and cache.peek((2, 2, 2, 2)) == (b, 4)


def test_recurrent_memory_needs_the_whole_saved_state() -> None:
    cache = PrefixCache(1000, 10_000, block=4, partial_reuse=False)
    cache.put(saved(list(range(8))))
    assert cache.lookup((*range(6), 99, 99, 99)) == (None, 0)  # only 1 of its 2 blocks match
    entry, reused = cache.lookup(tuple(range(11)))
    assert entry is not None and reused == 8


def test_a_grown_state_replaces_the_one_it_extends() -> None:
    cache = PrefixCache(1000, 10_000, block=4, partial_reuse=True)
    cache.put(saved(list(range(4))))
    cache.put(saved(list(range(8))))
    stats = cache.stats()
    assert stats.entries == 1 and stats.tokens == 8 and stats.evictions == 0


def test_least_recently_used_goes_first_within_both_limits() -> None:
    cache = PrefixCache(12, 10_000, block=4, partial_reuse=True)
    a, b, c = saved([1] * 4), saved([2] * 4), saved([3] * 4)
    cache.put(a)
    cache.put(b)
    cache.put(c)
    cache.lookup((1, 1, 1, 1))  # a is now the most recent
    cache.put(saved([4] * 4))  # 16 tokens > 12: the least recent (b) goes
    assert cache.lookup((2, 2, 2, 2))[0] is None
    assert cache.lookup((1, 1, 1, 1))[0] is a and cache.lookup((3, 3, 3, 3))[0] is c
    assert cache.stats().evictions == 1
    by_bytes = PrefixCache(1000, 250, block=4, partial_reuse=True)
    for token in range(3):
        by_bytes.put(saved([token] * 4, nbytes=100))
    assert by_bytes.stats().entries == 2 and by_bytes.stats().bytes == 200


def test_zero_disables_and_oversized_states_are_not_kept() -> None:
    for tokens, nbytes in ((0, 10_000), (1000, 0)):
        off = PrefixCache(tokens, nbytes, block=4, partial_reuse=True)
        off.put(saved([1] * 4))
        assert not off.enabled and off.stats().entries == 0
    small = PrefixCache(8, 10_000, block=4, partial_reuse=True)
    small.put(saved([1] * 4))
    small.put(saved([2] * 12))  # bigger than the whole cache: kept out, nothing evicted for it
    assert small.stats().entries == 1 and small.stats().evictions == 0


def test_prometheus_exports_cache_counters_and_size() -> None:
    metrics = Metrics()
    cache = PrefixCache(1000, 10_000, block=4, partial_reuse=True)
    metrics.watch_prefix_cache(cache.stats)
    cache.put(saved(list(range(8)), nbytes=321))
    cache.lookup(tuple(range(9)))
    cache.resident += 2  # what ``Prefill.resume_in_place`` counts
    metrics.record_prefill(prefix_tokens=9, reused_tokens=8)
    text = generate_latest(metrics.registry).decode()
    for line in (
        "semif_prefix_cache_hits_total 1.0",
        "semif_prefix_cache_misses_total 0.0",
        "semif_prefix_cache_evictions_total 0.0",
        "semif_prefix_cache_resident_total 2.0",
        "semif_prefix_cache_entries 1.0",
        "semif_prefix_cache_tokens 8.0",
        "semif_prefix_cache_bytes 321.0",
        "semif_prefix_reused_tokens_total 8.0",
        "semif_prefill_tokens_total 1.0",
    ):
        assert line in text, line


def test_a_state_longer_than_the_sliding_window_is_never_cut() -> None:
    cache = PrefixCache(1000, 10_000, block=4, partial_reuse=True, partial_limit=8)
    cache.put(saved(list(range(12))))  # 12 > 8: only the window's last cells were saved
    assert cache.lookup((*range(8), 99, 99, 99, 99)) == (None, 0)
    cache.put(saved([5] * 8))  # within the window: all its cells are there, cutting is safe
    entry, reused = cache.lookup((5, 5, 5, 5, 9, 9, 9, 9))
    assert entry is not None and reused == 4


def test_a_state_that_cannot_be_cut_back_keeps_its_block_checkpoint() -> None:
    """Event cuts (block 4, elements past the last block) on memory that reuses states only whole: the
    state at the block before the element cuts stays filed as the transcript grows, and is kept fresh."""
    cache = PrefixCache(40, 10_000, block=4, partial_reuse=False)
    assert cache.checkpoint((4, 8, 10, 11)) == 8
    assert cache.checkpoint((4, 8)) == 0  # blocks only: the state at the end is all a next turn needs
    assert PrefixCache(40, 10_000, block=4, partial_reuse=True).checkpoint((4, 8, 10, 11)) == 0
    assert PrefixCache(40, 10_000, block=4, partial_reuse=True, partial_limit=8).checkpoint((4, 8, 10)) == 8
    turn = list(range(100, 111))
    cache.put(saved(turn[:8]))  # the checkpoint (block cuts: 4, 8)
    cache.put(SavedPrefix(tuple(turn[:10]), (ctypes.c_uint8 * 10)(), (4, 8, 10)))
    cache.put(SavedPrefix(tuple(turn), (ctypes.c_uint8 * 10)(), (4, 8, 10, 11)))  # the next turn
    assert {len(k) for k in cache._entries} == {8, 11}  # the older end state went, the checkpoint stayed
    crossed = (*turn, 120, 121, 122)  # a turn whose new element completed the block at 12
    assert cache.peek(crossed, (4, 8, 12, 14)) == (cache._entries[tuple(turn[:8])], 8)
    for other in range(3):
        cache.put(saved([other] * 4))
    cache.lookup((*turn, 1), (4, 8, 10, 11))  # the transcript's end state is used: its checkpoint too
    cache.put(saved([7] * 12))  # 31 + 12 tokens > 40: the least recent other goes first
    assert tuple(turn[:8]) in cache._entries and tuple(turn) in cache._entries
