"""Which tokens share a ``llama_decode`` call in invariant numerics: shapes whose numbers never move.

With repacking and flash attention off and one KV stream per sequence (``numerics``), a token's logits
depend neither on how its sequence was split into calls nor on the other sequences in a call, with one
exception: a **short piece**. When a sequence brings only a few rows to a micro-batch, llama.cpp takes
other kernels for them (one row: a vector kernel instead of tinyBLAS; measured on the AVX2 build, pieces
of 1-7 tokens moved Qwen2.5-0.5B's logits by up to 0.26 and 4-7 tokens gemma-3-270m's by up to 1.16, 8
and more by nothing). The probe finds the smallest safe piece (``min_piece``, one of
:data:`PIECE_CANDIDATES`) and every plan here keeps each sequence's pieces at least that long:

* a run of one sequence's tokens is cut into calls of at most ``n_batch`` tokens, none short
  (:func:`pieces`);
* several sequences share a call only when llama.cpp's split of that call gives none of them a short
  piece (:func:`equal_split`, a model of ``llama_batch_allocr::split_equal`` with ``sequential``, which
  is what a KV cache with a stream per sequence uses); shortest first, lengths equal or ``min_piece``
  apart (:func:`group_calls`);
* where the probe proved it (``numerics``), a sequence shorter than others in its call by at most
  ``pad_limit`` tokens is **padded** to their length with filler tokens after its last real token
  (:func:`padded_lengths`); with flash attention, every part is planned at 64 rows or more
  (:func:`floored`), its tiled kernel's size. Every micro-batch of llama.cpp's split costs one pass
  over the weights, so runs of 36, 37, 38 and 39 tokens would take four passes (or calls) unpadded
  and one padded. A filler token comes after every real token of its sequence, so the causal mask
  hides it from them; its cells are dropped after the call, and no logits are read from it.

The model of llama.cpp's split is checked at load, not trusted: the probe decodes planned calls and
compares them with each sequence decoded alone, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The smallest piece the probe may prove safe, and the larger ones it tries when that one is not.
PIECE_CANDIDATES = (8, 16, 32)


#: llama.cpp attends over a sequence's KV cells up to its highest used cell rounded up to this many
#: (``llama_kv_cache::get_n_kv``); without flash attention the masked cells past a call's end cost as
#: much as real ones.
KV_CELL_ROUNDING = 256


#: Row-cells of masked attention (and filler) a shared call may add per call it saves. llama.cpp gives
#: every stream of a call the longest span among them (``get_n_kv`` takes the maximum over the call's
#: streams), so a sequence beside a longer one pays, per row, for cells that are not its own, and a
#: filler row for the whole span. The budget is what a saved call costs over what a row-cell costs,
#: measured per model by ``benchmarks/shared_call_budget.py`` (two threads, served context,
#: ``benchmarks/results/shared_call_budget-2cpu.md``): ~28,000 on Qwen2.5-0.5B (0.75 µs per row-cell,
#: 21 ms per call) and ~27,000 on gemma-3-270m (0.35 µs, 9 ms). The Qwen3.5-shaped hybrid, attention in
#: a quarter of its layers, implies ~219,000, yet with this budget its turns there took 0.80x (cold) and
#: 0.83x (warm) their time without one, so one figure serves all three.
SHARED_CALL_CELLS = 30_000


def kv_span(end: int) -> int:
    """The cells a row attends over (masked or not, without flash attention) in a call whose sequence
    ends at position ``end`` of its own stream."""
    return max(1, -(-end // KV_CELL_ROUNDING)) * KV_CELL_ROUNDING


def wasted_cells(lengths: Sequence[int], widths: Sequence[int], ends: Sequence[int]) -> int:
    """Row-cells a call spends past what its parts need: parts bringing ``lengths`` real rows that end
    at ``ends``, padded to ``widths``. Every row attends over the call's span (the padded parts'
    longest); a real row needs only its own part's, a filler row nothing (its other work is not
    counted, so this errs towards sharing)."""
    span = max(kv_span(e + w - n) for e, w, n in zip(ends, widths, lengths, strict=True))
    real = sum(n * (span - kv_span(e)) for n, e in zip(lengths, ends, strict=True))
    return real + (sum(widths) - sum(lengths)) * span


def pieces(
    start: int, end: int, limit: int, min_piece: int = PIECE_CANDIDATES[0], aligned: bool = False
) -> list[tuple[int, int]]:
    """``[start, end)`` (positions) cut into ``[a, b)`` spans of at most ``limit`` tokens, none shorter
    than ``min_piece`` unless the whole run is (a full span then leaves enough to its remainder).

    ``aligned`` (invariant numerics, where the split moves no number): calls end on the grid of
    :data:`KV_CELL_ROUNDING` cells. A call attends over the cells up to its end rounded up to that grid,
    and without flash attention each of its rows pays for all of them, masked or not: a 512-token call
    from position 39 attends over 768 cells, one that ends at 512 over 512 (Qwen2.5-0.5B, a 1,283-token
    prompt: 0.5 s of 8.9 s went to such cells). The cells a row pays for past its own position grow with
    the call's length, so a run longer than one grid unit is cut at every grid line it crosses
    (:func:`_unit_pieces`; Qwen2.5-0.5B, a 1,244-token prompt in 256-token calls: 0.93-0.95x the time of
    512-token ones, ``benchmarks/results/history.md``); a shorter run takes the grid only where that
    adds no call."""
    if aligned and end - start > KV_CELL_ROUNDING:
        return _unit_pieces(start, end, limit, min_piece)
    spans = _pieces(start, end, limit, min_piece)
    if aligned and len(spans) > 1:
        on_grid = _aligned_pieces(start, end, limit, min_piece)
        if len(on_grid) <= len(spans):
            return on_grid
    return spans


def run_pieces(length: int, start: int, limit: int, min_piece: int) -> list[tuple[int, int]]:
    """A run of ``length`` tokens from position ``start`` in calls, as offsets into the run, the calls
    ending on the grid of ``pieces(aligned=True)`` (invariant numerics only: the split moves nothing)."""
    return [(a - start, b - start) for a, b in pieces(start, start + length, limit, min_piece, aligned=True)]


def _unit_pieces(start: int, end: int, limit: int, min_piece: int) -> list[tuple[int, int]]:
    """A long run cut at every line of the cell grid, within ``limit``: a first stretch shorter than
    ``min_piece`` joins the unit after it, and the last call ends ``min_piece`` early where the run
    would leave less past the last line."""
    spans: list[tuple[int, int]] = []
    at = start
    while True:
        line = (at // KV_CELL_ROUNDING + 1) * KV_CELL_ROUNDING
        if line - at < min_piece:
            line += KV_CELL_ROUNDING
        stop = min(line, at + limit)
        if stop < end and end - stop < min_piece:
            stop = end - min_piece  # leave the remainder a whole piece
        if stop >= end or stop - at < min_piece:
            spans.append((at, end))
            return spans
        spans.append((at, stop))
        at = stop


def _aligned_pieces(start: int, end: int, limit: int, min_piece: int) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    at = start
    while end - at > limit:
        stop = (at + limit) // KV_CELL_ROUNDING * KV_CELL_ROUNDING  # the last cell boundary in reach
        if stop - at < min_piece:
            stop = at + limit
        stop = min(stop, end - min_piece)  # leave the remainder a whole piece
        spans.append((at, stop))
        at = stop
    spans.append((at, end))
    return spans


def _pieces(start: int, end: int, limit: int, min_piece: int) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    at = start
    while end - at > limit:
        after = end - at - limit
        step = limit - (min_piece - after) if after < min_piece else limit
        spans.append((at, at + step))
        at += step
    if end > at:
        spans.append((at, end))
    return spans


def equal_split(
    lengths: Sequence[int], n_ubatch: int, seq_ids: Sequence[int] | None = None
) -> list[list[int]]:
    """The micro-batches llama.cpp makes of one call whose parts bring ``lengths`` tokens, in this order in
    the batch: per micro-batch, the tokens each part gives (0: not in it).

    ``llama_batch_allocr::split_equal`` with ``sequential``: a micro-batch starts with the first part
    that has tokens left and takes the parts after it whose sequence id is one more than the last taken
    (``seq_ids``; default consecutive ids in this order), while they have tokens left; each gives as
    many as the one with fewest left (within ``n_ubatch``). Parts of non-consecutive ids never meet."""
    ids = list(range(len(lengths))) if seq_ids is None else list(seq_ids)
    remaining = list(lengths)
    batches: list[list[int]] = []
    while any(remaining):
        members: list[int] = []
        for i, n in enumerate(remaining):
            if n > 0 and (not members or ids[i] == ids[members[-1]] + 1):
                members.append(i)
        take = max(1, min(min(remaining[i] for i in members), n_ubatch // len(members)))
        given = [take if i in members else 0 for i in range(len(remaining))]
        for i in members:
            remaining[i] -= take
        batches.append(given)
    return batches


def shares_safely(
    lengths: Sequence[int],
    n_batch: int,
    min_piece: int = PIECE_CANDIDATES[0],
    seq_ids: Sequence[int] | None = None,
) -> bool:
    """Sequences bringing ``lengths`` tokens (ids ``seq_ids``, default consecutive) may share one call: it
    fits, and no piece is short."""
    if sum(lengths) > n_batch:
        return False
    return all(n == 0 or n >= min_piece for batch in equal_split(lengths, n_batch, seq_ids) for n in batch)


def padded_lengths(lengths: Sequence[int], pad_limit: int) -> list[int]:
    """The length each part of one call is decoded at: padded up to the next longer part's (padded)
    length when that adds at most ``pad_limit`` tokens, so the call's lengths fall on a few levels, more
    than ``pad_limit`` apart. ``pad_limit`` 0: no padding."""
    widths = list(lengths)
    level = None
    for i in sorted(range(len(widths)), key=lambda i: -widths[i]):
        if level is not None and 0 < level - widths[i] <= pad_limit:
            widths[i] = level
        level = widths[i]
    return widths


def floored(lengths: Sequence[int], min_rows: int) -> list[int]:
    """The length each part is planned at when no sequence may bring fewer than ``min_rows`` rows to a
    call (flash attention's tiled path, ``LlamaRuntime.min_rows``; 0: none): a shorter part is padded
    up to it with filler like any other (``padded_lengths``), so llama.cpp's split of a shared call never
    gives a sequence a piece under it."""
    return [max(n, min_rows) for n in lengths]


def group_calls(
    lengths: Sequence[int],
    n_batch: int,
    min_piece: int = PIECE_CANDIDATES[0],
    max_parts: int = 64,
    pad_limit: int = 0,
    ends: Sequence[int] | None = None,
) -> list[list[int]]:
    """Indices of parts (each at most ``n_batch`` tokens) grouped into calls of at most ``max_parts``,
    each call's parts in the order their sequence ids must follow: shortest first, every call one that
    :func:`shares_safely` allows once its parts are padded (``pad_limit``, :func:`padded_lengths`). A
    part shorter than ``min_piece`` gets a call of its own (the same shape wherever it is).

    With ``ends`` (each part's end position in its own stream; attention without flash attention), a
    part joins a call only where the row-cells that wastes (:func:`wasted_cells`: masked cells, and a
    filler row's whole span) stay within :data:`SHARED_CALL_CELLS`, the call it saves: sequences of
    very different lengths go apart, since a shared call would make the short ones attend over the long
    one's span, and a part is not padded to join agents far away. Only the grouping changes; invariant
    numerics make every grouping give the same numbers."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    calls: list[list[int]] = [[i] for i in order if lengths[i] < min_piece]
    left = [i for i in order if lengths[i] >= min_piece]
    while left:
        call = [left[0]]
        for i in left[1:]:
            members = [*call, i]
            widths = padded_lengths([lengths[j] for j in members], pad_limit)
            if (
                len(call) < max_parts
                and shares_safely(widths, n_batch, min_piece)
                and _worth_sharing(members, lengths, ends, pad_limit)
            ):
                call.append(i)
        calls.append(call)
        left = [i for i in left if i not in call]
    return calls


def _worth_sharing(
    members: list[int], lengths: Sequence[int], ends: Sequence[int] | None, pad_limit: int
) -> bool:
    if ends is None:
        return True

    def wasted(parts: list[int]) -> int:
        own = [lengths[j] for j in parts]
        return wasted_cells(own, padded_lengths(own, pad_limit), [ends[j] for j in parts])

    # joining saves the newcomer a call of its own; it may cost at most that much in wasted cells
    return wasted(members) - wasted(members[:-1]) <= SHARED_CALL_CELLS
