"""Which request's prefix each branch stream still holds between shared batches (invariant numerics).

Several agents batched together each make their prefill in a KV stream of their own. Emptied after the
batch, every agent's next turn would restore its last state from the prefix cache into a stream again (a
copy of every cell of the prefix) before decoding its new event. Kept, the stream serves the next turn in
place: cut back to what the two prompts share, it holds exactly what a restored state would (the same
cells, from the stream's first cell, the cells past the cut freed), so the answers cannot tell.

This is only the bookkeeping: which tokens each stream holds, which one serves a prompt best, and which
one to give up for a request that finds none. ``SharedCalls`` decides when a stream is used, and anything
else that writes a branch stream forgets it here first (``Prefill.reset`` keeps them, emptying only
sequence 0 and the streams nothing holds; a wipe after a failure forgets them all).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from itertools import count

from semif_adapter.engine.prefix_cache import common_prefix


@dataclass
class _Held:
    tokens: tuple[int, ...]
    used: int  # when it was last held or served (least recently used goes first)


@dataclass
class ResidentStreams:
    """Branch streams ``1..width`` and the prefix tokens each holds from position 0 (none: empty)."""

    width: int
    held: dict[int, _Held] = field(default_factory=dict)
    _clock: count[int] = field(default_factory=count)

    def hold(self, seq: int, tokens: tuple[int, ...]) -> None:
        """Stream ``seq`` holds exactly ``tokens`` (from position 0); nothing held if they are none."""
        if tokens:
            self.held[seq] = _Held(tokens, next(self._clock))
        else:
            self.held.pop(seq, None)

    def forget(self, seqs: Collection[int] | None = None) -> None:
        """What ``seqs`` (default: every stream) hold is no longer known: they are about to be written, or
        the context was emptied."""
        if seqs is None:
            self.held.clear()
        else:
            for seq in seqs:
                self.held.pop(seq, None)

    def best(self, tokens: tuple[int, ...], taken: Collection[int]) -> tuple[int | None, int]:
        """The stream not in ``taken`` that holds the longest common prefix with ``tokens``, and how many
        tokens they share (``None, 0``: none shares any)."""
        found, shared = None, 0
        for seq, held in self.held.items():
            n = common_prefix(held.tokens, tokens)
            if seq not in taken and n > shared:
                found, shared = seq, n
        if found is not None:
            self.held[found].used = next(self._clock)
        return found, shared

    def spare(self, taken: Collection[int]) -> int | None:
        """A stream not in ``taken`` to give a request: an empty one, else the least recently used."""
        free = [seq for seq in range(1, self.width + 1) if seq not in taken]
        empty = [seq for seq in free if seq not in self.held]
        if empty:
            return empty[0]
        return min(free, key=lambda seq: self.held[seq].used, default=None)
