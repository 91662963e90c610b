"""Flash attention without padding: one unified KV stream, each decision's own cells from a KV tile line.

The runtime of invariant numerics' tiled layout (``SEMIF_KV_LAYOUT=tiled``): ``numerics.probe_tiled``
proves it on the loaded library and model at start-up, ``Branches.decode_tiled`` plans its calls,
``benchmarks/tile_aligned_flash.py`` measures it and ``tests/engine/test_tile_layout.py`` proves it bit
for bit on the test models.

Why it is invariant. ggml-cpu's flash attention takes a tiled F32 path when a KV stream brings
``FLASH_TILE_ROWS`` (64) or more query rows to a call, and a per-row F16 path below that. The tiled path
computes every query row on its own (its own running maximum and sum), walks the KV cells in tiles of
``TILE_CELLS`` (64) from cell 0, skips a tile masked for all of a tile's rows and gives a masked cell an
exact zero. So a row's numbers depend only on where its own visible cells sit against the tile lines.
In ONE unified stream every sequence of a call is the same stream: 64 rows in all put the call on the
tiled path, however few each sequence brings, and a fork only tags the prefix's cells. With the prefix
from cell 0 and every decision's own cells from the next tile line, a decision sees the same tiles alone
as beside any others.

How the cells are steered. llama.cpp puts a call's tokens into the first free cells from its cache head.
During a call the gaps up to each tile line are held by **spacer** cells: a saved state of
``TILE_CELLS`` cells, restored into spare sequences one after another from the head, with the holes for
the call's tokens then removed from them (which moves the head back to the first hole). A call with
fewer than 64 rows gets filler rows on a sequence of their own. Spacers and filler are dropped after the
call; nothing but sequence 0 and its copies may hold cells at or past the prefix's end when a call
starts. Recurrent and hybrid memory cannot remove part of a sequence, so they are refused.

Calls on sequence 0 alone (the prefill, a suffix too long for one tiled call) go through
:meth:`LlamaRuntime.decode_parts`, padded to ``FLASH_TILE_ROWS`` rows past their end (``min_rows``):
their cells follow sequence 0's, contiguous from cell 0, as in a tiled call's prefix.

Several requests in one call (:meth:`TiledRuntime.decode_regions`). Each request gets a **region** that
starts at a tile line: its prefix (a saved state restored there), its tail, its runs from the tile lines
after, laid out exactly as the request's call alone would lay them out from cell 0. Its rows see only
their own region's cells; every tile before the region is masked for them, and the tiled kernel skips
a tile that is all masked for a row (``tile_max == -INFINITY``: the row's sum, maximum and output are not
touched), so a row's numbers are those of the request alone, shifted by whole tiles. Spacers hold the
gap before each region and the gaps inside it, as in a call of one request. Not on a sliding-window
model: its window cache holds a restored state's last window only, placed from wherever that cache's
head is, so a region there would not start at a tile line (measured: gemma-3-270m's rows moved by up to
1.37 on 1,200-token transcripts, while prefixes inside the window came out bit-identical).
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semif_adapter.engine.deadline import Deadline
from semif_adapter.engine.llama_backend import DECODE_ABORTED, FLASH_TILE_ROWS, PREFIX_SEQ, LlamaRuntime, Part
from semif_adapter.errors import EngineFailure, ModelLoadError

#: KV cells per tile of ggml-cpu's tiled flash attention (``GGML_FA_TILE_KV``)
TILE_CELLS = 64
#: sequences a llama.cpp context takes at most (``LLAMA_MAX_SEQ``)
MAX_SEQUENCES = 256


class LayoutRefused(ModelLoadError):
    """The tiled layout cannot run with this model or these settings; the engine loads the stream layout
    instead. Any other load error (a missing file, a context llama.cpp cannot create) is not this: the
    stream layout would fail the same way, so it ends start-up."""


def tile_line(cell: int) -> int:
    """The first tile line at or after ``cell``."""
    return -(-cell // TILE_CELLS) * TILE_CELLS


@dataclass(frozen=True)
class Run:
    """One decision's tokens in a tiled call: on sequence ``seq`` (a copy of sequence 0) from position
    ``start_pos``; its logits are read at its last token."""

    tokens: Sequence[int]
    start_pos: int
    seq: int


@dataclass(frozen=True)
class Region:
    """One request's part of a call over several requests: its prefix of ``prefix_end`` tokens on
    sequence ``seq`` (``state``: a saved copy of it, restored here; None: ``seq`` already holds it from
    cell 0, which only the first region may), the ``tail`` that extends it and its decisions' runs
    (each on an empty sequence of its own, given the prefix here)."""

    seq: int
    prefix_end: int
    tail: Sequence[int]
    runs: Sequence[Run]
    state: ctypes.Array[ctypes.c_uint8] | None = None


def holes(prefix_end: int, tail: int, runs: Sequence[int], filler: int) -> list[tuple[int, int]]:
    """The cells a call's tokens go into: ``tail`` tokens right after the prefix, each run of ``runs``
    tokens from the next tile line, then ``filler`` rows right after the last run."""
    spans, cell = [(prefix_end, prefix_end + tail)], prefix_end + tail
    for length in runs:
        cell = tile_line(cell)
        spans.append((cell, cell + length))
        cell += length
    spans.append((cell, cell + filler))
    return [(a, b) for a, b in spans if b > a]


class TiledRuntime(LlamaRuntime):
    """The engine's runtime on one unified KV stream with flash attention and plain weights, whose
    :meth:`decode_tiled` lays out a prefix tail and decisions' runs as the module text says.

    ``n_seq_max - 1`` decisions at once; ``n_ctx`` cells for the prefix, plus room for one call's runs,
    their tile gaps and filler. With ``regions`` > 1, sequences for that many requests of ``n_seq_max``
    each (a prefix and its decisions), whose prefixes ``n_ctx`` must hold together."""

    def __init__(
        self,
        path: Path,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        n_seq_max: int = 5,
        regions: int = 1,
        abi_record: Path | None = None,
    ) -> None:
        if n_batch < FLASH_TILE_ROWS:
            raise LayoutRefused(f"a tiled layout needs n_batch >= {FLASH_TILE_ROWS}, not {n_batch}")
        if regions < 1:
            raise LayoutRefused(f"a tiled call holds at least one request, not {regions}")
        self.decisions = n_seq_max - 1
        # llama.cpp takes at most LLAMA_MAX_SEQ sequences: fewer regions where their sequences and the
        # spacers would need more (a batch of more requests is cut into calls of these)
        while (
            regions > 1
            and n_seq_max * regions + self._spacers(n_batch, n_seq_max, regions) + 1 > MAX_SEQUENCES
        ):
            regions -= 1
        self.regions = regions
        self.call_cells = self._call_cells(n_batch, n_seq_max, regions)
        self.spacer_seqs = self._spacers(n_batch, n_seq_max, regions)
        seqs = n_seq_max * regions  # the prefixes and their decisions; spacers and filler come after
        super().__init__(
            path,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_threads=n_threads,
            n_gpu_layers=0,
            abi_record=abi_record,
            invariant=True,
            n_seq_max=seqs,
            flash_attention=True,
        )
        # sequence 0's own calls (the prefill) are padded past their end to the tiled path's rows; a
        # tiled call counts its rows over all its sequences and adds filler of its own
        self.min_rows = FLASH_TILE_ROWS
        self.n_seq_max = n_seq_max  # a request's prefix and decisions, as the stream layout counts them
        self.seqs = seqs  # every region's: spacers and filler come after
        try:
            if self.is_recurrent or self.is_hybrid:
                raise LayoutRefused(
                    f"{path.name}: a tiled layout removes part of a spacer sequence, which recurrent and "
                    "hybrid memory cannot"
                )
            self.first_spacer = seqs
            self.filler_seq = self.first_spacer + self.spacer_seqs
            self.tiled_batch = self.abi.batch_init(n_batch, 0, n_seq_max)  # a tail's token: n_seq_max owners
            self.spacer = self._spacer_state()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _call_cells(n_batch: int, n_seq_max: int, regions: int) -> int:
        """The most cells a call's tokens span past the prefixes: every run starts a tile later at
        worst; each further region adds a gap of less than a tile before it and one after its last run."""
        return n_batch + TILE_CELLS * ((n_seq_max - 1) * regions + 1 + 2 * (regions - 1))

    @classmethod
    def _spacers(cls, n_batch: int, n_seq_max: int, regions: int) -> int:
        """Spacer sequences a call may need: every stretch they hold ends in a partial spacer, one per
        further region before it and one after."""
        return math.ceil(cls._call_cells(n_batch, n_seq_max, regions) / TILE_CELLS) + 2 * (regions - 1)

    def _context_params(
        self, n_ctx: int, n_batch: int, n_threads: int, invariant: bool, n_seq_max: int, flash_attention: bool
    ) -> Any:
        cparams = super()._context_params(n_ctx, n_batch, n_threads, invariant, n_seq_max, flash_attention)
        cparams.n_ctx = n_ctx + self.call_cells
        cparams.n_seq_max = n_seq_max + self.spacer_seqs + 1  # decisions, spacers, filler
        cparams.kv_unified = True
        cparams.flash_attn_type = 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED
        return cparams

    def _spacer_state(self) -> Any:
        """A saved state of ``TILE_CELLS`` cells (any tokens: no one attends to a spacer)."""
        filler = [self._any_token()] * TILE_CELLS
        self.decode_parts([Part(filler, 0, self.first_spacer, False)])
        state = self.save_seq(self.first_spacer)
        self.drop(self.first_spacer)
        return state

    def _any_token(self) -> int:
        """A valid token for rows whose numbers no one reads."""
        bos = int(self.lib.llama_vocab_bos(self.vocab))
        return bos if bos >= 0 else 0

    def decode_tiled(
        self, prefix_end: int, tail: Sequence[int], runs: Sequence[Run], cancel: Deadline | None = None
    ) -> list[int]:
        """One ``llama_decode``: ``tail`` extends the prefix (sequence 0 and every run's sequence, cells
        from ``prefix_end``), each run on its own sequence from the next tile line. Returns each run's
        logits row (for :meth:`logits_at`). The tail's cells stay on all those sequences, a run's on its
        own; the caller drops the runs' sequences when done."""
        seqs = [r.seq for r in runs]
        if not runs or len(set(seqs)) != len(seqs) or not all(1 <= s <= self.decisions for s in seqs):
            raise EngineFailure(
                f"a tiled call needs distinct decision sequences 1..{self.decisions}, not {seqs}"
            )
        if any(not r.tokens for r in runs):
            raise EngineFailure("a tiled call got a run without tokens")
        if int(self.lib.llama_memory_seq_pos_max(self.memory, PREFIX_SEQ)) != prefix_end - 1:
            raise EngineFailure(f"sequence 0 does not end at position {prefix_end - 1}")
        rows = len(tail) + sum(len(r.tokens) for r in runs)
        filler = max(0, FLASH_TILE_ROWS - rows)
        if rows + filler > self.n_batch:
            raise EngineFailure(f"a tiled call of {rows} tokens (n_batch {self.n_batch})")
        spans = holes(prefix_end, len(tail), [len(r.tokens) for r in runs], filler)
        if cancel is not None:
            cancel.check()
        used: list[int] = []
        try:
            self._hold(prefix_end, spans, used)
            with self._abortable(cancel):
                return self._decode_tiled(prefix_end, tail, runs, filler, cancel)
        finally:
            for seq in [*used, self.filler_seq]:
                self.drop(seq)

    def _hold(self, start: int, spans: list[tuple[int, int]], used: list[int]) -> None:
        """Spacers over the cells from ``start`` to the last span's end (each one's sequence noted in
        ``used`` once restored), the spans then removed from them: the call's tokens go exactly into
        the spans."""
        end = spans[-1][1]
        for k in range(math.ceil((end - start) / TILE_CELLS)):
            seq = self.first_spacer + k
            used.append(seq)
            self.restore_seq(seq, self.spacer)
        for a, b in spans:
            for k in range((a - start) // TILE_CELLS, (b - 1 - start) // TILE_CELLS + 1):
                base = start + k * TILE_CELLS
                p0, p1 = max(a, base) - base, min(b, base + TILE_CELLS) - base
                if not self.lib.llama_memory_seq_rm(self.memory, self.first_spacer + k, p0, p1):
                    raise EngineFailure(f"llama.cpp could not free cells {p0}..{p1} of spacer {k}")

    def _decode_tiled(
        self, prefix_end: int, tail: Sequence[int], runs: Sequence[Run], filler: int, cancel: Deadline | None
    ) -> list[int]:
        return self._decode_regions([Region(PREFIX_SEQ, prefix_end, tail, runs)], filler, cancel)[0]

    def _decode_regions(
        self, regions: Sequence[Region], filler: int, cancel: Deadline | None
    ) -> list[list[int]]:
        """The call's batch in the order of its cells: each region's tail (on its sequence and its runs'),
        its runs, then the filler."""
        batch, i, rows = self.tiled_batch, 0, []

        def put(token: int, pos: int, seqs: Sequence[int], logits: bool) -> None:
            nonlocal i
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, len(seqs), logits
            for j, seq in enumerate(seqs):
                batch.seq_id[i][j] = seq
            i += 1

        for region in regions:
            owners, region_rows = [region.seq, *(r.seq for r in region.runs)], []
            for k, token in enumerate(region.tail):
                put(token, region.prefix_end + k, owners, False)
            for run in region.runs:
                for k, token in enumerate(run.tokens):
                    put(token, run.start_pos + k, [run.seq], k == len(run.tokens) - 1)
                region_rows.append(i - 1)
            rows.append(region_rows)
        for k in range(filler):
            put(self._any_token(), k, [self.filler_seq], False)
        batch.n_tokens = i
        started = time.perf_counter()
        rc = self.abi.decode(self.ctx, batch)
        if rc == DECODE_ABORTED and cancel is not None and cancel.cancelled:
            raise cancel.error()
        if rc != 0:
            raise EngineFailure(
                f"llama_decode failed with code {rc} in a tiled call at position {regions[0].prefix_end}"
            )
        if cancel is not None:
            cancel.advance(i, time.perf_counter() - started)
        return rows

    def decode_regions(self, regions: Sequence[Region], cancel: Deadline | None = None) -> list[list[int]]:
        """One ``llama_decode`` over several requests, each in a region of its own (module text): the
        first region's prefix from cell 0 (in place, or restored into an emptied context), every later
        one's restored from the first tile line after the cells the region before it spans. Returns
        each region's runs' logits rows (for :meth:`logits_at`). Afterwards each region's sequence
        holds its prefix and tail (save it to file the request's state) and each run's sequence those
        and its run; the caller drops them."""
        self._check_regions(regions)
        rows = sum(len(r.tail) + sum(len(run.tokens) for run in r.runs) for r in regions)
        filler = max(0, FLASH_TILE_ROWS - rows)
        if rows + filler > self.n_batch:
            raise EngineFailure(f"a tiled call of {rows} tokens (n_batch {self.n_batch})")
        if cancel is not None:
            cancel.check()
        used: list[int] = []
        try:
            self._punch(self._place(regions, filler, used))
            with self._abortable(cancel):
                return self._decode_regions(regions, filler, cancel)
        finally:
            for seq in [*used, self.filler_seq]:
                self.drop(seq)

    def _check_regions(self, regions: Sequence[Region]) -> None:
        if not regions or len(regions) > self.regions:
            raise EngineFailure(f"a tiled call holds 1..{self.regions} regions, not {len(regions)}")
        if len(regions) > 1 and self.n_swa > 0:
            # the window layers' cache holds a restored state's last window only, from wherever its
            # head is: its regions would not start at tile lines
            raise EngineFailure("several requests in one tiled call need a model without a sliding window")
        seqs = [s for r in regions for s in (r.seq, *(run.seq for run in r.runs))]
        if len(set(seqs)) != len(seqs) or not all(0 <= s < self.seqs for s in seqs):
            raise EngineFailure(f"a tiled call needs distinct sequences 0..{self.seqs - 1}, not {seqs}")
        if any(not r.runs or any(not run.tokens for run in r.runs) for r in regions):
            raise EngineFailure("a tiled call got a region without runs or a run without tokens")
        if any(r.state is None for r in regions[1:]):
            raise EngineFailure("only the first region of a tiled call may be in place")
        first = regions[0]
        if first.state is None:
            if int(self.lib.llama_memory_seq_pos_max(self.memory, first.seq)) != first.prefix_end - 1:
                raise EngineFailure(f"sequence {first.seq} does not end at position {first.prefix_end - 1}")
        else:  # llama.cpp searches for a restored state's cells from its head, which only this resets
            self.clear()

    def _place(self, regions: Sequence[Region], filler: int, used: list[int]) -> list[tuple[int, int, int]]:
        """Every region's prefix where the call puts it and spacers over every cell between them up to
        the last run's end (each spacer's sequence noted in ``used``); each region's runs' sequences get
        its prefix. Returns the cells the call's tokens go into, as (spacer sequence, first position,
        end) cuts of the spacers holding them, for :meth:`_punch`."""
        spacers: list[tuple[int, int]] = []  # (sequence, first cell)
        cursor = 0

        def hold(end: int) -> None:
            """Spacers from ``cursor`` to ``end``, the last one cut back to end there."""
            nonlocal cursor
            while cursor < end:
                seq = self.first_spacer + len(spacers)
                if seq >= self.filler_seq:
                    raise EngineFailure("a tiled call needs more spacers than the context was sized for")
                used.append(seq)
                self.restore_seq(seq, self.spacer)
                spacers.append((seq, cursor))
                cursor += TILE_CELLS
            if cursor > end:  # the head moves back to the first cell freed: the next restore lands there
                self._cut(spacers[-1][0], end - spacers[-1][1], TILE_CELLS)
                cursor = end

        spans: list[tuple[int, int]] = []
        for k, region in enumerate(regions):
            if region.state is not None:
                if k:
                    hold(self._region_start(cursor))
                self.restore_seq(region.seq, region.state)
                if int(self.lib.llama_memory_seq_pos_max(self.memory, region.seq)) != region.prefix_end - 1:
                    raise EngineFailure(
                        f"region {k}'s state does not end at position {region.prefix_end - 1}"
                    )
            for run in region.runs:
                self.drop(run.seq)
                self.fork(region.seq, run.seq)
            cursor += region.prefix_end
            if cursor > self.n_ctx + self.call_cells:
                raise EngineFailure(
                    f"the regions of a tiled call need more than the {self.n_ctx} cells of prefix"
                )
            last = regions[-1] is region
            cuts = holes(
                cursor, len(region.tail), [len(r.tokens) for r in region.runs], filler if last else 0
            )
            spans += cuts
            hold(cuts[-1][1])
        return [
            (seq, max(a, base) - base, min(b, base + TILE_CELLS) - base)
            for a, b in spans
            for seq, base in spacers
            if base < b and a < base + TILE_CELLS
        ]

    def _region_start(self, cursor: int) -> int:
        """Where a region after ``cursor`` starts: the next tile line (a test moves it to see the
        numbers move)."""
        return tile_line(cursor)

    def _punch(self, cuts: list[tuple[int, int, int]]) -> None:
        """The call's cells removed from the spacers holding them (after every region is placed: a cut
        moves llama.cpp's head back); llama.cpp then puts the call's tokens into exactly those cells, in
        the batch's order."""
        for seq, p0, p1 in cuts:
            self._cut(seq, p0, p1)

    def _cut(self, seq: int, p0: int, p1: int) -> None:
        if not self.lib.llama_memory_seq_rm(self.memory, seq, p0, p1):
            raise EngineFailure(f"llama.cpp could not free positions {p0}..{p1} of spacer {seq}")

    def close(self) -> None:
        if not self._closed and hasattr(self, "tiled_batch"):
            self.abi.batch_free(self.tiled_batch)
        super().close()
