"""Saved prefix states, reused across requests at chunk granularity (agent loops, several agents).

A prefix is decoded in chunks whose ends depend on the prompt alone (``chunking``: the template head,
blocks of ``block`` tokens, a JSON transcript's elements). At the last cut the engine saves the
sequence's state (``llama_state_seq_get_data``: KV cells, and for recurrent or hybrid models the
recurrent state too) and files it here under the tokens it holds. A later prefix that shares those
tokens and cuts restores that state and decodes only the rest, in the chunks a cold prefill would use,
so the answer is bit-identical whether the cache was cold, warm, or full of other agents' states.

Why saved states in host memory rather than extra llama.cpp sequences:

* recurrent and hybrid memory (Qwen3.5) cannot remove the tail of a sequence, so reuse needs a state
  taken exactly at a cut; llama.cpp's ``n_rs_seq`` only rolls a sequence back by a few tokens
  (speculative decoding), not to an arbitrary earlier cut;
* a restored state lands in the context's first cells, exactly where a cold prefill puts it, so the
  attention reductions see the same cell order — sequences scattered among other agents' cells
  would not guarantee that;
* the context only ever holds the request at hand: a cached state never takes a cell from it, so no
  request is refused or slowed by what is cached (the context needs no eviction at all).

The entries are immutable: one is filed only after its prefill succeeded (see ``DecisionEngine``),
so a failure or abort mid-prefill never leaves a half-written entry behind.

Entries remember where their prompt was cut (``chunking``): a state is reusable up to a cut both
prompts share with the same cuts before it. One more state is *pinned*: the template head's, which
every prompt starts with; it is kept outside the limits and the LRU (a few hundred kilobytes) until
``clear``, and a lookup that finds only it counts as a miss (nothing of the request's own was cached).
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from dataclasses import dataclass

from semif_adapter.engine.chunking import Cuts, block_cuts, shared_cut


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading tokens ``a`` and ``b`` share (bisection over C-speed tuple comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # a[:lo] == b[:lo] and a[:hi + 1] != b[:hi + 1] hold throughout
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class SavedPrefix:
    """One saved sequence state: the first ``len(tokens)`` prefix tokens, decoded in chunks ending at
    ``cuts`` (the last one is ``len(tokens)``; None: the cache's block rule)."""

    tokens: tuple[int, ...]
    data: ctypes.Array[ctypes.c_uint8]
    cuts: Cuts | None = None

    @property
    def nbytes(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class CacheStats:
    entries: int
    tokens: int
    bytes: int
    hits: int
    misses: int
    evictions: int
    resident: int = 0


class PrefixCache:
    """An LRU of saved prefix states bounded in tokens and bytes (either bound 0 disables it)."""

    def __init__(
        self,
        max_tokens: int,
        max_bytes: int,
        block: int,
        partial_reuse: bool,
        partial_limit: int = 0,
        head: int = 0,
        any_cut: bool = False,
    ) -> None:
        self.max_tokens = max_tokens
        self.max_bytes = max_bytes
        self.block = block
        self.head = head  # the block rule's head cut (``chunking.block_cuts``)
        # attention-only memory can drop a restored state's tail blocks; recurrent memory cannot,
        # so there a saved state is usable only when the prefix starts with all of it
        self.partial_reuse = partial_reuse
        # a sliding-window model saves only the window's last cells: a longer state cut short would
        # lack keys its next tokens attend to, so only states up to the window may be cut (0: any)
        self.partial_limit = partial_limit
        self.any_cut = False
        self.reuse_at_any_token(any_cut)
        self._entries: OrderedDict[tuple[int, ...], SavedPrefix] = OrderedDict()
        self._pinned: SavedPrefix | None = None
        self._tokens = 0
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        # warm prefills served by the prefix sequence 0 still held, cut back in place: nothing restored
        # (``Prefill.resident``; counted whether or not the cache is enabled)
        self.resident = 0

    def reuse_at_any_token(self, on: bool) -> None:
        """Invariant numerics on attention memory: the split does not move a number, so a state is
        reusable up to the longest token prefix it shares with the request, at any token (memory that
        cannot cut a state back, or a window shorter than the state, keeps the cut rule)."""
        self.any_cut = on and self.partial_reuse and self.partial_limit == 0

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0 and self.max_bytes > 0

    def lookup(self, prefix: tuple[int, ...], cuts: Cuts | None = None) -> tuple[SavedPrefix | None, int]:
        """The saved state ``prefix`` (cut at ``cuts``; None: the block rule) can reuse most of, and
        how many tokens of it.

        Counts a hit or a miss and marks the state as recently used; ``peek`` does neither.
        """
        best, reused = self.peek(prefix, cuts)
        if best is None or best is self._pinned:
            self.misses += 1
            return best, reused
        self.hits += 1
        keep = self.checkpoint(self._cuts(best))
        if keep and best.tokens[:keep] in self._entries:  # its transcript's next block turn needs it
            self._entries.move_to_end(best.tokens[:keep])
        self._entries.move_to_end(best.tokens)
        return best, reused

    def peek(self, prefix: tuple[int, ...], cuts: Cuts | None = None) -> tuple[SavedPrefix | None, int]:
        """What ``lookup`` would return, without touching counters or recency (deadline estimates)."""
        prefix_cuts = cuts if cuts is not None else self._block_cuts(len(prefix))
        best: SavedPrefix | None = None
        best_reuse = 0
        candidates = [*self._entries.values(), *([self._pinned] if self._pinned else [])]
        for entry in candidates:
            if self.any_cut:
                reuse = common_prefix(entry.tokens, prefix)
            else:
                reuse = shared_cut(entry.tokens, self._cuts(entry), prefix, prefix_cuts)
            if not (reuse == len(entry.tokens) or self._cuttable(len(entry.tokens))):
                continue
            if reuse > best_reuse:
                best, best_reuse = entry, reuse
        return best, best_reuse

    def checkpoint(self, cuts: Cuts) -> int:
        """Where a prefix cut at ``cuts`` needs a second saved state (0: nowhere): its last block before
        the element cuts (``chunking.event_cuts``), when the state at its end cannot be cut back to it.

        A transcript's next turn resumes at the last cut it shares with this one; when its new element
        completes a block, that is the block before this prefix's element cuts. Recurrent memory holds
        one state for the whole sequence, and a sliding-window state longer than the window has lost the
        window layers' earlier cells, so neither can serve that turn from the state at its end.
        """
        if not cuts or self._cuttable(cuts[-1]):
            return 0
        blocks = set(self._block_cuts(cuts[-1]))
        if set(cuts) <= blocks:
            return 0
        before = [c for c in cuts[:-1] if c in blocks and c != self.head]
        return before[-1] if before else 0

    def pin(self, entry: SavedPrefix) -> None:
        """Keep ``entry`` (the template head's state) until ``clear``, outside the limits and the LRU."""
        if self.enabled:
            self._pinned = entry

    @property
    def pinned(self) -> SavedPrefix | None:
        return self._pinned

    def put(self, entry: SavedPrefix) -> None:
        """File a complete state; states it extends are dropped (but its ``checkpoint``), then the least
        recently used."""
        if not self.enabled or not entry.tokens:
            return
        if len(entry.tokens) > self.max_tokens or entry.nbytes > self.max_bytes:
            return  # larger than the whole cache: keeping it would evict everything for nothing
        keep = self.checkpoint(self._cuts(entry))
        for key in [k for k in self._entries if entry.tokens[: len(k)] == k and len(k) != keep]:
            self._remove(key)  # the same conversation grew: the new state covers the old one
        self._entries[entry.tokens] = entry
        self._tokens += len(entry.tokens)
        self._bytes += entry.nbytes
        while self._tokens > self.max_tokens or self._bytes > self.max_bytes:
            self._remove(next(iter(self._entries)))
            self.evictions += 1

    def clear(self) -> None:
        self._entries.clear()
        self._pinned = None
        self._tokens = self._bytes = 0

    def stats(self) -> CacheStats:
        return CacheStats(
            entries=len(self._entries),
            tokens=self._tokens,
            bytes=self._bytes,
            hits=self.hits,
            misses=self.misses,
            evictions=self.evictions,
            resident=self.resident,
        )

    def _cuttable(self, n_tokens: int) -> bool:
        """A saved state of ``n_tokens`` can be cut back to an earlier cut."""
        return self.partial_reuse and not 0 < self.partial_limit < n_tokens

    def _block_cuts(self, n_tokens: int) -> Cuts:
        return block_cuts(n_tokens, self.block, self.head)

    def _cuts(self, entry: SavedPrefix) -> Cuts:
        return entry.cuts if entry.cuts is not None else self._block_cuts(len(entry.tokens))

    def _remove(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key)
        self._tokens -= len(entry.tokens)
        self._bytes -= entry.nbytes
