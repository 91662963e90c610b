"""The branches: each decision's suffix decoded on a branch of the prefix, and its label logits read.

In the fixed split each suffix gets a call of its own on a copy of sequence 0 (or on sequence 0 itself,
restored after, where a copy does not reproduce the prefix state). In invariant numerics the decisions
of a request are decoded together, each in a KV stream of its own, the prefix's tail in their call,
calls shaped so that no sequence gets a short piece and, where the probe allows it, runs of nearly one
length padded to one (``calls``). The readout takes the option labels' logits from the vocabulary row
and checks the row is finite.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from semif_adapter.engine.calls import floored, group_calls, padded_lengths, run_pieces
from semif_adapter.engine.chunking import Cuts
from semif_adapter.engine.deadline import Deadline
from semif_adapter.engine.llama_backend import BRANCH_SEQ, PREFIX_SEQ, LlamaRuntime, Part
from semif_adapter.engine.planner import Planned
from semif_adapter.engine.prefill import Prefill
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
        mass = float(np.exp(selected - peak).sum() / shifted.sum())
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

        A lone decision on memory that can drop a sequence's tail decodes the prefix tail and its suffix
        on sequence 0 and drops the suffix after (where the prefill saves its state at the prefix's end,
        its last stretch goes in that call too, and the state is saved after the drop); otherwise the
        prefix is copied into one stream per decision (at most ``batch_sequences`` at once) and a short
        tail is decoded in each of them, a long one once before the copies.
        """
        runtime, n = self.runtime, len(prefix_tokens)
        t0 = time.perf_counter()
        kept = self.prefill.keeps(prefix_tokens, cuts)
        lone = len(planned) == 1 and not (runtime.is_recurrent or runtime.is_hybrid)
        reused_tokens, tail_at, held = self.prefill.fill_shared(prefix_tokens, cuts, cancel, hold_end=lone)
        tail = prefix_tokens[tail_at:]
        copies = len(tail) * (len(planned) - 1)
        if tail and not lone and len(tail) >= self.prefill.min_piece and copies > TAIL_COPY_TOKENS:
            self.decode_run(tail, tail_at, PREFIX_SEQ, cancel)
            tail, tail_at = [], n
        prefill_seconds = 0.0 if kept else time.perf_counter() - t0
        runs = [tail + p.suffix_tokens for p in planned]
        labels = [p.label_ids for p in planned]
        forwards = self.decode_runs(runs, tail_at, labels, cancel, fork=not lone)
        if lone:
            runtime.drop(PREFIX_SEQ, n)  # the suffix goes; the whole prefix stays
            tail_at = n
            if held is not None:  # the prefill's last stretch was decoded with the suffix
                self.prefill.file_end(prefix_tokens, cuts, held)
        # sequence 0 keeps the prefix up to its tail: the next request about this state decodes only
        # the tail again, in its decisions' calls
        self.prefill.keep(prefix_tokens, cuts, tail_at)
        return prefill_seconds, reused_tokens, forwards

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
        runtime, limit, pad_limit = self.runtime, self.runtime.n_batch, self.prefill.pad_limit
        spans = [self.spans(len(run), start) for run in runs]
        seconds = [0.0] * len(runs)
        readouts: list[Readout | None] = [None] * len(runs)
        width = runtime.n_seq_max - 1 if fork else 1
        lasts = floored([b - a for a, b in (s[-1] for s in spans)], runtime.min_rows)
        ends = None if runtime.min_rows else [start + s[-1][0] + n for s, n in zip(spans, lasts, strict=True)]
        for call in group_calls(lasts, limit, self.prefill.min_piece, width, pad_limit, ends):
            # consecutive sequence ids in the call's order: the order llama.cpp's split was modelled in
            seqs = list(range(1, 1 + len(call))) if fork else [PREFIX_SEQ]
            if fork:
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
