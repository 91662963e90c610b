"""The prefill: what sequence 0 holds, and how a request's prefix gets there.

The prefix is decoded in chunks its cuts fix (``chunking``), or, in invariant numerics, in as few
calls as its saved states allow (``stops``); states are saved at the cuts the prefix cache keeps and
restored from it, so an agent's next turn decodes only what it added. The template head is decoded
once at load and pinned. Whatever was reused, every token is decoded in the call it would be decoded
in cold: that is what keeps answers bit-identical with the cache on or off.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from semif_adapter.engine.calls import pieces
from semif_adapter.engine.chunking import Cuts, chunks, head_cuts
from semif_adapter.engine.deadline import Deadline
from semif_adapter.engine.llama_backend import PREFIX_SEQ, LlamaRuntime
from semif_adapter.engine.planner import Planner
from semif_adapter.engine.prefix_cache import PrefixCache, SavedPrefix, common_prefix
from semif_adapter.engine.resident_streams import ResidentStreams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FillPlan:
    """An invariant prefill: the saved state it starts from (None: an empty sequence), how many prefix
    tokens of it are kept, and the points its calls end at (``points[0]`` is ``reused``; between two
    points, calls of at most ``n_batch``); the states at ``save_at`` go into the prefix cache."""

    saved: SavedPrefix | None
    reused: int
    points: tuple[int, ...]
    save_at: tuple[int, ...]
    in_place: bool = False  # sequence 0 still holds the ``reused`` tokens (``Prefill.resident``)

    @property
    def tail_at(self) -> int:
        """Where the prefix's tail (decoded in its decisions' calls) starts."""
        return self.points[-1]

    @property
    def cut_back(self) -> bool:
        """The saved state holds more than the prefix shares with it: drop its cells past ``reused``."""
        return self.saved is not None and self.reused < len(self.saved.tokens)


class Prefill:
    """Sequence 0 and the prefix cache of one context; the engine sets ``fork_mode``, ``invariant``,
    ``min_piece`` and ``pad_limit`` once its probes have decided them."""

    def __init__(self, runtime: LlamaRuntime, planner: Planner, prefix_cache: PrefixCache) -> None:
        self.runtime = runtime
        self.planner = planner
        self.prefix_cache = prefix_cache
        self.fork_mode = "copy"
        self.invariant = False
        self.min_piece = 1
        self.pad_limit = 0  # tokens of filler a run may get to share a call (``calls``); 0: none
        self.cached_prefix: list[int] | None = None
        self.cached_cuts: Cuts | None = None
        self.kept_until = 0  # invariant numerics: sequence 0 holds the kept prefix up to here
        self.snapshot: Any = None  # fork mode "state": sequence 0's state after the prefill
        # what the branch streams hold between shared batches (``resident_streams``)
        self.streams = ResidentStreams(max(0, runtime.n_seq_max - 1))

    @property
    def streams_stay(self) -> bool:
        """Shared batches leave each request's prefix in its stream for its next turn: invariant numerics
        on memory reused at any token (``resident``'s condition), in the stream layout."""
        return self.invariant and self.prefix_cache.any_cut and self.runtime.n_swa == 0

    def reset(self, wipe: bool = False) -> None:
        """Empty sequence 0 (``wipe``: the whole context and its data, after a failure); saved states stay
        (each one is complete, whatever failed since), and so do the prefixes branch streams hold for
        their next turns (``resident_streams``)."""
        self.cached_prefix = None
        self.cached_cuts = None
        self.kept_until = 0
        self.snapshot = None
        try:
            if self.streams.held and not wipe:
                self.runtime.drop(PREFIX_SEQ)
                for seq in range(1, self.streams.width + 1):
                    if seq not in self.streams.held:
                        self.runtime.drop(seq)
                return
            self.streams.forget()
            self.runtime.clear(wipe)
        except Exception:  # pragma: no cover - nothing more we can do
            log.exception("could not clear llama.cpp memory")

    def keeps(self, prefix_tokens: list[int], cuts: Cuts) -> bool:
        """Sequence 0 already holds ``prefix_tokens``, decoded at ``cuts``."""
        return self.cached_prefix == prefix_tokens and self.cached_cuts == cuts

    def keep(self, prefix_tokens: list[int], cuts: Cuts, until: int) -> None:
        """Sequence 0 holds ``prefix_tokens`` (decoded at ``cuts``) up to ``until``: the next request about
        this state decodes only the rest (invariant numerics: the tail, in its decisions' calls)."""
        self.cached_prefix, self.cached_cuts, self.kept_until = list(prefix_tokens), cuts, until

    def reusable(self, prefix_tokens: list[int], cuts: Cuts) -> int:
        """Prefix tokens the next prefill will not decode (the kept prefix, or a saved state's chunks)."""
        if self.keeps(prefix_tokens, cuts):
            return len(prefix_tokens)
        resident = self.resident(prefix_tokens)
        if not self.prefix_cache.enabled:
            return resident
        return max(resident, self.prefix_cache.peek(tuple(prefix_tokens), cuts)[1])

    def resident(self, prefix_tokens: list[int]) -> int:
        """How many leading tokens of ``prefix_tokens`` sequence 0 still holds from the request before,
        where it can serve them in place (0: it cannot).

        An agent's next turn extends its last prompt: rather than empty the context and restore the
        saved state of that prompt (a copy of every cell), its prefill cuts sequence 0 back to what the
        two prompts share and decodes the rest there. Only in invariant numerics on memory the prefix
        cache reuses at any token (attention only, no sliding window: ``PrefixCache.any_cut``), where a
        prefix's cells are the same numbers however they were decoded, and sit where a restored state
        would put them (from the stream's first cell, the cells past the cut freed).
        """
        if not (self.invariant and self.prefix_cache.any_cut and self.cached_prefix and self.kept_until):
            return 0
        return common_prefix(tuple(self.cached_prefix[: self.kept_until]), tuple(prefix_tokens))

    def fill(self, prefix_tokens: list[int], cancel: Deadline | None = None, cuts: Cuts | None = None) -> int:
        """Make sequence 0 hold exactly ``prefix_tokens``; returns how many tokens were reused.

        Chunks follow ``cuts`` (default: the head and blocks) whatever is reused, so each token is
        decoded in the same chunk as in a cold prefill. The state at the last cut is filed in the prefix
        cache only once the whole prefill succeeded; on any exception (an abort included) the caller
        empties the context (``reset``) and nothing partial was filed.
        """
        cuts = cuts if cuts is not None else self.planner.block_cuts(len(prefix_tokens))
        if self.keeps(prefix_tokens, cuts):
            return len(prefix_tokens)
        runtime, cache = self.runtime, self.prefix_cache
        key = tuple(prefix_tokens)
        reused = self.restore(key, cuts)
        last = cuts[-1] if cuts else 0  # the state saved there; the rest is decoded after the save
        fresh: list[SavedPrefix] = []
        if last > reused:
            # the state at the last cut, and where it cannot be cut back, at the block before its elements
            filed = [p for p in (cache.checkpoint(cuts), last) if p > reused and p != self.planner.head_cut]
            states = self.decode_chunks(
                prefix_tokens, chunks(cuts, reused, last), cuts, cancel, filed if cache.enabled else ()
            )
            fresh = [SavedPrefix(key[:p], state, self.cuts_to(cuts, p)) for p, state in states.items()]
        block = self.planner.block_tokens
        runtime.decode(prefix_tokens[last:], last, PREFIX_SEQ, False, block, cancel=cancel)
        for entry in fresh:
            cache.put(entry)
        self.keep(prefix_tokens, cuts, len(prefix_tokens))
        if self.fork_mode == "state":
            self.snapshot = runtime.save_seq(PREFIX_SEQ)
        return reused

    def restore(self, key: tuple[int, ...], cuts: Cuts) -> int:
        """Empty the context, then restore the saved state that serves most of ``key`` into sequence 0
        (cut back to what it shares); returns how many prefix tokens it holds."""
        self.reset()
        if not self.prefix_cache.enabled:
            return 0
        saved, reused = self.prefix_cache.lookup(key, cuts)
        if saved is not None:
            self.runtime.restore_seq(PREFIX_SEQ, saved.data)
            if reused < len(saved.tokens):
                self.runtime.drop(PREFIX_SEQ, reused)
        return reused

    def cuts_to(self, cuts: Cuts, last: int) -> Cuts | None:
        """The cuts a state saved at ``last`` remembers (None when the block rule gives them)."""
        kept = tuple(c for c in cuts if c <= last)
        return None if kept == self.planner.block_cuts(last) else kept

    def decode_chunks(
        self,
        tokens: list[int],
        spans: list[tuple[int, int]],
        cuts: Cuts,
        cancel: Deadline | None = None,
        save_at: Collection[int] = (),
    ) -> dict[int, Any]:
        """Decode the chunks ``spans`` of ``tokens``, pinning the template head's state on the way;
        returns the states saved at the chunk ends ``save_at``.

        On a sliding-window model, a saved sequence state holds only the window's cells, so after a
        restore the window cache has fewer cells than after a cold prefill; the CPU kernels split
        their work by that cell count and round differently. Saving and restoring the sequence
        after each chunk gives every prefill, cold or warm, cache on or off, the same cache layout
        and bytes.
        """
        runtime = self.runtime
        head, cache = self.planner.head_cut, self.prefix_cache
        pin = cache.enabled and head > 0 and tokens[:head] == self.planner.head_tokens
        saved: dict[int, Any] = {}
        for start, end in spans:
            runtime.decode(tokens[start:end], start, PREFIX_SEQ, False, end - start, cancel=cancel)
            if runtime.n_swa > 0 or (pin and end == head) or end in save_at:
                state = runtime.save_seq(PREFIX_SEQ)
                if runtime.n_swa > 0:
                    runtime.restore_seq(PREFIX_SEQ, state)
                if pin and end == head:
                    cache.pin(SavedPrefix(tuple(tokens[:head]), state, self.cuts_to(cuts, head)))
                if end in save_at:
                    saved[end] = state
        return saved

    def fill_shared(
        self, prefix_tokens: list[int], cuts: Cuts, cancel: Deadline | None, hold_end: bool = False
    ) -> tuple[int, int, FillPlan | None]:
        """Invariant numerics: sequence 0 holds the prefix up to its tail; returns the tokens reused, where
        the tail (left to the decisions' calls) starts (``plan_fill`` says which calls) and, with
        ``hold_end``, the plan whose last call was left to the caller.

        ``hold_end``: where the state is saved at the prefix's end (``save_point``), its last call is not
        made here: the caller decodes that stretch in sequence 0 with a decision's suffix (one call where
        there were two), drops the suffix's cells and files the state with :meth:`file_end`.
        """
        n = len(prefix_tokens)
        if self.keeps(prefix_tokens, cuts):
            return n, self.kept_until, None
        plan = self.plan_fill(prefix_tokens, cuts, self.resident(prefix_tokens))
        held = hold_end and len(plan.points) > 1 and plan.points[-1] == n
        if held:
            plan = replace(plan, points=plan.points[:-1])
        # in place, a short stretch to a state filed at the end is the tail: filed once the tail is in
        held = held or (hold_end and plan.in_place and n in plan.save_at)
        if plan.in_place:
            self.resume_in_place(plan.reused)
        else:
            self.reset()
        if plan.saved is not None:
            self.runtime.restore_seq(PREFIX_SEQ, plan.saved.data)
            if plan.cut_back:
                self.runtime.drop(PREFIX_SEQ, plan.reused)
        limit, least = self.runtime.n_batch, self.min_piece
        spans = [p for a, b in pairwise(plan.points) for p in pieces(a, b, limit, least, aligned=True)]
        states = self.decode_chunks(prefix_tokens, spans, cuts, cancel, plan.save_at)
        for p, state in states.items():
            self.file_state(prefix_tokens, cuts, plan, p, state)
        return plan.reused, plan.tail_at, plan if held else None

    def resume_in_place(self, at: int) -> None:
        """Sequence 0 keeps its first ``at`` tokens and loses the rest; it no longer holds a kept prefix
        (a failure from here on leaves it to ``reset``)."""
        self.cached_prefix = self.cached_cuts = None
        self.kept_until = 0
        self.snapshot = None
        self.runtime.drop(PREFIX_SEQ, at)
        self.prefix_cache.resident += 1

    def file_end(self, prefix_tokens: list[int], cuts: Cuts, plan: FillPlan) -> None:
        """Sequence 0 holds exactly ``prefix_tokens``, its last stretch decoded by the caller of
        ``fill_shared(hold_end=True)``: save and file the state the prefill left to it."""
        n = len(prefix_tokens)
        if n in plan.save_at:
            self.file_state(prefix_tokens, cuts, plan, n, self.runtime.save_seq(PREFIX_SEQ))

    def file_whole(self, prefix_tokens: list[int], cuts: Cuts, state: Any) -> None:
        """File ``state``, of all of ``prefix_tokens``, whatever a prefill plan saves: a shared tiled call
        leaves each request's whole prefix in its region, and its next turn resumes there. Only where
        the cache reuses a state at any token: a state anywhere is then one a later prompt can start from
        (a lone prefill does not stop for a stretch shorter than the minimum piece, so it files none)."""
        if self.prefix_cache.enabled and self.prefix_cache.any_cut:
            at = len(prefix_tokens)
            self.prefix_cache.put(SavedPrefix(tuple(prefix_tokens), state, self.cuts_to(cuts, at)))

    def plan_fill(self, prefix_tokens: list[int], cuts: Cuts, resident: int = 0) -> FillPlan:
        """Invariant numerics: the saved state a prefill starts from (counted as a cache hit or miss) and
        the calls it makes from there, touching no sequence (so the engine may decode it in any stream).
        ``resident``: the prefix tokens sequence 0 holds in place (``resident``); where they are at least
        what the saved state serves, the plan starts from them (``in_place``) and restores nothing.

        Calls stop only where a state is saved (the last cut, the block before a transcript's elements
        where a state cannot be cut back, the template head) and, on a sliding-window model, at every cut
        (each chunk's state is saved and restored so that the window cache has one layout, see
        ``decode_chunks``): ``stops``.
        """
        cache = self.prefix_cache
        saved, reused = cache.lookup(tuple(prefix_tokens), cuts) if cache.enabled else (None, 0)
        last = self.save_point(len(prefix_tokens), cuts)
        filed = [cache.checkpoint(cuts), last] if cache.enabled else []
        chain = self.stops(cuts, filed, last)
        points = self.points(reused, chain)
        save_at = tuple(p for p in filed if p in points[1:] and p != self.planner.head_cut)
        in_place = 0 < resident >= reused
        if in_place:
            # the states a prefill from the saved state would file are filed in place too, those past
            # the resident tokens: a turn of a few tokens has no call of its own, so its state at the
            # prefix's end is filed once its tail is in (``fill_shared``) and a turn after another
            # agent's finds it
            saved, reused, points = None, resident, self.points(resident, chain)
            save_at = tuple(p for p in save_at if p > resident)
        return FillPlan(saved, reused, tuple(points), save_at, in_place)

    def points(self, reused: int, chain: list[int]) -> list[int]:
        """Where a prefill from ``reused`` tokens ends its calls: the stops past it (``stops``), one closer
        than ``min_piece`` to the start passed over (a reuse at any token may leave a short first span)."""
        points = [reused, *(p for p in chain if p > reused)]
        while len(points) > 1 and points[1] - points[0] < self.min_piece:
            del points[1]
        return points

    def files_at(self, prefix_tokens: list[int], plan: FillPlan, at: int) -> bool:
        """A call of ``plan`` that ends at ``at`` leaves a state :meth:`file_state` files."""
        if not self.prefix_cache.enabled:
            return False
        head = self.planner.head_cut
        return at in plan.save_at or (at == head > 0 and prefix_tokens[:head] == self.planner.head_tokens)

    def file_state(self, prefix_tokens: list[int], cuts: Cuts, plan: FillPlan, at: int, state: Any) -> None:
        """A prefill ``plan`` ended a call at ``at`` with ``state``: file it (the prefix cache at a saved cut,
        the pin at the template head), the same for a prefill in sequence 0 or in another stream."""
        cache, head = self.prefix_cache, self.planner.head_cut
        if not cache.enabled:
            return
        if at == head and head > 0 and prefix_tokens[:head] == self.planner.head_tokens:
            cache.pin(SavedPrefix(tuple(prefix_tokens[:head]), state, self.cuts_to(cuts, head)))
        elif at in plan.save_at:
            cache.put(SavedPrefix(tuple(prefix_tokens[:at]), state, self.cuts_to(cuts, at)))

    def save_point(self, n_prefix: int, cuts: Cuts) -> int:
        """Where the state of a prefix of ``n_prefix`` tokens cut at ``cuts`` is saved: its last cut, or in
        invariant numerics on memory the prefix cache reuses at any token (``PrefixCache.any_cut``) the
        prefix's end. A later prompt resumes from the state at the longest token prefix they share, which
        the cut-back state reaches wherever the cuts fall; the prefill then needs no stop before the end
        (one call fewer when the last cut is not the end). Memory whose state cannot be cut back, or a
        sliding window, keeps the last cut: a state must be taken exactly where a later prompt resumes."""
        if self.invariant and self.prefix_cache.any_cut:
            return n_prefix
        return cuts[-1] if cuts else 0

    def stops(self, cuts: Cuts, filed: Collection[int], last: int | None = None) -> list[int]:
        """Invariant numerics: where a prefix cut at ``cuts`` ends its calls, a function of the prompt
        alone (so a warm prefill resumes at a stop of the cold one and continues with the same calls).

        Calls stop where a state is saved (``filed``, the head; none past ``last``, the save point,
        default the last cut) and, on a sliding-window model, at every cut; a stop closer than
        ``min_piece`` to the one before is passed over, so no call holds a short piece; the state there
        is not saved (and the prefix's tail starts at the stop before).
        """
        if last is None:
            last = cuts[-1] if cuts else 0
        wanted = {p for p in filed if 0 < p <= last}
        if self.prefix_cache.enabled and 0 < self.planner.head_cut <= last:
            wanted.add(self.planner.head_cut)
        if self.runtime.n_swa > 0:
            wanted.update(cuts)
        chain: list[int] = []
        for stop in sorted(wanted):
            if stop - (chain[-1] if chain else 0) >= self.min_piece:
                chain.append(stop)
        return chain

    def pin_head(self) -> None:
        """Decode the template head once at load and pin its state: not even the first request decodes it."""
        if not (self.prefix_cache.enabled and self.planner.head_cut > 0):
            return
        cuts = head_cuts(self.planner.head_cut, self.planner.block_tokens)
        spans = chunks(cuts, 0, self.planner.head_cut)
        if self.invariant:  # the calls any prompt makes up to the head (``stops``), if it stops there
            points = [0, *self.stops(cuts, ())]
            if points[-1] != self.planner.head_cut:
                return
            spans = [
                p for a, b in pairwise(points) for p in pieces(a, b, self.runtime.n_batch, self.min_piece)
            ]
        try:
            self.decode_chunks(self.planner.head_tokens, spans, cuts)
        finally:
            self.reset()

    def saved_cuts(self, cuts: Cuts, n_prefix: int) -> tuple[int, ...]:
        """Where a prefix of ``n_prefix`` tokens cut at ``cuts`` files its saved states: its save point
        (``save_point``) and, where a state cannot be cut back, the block before a transcript's elements;
        in invariant numerics only those its calls stop at (``stops``)."""
        if not (cuts and self.prefix_cache.enabled):
            return ()
        head = self.planner.head_cut
        last = self.save_point(n_prefix, cuts)
        filed = [p for p in (self.prefix_cache.checkpoint(cuts), last) if p and p != head]
        if self.invariant:
            chain = self.stops(cuts, filed, last)
            filed = [p for p in filed if p in chain]
        return tuple(sorted(set(filed)))
