"""Several requests scored in one engine operation: validated and planned each on its own, cut into
batches the context can hold, and decoded together in invariant numerics (``shared_calls``; in the tiled
layout, requests of short turns only, ``tiled_batches``).

Each request's outcome is its own: a validation error, a refusal by its deadline or an abort ends that
request only. Alone (one request in a batch, or the fixed split) a request takes exactly the path of
``DecisionEngine.score``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from semif_adapter.engine.branches import Branches
from semif_adapter.engine.deadline import Deadline
from semif_adapter.engine.planner import Planner
from semif_adapter.engine.prefill import Prefill
from semif_adapter.engine.results import ResultBuilder
from semif_adapter.engine.shared_calls import Job, SharedCalls
from semif_adapter.engine.tiled_batches import TiledBatches
from semif_adapter.errors import EngineFailure, SemifError
from semif_adapter.protocol import BatchResult, Decision

Request = tuple[Sequence[Decision | Mapping[str, Any]], Deadline | None]


class RequestBatches:
    """The engine's requests-at-once room: plans each request, batches them, keeps each its outcome."""

    def __init__(
        self,
        planner: Planner,
        prefill: Prefill,
        branches: Branches,
        shared: SharedCalls,
        results: ResultBuilder,
        tiled: TiledBatches | None = None,
    ) -> None:
        """``tiled``: the tiled layout's shared calls (short turns only); None in the stream layout, whose
        batches go to ``shared``."""
        self.planner, self.prefill, self.branches = planner, prefill, branches
        self.shared, self.results, self.tiled = shared, results, tiled

    def score_many(self, jobs: Sequence[Request], max_requests: int) -> list[BatchResult | SemifError]:
        if not self.prefill.invariant or len(jobs) == 1:
            return [self._caught(decisions, cancel) for decisions, cancel in jobs]
        outcomes: list[BatchResult | SemifError | None] = [None] * len(jobs)
        ready: list[tuple[int, Job]] = []
        for j, (decisions, cancel) in enumerate(jobs):
            try:
                ready.append((j, self.plan(decisions, cancel)))
            except SemifError as exc:
                outcomes[j] = exc
        alone: list[tuple[int, Job]] = []
        if self.tiled is not None:  # a request that would not gain from a shared tiled call runs alone
            shares = [self.tiled.eligible(job) for _, job in ready]
            alone = [r for r, share in zip(ready, shares, strict=True) if not share]
            ready = [r for r, share in zip(ready, shares, strict=True) if share]
        for group in self.batches(ready, max_requests) + [[r] for r in alone]:
            started = time.perf_counter()
            if len(group) == 1:  # alone: exactly the path of ``DecisionEngine.score``
                j, job = group[0]
                outcomes[j] = self.alone(job, started)
                continue
            decode = self.shared.decode if self.tiled is None else self.tiled.decode
            decoded = decode([job for _, job in group])
            for (j, job), outcome in zip(group, decoded, strict=True):
                if isinstance(outcome, SemifError):
                    outcomes[j] = outcome
                    continue
                try:
                    outcomes[j] = self.results.build(job[0], job[1], outcome, started)
                except SemifError as exc:
                    outcomes[j] = exc
        return [o for o in outcomes if o is not None]

    def batches(self, ready: list[tuple[int, Job]], max_requests: int) -> list[list[tuple[int, Job]]]:
        """Requests in arrival order, cut into batches of at most ``max_requests`` whose prefixes and
        longest suffixes hold at most ``n_ctx`` tokens together (that bounds the host copies of their
        states); a request that needs more runs in a batch of its own."""
        batches: list[list[tuple[int, Job]]] = []
        tokens, limit = 0, self.prefill.runtime.n_ctx
        for item in ready:
            prefix_tokens, planned = item[1][0], item[1][1]
            need = len(prefix_tokens) + max((len(p.suffix_tokens) for p in planned), default=0)
            current = batches[-1] if batches else None
            if current is None or len(current) >= max_requests or tokens + need > limit:
                batches.append([item])
                tokens = need
            else:
                current.append(item)
                tokens += need
        return batches

    def plan(self, decisions: Sequence[Decision | Mapping[str, Any]], cancel: Deadline | None) -> Job:
        """Validate and plan one request (all validation before any decoding); with ``cancel``, refuse it
        now if its tokens cannot be decoded in time (``Deadline.begin``)."""
        prefix_tokens, planned, cuts = self.planner.plan(self.planner.parse(decisions))
        if cancel is not None:
            to_prefill = len(prefix_tokens) - self.prefill.reusable(prefix_tokens, cuts)
            cancel.begin(to_prefill + sum(len(p.suffix_tokens) for p in planned))
        return prefix_tokens, planned, cuts, cancel

    def alone(self, job: Job, started: float) -> BatchResult | SemifError:
        """One request decoded alone; a failure or abort empties the context (the kept prefix may be
        half-written), so the next request starts from clean memory and answers bit-identically."""
        prefix_tokens, planned, cuts, cancel = job
        branches = self.branches
        decode = branches.decode_shared if self.prefill.invariant else branches.decode_alone
        try:
            decoded = decode(prefix_tokens, planned, cuts, cancel)
            return self.results.build(prefix_tokens, planned, decoded, started)
        except SemifError as exc:
            self.prefill.reset(wipe=True)
            return exc
        except Exception as exc:  # a ctypes/numpy fault is an engine failure, never the caller's
            self.prefill.reset(wipe=True)
            return EngineFailure(f"engine fault: {type(exc).__name__}: {exc}")

    def _caught(
        self, decisions: Sequence[Decision | Mapping[str, Any]], cancel: Deadline | None
    ) -> BatchResult | SemifError:
        started = time.perf_counter()  # as ``DecisionEngine.score``: the timing includes the planning
        try:
            return self.alone(self.plan(decisions, cancel), started)
        except SemifError as exc:
            return exc
