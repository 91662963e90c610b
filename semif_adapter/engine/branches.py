"""The branches: each decision's suffix decoded on a branch of the prefix, and its label logits read.

In the fixed split each suffix gets a call of its own on a copy of sequence 0 (or on sequence 0 itself,
restored after, where a copy does not reproduce the prefix state). In invariant numerics the decisions
of a request are decoded together, each in a KV stream of its own, the prefix's tail in one decision's
call (the others read it from sequence 0 after), calls shaped so that no sequence gets a short piece and,
where the probe allows it, runs of nearly one length padded to one (``calls``). In the tiled layout
(``tile_layout``: one unified KV stream, flash attention) they share calls with the prefix's tail, each
from a KV tile line (:meth:`Branches.decode_tiled`). The readout takes the option labels' logits from
the vocabulary row and checks the row is finite.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from semif_adapter.engine.calls import equal_split, floored, group_calls, padded_lengths, run_pieces
from semif_adapter.engine.chunking import Cuts
from semif_adapter.engine.deadline import Deadline
from semif_adapter.engine.llama_backend import BRANCH_SEQ, PREFIX_SEQ, LlamaRuntime, Part
from semif_adapter.engine.planner import Planned
from semif_adapter.engine.prefill import Prefill
from semif_adapter.engine.tile_layout import Run, TiledRuntime
from semif_adapter.errors import EngineFailure

# Invariant numerics: a prefix tail this short (times the other decisions) is decoded in every decision's
# own call rather than in a call of its own.
TAIL_COPY_TOKENS = 16

#: What decoding a request's decisions gives: the prefill's seconds (0 when the kept prefix served), the
#: prefix tokens reused, and each decision's readout with its seconds.
Decoded = tuple[float, int, list[tuple["Readout", float]]]


@dataclass
class Readout:
    option_logits: np.ndarray
    allowed_token_mass: float
    argmax_token: int


class Branches:
    """Decodes a request's suffixes after its prefill (``Prefill``) and reads their logits."""

    def __init__(self, runtime: LlamaRuntime, prefill: Prefill) -> None:
        self.runtime = runtime
        self.prefill = prefill

    def branch(
        self, n_prefix: int, suffix_tokens: list[int], label_ids: list[int], cancel: Deadline | None = None
    ) -> Readout:
        """Decode one suffix on a branch of the prefix and read the label logits."""
        runtime = self.runtime
        if self.prefill.fork_mode == "copy":
            self.prefill.streams.forget([BRANCH_SEQ])
            runtime.fork(PREFIX_SEQ, BRANCH_SEQ)
            try:
                runtime.decode(suffix_tokens, n_prefix, BRANCH_SEQ, want_logits=True, cancel=cancel)
                return self.read(label_ids)
            finally:
                runtime.drop(BRANCH_SEQ)
        try:
            runtime.decode(suffix_tokens, n_prefix, PREFIX_SEQ, want_logits=True, cancel=cancel)
            return self.read(label_ids)
        finally:
            runtime.restore_seq(PREFIX_SEQ, self.prefill.snapshot)

    def read(self, label_ids: list[int], logits: np.ndarray | None = None) -> Readout:
        """The label logits and the readout's checks, from ``logits`` (default: the last position's)."""
        if logits is None:
            logits = self.runtime.last_logits()  # zero-copy view of the vocabulary row
        selected = logits[label_ids].astype(np.float64)
        top = int(logits.argmax())  # NaN anywhere makes argmax land on it
        peak = float(logits[top])
        if not (math.isfinite(peak) and np.isfinite(selected).all() and np.isfinite(logits.min())):
            raise EngineFailure("the model produced non-finite logits")
        shifted = logits.astype(np.float64)
        shifted -= peak
        np.exp(shifted, out=shifted)
        # a diagnostic, kept to float32's precision: numpy's exp kernel follows the CPU (AVX-512 or
        # libm's) and moves the float64 sum's last bits (``calibration.portable_softmax``)
        mass = float(np.float32(np.exp(selected - peak).sum() / shifted.sum()))
        return Readout(selected, mass, top)

    def decode_alone(
        self, prefix_tokens: list[int], planned: list[Planned], cuts: Cuts, cancel: Deadline | None
    ) -> Decoded:
        """The fixed split: the prefix in its chunks, then each decision's suffix in a call of its own.
        Returns the prefill's seconds (0 when the kept prefix served), the prefix tokens reused, and each
        decision's readout with its seconds."""
        t0 = time.perf_counter()
        kept = self.prefill.keeps(prefix_tokens, cuts)
        reused_tokens = self.prefill.fill(prefix_tokens, cancel, cuts)
        prefill_seconds = 0.0 if kept else time.perf_counter() - t0
        forwards: list[tuple[Readout, float]] = []
        for plan in planned:
            if cancel is not None:
                cancel.check()
            t_start = time.perf_counter()
            readout = self.branch(len(prefix_tokens), plan.suffix_tokens, plan.label_ids, cancel)
            forwards.append((readout, time.perf_counter() - t_start))
        return prefill_seconds, reused_tokens, forwards

    def decode_shared(
        self, prefix_tokens: list[int], planned: list[Planned], cuts: Cuts, cancel: Deadline | None
    ) -> Decoded:
        """Invariant numerics: the prefix in as few calls as its saved states allow, its tail in the
        decisions' call(s), and the decisions of a request decoded together, each in its own stream.

        On memory that can drop a sequence's tail, one decision (the **rider**, :meth:`rider`) decodes the
        prefix's tail and its own suffix on sequence 0, in one call, and the suffix is dropped after
        (where the prefill saves its state at the prefix's end, its last stretch is that tail, and the
        state is saved after the drop); the other decisions then start from the whole prefix, each in a
        stream of its own (at most ``batch_sequences`` at once). The tail costs no call of its own: an
        agent's turn of two decisions is two passes over the weights (its event with one suffix, the
        other suffix), not three. Elsewhere (a recurrent state cannot drop a tail) the prefix is copied
        into one stream per decision, a short tail decoded in each of them, a long one once before.
        The tiled layout plans its own calls (:meth:`decode_tiled`).
        """
        if isinstance(self.runtime, TiledRuntime):
            return self.decode_tiled(prefix_tokens, planned, cuts, cancel)
        runtime, n = self.runtime, len(prefix_tokens)
        t0 = time.perf_counter()
        kept = self.prefill.keeps(prefix_tokens, cuts)
        droppable = not (runtime.is_recurrent or runtime.is_hybrid)
        reused_tokens, tail_at, held = self.prefill.fill_shared(
            prefix_tokens, cuts, cancel, hold_end=droppable
        )
        tail = prefix_tokens[tail_at:]
        copies = len(tail) * (len(planned) - 1)
        long_tail = len(tail) >= self.prefill.min_piece and copies > TAIL_COPY_TOKENS
        labels = [p.label_ids for p in planned]
        riding = None
        if droppable and (len(planned) == 1 or held is not None or (tail and long_tail)):
            riding = self.rider([len(p.suffix_tokens) for p in planned], n)
        elif tail and long_tail:
            self.decode_run(tail, tail_at, PREFIX_SEQ, cancel)
            tail, tail_at = [], n
        prefill_seconds = 0.0 if kept else time.perf_counter() - t0
        if riding is None:
            runs = [tail + p.suffix_tokens for p in planned]
            forwards = self.decode_runs(runs, tail_at, labels, cancel)
        else:
            run = tail + planned[riding].suffix_tokens
            first = self.decode_runs([run], tail_at, [labels[riding]], cancel, fork=False)
            runtime.drop(PREFIX_SEQ, n)  # the suffix goes; the whole prefix stays
            tail_at = n
            if held is not None:  # the prefill's last stretch was decoded with the suffix
                self.prefill.file_end(prefix_tokens, cuts, held)
            others = [i for i in range(len(planned)) if i != riding]
            rest = self.decode_runs(
                [planned[i].suffix_tokens for i in others], n, [labels[i] for i in others], cancel
            )
            forwards = rest[:riding] + first + rest[riding:]
        # sequence 0 keeps the prefix up to its tail: the next request about this state decodes only
        # the tail again, in its decisions' calls
        self.prefill.keep(prefix_tokens, cuts, tail_at)
        return prefill_seconds, reused_tokens, forwards

    def decode_tiled(
        self, prefix_tokens: list[int], planned: list[Planned], cuts: Cuts, cancel: Deadline | None
    ) -> Decoded:
        """The tiled layout (``tile_layout``): the prefix up to its tail as the prefill plans it, then the
        decisions in tiled calls of at most ``decisions`` runs and ``n_batch`` rows (``tiled_calls``), the
        tail riding in the first where it fits (else decoded before, on sequence 0 alone: the same cells
        and numbers). A suffix longer than one call is decoded on sequence 0 itself, after the whole
        prefix, and dropped: alone or not, it always takes that path. Sequence 0 keeps the whole prefix,
        and its state at the prefix's end is filed once the tail is in (``Prefill.file_end``)."""
        runtime, n = self.runtime, len(prefix_tokens)
        assert isinstance(runtime, TiledRuntime)
        t0 = time.perf_counter()
        kept = self.prefill.keeps(prefix_tokens, cuts)
        reused_tokens, tail_at, held = self.prefill.fill_shared(prefix_tokens, cuts, cancel, hold_end=True)
        tail = prefix_tokens[tail_at:]
        lengths = [len(p.suffix_tokens) for p in planned]
        rides, calls, long_runs = tiled_calls(len(tail), lengths, runtime.n_batch, runtime.decisions)
        if tail and not rides:
            self.decode_run(tail, tail_at, PREFIX_SEQ, cancel)
            tail, tail_at = [], n
            if held is not None:
                self.prefill.file_end(prefix_tokens, cuts, held)
        prefill_seconds = 0.0 if kept else time.perf_counter() - t0
        forwards: list[tuple[Readout, float] | None] = [None] * len(planned)
        for call in calls:
            seqs = list(range(1, 1 + len(call)))
            for seq in seqs:
                runtime.fork(PREFIX_SEQ, seq)
            try:
                runs = [Run(planned[i].suffix_tokens, n, q) for i, q in zip(call, seqs, strict=True)]
                t = time.perf_counter()
                rows = runtime.decode_tiled(tail_at, tail, runs, cancel)
                elapsed, tokens = time.perf_counter() - t, sum(lengths[i] for i in call)
                for i, row in zip(call, rows, strict=True):
                    readout = self.read(planned[i].label_ids, runtime.logits_at(row))
                    forwards[i] = (readout, elapsed * lengths[i] / tokens)
            finally:
                for seq in seqs:
                    runtime.drop(seq)
            if tail:  # sequence 0 now holds the whole prefix
                tail, tail_at = [], n
                if held is not None:
                    self.prefill.file_end(prefix_tokens, cuts, held)
        for i in long_runs:
            forwards[i] = self.decode_on_prefix(planned[i], n, cancel)
        self.prefill.keep(prefix_tokens, cuts, n)
        return prefill_seconds, reused_tokens, [f for f in forwards if f is not None]

    def decode_on_prefix(self, plan: Planned, n: int, cancel: Deadline | None) -> tuple[Readout, float]:
        """A suffix on sequence 0 itself, after its whole prefix of ``n`` tokens, in calls of sequence 0
        alone; its cells are dropped after."""
        runtime, tokens = self.runtime, plan.suffix_tokens
        t = time.perf_counter()
        try:
            spans = self.spans(len(tokens), n)
            for a, b in spans[:-1]:
                runtime.decode_parts([Part(tokens[a:b], n + a, PREFIX_SEQ, False)], cancel)
            a, _ = spans[-1]
            (row,) = runtime.decode_parts([Part(tokens[a:], n + a, PREFIX_SEQ)], cancel)
            readout = self.read(plan.label_ids, runtime.logits_at(row))
        finally:
            runtime.drop(PREFIX_SEQ, n)
        return readout, time.perf_counter() - t

    def rider(self, suffix_lengths: list[int], start: int) -> int:
        """Which decision decodes the prefix's tail with its suffix: the one that leaves the others the
        fewest micro-batches (then calls) of llama.cpp's split, the longest suffix among equals. One
        candidate per suffix length: decisions of one length leave the same rest."""

        def cost(i: int) -> tuple[int, int, int]:
            rest = [n for j, n in enumerate(suffix_lengths) if j != i]
            batches, calls = self.shape(rest, start) if rest else (0, 0)
            return batches, calls, -suffix_lengths[i]

        firsts = {n: i for i, n in reversed(list(enumerate(suffix_lengths)))}  # the first of each length
        return min(firsts.values(), key=cost)

    def shape(self, lengths: list[int], start: int) -> tuple[int, int]:
        """The micro-batches and calls :meth:`decode_runs` would make of runs of ``lengths`` tokens from
        ``start``."""
        spans, lasts, calls = self.plan(lengths, start, fork=True)
        alone = sum(len(s) - 1 for s in spans)  # a long run's leading pieces, each a call of its own
        pad_limit, n_batch = self.prefill.pad_limit, self.runtime.n_batch
        batches = sum(
            len(equal_split(padded_lengths([lasts[i] for i in c], pad_limit), n_batch)) for c in calls
        )
        return alone + batches, alone + len(calls)

    def decode_run(self, tokens: list[int], start: int, seq: int, cancel: Deadline | None) -> None:
        """One sequence's tokens from ``start``, in calls of at most ``n_batch``, no piece of one token."""
        for a, b in self.spans(len(tokens), start):
            self.runtime.decode_parts([Part(tokens[a:b], start + a, seq, False)], cancel)

    def spans(self, length: int, start: int) -> list[tuple[int, int]]:
        """A run of ``length`` tokens from position ``start`` in calls (offsets into the run)."""
        return run_pieces(length, start, self.runtime.n_batch, self.prefill.min_piece)

    def decode_runs(
        self,
        runs: list[list[int]],
        start: int,
        label_ids: list[list[int]],
        cancel: Deadline | None,
        fork: bool = True,
    ) -> list[tuple[Readout, float]]:
        """Each run of tokens from position ``start`` on a copy of sequence 0 (``fork``; else the one run
        on sequence 0 itself), runs sharing calls as ``calls.group_calls`` allows; each run's readout at
        its last token, with its share of the calls' seconds (by tokens)."""
        runtime, pad_limit = self.runtime, self.prefill.pad_limit
        spans, lasts, calls = self.plan([len(run) for run in runs], start, fork)
        seconds = [0.0] * len(runs)
        readouts: list[Readout | None] = [None] * len(runs)
        for call in calls:
            # consecutive sequence ids in the call's order: the order llama.cpp's split was modelled in
            seqs = list(range(1, 1 + len(call))) if fork else [PREFIX_SEQ]
            if fork:
                self.prefill.streams.forget(seqs)  # a prefix a shared batch left there goes
                for seq in seqs:
                    runtime.fork(PREFIX_SEQ, seq)
            try:
                for i, seq in zip(call, seqs, strict=True):
                    for a, b in spans[i][:-1]:  # a run longer than a call: its leading pieces alone
                        t = time.perf_counter()
                        runtime.decode_parts([Part(runs[i][a:b], start + a, seq, False)], cancel)
                        seconds[i] += time.perf_counter() - t
                at = [spans[i][-1][0] for i in call]
                # every run starts at ``start``: padded to another run's length, it ends where that one
                # does (inside the context); the copies are dropped after the call
                widths = padded_lengths([lasts[i] for i in call], pad_limit)
                parts = [
                    Part(runs[i][a:], start + a, q).padded(w)
                    for i, a, q, w in zip(call, at, seqs, widths, strict=True)
                ]
                t = time.perf_counter()
                rows = runtime.decode_parts(parts, cancel)
                for i, row in zip(call, rows, strict=True):
                    readouts[i] = self.read(label_ids[i], runtime.logits_at(row))
                elapsed, tokens = time.perf_counter() - t, sum(len(p.tokens) for p in parts)
                for i, part in zip(call, parts, strict=True):
                    seconds[i] += elapsed * len(part.tokens) / tokens
            finally:
                if fork:
                    for seq in seqs:
                        runtime.drop(seq)
        return [(r, t) for r, t in zip(readouts, seconds, strict=True) if r is not None]

    def plan(
        self, lengths: list[int], start: int, fork: bool
    ) -> tuple[list[list[tuple[int, int]]], list[int], list[list[int]]]:
        """How :meth:`decode_runs` decodes runs of ``lengths`` tokens: each run's pieces, the length its
        last piece is planned at, and which runs' last pieces share each call."""
        runtime = self.runtime
        spans = [self.spans(n, start) for n in lengths]
        width = runtime.n_seq_max - 1 if fork else 1
        lasts = floored([b - a for a, b in (s[-1] for s in spans)], runtime.min_rows)
        ends = None if runtime.min_rows else [start + s[-1][0] + n for s, n in zip(spans, lasts, strict=True)]
        limit, least, pad_limit = runtime.n_batch, self.prefill.min_piece, self.prefill.pad_limit
        return spans, lasts, group_calls(lasts, limit, least, width, pad_limit, ends)


def tiled_calls(
    tail: int, lengths: list[int], n_batch: int, width: int
) -> tuple[bool, list[list[int]], list[int]]:
    """How the tiled layout decodes runs of ``lengths`` tokens after a prefix tail of ``tail`` tokens:
    whether the tail rides in the first call, the calls (runs in order, at most ``width`` a call, their
    rows and a riding tail at most ``n_batch``) and the runs too long for any call (decoded one by one on
    sequence 0). Filler and tile gaps take no rows of the budget: ``TiledRuntime`` adds them."""
    long_runs = [i for i, length in enumerate(lengths) if length > n_batch]
    short = [i for i, length in enumerate(lengths) if length <= n_batch]
    rides = bool(tail and short and tail + lengths[short[0]] <= n_batch)
    calls: list[list[int]] = []
    rows = 0
    for i in short:
        budget = n_batch - (tail if rides and len(calls) == 1 else 0)
        if not calls or len(calls[-1]) >= width or rows + lengths[i] > budget:
            calls.append([])
            rows = 0
        calls[-1].append(i)
        rows += lengths[i]
    return rides, calls, long_runs
