"""Several requests decoded together (invariant numerics): their prefills, their prefix tails and every
decision of every request in shared ``llama_decode`` calls.

Why this keeps every answer bit-identical: with the invariant kernels (``numerics``) a sequence's logits
depend neither on how its tokens were grouped into calls nor on the other sequences in a call, as long
as no sequence gets a short piece of a micro-batch (``calls``; runs of nearly one length padded to
one, where the probe proved it, their filler's cells dropped after the call). So a request's prefill
may be decoded in a stream of its own beside other requests' prefills, and a decision's suffix beside
another request's suffix, on a copy of its own request's prefix, and each gives what it gives alone.
The probe proves this at load on the library and model actually loaded, including a short sequence
decoded beside a much longer one (other requests' prefixes have other lengths).

How the requests' states meet: the context holds one prefix (sequence 0) and ``n_seq_max - 1`` branch
streams. A request whose prefix sequence 0 holds forks from it; every other request starts from the
saved state the prefix cache serves it, restored into a stream, and makes its prefill's calls there
(``Prefill.plan_fill``), its k-th call beside the others' k-th; the state at each call's end is copied
to host memory (``llama_state_seq_get_data``) and filed in the prefix cache where a lone prefill would
file it. A branch stream is then seeded from that copy. On attention-only memory without a sliding
window (``Prefill.streams_stay``) each request instead holds a stream for the whole batch, and keeps it
after: its prefill's calls, its tail and one of its decisions per call go there (cut back to the prefix
after each call), and the agent's next turn goes on there in place (``resident_streams``). A long
prefix tail is decoded once per request (tails of several requests share calls) and its state saved the
same way; a short one is decoded in each decision's own run, as ``Branches.decode_shared`` does. On a
sliding-window model the prefills run one after another in sequence 0, exactly as a lone request's
(``Prefill.decode_chunks`` keeps the window cache in one layout there).

Each request keeps its own deadline and errors: a member cancelled while a shared call runs is dropped
after the call (the call itself aborts only when every member is cancelled, ``Joint``), one whose
prefill fails gets that error while the others go on; a fault of llama.cpp itself fails every request
still in the batch.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from semif_adapter.engine.branches import TAIL_COPY_TOKENS, Branches, Decoded, Readout
from semif_adapter.engine.calls import floored, group_calls, padded_lengths, run_pieces, shares_safely
from semif_adapter.engine.chunking import Cuts
from semif_adapter.engine.deadline import Deadline, Joint
from semif_adapter.engine.llama_backend import PREFIX_SEQ, LlamaRuntime, Part
from semif_adapter.engine.planner import Planned
from semif_adapter.engine.prefill import FillPlan, Prefill
from semif_adapter.errors import EngineFailure, SemifError

#: What a request brings to a shared batch: its prefix tokens, planned decisions, cuts and cancel token.
Job = tuple[list[int], list[Planned], Cuts, Deadline | None]
#: Per request: what it decoded, or the error that ended it.
Outcome = Decoded | SemifError


@dataclass
class _Source:
    """Where a request's runs start: sequence 0 itself while the request holds it, else a saved copy
    (its cells past ``cut`` dropped, when set), or nothing (``empty``: a cold prefill without a pinned
    head); ``at``: the position its runs start from. ``stream``: the branch stream that holds the
    request's prefix up to ``at`` (and keeps it for its next turn, ``resident_streams``); its runs go
    there, one per call, cut back to ``at`` after it, and a copy (``state``, saved when first wanted)
    seeds any other stream."""

    at: int
    state: ctypes.Array[ctypes.c_uint8] | None = None
    cut: int | None = None
    empty: bool = False
    stream: int | None = None


@dataclass
class _Run:
    """One sequence's tokens from its request's source; ``decision`` None: a stretch of the prefix, its
    state kept after (``prefill``: a call of the request's prefill, else its tail)."""

    job: int
    decision: int | None
    tokens: list[int]
    labels: list[int] = field(default_factory=list)
    prefill: bool = False


class SharedCalls:
    """Decodes a batch of requests (each already parsed and planned) in shared calls; invariant only."""

    def __init__(self, runtime: LlamaRuntime, prefill: Prefill, branches: Branches) -> None:
        self.runtime = runtime
        self.prefill = prefill
        self.branches = branches

    def decode(self, jobs: Sequence[Job]) -> list[Outcome]:
        """Every job's decisions decoded; per job its ``Decoded`` or the error that ended it (never raises
        for one job's failure)."""
        self._outcomes: list[Outcome | None] = [None] * len(jobs)
        self._jobs = list(jobs)
        self._seconds = [[0.0] * len(j[1]) for j in jobs]
        self._readouts: list[list[Readout | None]] = [[None] * len(j[1]) for j in jobs]
        self._taken: set[int] = set()  # the streams that hold this batch's prefixes
        # more requests than streams: one stays spare for the runs of those without one
        width = self.runtime.n_seq_max - 1
        self._room = width if len(jobs) <= width else width - 1
        try:
            sources, prefill = self._prefills()
            tails = [r for r in self._tail_runs(sources) if self._outcomes[r.job] is None]
            self._decode_runs(tails, sources)
            runs = [
                _Run(j, i, self._jobs[j][0][sources[j].at :] + p.suffix_tokens, p.label_ids)
                for j, source in sources.items()
                if self._outcomes[j] is None
                for i, p in enumerate(self._jobs[j][1])
            ]
            self._decode_runs(runs, sources)
            for j, source in sources.items():  # each prefix stays in its stream for the next turn
                if source.stream is not None:
                    self.prefill.streams.hold(source.stream, tuple(self._jobs[j][0][: source.at]))
        except SemifError as exc:  # the engine itself failed: every request still here gets the error
            self._fail_all(exc)
        except Exception as exc:  # a ctypes/numpy fault is an engine failure, never a caller's
            self._fail_all(EngineFailure(f"engine fault: {type(exc).__name__}: {exc}"))
        outcomes: list[Outcome] = []
        for j, outcome in enumerate(self._outcomes):
            if outcome is None:
                seconds, reused = prefill[j]
                forwards = [(r, t) for r, t in zip(self._readouts[j], self._seconds[j], strict=True) if r]
                outcome = (seconds, reused, forwards)
            outcomes.append(outcome)
        return outcomes

    # --- the prefills ---------------------------------------------------------------------------
    def _prefills(self) -> tuple[dict[int, _Source], dict[int, tuple[float, int]]]:
        """Every request's prefix up to its tail, the prefills of several requests in shared calls.

        A request whose prefix sequence 0 already holds forks from it; one with the same prefix as
        another shares that one's source. Each other request starts from the saved state the prefix
        cache serves it (``Prefill.plan_fill``) in a stream of its own and makes the calls its prefill
        makes alone, its k-th call beside the others' k-th; the state at each call's end is kept (and
        filed in the prefix cache where a prefill in sequence 0 would file it)."""
        if self.runtime.n_swa > 0:
            return self._prefills_in_turn()
        sources: dict[int, _Source] = {}
        done: dict[int, tuple[float, int]] = {}
        self._plans: dict[int, tuple[FillPlan, list[tuple[int, int]]]] = {}
        first: dict[tuple[tuple[int, ...], Cuts], int] = {}
        self._holder = None
        for j, (prefix_tokens, _, cuts, _) in enumerate(self._jobs):
            if not self._still_live(j):
                continue
            key = (tuple(prefix_tokens), cuts)
            if key in first:
                sources[j] = sources[first[key]]
                done[j] = (0.0, len(prefix_tokens))
                continue
            first[key] = j
            if self.prefill.keeps(prefix_tokens, cuts):
                sources[j] = self._holder = _Source(self.prefill.kept_until)
                done[j] = (0.0, len(prefix_tokens))
                continue
            plan, stream = self._plan(prefix_tokens, cuts)
            if stream is not None:
                sources[j] = _Source(plan.reused, stream=stream)
            else:
                data = plan.saved.data if plan.saved is not None else None
                cut = plan.reused if plan.cut_back else None
                sources[j] = _Source(plan.reused, data, cut, empty=data is None)
            self._plans[j] = (plan, list(pairwise(plan.points)))
            done[j] = (0.0, plan.reused)
        self._prefill_seconds = dict.fromkeys(self._plans, 0.0)
        while calls := self._next_prefill_calls():
            self._decode_runs(calls, sources)
        for j, seconds in self._prefill_seconds.items():
            done[j] = (seconds, done[j][1])
        return sources, done

    def _plan(self, prefix_tokens: list[int], cuts: Cuts) -> tuple[FillPlan, int | None]:
        """A request's prefill plan (``Prefill.plan_fill``) and, where streams stay
        (``Prefill.streams_stay``), the stream that holds its prefix: the one that still holds most of
        it from an earlier batch, cut back in place where it serves at least what the prefix cache does,
        else a spare one, seeded once from the saved state the plan starts from. None: no stream is left
        (the request's runs are seeded from saved copies, call by call)."""
        streams = self.prefill.streams
        if not self.prefill.streams_stay or len(self._taken) >= self._room:
            return self.prefill.plan_fill(prefix_tokens, cuts), None
        stream, shared = streams.best(tuple(prefix_tokens), self._taken)
        plan = self.prefill.plan_fill(prefix_tokens, cuts, shared)
        if not plan.in_place:
            stream = streams.spare(self._taken)
        if stream is None:
            return plan, None
        self._taken.add(stream)
        streams.forget([stream])  # in flux until the batch ends
        if plan.in_place:
            self.runtime.drop(stream, plan.reused)
            self.prefill.prefix_cache.resident += 1
        elif plan.saved is not None:
            self.runtime.restore_seq(stream, plan.saved.data)
            if plan.cut_back:
                self.runtime.drop(stream, plan.reused)
        else:
            self.runtime.drop(stream)
        return plan, stream

    def _next_prefill_calls(self) -> list[_Run]:
        """Each live request's next prefill call (its k-th beside the others' k-th)."""
        calls = []
        for j, (_, spans) in self._plans.items():
            if spans and self._outcomes[j] is None:
                a, b = spans.pop(0)
                calls.append(_Run(j, None, self._jobs[j][0][a:b], prefill=True))
        return calls

    def _prefills_in_turn(self) -> tuple[dict[int, _Source], dict[int, tuple[float, int]]]:
        """Sliding-window models: fill each request's prefix into sequence 0 (up to its tail), the way a
        lone request is filled (``Prefill.decode_chunks`` keeps the window cache in one layout); save
        the state of each but the last one filled. A request whose prefill fails gets its error; the
        context is emptied."""
        sources: dict[int, _Source] = {}
        done: dict[int, tuple[float, int]] = {}
        holder: int | None = None  # the request whose prefix sequence 0 holds
        for j, (prefix_tokens, _, cuts, _) in enumerate(self._jobs):
            if not self._still_live(j):
                continue
            if holder is not None and self.prefill.keeps(prefix_tokens, cuts):
                sources[j] = sources[holder]  # the same prefix as the holder's: share its state
                done[j] = (0.0, len(prefix_tokens))
                continue
            if holder is not None:  # another prefix takes sequence 0: keep a copy of this one
                sources[holder].state = self.runtime.save_seq(PREFIX_SEQ)
                holder = None
            t0 = time.perf_counter()
            kept = self.prefill.keeps(prefix_tokens, cuts)
            try:
                reused, tail_at, _ = self.prefill.fill_shared(prefix_tokens, cuts, self._jobs[j][3])
            except SemifError as exc:
                self._outcomes[j] = exc
                self.prefill.reset(wipe=True)
                continue
            self.prefill.keep(prefix_tokens, cuts, tail_at)
            done[j] = (0.0 if kept else time.perf_counter() - t0, reused)
            sources[j] = _Source(tail_at)
            holder = j
        self._holder = sources[holder] if holder is not None else None
        return sources, done

    def _tail_runs(self, sources: dict[int, _Source]) -> list[_Run]:
        """A request's prefix tail decoded once (then saved) when copying it into every decision's run
        would cost more than ``TAIL_COPY_TOKENS`` tokens, the rule ``Branches.decode_shared`` follows.

        Not on a sliding-window model: a saved state holds only the window's cells, so a tail restored
        from one would sit in another cache layout than a tail forked on (``Prefill.decode_chunks``);
        there every decision's run carries the tail."""
        if self.runtime.n_swa > 0:
            return []
        runs, seen = [], set()
        for j, source in sources.items():
            if id(source) in seen:
                continue
            seen.add(id(source))
            prefix_tokens = self._jobs[j][0]
            tail = prefix_tokens[source.at :]
            sharing = [k for k, s in sources.items() if s is source]
            decisions = sum(len(self._jobs[k][1]) for k in sharing)
            if len(tail) >= self.prefill.min_piece and len(tail) * (decisions - 1) > TAIL_COPY_TOKENS:
                runs.append(_Run(j, None, tail))
        return runs

    # --- shared calls ---------------------------------------------------------------------------
    def _decode_runs(self, runs: list[_Run], sources: dict[int, _Source]) -> None:
        """Decode ``runs`` in calls ``calls.group_calls`` allows, each on a stream seeded from its request's
        source; a call's members whose request was cancelled meanwhile are dropped before the next."""
        runtime, limit, min_piece = self.runtime, self.runtime.n_batch, self.prefill.min_piece
        width = runtime.n_seq_max - 1
        # filler cells are dropped after the call: a decision's stream goes whole, a prefix stretch's
        # filler only where the memory can drop a sequence's tail (not recurrent or hybrid layers); and
        # runs of several requests start at other positions, so filler must still fit in a stream
        tails_drop = not (runtime.is_recurrent or runtime.is_hybrid)
        pad_limit = self.prefill.pad_limit if tails_drop or all(r.decision is not None for r in runs) else 0
        if any(sources[r.job].at + len(r.tokens) + pad_limit > runtime.n_ctx for r in runs):
            pad_limit = 0
        pending = list(runs)
        while pending:
            self._drop_cancelled()
            pending = [r for r in pending if self._outcomes[r.job] is None]
            if not pending:
                return
            spans = [run_pieces(len(r.tokens), sources[r.job].at, limit, min_piece) for r in pending]
            lasts = floored([b - a for a, b in (s[-1] for s in spans)], runtime.min_rows)
            # where each run's last piece ends in its stream: without flash attention, runs of very
            # different lengths are decoded apart (``calls.group_calls``)
            ends = (
                None
                if runtime.min_rows
                else [sources[r.job].at + s[-1][0] + n for r, s, n in zip(pending, spans, lasts, strict=True)]
            )
            call = group_calls(lasts, limit, min_piece, width, pad_limit, ends)[0]
            call, seqs = self._placed(call, pending, lasts, pad_limit, sources)
            members = [pending[i] for i in call]
            widths = padded_lengths([lasts[i] for i in call], pad_limit)
            self._call(members, seqs, [spans[i] for i in call], widths, sources)
            taken = set(call)
            pending = [r for i, r in enumerate(pending) if i not in taken]

    def _placed(
        self, call: list[int], runs: list[_Run], lasts: list[int], pad_limit: int, sources: dict[int, _Source]
    ) -> tuple[list[int], list[int]]:
        """The runs of a planned ``call`` (indices into ``runs``, shortest first) that can go together, in
        the order of the streams they go in, and those streams.

        A request's run goes in the stream that holds its prefix, if no other run of the request took
        it in this call; any other run in a spare stream (not held by this batch), the lowest first, and
        waits for a later call when none is left. ``calls.group_calls`` planned the call with consecutive
        stream ids in its order; where held streams break that, llama.cpp splits it otherwise, so the
        split is checked again with the real ids (``calls.shares_safely``) and the longest run left out
        until no piece is short (one run alone always is)."""
        limit, least = self.runtime.n_batch, self.prefill.min_piece
        while True:
            spare = [q for q in range(1, self.runtime.n_seq_max) if q not in self._taken]
            placed: list[tuple[int, int]] = []
            for i in call:
                stream = sources[runs[i].job].stream
                if stream is not None and all(q != stream for q, _ in placed):
                    placed.append((stream, i))
                elif spare:
                    placed.append((spare.pop(0), i))
            if not placed:
                raise EngineFailure("a shared batch found no stream for a run")
            placed.sort()
            seqs, members = [q for q, _ in placed], [i for _, i in placed]
            widths = padded_lengths([lasts[i] for i in members], pad_limit)
            if len(members) == 1 or shares_safely(widths, limit, least, seqs):
                return members, seqs
            call = [i for i in call if i in members][:-1]

    def _call(
        self,
        members: list[_Run],
        seqs: list[int],
        spans: list[list[tuple[int, int]]],
        widths: list[int],
        sources: dict[int, _Source],
    ) -> None:
        """One planned call in streams ``seqs``: each member's stream seeded (not the one holding its
        request's prefix), its leading pieces (a run longer than a call) decoded alone, then the last
        pieces of those still live together, each padded to its width; after it, a stream that holds a
        prefix is cut back to where the prefix ends, every other one emptied."""
        runtime = self.runtime
        own = [seq == sources[run.job].stream for run, seq in zip(members, seqs, strict=True)]
        try:
            for run, seq, held in zip(members, seqs, own, strict=True):
                if not held:
                    self.prefill.streams.forget([seq])
                    self._seed(seq, sources[run.job])
            for run, seq, run_spans in zip(members, seqs, spans, strict=True):
                self._lead(run, seq, run_spans[:-1], sources[run.job].at)
            live = [
                (r, q, s[-1][0], w)
                for r, q, s, w in zip(members, seqs, spans, widths, strict=True)
                if self._outcomes[r.job] is None
            ]
            if live:
                self._together(live, sources)
        finally:
            for run, seq, held in zip(members, seqs, own, strict=True):
                runtime.drop(seq, sources[run.job].at if held else -1)

    def _lead(self, run: _Run, seq: int, spans: list[tuple[int, int]], start: int) -> None:
        cancel = self._jobs[run.job][3]
        for a, b in spans:
            t = time.perf_counter()
            try:
                self.runtime.decode_parts([Part(run.tokens[a:b], start + a, seq, False)], cancel)
            except SemifError as exc:
                if cancel is None or not cancel.cancelled:
                    raise
                self._outcomes[run.job] = exc
                return
            finally:
                self._add_seconds(run, time.perf_counter() - t)

    def _together(self, live: list[tuple[_Run, int, int, int]], sources: dict[int, _Source]) -> None:
        """The members' last pieces (each from offset ``a`` of its run, padded to its width) in ONE call,
        aborted only when every member is cancelled; then each member's share of its seconds, and its
        readout or saved tail (its filler's cells dropped first)."""
        runtime = self.runtime
        parts = [
            Part(r.tokens[a:], sources[r.job].at + a, q, r.decision is not None).padded(w)
            for r, q, a, w in live
        ]
        tokens = sum(len(p.tokens) for p in parts)
        cancels = [c for c in (self._jobs[r.job][3] for r, _, _, _ in live) if c is not None]
        joint = Joint(cancels) if len(live) == len(cancels) and cancels else None
        t = time.perf_counter()
        try:
            rows = iter(runtime.decode_parts(parts, joint))
        except SemifError:
            if joint is None or not joint.cancelled:
                raise
            for r, _, _, _ in live:
                self._outcomes[r.job] = self._jobs[r.job][3].error()  # type: ignore[union-attr]
            return
        finally:
            if joint is not None:
                joint.close()
        elapsed = time.perf_counter() - t
        for (run, seq, _, _), part in zip(live, parts, strict=True):
            share = elapsed * len(part.tokens) / tokens
            self._add_seconds(run, share)
            cancel = self._jobs[run.job][3]
            if cancel is not None:
                cancel.advance(len(part.tokens), share)
            if run.decision is None:
                self._prefix_run_ended(run, seq, part, sources)
                continue
            try:
                readout = self.branches.read(run.labels, runtime.logits_at(next(rows)))
            except SemifError as exc:  # this decision's row only (non-finite logits)
                self._outcomes[run.job] = exc
                continue
            self._readouts[run.job][run.decision] = readout

    def _prefix_run_ended(self, run: _Run, seq: int, part: Part, sources: dict[int, _Source]) -> None:
        """A stretch of a request's prefix is in stream ``seq`` (its filler dropped): the request's runs go
        on from there. The state is saved where a prefill files it or where the request's other runs are
        seeded from a copy; a stream that holds the prefix keeps it and saves only to file it."""
        source = sources[run.job]
        tail_end = source.at + len(run.tokens)
        if part.filler:
            self.runtime.drop(seq, tail_end)
        prefix_tokens, _, cuts, _ = self._jobs[run.job]
        plan = self._plans[run.job][0] if run.prefill else None
        filed = plan is not None and self.prefill.files_at(prefix_tokens, plan, tail_end)
        held = seq == source.stream
        state = self.runtime.save_seq(seq) if filed or not held else None
        new = _Source(tail_end, state, stream=source.stream if held else None)
        for k, other in list(sources.items()):
            if other is source:
                sources[k] = new
        if plan is not None and state is not None:
            self.prefill.file_state(prefix_tokens, cuts, plan, tail_end, state)

    def _seed(self, seq: int, source: _Source) -> None:
        """Stream ``seq`` starts as a copy of its request's prefix: forked from sequence 0 while the request
        holds it, else restored from its saved state (saved now from the stream that holds it, if not
        yet)."""
        if source.empty or (source.stream is not None and source.at == 0):
            self.runtime.drop(seq)  # an earlier batch may have left a prefix there
            return
        if source.stream is not None and source.state is None:
            source.state = self.runtime.save_seq(source.stream)
        if source.state is None:
            if source is not self._holder:
                raise EngineFailure("a shared batch lost a request's prefix state")
            self.runtime.fork(PREFIX_SEQ, seq)
        else:
            self.runtime.restore_seq(seq, source.state)
            if source.cut is not None:
                self.runtime.drop(seq, source.cut)

    def _add_seconds(self, run: _Run, seconds: float) -> None:
        """A prefill call's seconds are its request's prefill time; a tail's are spread over its request's
        decisions; a decision's are its own."""
        if run.prefill:
            self._prefill_seconds[run.job] += seconds
            return
        row = self._seconds[run.job]
        if run.decision is not None:
            row[run.decision] += seconds
        elif row:
            for i in range(len(row)):
                row[i] += seconds / len(row)

    def _drop_cancelled(self) -> None:
        for j in range(len(self._jobs)):
            self._still_live(j)

    def _still_live(self, j: int) -> bool:
        """Request ``j`` has no outcome yet and its token is not cancelled (else that error is its
        outcome)."""
        cancel = self._jobs[j][3]
        if self._outcomes[j] is None and cancel is not None:
            try:
                cancel.check()
            except SemifError as exc:
                self._outcomes[j] = exc
        return self._outcomes[j] is None

    def _fail_all(self, error: SemifError) -> None:
        self.prefill.reset(wipe=True)
        for j, outcome in enumerate(self._outcomes):
            if outcome is None:
                self._outcomes[j] = error
