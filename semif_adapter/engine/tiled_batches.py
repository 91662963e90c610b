"""Several requests in one decode in the tiled layout: short turns share a call, each request in a region
of its own (``TiledRuntime.decode_regions``), every answer bit-identical to the request alone.

Which requests. Alone, a request of the tiled layout makes one call of at least 64 rows (the tiled
kernel's threshold, made up with filler), so a short turn — a one-line event and a decision, say — pays
for rows it does not have; beside other requests the filler goes. A longer turn gains little and can
lose: the kernel reads every KV tile's mask for every 64 query rows, so a shared call's attention grows
with its rows times all its regions' cells. Measured on the raw runtime (``benchmarks/tiled_regions.py``,
Qwen2.5-0.5B, four agents): 28-row turns 1.53× (1,200-token transcripts) and 1.98× (300) faster
together; 64-row turns 0.96× and 1.08×, 108-row ones 0.89× and 0.81×. So a request joins a shared
call only when its decisions and the prefix it still has to decode come to fewer than 64 rows
(``eligible``); any other runs alone.

How. Each request's prefill runs alone in sequence 0, exactly as for the request alone
(``Prefill.fill_shared``, the state at the prefix's end held back for the call), and the state it
leaves is copied to host memory; the call restores each copy into a region and decodes every request's
tail and decisions at once. Each region's sequence then holds its whole prefix, whose state is filed in
the prefix cache (``Prefill.file_whole``: alone, a turn shorter than the minimum piece files none; here
the next turn resumes at this one's end, so it stays short). A request whose cancel token fires while the
call runs is dropped after it (the call aborts only when every request in it is cancelled, ``Joint``);
one whose prefill fails gets that error and the others go on; a fault of llama.cpp itself fails every
request still in the batch.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass

from semif_adapter.engine.branches import Branches, Decoded
from semif_adapter.engine.deadline import Joint
from semif_adapter.engine.llama_backend import FLASH_TILE_ROWS, PREFIX_SEQ
from semif_adapter.engine.planner import Planned
from semif_adapter.engine.prefill import Prefill
from semif_adapter.engine.shared_calls import Job, Outcome
from semif_adapter.engine.tile_layout import Region, Run, TiledRuntime
from semif_adapter.errors import EngineFailure, SemifError


@dataclass(frozen=True)
class _Filled:
    """A request's prefill done: where its tail starts, its state there, and the prefill's seconds and
    reused tokens."""

    job: int
    tail_at: int
    state: ctypes.Array[ctypes.c_uint8]
    seconds: float
    reused: int


class TiledBatches:
    """Decodes a batch of planned requests of the tiled layout: the eligible ones in shared calls."""

    def __init__(self, runtime: TiledRuntime, prefill: Prefill, branches: Branches) -> None:
        self.runtime, self.prefill, self.branches = runtime, prefill, branches

    def eligible(self, job: Job) -> bool:
        """Alone, the request would make one tiled call of fewer than 64 rows: its decisions fit one call
        and, with the prefix it still has to decode (the tail is at most what the prefix cache or the
        kept prefix does not serve), come to fewer rows than the tiled path's threshold."""
        prefix_tokens, planned, cuts, _ = job
        if not planned or len(planned) > self.runtime.decisions:
            return False
        rest = len(prefix_tokens) - self.prefill.reusable(prefix_tokens, cuts)
        return rest + sum(len(p.suffix_tokens) for p in planned) < FLASH_TILE_ROWS

    def decode(self, jobs: Sequence[Job]) -> list[Outcome]:
        """Every job's decisions decoded; per job its ``Decoded`` or the error that ended it (never raises
        for one job's failure). A job whose tail came out longer than ``eligible`` judged (the prefix
        cache evicted its state meanwhile) is decoded alone."""
        outcomes: list[Outcome | None] = [None] * len(jobs)
        try:
            filled: list[_Filled] = []
            # the request whose prefix sequence 0 holds first: the others' prefills replace it
            order = sorted(range(len(jobs)), key=lambda j: not self.prefill.keeps(jobs[j][0], jobs[j][2]))
            for j in order:
                job = jobs[j]
                try:
                    done = self._fill(j, job)
                except SemifError as exc:
                    outcomes[j] = exc
                    self.prefill.reset(wipe=True)
                    continue
                if self._rows(job, done.tail_at) < FLASH_TILE_ROWS:
                    filled.append(done)
                    continue
                outcomes[j] = self._alone(job)
            for group in self._calls(jobs, sorted(filled, key=lambda f: f.job)):
                live = [f for f in group if self._still_live(jobs[f.job], outcomes, f.job)]
                if live:
                    self._call(jobs, live, outcomes)
        except SemifError as exc:  # the engine itself failed: every request still here gets the error
            self._fail_all(outcomes, exc)
        except Exception as exc:  # a ctypes/numpy fault is an engine failure, never a caller's
            self._fail_all(outcomes, EngineFailure(f"engine fault: {type(exc).__name__}: {exc}"))
        finally:
            self.prefill.reset()  # the regions' cells are no request's kept prefix
        return [o if o is not None else EngineFailure("a shared tiled call lost a request") for o in outcomes]

    @staticmethod
    def _rows(job: Job, tail_at: int) -> int:
        return len(job[0]) - tail_at + sum(len(p.suffix_tokens) for p in job[1])

    def _fill(self, j: int, job: Job) -> _Filled:
        """The request's prefill alone in sequence 0, as ``Branches.decode_tiled`` makes it, and a copy of
        the state it leaves."""
        prefix_tokens, _, cuts, cancel = job
        t0 = time.perf_counter()
        kept = self.prefill.keeps(prefix_tokens, cuts)
        reused, tail_at, _ = self.prefill.fill_shared(prefix_tokens, cuts, cancel, hold_end=True)
        seconds = 0.0 if kept else time.perf_counter() - t0
        return _Filled(j, tail_at, self.runtime.save_seq(PREFIX_SEQ), seconds, reused)

    def _alone(self, job: Job) -> Outcome:
        """The request's whole path alone (its prefill again: a rare case, see :meth:`decode`)."""
        prefix_tokens, planned, cuts, cancel = job
        self.prefill.reset()
        try:
            return self.branches.decode_tiled(prefix_tokens, planned, cuts, cancel)
        except SemifError as exc:
            self.prefill.reset(wipe=True)
            return exc

    def _calls(self, jobs: Sequence[Job], filled: list[_Filled]) -> list[list[_Filled]]:
        """The filled requests in arrival order, cut into calls the runtime can make: at most ``regions``
        requests, ``seqs`` sequences (a request's prefix and each of its decisions) and ``n_batch``
        rows."""
        runtime = self.runtime
        calls: list[list[_Filled]] = []
        seqs = rows = 0
        for f in filled:
            need, width = 1 + len(jobs[f.job][1]), self._rows(jobs[f.job], f.tail_at)
            if (
                not calls
                or len(calls[-1]) >= runtime.regions
                or seqs + need > runtime.seqs
                or rows + width > runtime.n_batch
            ):
                calls.append([])
                seqs = rows = 0
            calls[-1].append(f)
            seqs, rows = seqs + need, rows + width
        return calls

    def _call(self, jobs: Sequence[Job], live: list[_Filled], outcomes: list[Outcome | None]) -> None:
        """One shared call over ``live``, aborted only when every member is cancelled; then each member's
        state filed, its share of the seconds and its readouts."""
        runtime, regions, seq = self.runtime, [], 0
        for f in live:
            prefix_tokens, planned, _, _ = jobs[f.job]
            n = len(prefix_tokens)
            runs = [Run(p.suffix_tokens, n, seq + 1 + k) for k, p in enumerate(planned)]
            regions.append(Region(seq, f.tail_at, prefix_tokens[f.tail_at :], runs, f.state))
            seq += 1 + len(planned)
        cancels = [c for c in (jobs[f.job][3] for f in live) if c is not None]
        joint = Joint(cancels) if len(cancels) == len(live) else None
        t = time.perf_counter()
        try:
            rows = runtime.decode_regions(regions, joint)
        except SemifError:
            if joint is None or not joint.cancelled:
                raise
            for f in live:
                outcomes[f.job] = jobs[f.job][3].error()  # type: ignore[union-attr]
            return
        finally:
            if joint is not None:
                joint.close()
        elapsed = time.perf_counter() - t
        total = sum(self._rows(jobs[f.job], f.tail_at) for f in live)
        for f, region, region_rows in zip(live, regions, rows, strict=True):
            prefix_tokens, planned, cuts, cancel = jobs[f.job]
            tokens = self._rows(jobs[f.job], f.tail_at)
            share = elapsed * tokens / total
            if cancel is not None:
                cancel.advance(tokens, share)
            self.prefill.file_whole(prefix_tokens, cuts, runtime.save_seq(region.seq))
            if not self._still_live(jobs[f.job], outcomes, f.job):
                continue
            outcomes[f.job] = self._decoded(f, planned, region_rows, share)

    def _decoded(self, f: _Filled, planned: Sequence[Planned], rows: list[int], seconds: float) -> Outcome:
        lengths = [len(p.suffix_tokens) for p in planned]
        try:
            forwards = [
                (
                    self.branches.read(p.label_ids, self.runtime.logits_at(row)),
                    seconds * length / sum(lengths),
                )
                for p, row, length in zip(planned, rows, lengths, strict=True)
            ]
        except SemifError as exc:  # a decision's row only (non-finite logits)
            return exc
        decoded: Decoded = (f.seconds, f.reused, forwards)
        return decoded

    @staticmethod
    def _still_live(job: Job, outcomes: list[Outcome | None], j: int) -> bool:
        """Request ``j`` has no outcome yet and its token is not cancelled (else that error is its
        outcome)."""
        cancel = job[3]
        if outcomes[j] is None and cancel is not None:
            try:
                cancel.check()
            except SemifError as exc:
                outcomes[j] = exc
        return outcomes[j] is None

    def _fail_all(self, outcomes: list[Outcome | None], error: SemifError) -> None:
        self.prefill.reset(wipe=True)
        for j, outcome in enumerate(outcomes):
            if outcome is None:
                outcomes[j] = error
